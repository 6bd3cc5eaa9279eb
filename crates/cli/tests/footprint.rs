//! The server at rest: it holds little memory and pins none at any thread count; its
//! buffer pools grow under load and give everything back once traffic stops; and then no
//! thread of it wakes.

mod common;

use std::time::Duration;

use common::pool::wait_for;
use common::*;

const MIB: u64 = 1 << 20;

/// Idle resident memory the server may hold, whatever its thread count (issue goal).
const RSS_AT_REST_MAX_BYTES: u64 = 16 * MIB;

/// A `VmRSS:`-style line of /proc/PID/status, in bytes.
fn status_bytes(pid: u32, key: &str) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find_map(|l| l.strip_prefix(key)).unwrap_or_else(|| panic!("no {key} in\n{status}"));
    let kib: u64 = line.trim().trim_end_matches("kB").trim().parse().unwrap();
    kib * 1024
}

/// Context switches of every thread of the process so far.
fn wakeups(pid: u32) -> u64 {
    let mut total = 0;
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let Ok(status) = std::fs::read_to_string(task.unwrap().path().join("status")) else { continue };
        for line in status.lines() {
            if let Some(n) = line.strip_prefix("voluntary_ctxt_switches:").or_else(|| line.strip_prefix("nonvoluntary_ctxt_switches:")) {
                total += n.trim().parse::<u64>().unwrap();
            }
        }
    }
    total
}

#[test]
fn an_idle_server_holds_little_and_pins_nothing_at_any_thread_count() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::File::create(&image).unwrap().set_len(1 << 30).unwrap();
    let spec = format!("d={}", image.display());
    for threads in ["1", "16"] {
        let s = Sluice::start(&["--threads", threads, "--export", &spec]);
        let (rss, pinned) = (status_bytes(s.pid(), "VmRSS:"), status_bytes(s.pid(), "VmPin:"));
        assert_eq!(pinned, 0, "{threads} threads pin {pinned} bytes at rest");
        assert!(rss <= RSS_AT_REST_MAX_BYTES, "{threads} threads hold {rss} bytes at rest");
        assert_eq!(s.stop().code(), Some(0));
    }
}

#[test]
fn buffer_pools_grow_under_load_and_give_everything_back_at_rest() {
    require!("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    let data = pattern(64 << 20, 11);
    write_file(&src, &data);
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "[limits]\nbuffer-pool-quiet-ms = 300\n").unwrap();
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let spec = format!("d={},data-path=copy", src.display());
    let args = ["--threads", "1", "--chunk", "0", "--config", config.to_str().unwrap(), "--metrics", &addr, "--export", &spec];
    let s = Sluice::start(&args);
    assert_eq!(status_bytes(s.pid(), "VmPin:"), 0, "nothing is pinned before the first request");

    // Reads of 16 MiB, read whole (--chunk 0) into one buffer each: more than the pool's
    // first 4 MiB step, whatever the timing.
    let (ok, out, err) = run("nbdcopy", &["--connections=1", "--requests=2", "--request-size=16777216", &s.uri_for("d"), back.to_str().unwrap()]);
    assert!(ok, "nbdcopy: {out}{err}");
    assert!(std::fs::read(&back).unwrap() == data, "data came back different");
    let body = http_get(port, "/metrics").1;
    assert!(sample(&body, "sluice_buffer_pool_grows_total") >= 1.0, "the pool did not grow:\n{body}");
    assert_eq!(sample(&body, "sluice_buffer_heap_fallbacks_total"), 0.0, "{body}");

    // Once the quiet period has passed with no traffic, every slab is unpinned and unmapped.
    wait_for("the pool given back", || match status_bytes(s.pid(), "VmPin:") {
        0 => Ok(()),
        pinned => Err(format!("{pinned} bytes pinned")),
    });
    let body = http_get(port, "/metrics").1;
    assert_eq!(sample(&body, "sluice_buffer_pool_bytes"), 0.0, "{body}");
    assert_eq!(sample(&body, "sluice_buffer_pool_releases_total"), sample(&body, "sluice_buffer_pool_grows_total"), "{body}");
    let rss = status_bytes(s.pid(), "VmRSS:");
    assert!(rss <= RSS_AT_REST_MAX_BYTES, "{rss} bytes resident after the pool was given back");

    // At rest nothing is left to time: a timer of a second or shorter would wake the
    // server three times or more here. One wake-up is allowed for the worker going back
    // to sleep after the release, and one for the metrics endpoint's last reply.
    let before = wakeups(s.pid());
    std::thread::sleep(Duration::from_secs(3));
    let woken = wakeups(s.pid()) - before;
    assert!(woken <= 2, "the server at rest woke {woken} times in 3 s");
    assert_eq!(s.stop().code(), Some(0));
}
