//! `rbd:` exports serve Ceph RBD images to real clients (nbdinfo, nbdcopy, qemu-img,
//! qemu-io, fio) against a real single-node Ceph cluster, and what they write is what Ceph's
//! own `rbd export` reads back.
mod common;
use common::ceph::{shared, Ceph};
use common::*;
use std::time::Duration;

/// qemu-io's commands on `uri`, opened read-only when it starts with "ro:".
fn qemu_io(uri: &str, commands: &[&str]) -> (bool, String) {
    let mut args = vec!["-f", "raw"];
    let uri = match uri.strip_prefix("ro:") {
        Some(rest) => {
            args.push("-r");
            rest
        }
        None => uri,
    };
    for c in commands {
        args.extend(["-c", c]);
    }
    args.push(uri);
    let (ok, out, err) = run("qemu-io", &args);
    let text = format!("{out}{err}");
    (ok && !text.contains("failed") && !text.contains("error"), text)
}

fn qemu_io_ok(uri: &str, commands: &[&str]) {
    let (ok, text) = qemu_io(uri, commands);
    assert!(ok, "qemu-io on {uri} failed:\n{text}");
}

/// Serves `rbd:rbd/IMAGE` of the shared cluster as export "vm".
fn serve(ceph: &Ceph, image: &str, more: &[&str]) -> Sluice {
    let export = format!("vm=rbd:rbd/{image}");
    let mut args = vec!["--export", &export, "--rbd-conf", ceph.conf()];
    args.extend_from_slice(more);
    Sluice::start(&args)
}

/// The image as Ceph itself reads it, bypassing sluice.
fn rbd_export(ceph: &Ceph, image: &str, dir: &std::path::Path) -> Vec<u8> {
    let out = dir.join(format!("{image}.export"));
    ceph.rbd(&["export", &format!("rbd/{image}"), out.to_str().unwrap()]);
    std::fs::read(out).unwrap()
}

#[test]
fn nbdinfo_reports_the_image_size_and_a_map_from_the_object_map() {
    require!("nbdinfo", "qemu-io");
    require_ceph!();
    let ceph = shared();
    let image = ceph.image("64M");
    let s = serve(ceph, &image, &[]);
    let uri = s.uri_for("vm");
    let (ok, out, err) = run("nbdinfo", &["--json", &uri]);
    assert!(ok, "{err}");
    assert!(out.contains("\"export-size\": 67108864"), "{out}");
    assert!(out.contains("\"can_multi_conn\": true"), "{out}");
    assert!(out.contains("\"is_read_only\": false"), "{out}");
    // Objects are 4 MiB: data written at 8M..12M allocates exactly one.
    qemu_io_ok(&uri, &["write -P 0x5a 8M 4M"]);
    let (ok, map, err) = run("nbdinfo", &["--map", &uri]);
    assert!(ok, "{err}");
    let rows: Vec<Vec<&str>> = map.lines().map(|l| l.split_whitespace().collect()).collect();
    let expect = [["0", "8388608", "3"], ["8388608", "4194304", "0"], ["12582912", "54525952", "3"]];
    assert_eq!(rows.len(), 3, "{map}");
    for (row, want) in rows.iter().zip(expect) {
        assert_eq!(&row[..3], &want[..], "{map}");
    }
}

#[test]
fn without_an_object_map_everything_is_reported_as_data() {
    require!("nbdinfo");
    require_ceph!();
    let ceph = shared();
    let image = format!("{}-plain", ceph.image("1M"));
    // Only layering: no object map, no fast-diff, so allocation cannot be told cheaply.
    ceph.rbd(&["create", "--size", "8M", "--image-feature", "layering", &format!("rbd/{image}")]);
    let s = serve(ceph, &image, &[]);
    let (ok, map, err) = run("nbdinfo", &["--map", &s.uri_for("vm")]);
    assert!(ok, "{err}");
    let rows: Vec<Vec<&str>> = map.lines().map(|l| l.split_whitespace().collect()).collect();
    assert_eq!(rows.len(), 1, "{map}");
    assert_eq!(&rows[0][..3], &["0", "8388608", "0"], "{map}");
}

#[test]
fn nbdcopy_round_trip_is_byte_exact_and_rbd_export_reads_the_same() {
    require!("nbdcopy");
    require_ceph!();
    let ceph = shared();
    let image = ceph.image("32M");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(32 << 20, 7);
    let src = dir.path().join("src.img");
    write_file(&src, &data);
    let s = serve(ceph, &image, &[]);
    let uri = s.uri_for("vm");
    let (ok, _, err) = run("nbdcopy", &[src.to_str().unwrap(), &uri]);
    assert!(ok, "nbdcopy to the export: {err}");
    let back = dir.path().join("back.img");
    let (ok, _, err) = run("nbdcopy", &[&uri, back.to_str().unwrap()]);
    assert!(ok, "nbdcopy from the export: {err}");
    assert!(std::fs::read(&back).unwrap() == data, "nbdcopy read back other bytes");
    assert!(rbd_export(ceph, &image, dir.path()) == data, "rbd export reads other bytes than were written");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn qemu_img_converts_into_the_export() {
    require!("qemu-img");
    require_ceph!();
    let ceph = shared();
    let image = ceph.image("16M");
    let dir = tempfile::tempdir().unwrap();
    let data = pattern(16 << 20, 11);
    let raw = dir.path().join("disk.raw");
    write_file(&raw, &data);
    let qcow = dir.path().join("disk.qcow2");
    let (ok, _, err) = run("qemu-img", &["convert", "-f", "raw", "-O", "qcow2", raw.to_str().unwrap(), qcow.to_str().unwrap()]);
    assert!(ok, "{err}");
    let s = serve(ceph, &image, &[]);
    let (ok, _, err) = run("qemu-img", &["convert", "-n", "-f", "qcow2", "-O", "raw", qcow.to_str().unwrap(), &s.uri_for("vm")]);
    assert!(ok, "qemu-img convert into the export: {err}");
    assert!(rbd_export(ceph, &image, dir.path()) == data, "the image differs from what qemu-img converted");
}

#[test]
fn fio_writes_and_verifies_with_crc32c() {
    require!("fio");
    require_ceph!();
    let ceph = shared();
    let image = ceph.image("16M");
    let s = serve(ceph, &image, &[]);
    let uri = format!("--uri={}", s.uri_for("vm"));
    let args = [
        "--name=rbd",
        "--ioengine=nbd",
        &uri,
        "--rw=randwrite",
        "--bs=4k",
        "--iodepth=16",
        "--size=16M",
        "--verify=crc32c",
        "--do_verify=1",
        "--verify_state_save=0",
    ];
    let (ok, out, err) = run("fio", &args);
    let text = format!("{out}{err}");
    assert!(ok && text.contains("err= 0"), "fio failed:\n{text}");
    assert!(!text.lines().any(|l| l.contains("verify:") || l.contains("bad magic")), "{text}");
}

#[test]
fn discards_and_zeroes_read_back_as_zeros() {
    require!("qemu-io");
    require_ceph!();
    let ceph = shared();
    let image = ceph.image("16M");
    let dir = tempfile::tempdir().unwrap();
    let s = serve(ceph, &image, &[]);
    let uri = s.uri_for("vm");
    qemu_io_ok(
        &uri,
        &[
            "write -P 0x77 0 16M",
            // A whole object, and part of one.
            "discard 4M 4M",
            "discard 9M 1M",
            "write -z 12M 1M",
            "write -z 14M 6000",
            "read -P 0x77 0 4M",
            "read -P 0 4M 4M",
            "read -P 0x77 8M 1M",
            "read -P 0 9M 1M",
            "read -P 0x77 10M 2M",
            "read -P 0 12M 1M",
            "read -P 0x77 13M 1M",
            "read -P 0 14M 6000",
            "read -P 0x77 14686064 2091152",
        ],
    );
    let mut want = vec![0x77u8; 16 << 20];
    for (at, len) in [(4 << 20, 4 << 20), (9 << 20, 1 << 20), (12 << 20, 1 << 20), (14 << 20, 6000)] {
        want[at..at + len].fill(0);
    }
    assert!(rbd_export(ceph, &image, dir.path()) == want, "rbd export disagrees with what sluice read back");
}

#[test]
fn a_snapshot_is_served_read_only_with_the_data_it_had() {
    require!("qemu-io", "nbdinfo");
    require_ceph!();
    let ceph = shared();
    let image = ceph.image("8M");
    // Each server is stopped, not killed: a stop closes the image and releases its lock at
    // once, where a killed client's lock is only broken after its watch times out (30 s).
    let s = serve(ceph, &image, &[]);
    qemu_io_ok(&s.uri_for("vm"), &["write -P 0x11 0 8M"]);
    assert_eq!(s.stop().code(), Some(0));
    ceph.rbd(&["snap", "create", &format!("rbd/{image}@before")]);
    let head = serve(ceph, &image, &[]);
    qemu_io_ok(&head.uri_for("vm"), &["write -P 0x22 0 8M"]);
    assert_eq!(head.stop().code(), Some(0));
    let export = format!("old=rbd:rbd/{image}@before");
    let s = Sluice::start(&["--export", &export, "--rbd-conf", ceph.conf()]);
    let uri = s.uri_for("old");
    let (ok, out, err) = run("nbdinfo", &["--json", &uri]);
    assert!(ok, "{err}");
    assert!(out.contains("\"is_read_only\": true"), "{out}");
    qemu_io_ok(&format!("ro:{uri}"), &["read -P 0x11 0 8M"]);
    let (ok, text) = qemu_io(&uri, &["write -P 0x33 0 4k"]);
    assert!(!ok, "a write to a snapshot succeeded:\n{text}");
    assert!(s.log_text().contains("is a snapshot, so this export is read-only"), "{}", s.log_text());
}

/// `sluice serve ARGS`, expected to fail at start: its exit code and message.
fn serve_fails(args: &[&str]) -> (Option<i32>, String) {
    let out = output(std::process::Command::new(SLUICE).arg("serve").args(args).args(["--listen", "127.0.0.1:0"]));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn start_errors_say_what_is_missing_and_exit_2() {
    require_ceph!();
    let ceph = shared();
    let image = ceph.image("4M");
    let conf = ceph.conf();
    let cases = [
        (format!("a=rbd:nosuchpool/{image}"), "pool \"nosuchpool\" does not exist"),
        ("a=rbd:rbd/nosuchimage".to_owned(), "no image \"nosuchimage\" in pool \"rbd\""),
        (format!("a=rbd:rbd/{image}@nosuchsnap"), "has no snapshot \"nosuchsnap\""),
        (format!("a=rbd:rbd/{image},rbd-conf=/nonexistent/ceph.conf"), "cannot read the Ceph configuration /nonexistent/ceph.conf"),
    ];
    for (export, want) in cases {
        let (code, err) = serve_fails(&["--export", &export, "--rbd-conf", conf]);
        assert_eq!(code, Some(2), "{export}: {err}");
        assert!(err.contains(want), "{export}: expected {want:?} in: {err}");
    }
    let (code, err) = serve_fails(&["--export", "m=memory:1M,rbd-id=x"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("apply to rbd: exports only"), "{err}");
    let (code, err) = serve_fails(&["--export", "a=rbd:just-a-pool"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("expected rbd:POOL/IMAGE"), "{err}");
}

#[test]
fn an_unreachable_cluster_is_an_error_at_start() {
    require_ceph!();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("ceph.conf");
    // Nothing listens on the port; the configured timeout is what sluice waits.
    let port = free_port();
    let text = format!(
        "[global]\nmon host = v1:127.0.0.1:{port}\nauth client required = none\nclient mount timeout = 2\nlog file = {}/client.log\n",
        dir.path().display()
    );
    std::fs::write(&conf, text).unwrap();
    let (code, err) = serve_fails(&["--export", "a=rbd:rbd/x", "--rbd-conf", conf.to_str().unwrap()]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("did not answer client.admin within 2"), "{err}");
}

/// How long the paused-cluster test waits for a condition it needs (the clients inside
/// sluice learning of the pause, a held read counted as slow); far more than any takes.
const PAUSE_NOTICE: Duration = Duration::from_secs(60);

#[test]
fn a_paused_cluster_holds_or_fails_requests_and_the_server_serves_on() {
    require!("qemu-io", "nbdinfo", "fio");
    require_ceph!();
    // A cluster of its own: it is paused.
    let ceph = Ceph::start("");
    let image = ceph.image("8M");
    let dir = tempfile::tempdir().unwrap();
    // A second configuration for the same cluster that gives up on an operation after 3 s.
    let quick = dir.path().join("quick.conf");
    let text = std::fs::read_to_string(&ceph.conf).unwrap();
    std::fs::write(&quick, format!("{text}\n[client]\nrados osd op timeout = 3\n")).unwrap();
    // And one that waits (much) longer than any pause here, however loaded the machine.
    let patient = dir.path().join("patient.conf");
    std::fs::write(&patient, format!("{text}\n[client]\nrados osd op timeout = 600\n")).unwrap();
    let limits = dir.path().join("sluice.toml");
    std::fs::write(&limits, "[limits]\nslow-request-ms = 1000\n").unwrap();
    let waits = format!("waits=rbd:rbd/{image},rbd-conf={}", patient.display());
    let fails = format!("fails=rbd:rbd/{image},ro,rbd-conf={}", quick.display());
    let port = free_port();
    let s = Sluice::start(&[
        "--rbd-conf",
        ceph.conf(),
        "--config",
        limits.to_str().unwrap(),
        "--metrics",
        &format!("127.0.0.1:{port}"),
        "--export",
        &waits,
        "--export",
        &fails,
        "--export",
        "mem=memory:1M",
    ]);
    let logs = || format!("sluice's log:\n{}\ncluster:\n{}", s.log_text(), ceph.state());
    let gauge = |name: &str| sample(&http_get(port, "/metrics").1, &format!("{name}{{export=\"waits\"}}"));
    qemu_io_ok(&s.uri_for("waits"), &["write -P 0x5a 0 8M"]);

    // A workload of writes and verifying reads, running while the cluster stops answering
    // and comes back: not one acknowledged write may be lost.
    let fio_uri = format!("--uri={}", s.uri_for("waits"));
    let fio = ["--name=pause", "--ioengine=nbd", &fio_uri, "--rw=randwrite", "--bs=4k", "--iodepth=16", "--offset=4M", "--size=4M"];
    let workload = run_in_background("fio", &[&fio[..], &["--loops=4", "--verify=crc32c", "--do_verify=1", "--verify_state_save=0"]].concat());
    ceph.pause();

    // Each export has a cluster connection of its own, which learns of the pause when the
    // monitor sends it the new map: until then its requests still go through. So each
    // check below waits for the condition it needs rather than for a time.
    // A read on the export that gives up after 3 s fails with EIO...
    let fails_ro = format!("ro:{}", s.uri_for("fails"));
    let mut failed = None;
    wait_until("a read on the impatient export to fail", PAUSE_NOTICE, || {
        let (ok, text) = qemu_io(&fails_ro, &["read 0 64k"]);
        failed = (!ok).then_some(text);
        failed.is_some()
    }, logs);
    let text = failed.unwrap();
    assert!(text.contains("Input/output error"), "a read with the cluster paused failed otherwise than with EIO:\n{text}");
    // ...the server goes on serving its other exports...
    let (ok, out, err) = run("nbdinfo", &["--size", &s.uri_for("mem")]);
    assert!(ok && out.trim() == "1048576", "the memory export stopped answering: {out}{err}");
    // ...and a read on the patient export waits, and is logged and counted as slow.
    let held = "slow request: export \"waits\", READ offset 0 length 1048576, at the backend for";
    let waits_uri = s.uri_for("waits");
    let read = || run_in_background("qemu-io", &["-f", "raw", "-c", "read -P 0x5a 0 1M", &waits_uri]);
    let mut reader = read();
    wait_until("a read on the patient export to be held", PAUSE_NOTICE, || {
        if s.log_text().contains(held) {
            return true;
        }
        if reader.is_finished() {
            // Answered before its connection learned of the pause: try again.
            let (ok, out, err) = std::mem::replace(&mut reader, read()).join().unwrap();
            assert!(ok && !out.contains("failed"), "a read on the patient export failed: {out}{err}");
        }
        false
    }, logs);
    assert!(gauge("sluice_requests_slow") >= 1.0, "the held read is not counted:\n{}", logs());
    assert!(gauge("sluice_request_oldest_seconds") >= 1.0, "the oldest request is younger than the slow one:\n{}", logs());

    ceph.unpause();
    let (ok, out, err) = reader.join().unwrap();
    assert!(ok && !out.contains("failed"), "the read held by the pause failed once it ended:\n{out}{err}\n{}", logs());
    let (ok, out, err) = workload.join().unwrap();
    let text = format!("{out}{err}");
    assert!(ok && text.contains("err= 0"), "the workload across the pause failed:\n{text}\n{}", logs());
    assert!(!text.lines().any(|l| l.contains("verify:") || l.contains("bad magic")), "{text}");
    let ended = "slow request ended: export \"waits\", READ offset 0 length 1048576, after";
    let log = s.log_text();
    assert!(log.lines().any(|l| l.contains(ended) && l.contains(": answered")), "no end for the held read:\n{log}");
    qemu_io_ok(&fails_ro, &["read -P 0x5a 0 4M"]);
    assert_eq!(s.stop().code(), Some(0), "sluice did not stop cleanly after the cluster came back");
}
