//! Load restriction (`[qos.NAME]`, `[limits] storage-*`) holds requests to their limits:
//! clients measured over a bounded loop never get more than limit × (time + burst); a
//! reload changes the limit; /metrics shows each class; configuration errors are refused.
//! Only upper bounds are asserted: a slow, shared machine can make any client slower.
mod common;
mod raw;
use common::tls::Keys;
use common::*;
use raw::*;

use std::path::Path;
use std::time::{Duration, Instant};

/// How long each measured loop runs.
const LOOP: Duration = Duration::from_millis(1500);

/// Reads of `len` bytes from `connections` connections to `export` at once, one request at
/// a time each, for `LOOP`: how many were answered, and the seconds from before the first
/// connection was opened to after the last answer.
fn measure(socket: &Path, export: &str, connections: usize, len: u32) -> (u64, f64) {
    let start = Instant::now();
    let threads: Vec<_> = (0..connections)
        .map(|_| {
            let (socket, export) = (socket.to_owned(), export.to_owned());
            std::thread::spawn(move || {
                let (mut c, _) = Client::connect(&socket, &export, true, false);
                // A request the scheduler never lets go fails the test rather than hang it.
                c.set_read_timeout(Duration::from_secs(20));
                let mut n = 0u64;
                while start.elapsed() < LOOP {
                    assert_eq!(c.read(0, len).len(), len as usize);
                    n += 1;
                }
                c.disconnect();
                n
            })
        })
        .collect();
    let n = threads.into_iter().map(|t| t.join().unwrap()).sum();
    (n, start.elapsed().as_secs_f64())
}

/// At most `rate` per second over `seconds`, plus the `burst` seconds' worth a full bucket
/// holds (every request here is smaller than a burst), plus one per connection to spare.
fn assert_within(what: &str, n: f64, rate: f64, seconds: f64, burst: f64, connections: usize) {
    let most = rate * (seconds + burst) + connections as f64;
    eprintln!("{what}: {n} in {seconds:.3} s, at most {most:.0}");
    assert!(n <= most, "{what}: {n} in {seconds:.3} s, more than {rate}/s allows ({most:.0})");
}

#[test]
fn an_iops_limit_holds_across_connections_and_workers() {
    let dir = tempfile::tempdir().unwrap();
    let text = "threads = 2\n[qos.slow]\niops = 200\nburst = 0.5\n[[export]]\nname = \"slow\"\nspec = \"memory:1M\"\nqos = \"slow\"\n\
                [[export]]\nname = \"free\"\nspec = \"memory:1M\"\n";
    let config = write_config(dir.path(), text);
    let port = free_port();
    let s = Sluice::start(&["--config", config.to_str().unwrap(), "--metrics", &format!("127.0.0.1:{port}")]);
    // Four connections of one client share its instance of the class, over both workers.
    let (n, seconds) = measure(&s.socket, "slow", 4, 4096);
    assert!(n > 0, "no read was answered");
    assert_within("reads of the limited export", n as f64, 200.0, seconds, 0.5, 4);
    // The export without a class is not held to it (no bound to assert: only that it works).
    let (free, seconds) = measure(&s.socket, "free", 1, 4096);
    eprintln!("reads of the export without a class: {free} in {seconds:.3} s");
    assert!(free > 0);

    let metrics = http_get(port, "/metrics").1;
    let started = sample(&metrics, r#"sluice_qos_started_requests_total{class="slow"}"#);
    assert!(started >= n as f64, "{started} started, {n} answered\n{metrics}");
    assert_eq!(sample(&metrics, r#"sluice_qos_held_requests{class="slow"}"#), 0.0, "nothing is held once the clients left");
    if n > 200 / 2 + 4 {
        // Past the burst some requests had to wait.
        assert!(sample(&metrics, r#"sluice_qos_held_seconds_count{class="slow"}"#) >= 1.0, "{metrics}");
    }
    assert!(metrics.contains("# TYPE sluice_qos_held_seconds histogram"), "{metrics}");
    assert!(s.stop().success());
}

#[test]
fn a_qos_match_rule_puts_a_client_in_its_class() {
    // Over the Unix socket the client is its uid.
    let uid = rustix::process::getuid().as_raw();
    let text = format!("[qos.me]\niops = 100\nburst = 0.5\n[[qos-match]]\nclient = \"uid:{uid}\"\nclass = \"me\"\n");
    let (_dir, config) = qos_file(&text);
    let s = Sluice::start(&["--export", "disk=memory:1M", "--config", &config]);
    let (n, seconds) = measure(&s.socket, "disk", 2, 4096);
    assert!(n > 0);
    assert_within("reads of a client matched into a class", n as f64, 100.0, seconds, 0.5, 2);
    assert!(s.stop().success());
}

#[test]
fn a_qos_match_rule_by_psk_identity_applies_over_tls() {
    require!("nbdsh", "psktool", "certtool");
    let keys = Keys::generate();
    let psk = keys.psk_file();
    let (_dir, config) = qos_file("[qos.alice]\niops = 100\nburst = 0.5\n[[qos-match]]\nclient = \"psk:alice\"\nclass = \"alice\"\n");
    let s = Sluice::start(&["--config", &config, "--export", "d=memory:1M", "--tls", "require", "--tls-psk", psk.to_str().unwrap()]);
    let uri = format!("nbds://alice@localhost:{}/d?tls-psk-file={}", s.port, psk.display());
    // One client, one request at a time, for 1.5 s by its own clock; the bound is taken
    // over the whole run of nbdsh, which holds that time and more.
    let script = format!(
        "import time\nh.set_uri_allow_local_file(True)\nh.connect_uri({uri:?})\nt = time.monotonic()\nn = 0\n\
         while time.monotonic() - t < 1.5:\n    h.pread(4096, 0)\n    n += 1\nprint(n)\n"
    );
    let start = Instant::now();
    let (ok, out, err) = run("nbdsh", &["-c", &script]);
    let seconds = start.elapsed().as_secs_f64();
    assert!(ok, "{out}{err}\n{}", s.log_text());
    let n: f64 = out.trim().parse().unwrap_or_else(|_| panic!("nbdsh printed {out:?}"));
    assert!(n > 0.0);
    assert_within("reads of psk:alice over TLS", n, 100.0, seconds, 0.5, 1);
    assert!(s.stop().success());
}

#[test]
fn a_bytes_limit_counts_bytes_not_requests() {
    let (_dir, config) = qos_file("[qos.narrow]\nbps = \"2M\"\n");
    let s = Sluice::start(&["--export", "disk=memory:4M,qos=narrow", "--config", &config]);
    let (n, seconds) = measure(&s.socket, "disk", 2, 256 << 10);
    assert!(n > 0);
    assert_within("256 KiB reads under bps = 2M", (n * (256 << 10)) as f64, (2 << 20) as f64, seconds, 1.0, 2);
    assert!(s.stop().success());
}

/// A configuration file, and the directory that holds it (removed when dropped).
fn qos_file(text: &str) -> (tempfile::TempDir, String) {
    let dir = tempfile::tempdir().unwrap();
    let path = write_config(dir.path(), text).to_str().unwrap().to_owned();
    (dir, path)
}

#[test]
fn the_storage_caps_hold_for_all_exports_together() {
    let text = "[limits]\nstorage-iops = 300\n[[export]]\nname = \"a\"\nspec = \"memory:1M\"\n[[export]]\nname = \"b\"\nspec = \"memory:1M\"\n";
    let (_dir, config) = qos_file(text);
    let s = Sluice::start(&["--config", &config]);
    let (socket_a, socket_b) = (s.socket.clone(), s.socket.clone());
    let a = std::thread::spawn(move || measure(&socket_a, "a", 2, 4096));
    let b = std::thread::spawn(move || measure(&socket_b, "b", 2, 4096));
    let ((na, ta), (nb, tb)) = (a.join().unwrap(), b.join().unwrap());
    assert!(na > 0 && nb > 0);
    // The storage caps' burst is one second (sluice_qos::limits::STORAGE_BURST_NS).
    assert_within("reads of both exports", (na + nb) as f64, 300.0, ta.max(tb), 1.0, 4);
    assert!(s.stop().success());
}

#[test]
fn a_storage_queue_depth_of_one_serves_many_connections_over_both_workers() {
    // Every request waits for the one before it, whichever worker's connection sent it:
    // held requests are let go by the worker whose request finished, through the owner's
    // mailbox.
    let text = "threads = 2\n[limits]\nstorage-inflight = 1\n[[export]]\nname = \"d\"\nspec = \"memory:4M\"\n";
    let (_dir, config) = qos_file(text);
    let port = free_port();
    let s = Sluice::start(&["--config", &config, "--metrics", &format!("127.0.0.1:{port}")]);
    let (n, _) = measure(&s.socket, "d", 8, 64 << 10);
    assert!(n > 0);
    let metrics = http_get(port, "/metrics").1;
    assert_eq!(sample(&metrics, r#"sluice_qos_held_requests{class="default"}"#), 0.0, "{metrics}");
    assert!(sample(&metrics, r#"sluice_qos_started_requests_total{class="default"}"#) >= n as f64, "{metrics}");
    assert!(s.stop().success());
}

#[test]
fn a_reload_lowers_the_limit_for_open_and_new_connections() {
    let dir = tempfile::tempdir().unwrap();
    let export = "[[export]]\nname = \"disk\"\nspec = \"memory:1M\"\nqos = \"c\"\n";
    let config = write_config(dir.path(), &format!("[qos.c]\niops = 100000\n{export}"));
    let s = Sluice::start(&["--config", config.to_str().unwrap()]);
    write_config(dir.path(), &format!("[qos.c]\niops = 50\nburst = 1\n{export}"));
    let before = s.log_text().matches("reloaded").count();
    signal(s.pid(), libc::SIGHUP);
    wait_until("the reload", Duration::from_secs(30), || s.log_text().matches("reloaded").count() > before, || s.log_text());
    assert!(!s.log_text().contains("reload refused"), "{}", s.log_text());
    let (n, seconds) = measure(&s.socket, "disk", 2, 4096);
    assert_within("reads after the reload", n as f64, 50.0, seconds, 1.0, 2);
    // A bad class in a reload changes nothing and says why.
    write_config(dir.path(), &format!("[qos.c]\niops = 0\n{export}"));
    signal(s.pid(), libc::SIGHUP);
    wait_until("the refusal", Duration::from_secs(30), || s.log_text().contains("reload refused"), || s.log_text());
    assert!(s.log_text().contains("qos.c: iops = 0 allows nothing"), "{}", s.log_text());
    assert!(s.stop().success());
}

#[test]
fn configuration_errors_are_refused_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("x.sock");
    let sock = sock.to_str().unwrap();
    for (file, args, words) in [
        ("[qos.a]\niops = 10\n[[export]]\nname = \"d\"\nspec = \"memory:1M\"\nqos = \"b\"\n", &[][..], "export \"d\": qos = \"b\" names no [qos.b] table"),
        ("", &["--export", "d=memory:1M,qos=gold"][..], "export \"d\": qos = \"gold\" names no [qos.gold] table"),
        ("[qos.a]\niops = 0\n", &[][..], "qos.a: iops = 0 allows nothing"),
        ("[qos.a]\niopz = 5\n", &[][..], "unknown field `iopz`"),
        ("[qos.a]\nweight = 0\n", &[][..], "qos.a: weight 0 is not from 1"),
        ("[qos.a]\n[[qos-match]]\nclient = \"10.0.0.0/8\"\nclass = \"z\"\n", &[][..], "qos-match 10.0.0.0/8: class \"z\" names no [qos.z] table"),
        ("[[qos-match]]\nclient = \"10.0.0.300\"\nclass = \"default\"\n", &[][..], "qos-match[0].client"),
        ("[limits]\nstorage-iops = 0\n", &[][..], "storage-iops = 0 allows nothing"),
        ("[limits]\nstorage-bps = \"9X\"\n", &[][..], "limits.storage-bps"),
    ] {
        let config = write_config(dir.path(), file);
        let mut argv = vec!["serve", "--unix", sock, "--config", config.to_str().unwrap()];
        argv.extend_from_slice(args);
        let (ok, _, err) = run(SLUICE, &argv);
        assert!(!ok && err.contains(words), "{file:?} {args:?}: {err}");
        argv.push("--check");
        let (ok, _, err) = run(SLUICE, &argv);
        assert!(!ok && err.contains(words), "--check, {file:?} {args:?}: {err}");
    }
    let text = "[qos.gold]\niops = 500\n[[qos-match]]\nclient = \"psk:node7\"\nclass = \"gold\"\n[limits]\nstorage-iops = 900\n";
    let config = write_config(dir.path(), text);
    let (ok, out, err) = run(SLUICE, &["serve", "--check", "--unix", sock, "--config", config.to_str().unwrap(), "--export", "d=memory:1M,qos=gold"]);
    assert!(ok, "{out}{err}");
    let expected = [
        "qos: class gold",
        "qos: export \"d\" in class gold",
        "qos: clients matching psk:node7 in class gold",
        "qos: storage-iops = 900",
        "warning: qos-match psk:node7 can match no one: TLS is off (see --tls)",
    ];
    for line in expected {
        assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
    }
}
