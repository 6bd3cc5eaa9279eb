//! An elastic RAM export gives memory back when the node runs short; what it gave back reads
//! as zeros, it stays served and writable, and a plain RAM export beside it loses nothing.
//!
//! Real memory pressure cannot be made on demand, so the server reads the node's memory from
//! files the test writes (`SLUICE_ELASTIC_MEMINFO`, `SLUICE_ELASTIC_PRESSURE`, for testing).
mod common;
use common::*;

use std::path::Path;
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// Bytes written to each export: whole 2 MiB chunks, the unit memory is given back in.
const WRITTEN: u64 = 48 * MIB;
const CHUNK: u64 = 2 * MIB;
/// The node the fake readings describe: 1 GiB, so its low mark is 256 MiB.
const TOTAL_KIB: u64 = 1 << 20;
const PLENTY_KIB: u64 = 900 << 10;
const SHORT_KIB: u64 = 100 << 10;
/// Far above what the watcher (a reading a second, a give-back at most every 2 s) needs.
const WATCH_TIMEOUT: Duration = Duration::from_secs(30);

/// Writes a reading aside, then renames it over the one the server reads: never half a file.
fn put(path: &Path, text: &str) {
    let aside = path.with_extension("new");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, path).unwrap();
}

fn meminfo(path: &Path, available_kib: u64) {
    put(path, &format!("MemTotal:       {TOTAL_KIB} kB\nMemFree:        {available_kib} kB\nMemAvailable:   {available_kib} kB\n"));
}

/// The value of a series, or None while it is not shown (no reading taken yet).
fn value(body: &str, series: &str) -> Option<f64> {
    body.lines().find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.trim().parse().ok())
}

fn metrics(port: u16) -> String {
    http_get(port, "/metrics").1
}

/// Runs `script` under nbdsh (with /usr/bin first on PATH) against `s` and returns its
/// output; a failure shows the server's log too.
fn nbdsh(s: &Sluice, script: &str) -> String {
    let full = format!("import nbd\n{script}\nprint('SCRIPT-COMPLETED')\n");
    let (ok, out, err) = run("nbdsh", &["-c", &full]);
    assert!(ok && out.contains("SCRIPT-COMPLETED"), "nbdsh script failed\nstdout:\n{out}\nstderr:\n{err}\nserver log:\n{}", s.log_text());
    out
}

/// Stops the server and checks that it exited cleanly, showing its log when it did not.
fn stop(s: Sluice) {
    let (status, log) = s.stop_with_log();
    assert_eq!(status.code(), Some(0), "sluice exited with {status}\n{log}");
}

/// Python for the data each 4 KiB block holds: its own offset, so any misplaced or stale
/// block shows.
const BLOCK: &str = "def block(off):\n    return off.to_bytes(8, 'little') * 512\n";

/// Writes WRITTEN bytes of blocks to both exports.
fn fill(s: &Sluice) {
    nbdsh(s, &format!(
        "{BLOCK}\nfor uri in ('{}', '{}'):\n    h = nbd.NBD()\n    h.connect_uri(uri)\n    for off in range(0, {WRITTEN}, {MIB}):\n        h.pwrite(b''.join(block(o) for o in range(off, off + {MIB}, 4096)), off)\n    h.shutdown()\n",
        s.uri_for("cache"),
        s.uri_for("disk"),
    ));
}

/// Reads both exports back: every chunk of the elastic one is whole or all zeros, the plain
/// one is whole; returns how many chunks of the elastic one are zeros.
fn zeroed_chunks(s: &Sluice) -> u64 {
    let out = nbdsh(s, &format!(
        r#"{BLOCK}
def check(uri, may_lose):
    h = nbd.NBD()
    h.connect_uri(uri)
    lost = 0
    for off in range(0, {WRITTEN}, {CHUNK}):
        got = h.pread({CHUNK}, off)
        whole = b''.join(block(o) for o in range(off, off + {CHUNK}, 4096))
        if got == whole:
            continue
        assert may_lose and got == bytes({CHUNK}), "%s: the chunk at %d is neither its data nor zeros" % (uri, off)
        lost += 1
    h.shutdown()
    return lost
assert check('{disk}', False) == 0
print('ZEROED', check('{cache}', True))
"#,
        disk = s.uri_for("disk"),
        cache = s.uri_for("cache"),
    ));
    let line = out.lines().find_map(|l| l.strip_prefix("ZEROED ")).expect("a count");
    line.trim().parse().unwrap()
}

/// Waits until the watcher has read `available_kib`: every give-back it starts after that
/// answers that reading.
fn wait_for_reading(s: &Sluice, port: u16, available_kib: u64) {
    let seen = || value(&metrics(port), "sluice_elastic_memory_available_bytes") == Some((available_kib * 1024) as f64);
    wait_until(&format!("the watcher to read MemAvailable {available_kib} kB"), WATCH_TIMEOUT, seen, || s.log_text());
}

/// Makes the node short of memory until the elastic export "cache" has given some back,
/// then plentiful again until the watcher has read that: nothing more is given back after,
/// so that no read races a punch.
fn squeeze(s: &Sluice, port: u16, info: &Path) {
    meminfo(info, SHORT_KIB);
    let given = r#"sluice_elastic_given_back_bytes_total{export="cache"}"#;
    let gave = || value(&metrics(port), given).is_some_and(|v| v > 0.0);
    wait_until("the elastic export to give memory back", WATCH_TIMEOUT, gave, || s.log_text());
    meminfo(info, PLENTY_KIB);
    wait_for_reading(s, port, PLENTY_KIB);
}

/// Fake readings in `dir` (MemAvailable `available_kib`, no memory pressure), and the
/// environment that points the server at them.
fn readings(dir: &Path, available_kib: u64) -> (std::path::PathBuf, [(String, String); 2]) {
    let (info, pressure) = (dir.join("meminfo"), dir.join("pressure"));
    meminfo(&info, available_kib);
    put(&pressure, "some avg10=0.00 avg60=0.00 avg300=0.00 total=0\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n");
    let path = |p: &Path| p.to_str().unwrap().to_owned();
    (info.clone(), [("SLUICE_ELASTIC_MEMINFO".into(), path(&info)), ("SLUICE_ELASTIC_PRESSURE".into(), path(&pressure))])
}

fn start(args: &[&str], env: &[(String, String)]) -> Sluice {
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    Sluice::start_with_env(args, &env)
}

#[test]
fn an_elastic_export_gives_memory_back_under_a_low_reading_and_a_plain_one_does_not() {
    require!("nbdsh");
    let dir = tempfile::tempdir().unwrap();
    let (info, env) = readings(dir.path(), PLENTY_KIB);
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let s = start(&["--export", "cache=memory:64M,elastic", "--export", "disk=memory:64M", "--metrics", &addr], &env);
    fill(&s);
    let held = r#"sluice_elastic_held_bytes{export="cache"}"#;
    let given = r#"sluice_elastic_given_back_bytes_total{export="cache"}"#;
    assert_eq!(sample(&metrics(port), held), WRITTEN as f64);
    assert!(!metrics(port).contains(r#"sluice_elastic_held_bytes{export="disk"}"#), "a plain RAM export is not elastic");

    // Plenty of memory: read at least once, nothing given back.
    wait_for_reading(&s, port, PLENTY_KIB);
    assert_eq!(sample(&metrics(port), given), 0.0);

    squeeze(&s, port, &info);
    let after = metrics(port);
    let (given_bytes, held_bytes) = (sample(&after, given), sample(&after, held));
    assert!(sample(&after, r#"sluice_elastic_give_backs_total{export="cache"}"#) >= 1.0, "{after}");
    assert_eq!(held_bytes + given_bytes, WRITTEN as f64, "{after}");
    let zeroed = zeroed_chunks(&s);
    assert_eq!((zeroed * CHUNK) as f64, given_bytes, "what was given back is exactly the chunks that read as zeros");
    assert!(s.log_text().contains("gave back"), "{}", s.log_text());

    // Still served and writable: the chunks given back take data again.
    fill(&s);
    assert_eq!(zeroed_chunks(&s), 0);
    assert_eq!(sample(&metrics(port), held), WRITTEN as f64);
    stop(s);
}

/// A server without an elastic export has no watcher; a reload that adds one starts it.
#[test]
fn an_elastic_export_added_by_a_reload_is_watched() {
    require!("nbdsh");
    let dir = tempfile::tempdir().unwrap();
    let (info, env) = readings(dir.path(), PLENTY_KIB);
    let port = free_port();
    let plain = "[[export]]\nname = \"disk\"\nspec = \"memory:64M\"\n";
    let config = write_config(dir.path(), plain);
    let s = start(&["--config", config.to_str().unwrap(), "--metrics", &format!("127.0.0.1:{port}")], &env);
    assert!(!s.log_text().contains("elastic memory: watching"), "{}", s.log_text());
    assert!(!metrics(port).contains("sluice_elastic_"), "nothing elastic, no series");
    write_config(dir.path(), &format!("{plain}[[export]]\nname = \"cache\"\nspec = \"memory:64M,elastic\"\n"));
    signal(s.pid(), libc::SIGHUP);
    // The watcher starts before the reload swaps the exports in; the export's line comes after.
    let served = || {
        let log = s.log_text();
        log.contains("elastic memory: watching") && log.contains("export \"cache\": memory backend, 67108864 bytes, elastic")
    };
    wait_until("the reload to start the elastic watcher and serve \"cache\"", WATCH_TIMEOUT, served, || s.log_text());
    // Filled while memory is plentiful, so that no chunk is given back half written.
    wait_for_reading(&s, port, PLENTY_KIB);
    fill(&s);
    squeeze(&s, port, &info);
    let given = sample(&metrics(port), r#"sluice_elastic_given_back_bytes_total{export="cache"}"#);
    assert_eq!((zeroed_chunks(&s) * CHUNK) as f64, given, "the plain export lost nothing, the elastic one what it says");
    stop(s);
}
