//! The binary starts, serves the default in-memory export, and stops cleanly on SIGTERM.
mod common;
use common::*;

#[test]
fn default_memory_export_serves_and_stops_cleanly() {
    require!("nbdinfo");
    let s = Sluice::start(&[]);
    let (ok, out, err) = run("nbdinfo", &["--size", &s.uri()]);
    assert!(ok, "{err}");
    assert_eq!(out.trim(), "1073741824");
    let status = s.stop();
    assert_eq!(status.code(), Some(0));
}
