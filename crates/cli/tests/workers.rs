//! Worker threads: `--pin-threads` pins each to its CPU, `--busy-poll` serves data intact
//! and does not keep spinning once the traffic stops.

mod common;

use std::path::PathBuf;
use std::time::Duration;

use common::*;

/// The server's `n` worker threads, once all have started (the listening socket accepts
/// before they do), in N order.
fn workers(pid: u32, n: usize) -> Vec<(usize, PathBuf)> {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        let found = worker_threads(pid);
        if found.len() >= n || std::time::Instant::now() > deadline {
            return found;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The server's worker threads, by name (`sluice-worker-N`), in N order.
fn worker_threads(pid: u32) -> Vec<(usize, PathBuf)> {
    let mut found: Vec<(usize, PathBuf)> = std::fs::read_dir(format!("/proc/{pid}/task"))
        .unwrap()
        .filter_map(|t| {
            let dir = t.ok()?.path();
            let name = std::fs::read_to_string(dir.join("comm")).ok()?;
            let n = name.trim().strip_prefix("sluice-worker-")?.parse().ok()?;
            Some((n, dir))
        })
        .collect();
    found.sort();
    found
}

/// The `Cpus_allowed_list` line of a /proc status file, expanded.
fn allowed_cpus(status: &str) -> Vec<usize> {
    let list = status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).expect("Cpus_allowed_list").trim();
    let mut cpus = Vec::new();
    for part in list.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<usize>().unwrap()..=b.parse::<usize>().unwrap()),
            None => cpus.push(part.parse().unwrap()),
        }
    }
    cpus
}

/// User plus system time a thread has run, in clock ticks.
fn cpu_ticks(task: &std::path::Path) -> u64 {
    let stat = std::fs::read_to_string(task.join("stat")).unwrap();
    let fields: Vec<&str> = stat.rsplit_once(')').unwrap().1.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

#[test]
fn pinned_workers_each_run_on_the_next_allowed_cpu() {
    let mine = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    // One more worker than CPUs, so the last one wraps around to the first CPU.
    let threads = mine.len() + 1;
    let s = Sluice::start(&["--threads", &threads.to_string(), "--pin-threads", "--export", "a=memory:1M"]);
    let found = workers(s.pid(), threads);
    assert_eq!(found.len(), threads, "worker threads: {found:?}");
    for (n, task) in &found {
        let pinned = allowed_cpus(&std::fs::read_to_string(task.join("status")).unwrap());
        assert_eq!(pinned, vec![mine[n % mine.len()]], "worker {n}");
    }
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn unpinned_workers_may_run_anywhere_the_server_may() {
    let mine = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    let s = Sluice::start(&["--threads", "2", "--export", "a=memory:1M"]);
    for (n, task) in workers(s.pid(), 2) {
        assert_eq!(allowed_cpus(&std::fs::read_to_string(task.join("status")).unwrap()), mine, "worker {n}");
    }
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn busy_polling_workers_serve_intact_data_then_stop_spinning() {
    require!("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    let data = pattern(16 << 20, 7);
    write_file(&src, &data);
    // The longest spin allowed, on one worker, so any spinning at rest would show.
    let s = Sluice::start(&["--threads", "1", "--busy-poll", "1000", "--export", "d=memory:16M"]);
    let uri = s.uri_for("d");
    for (from, to) in [(src.to_str().unwrap(), uri.as_str()), (uri.as_str(), back.to_str().unwrap())] {
        let (ok, out, err) = run("nbdcopy", &["--requests=16", from, to]);
        assert!(ok, "nbdcopy {from} {to}: {out}{err}");
    }
    assert!(std::fs::read(&back).unwrap() == data, "data came back different");

    // At rest the spin winds down after at most twice the longest spin (2 ms), so a worker
    // still spinning would run for the whole half second below: 50 ticks at the usual 100
    // per second. Allow a tenth of that for the wind-down and the wake-ups of the copy's end.
    let (_, worker) = workers(s.pid(), 1).pop().expect("one worker");
    std::thread::sleep(Duration::from_millis(100));
    let before = cpu_ticks(&worker);
    std::thread::sleep(Duration::from_millis(500));
    let ticks = cpu_ticks(&worker) - before;
    let per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as u64;
    assert!(ticks * 10 <= per_second / 2, "an idle worker ran for {ticks} ticks of half a second ({per_second}/s)");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn busy_poll_and_pinning_come_from_the_config_file_too() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "threads = 1\npin-threads = true\nbusy-poll = 20\n").unwrap();
    let s = Sluice::start(&["--config", config.to_str().unwrap(), "--export", "a=memory:1M"]);
    let found = workers(s.pid(), 1);
    assert_eq!(found.len(), 1);
    let mine = allowed_cpus(&std::fs::read_to_string("/proc/self/status").unwrap());
    assert_eq!(allowed_cpus(&std::fs::read_to_string(found[0].1.join("status")).unwrap()), vec![mine[0]]);
    assert_eq!(s.stop().code(), Some(0));

    std::fs::write(&config, "busy-poll = 5000\n").unwrap();
    let out = output(std::process::Command::new(SLUICE).args(["serve", "--config", config.to_str().unwrap()]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("5000"), "the message does not name the value: {err}");
}
