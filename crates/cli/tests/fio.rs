//! fio's nbd engine writes and verifies 64 MiB at queue depth 32 through sluice, over Unix and TCP.
mod common;
use common::*;

/// Runs one fio write+verify job; returns (exit ok, output).
fn fio(uri: &str, size: &str, block_sizes: &str) -> (bool, String) {
    let uri_arg = format!("--uri={uri}");
    let size_arg = format!("--size={size}");
    let mut args = vec![
        "--name=sluice",
        "--ioengine=nbd",
        &uri_arg,
        "--rw=randwrite",
        "--iodepth=32",
        &size_arg,
        "--verify=crc32c",
        "--do_verify=1",
        // No state files in the working directory, whatever happens.
        "--verify_state_save=0",
    ];
    args.push(block_sizes);
    let (ok, out, err) = run("fio", &args);
    (ok, format!("{out}{err}"))
}

/// What is wrong with a fio run: a failing exit, a non-zero "err=" in the job summary,
/// verification complaints, or a missing write or verify phase. Empty when it passed.
fn problems(ok: bool, text: &str) -> Vec<String> {
    let mut p = Vec::new();
    if !ok {
        p.push("fio exited with a failure".to_owned());
    }
    if !text.contains("err= 0") {
        p.push("no \"err= 0\" in the job summary".to_owned());
    }
    p.extend(text.lines().filter(|l| l.contains("verify:") || l.contains("bad magic")).map(str::to_owned));
    if !(text.contains("write:") && text.contains("read:")) {
        p.push("fio did not both write and verify".to_owned());
    }
    p
}

fn assert_clean(ok: bool, text: &str) {
    let p = problems(ok, text);
    assert!(p.is_empty(), "fio run failed: {p:#?}\n{text}");
}

#[test]
fn randwrite_4k_qd32_with_crc32c_verify_over_unix() {
    require!("fio");
    let s = Sluice::start(&["--export", "m=memory:64M"]);
    let (ok, text) = fio(&s.uri_for("m"), "64M", "--bs=4k");
    assert_clean(ok, &text);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn randwrite_4k_qd32_with_crc32c_verify_over_tcp_on_a_file_export() {
    require!("fio");
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("disk.img");
    std::fs::File::create(&backing).unwrap().set_len(64 << 20).unwrap();
    let s = Sluice::start(&[backing.to_str().unwrap()]);
    let (ok, text) = fio(&s.tcp_uri(), "64M", "--bs=4k");
    assert_clean(ok, &text);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn mixed_block_sizes_with_crc32c_verify_over_unix_and_tcp() {
    require!("fio");
    let s = Sluice::start(&["--export", "m=memory:64M"]);
    let bssplit = "--bssplit=4k/40:16k/20:64k/20:1m/15:4m/5";
    let (ok, text) = fio(&s.uri_for("m"), "64M", bssplit);
    assert_clean(ok, &text);
    let tcp = format!("nbd://127.0.0.1:{}/m", s.port);
    let (ok, text) = fio(&tcp, "64M", bssplit);
    assert_clean(ok, &text);
    assert_eq!(s.stop().code(), Some(0));
}

/// The checks above can fail: a null export drops writes, so fio's verify must complain.
#[test]
fn verify_failures_are_detected_on_a_null_export() {
    require!("fio");
    let s = Sluice::start(&["--export", "n=null:4M"]);
    let (ok, text) = fio(&s.uri_for("n"), "4M", "--bs=4k");
    let p = problems(ok, &text);
    assert!(p.iter().any(|l| l.contains("verify:")), "fio verify passed on a null export:\n{text}");
    assert_eq!(s.stop().code(), Some(0));
}
