//! SIGHUP re-reads `--config`: exports added and removed (a removed one's open connections
//! finish), a rotated certificate (new clients see it, an open connection goes on), limits,
//! and a bad file that changes nothing.
mod common;
use common::tls::Keys;
use common::*;

use std::path::Path;
use std::time::Duration;

fn export(name: &str, spec: &str) -> String {
    format!("[[export]]\nname = \"{name}\"\nspec = \"{spec}\"\n")
}

/// Sends SIGHUP and waits for the reload's outcome line (the count of such lines grows).
fn reload(s: &Sluice) -> String {
    let before = outcomes(&s.log_text());
    signal(s.pid(), libc::SIGHUP);
    wait_until("the reload to finish", Duration::from_secs(30), || outcomes(&s.log_text()) > before, || s.log_text());
    s.log_text()
}

fn outcomes(log: &str) -> usize {
    log.lines().filter(|l| l.contains(": reloaded ") || l.contains("reload refused")).count()
}

/// An nbdsh client that writes a block, says so by creating `ready`, waits (bounded) for
/// `go`, then reads the block back on the same connection and checks it.
fn held_connection(uri: &str, ready: &Path, go: &Path) -> std::thread::JoinHandle<(bool, String, String)> {
    let script = format!(
        "import os, time\n\
         h.set_uri_allow_local_file(True)\n\
         h.connect_uri({uri:?})\n\
         block = bytes(range(256)) * 16\n\
         h.pwrite(block, 4096)\n\
         open({ready:?}, 'w').close()\n\
         deadline = time.monotonic() + 60\n\
         while not os.path.exists({go:?}):\n    assert time.monotonic() < deadline, 'no go'\n    time.sleep(0.02)\n\
         assert h.pread(4096, 4096) == block, 'read back different data'\n\
         print('held connection ok')\n",
        ready = ready.to_str().unwrap(),
        go = go.to_str().unwrap()
    );
    run_in_background("nbdsh", &["-c", &script])
}

type Background = std::thread::JoinHandle<(bool, String, String)>;

/// Waits (bounded) for a held connection's write; one that ended instead fails the test
/// with what it printed.
fn wait_for_write(held: Background, ready: &Path, s: &Sluice) -> Background {
    wait_until("the held connection's write", Duration::from_secs(30), || ready.exists() || held.is_finished(), || s.log_text());
    if !ready.exists() {
        let (_, out, err) = held.join().unwrap();
        panic!("the held connection ended early: {out}{err}\n{}", s.log_text());
    }
    held
}

fn fio_verify(uri: &str) -> std::thread::JoinHandle<(bool, String, String)> {
    let uri = format!("--uri={uri}");
    let args = ["--name=reload", "--ioengine=nbd", &uri, "--rw=randwrite", "--bs=64k", "--iodepth=8", "--size=24M", "--rate=12m", "--verify=crc32c", "--do_verify=1", "--verify_state_save=0"];
    run_in_background("fio", &args)
}

#[test]
fn reload_adds_and_removes_exports_and_a_removed_ones_connections_finish() {
    require!("nbdsh", "nbdinfo", "fio");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &format!("{}{}", export("keep", "memory:8M"), export("old", "memory:64M")));
    let s = Sluice::start(&["--config", config.to_str().unwrap()]);
    // Data on the export that stays: a reload must not reopen it (a RAM disk would be empty).
    let (ready, go) = (dir.path().join("ready"), dir.path().join("go"));
    let keeper = held_connection(&s.uri_for("keep"), &dir.path().join("keep-ready"), &dir.path().join("keep-ready"));
    let (ok, out, err) = keeper.join().unwrap();
    assert!(ok, "{out}{err}");
    let held = held_connection(&s.uri_for("old"), &ready, &go);
    let fio = fio_verify(&s.uri_for("old"));
    let held = wait_for_write(held, &ready, &s);
    // fio looks at the export on a connection of its own first (opened and closed), then
    // opens the one it works on: three opened, one closed, with the held connection.
    let fio_working = || {
        let log = s.log_text();
        log.matches("opened export \"old\"").count() >= 3 && log.matches("closed export \"old\"").count() >= 1
    };
    wait_until("fio's working connection", Duration::from_secs(30), fio_working, || s.log_text());

    write_config(dir.path(), &format!("{}{}", export("keep", "memory:8M"), export("new", "null:1M")));
    let log = reload(&s);
    assert!(log.contains("reloaded"), "{log}");
    let (ok, out, err) = run("nbdinfo", &["--list", "--json", &s.uri()]);
    assert!(ok, "{err}");
    assert!(out.contains("\"keep\"") && out.contains("\"new\"") && !out.contains("\"old\""), "{out}");
    let (ok, _, err) = run("nbdinfo", &["--size", &s.uri_for("new")]);
    assert!(ok, "the added export is not served: {err}\n{}", s.log_text());
    let (ok, _, _) = run("nbdinfo", &["--size", &s.uri_for("old")]);
    assert!(!ok, "a new connection opened the removed export\n{}", s.log_text());
    let script = "assert h.pread(4096, 4096) == bytes(range(256)) * 16, 'keep was reopened'";
    let (ok, out, err) = run("nbdsh", &["-u", &s.uri_for("keep"), "-c", script]);
    assert!(ok, "{out}{err}\n{}", s.log_text());
    // A server-wide default that would change the RAM export's options is refused, rather
    // than reopening (emptying) it; its data stays.
    write_config(dir.path(), &format!("chunk = \"256K\"\n{}{}", export("keep", "memory:8M"), export("new", "null:1M")));
    let log = reload(&s);
    assert!(log.contains("reload refused, nothing changed: export \"keep\": a RAM export's options cannot change"), "{log}");
    let (ok, out, err) = run("nbdsh", &["-u", &s.uri_for("keep"), "-c", script]);
    assert!(ok, "{out}{err}\n{}", s.log_text());

    std::fs::write(&go, "").unwrap();
    let (ok, out, err) = held.join().unwrap();
    assert!(ok && out.contains("held connection ok"), "the removed export's open connection failed: {out}{err}\n{}", s.log_text());
    let (ok, out, err) = fio.join().unwrap();
    assert!(ok && out.contains("err= 0"), "fio on the removed export failed: {out}{err}\n{}", s.log_text());
    wait_until("the removed export to be released", Duration::from_secs(15), || s.log_text().contains("export \"old\": its last connection closed; released"), || s.log_text());
    assert!(s.stop().success());
}

#[test]
fn reload_rotates_the_certificate_for_new_handshakes_and_keeps_open_sessions() {
    require!("nbdsh", "nbdinfo", "certtool", "psktool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let tls = |pki: &Path| format!("tls = \"require\"\ntls-certificates = \"{}\"\n{}", pki.display(), export("disk", "memory:8M"));
    let config = write_config(dir.path(), &tls(&keys.server_dir()));
    let s = Sluice::start(&["--config", config.to_str().unwrap()]);
    let uri = |trust: &Path| format!("nbds://localhost:{}/disk?tls-certificates={}", s.port, trust.display());
    let (ok, _, err) = run("nbdinfo", &["--size", &uri(&keys.client_dir())]);
    assert!(ok, "{err}\n{}", s.log_text());
    let (ready, go) = (dir.path().join("ready"), dir.path().join("go"));
    let held = held_connection(&uri(&keys.client_dir()), &ready, &go);
    let held = wait_for_write(held, &ready, &s);

    // The new certificate comes from another CA, so which one a client sees is plain.
    write_config(dir.path(), &tls(&keys.other_ca_server_dir()));
    reload(&s);
    let (ok, _, _) = run("nbdinfo", &["--size", &uri(&keys.client_dir())]);
    assert!(!ok, "a new client still got the old certificate\n{}", s.log_text());
    let (ok, _, err) = run("nbdinfo", &["--size", &uri(&keys.other_ca_server_dir())]);
    assert!(ok, "a new client did not get the new certificate: {err}\n{}", s.log_text());
    std::fs::write(&go, "").unwrap();
    let (ok, out, err) = held.join().unwrap();
    assert!(ok && out.contains("held connection ok"), "the open TLS connection failed: {out}{err}\n{}", s.log_text());
    assert!(s.stop().success());
}

#[test]
fn a_bad_file_changes_nothing_and_says_what_a_start_would() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &export("disk", "memory:8M"));
    let s = Sluice::start(&["--config", config.to_str().unwrap()]);
    let bad = format!("{}[limits]\ninflight-requests-per-connection = 0\n", export("other", "memory:1M"));
    write_config(dir.path(), &bad);
    let check = output(std::process::Command::new(SLUICE).args(["serve", "--check", "--config", config.to_str().unwrap()]));
    let message = String::from_utf8_lossy(&check.stderr).trim().trim_start_matches("sluice serve: ").to_owned();
    assert!(!message.is_empty() && !check.status.success());
    let log = reload(&s);
    assert!(log.contains(&format!("reload refused, nothing changed: {message}")), "expected {message:?}\n{log}");
    let (ok, _, err) = run("nbdinfo", &["--size", &s.uri_for("disk")]);
    assert!(ok, "{err}");
    let (ok, _, _) = run("nbdinfo", &["--size", &s.uri_for("other")]);
    assert!(!ok, "the refused file's export is served");
    // An export that cannot be opened refuses the whole file too.
    write_config(dir.path(), &format!("{}{}", export("disk", "memory:8M"), export("gone", "/nonexistent/disk.img")));
    let log = reload(&s);
    assert!(log.contains("reload refused, nothing changed: export \"gone\": cannot open /nonexistent/disk.img"), "{log}");
    assert!(s.stop().success());
}

#[test]
fn reload_applies_the_connection_limit_and_names_limits_that_need_a_restart() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &export("disk", "memory:8M"));
    let s = Sluice::start(&["--config", config.to_str().unwrap()]);
    write_config(dir.path(), &format!("threads = 1\n{}[limits]\nconnections = 1\nslow-request-ms = 1234\n", export("disk", "memory:8M")));
    let log = reload(&s);
    assert!(log.contains("[limits] slow-request-ms changed, which takes a restart"), "{log}");
    assert!(log.contains("reload: threads changed, which takes a restart"), "{log}");
    assert!(!log.contains("connections changed"), "{log}");
    // One connection at a time now: a second client is refused while the first is open.
    let (ready, go) = (dir.path().join("ready"), dir.path().join("go"));
    let held = held_connection(&s.uri_for("disk"), &ready, &go);
    let held = wait_for_write(held, &ready, &s);
    let (ok, _, _) = run("nbdinfo", &["--size", &s.uri_for("disk")]);
    assert!(!ok, "a second connection got past connections = 1\n{}", s.log_text());
    assert!(s.log_text().contains("refused, 1 connections already open"), "{}", s.log_text());
    std::fs::write(&go, "").unwrap();
    let (ok, out, err) = held.join().unwrap();
    assert!(ok, "{out}{err}");
    assert!(s.stop().success());
}
