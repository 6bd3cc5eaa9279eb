//! A request held at its backend past `[limits] slow-request-ms` shows in the log (when it
//! is found and when it ends) and in /metrics (how many are slow, how old the oldest is).
//! The backend is an nbdkit whose reads wait until the test lets them go, served through
//! a remote export.
mod common;
use common::*;
use std::time::Duration;

/// How long the test waits for the server to notice or to settle; far more than it needs
/// (a look every 50 ms here), so reaching it means the server never did.
const NOTICE: Duration = Duration::from_secs(30);

#[test]
fn a_request_stuck_at_the_backend_is_logged_and_counted_until_it_ends() {
    require!("nbdkit", "qemu-io", "nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let gate = dir.path().join("go");
    // Reads wait for the gate file; nothing else in the test reads.
    let pread = format!("while [ ! -e {} ]; do sleep 0.02; done; head -c $3 /dev/zero", gate.display());
    let nbdkit = Nbdkit::start(dir.path(), "held", &["eval", "get_size=echo 1048576", &format!("pread={pread}")]);
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "[limits]\nslow-request-ms = 200\n").unwrap();
    let port = free_port();
    let held = format!("held={},ro", nbdkit.uri());
    let s = Sluice::start(&[
        "--config",
        config.to_str().unwrap(),
        "--export",
        &held,
        "--export",
        "mem=memory:1M",
        "--metrics",
        &format!("127.0.0.1:{port}"),
    ]);
    let gauge = |name: &str, export: &str| sample(&http_get(port, "/metrics").1, &format!("{name}{{export=\"{export}\"}}"));
    assert_eq!(gauge("sluice_requests_slow", "held"), 0.0);

    let reader = run_in_background("qemu-io", &["-f", "raw", "-r", "-c", "read -P 0 4096 8192", &s.uri_for("held")]);
    wait_until("the held read to count as slow", NOTICE, || gauge("sluice_requests_slow", "held") == 1.0, || s.log_text());
    let found = "slow request: export \"held\", READ offset 4096 length 8192, at the backend for";
    assert!(s.log_text().contains(found), "no warning for the held read:\n{}", s.log_text());
    let oldest = gauge("sluice_request_oldest_seconds", "held");
    assert!(oldest >= 0.2, "the oldest request is {oldest} s old, yet counted as slow past 0.2 s");
    assert_eq!(gauge("sluice_requests_slow", "mem"), 0.0, "another export's gauge moved");
    assert_eq!(gauge("sluice_request_oldest_seconds", "mem"), 0.0);
    // The server answers its other exports meanwhile.
    let (ok, out, err) = run("nbdinfo", &["--size", &s.uri_for("mem")]);
    assert!(ok && out.trim() == "1048576", "{out}{err}");

    std::fs::write(&gate, "").unwrap();
    let (ok, out, err) = reader.join().unwrap();
    assert!(ok && !out.contains("failed"), "the held read failed once let go:\n{out}{err}");
    let ended = "slow request ended: export \"held\", READ offset 4096 length 8192, after";
    wait_until("the end of the slow read in the log", NOTICE, || s.log_text().contains(ended), || s.log_text());
    let log = s.log_text();
    let line = log.lines().find(|l| l.contains(ended)).unwrap();
    assert!(line.contains(": answered"), "{line}");
    assert_eq!(log.matches(found).count(), 1, "the warning is given once:\n{log}");
    wait_until(
        "the gauges to clear",
        NOTICE,
        || gauge("sluice_requests_slow", "held") == 0.0 && gauge("sluice_request_oldest_seconds", "held") == 0.0,
        || s.log_text(),
    );
}
