//! `sluice bench` sweeps size x depth against a real sluice export, writes bench.csv and SVG
//! plots, never writes without --write, and fails cleanly on read-only or absent servers.
mod common;
use common::*;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

const CSV_HEADER: &str =
    "op,pattern,size_bytes,depth,connections,seconds,ios,bytes,mb_per_s,iops,lat_mean_us,lat_p50_us,lat_p99_us,lat_max_us";

struct Outcome {
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

/// Runs `sluice bench ARGS` in `cwd`, killed after two minutes (a hang fails the test).
fn bench(cwd: &Path, args: &[&str]) -> Outcome {
    let (out_path, err_path) = (cwd.join(".bench.stdout"), cwd.join(".bench.stderr"));
    let mut child = Command::new(SLUICE)
        .arg("bench")
        .args(args)
        .current_dir(cwd)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(&err_path).unwrap())
        .spawn()
        .expect("spawn sluice bench");
    let status = wait_timeout(&mut child, Duration::from_secs(120)).expect("sluice bench did not finish within 120 s");
    let outcome = Outcome {
        code: status.code(),
        stdout: std::fs::read_to_string(&out_path).unwrap(),
        stderr: std::fs::read_to_string(&err_path).unwrap(),
    };
    std::fs::remove_file(out_path).unwrap();
    std::fs::remove_file(err_path).unwrap();
    outcome
}

/// The rows of bench.csv as field lists, after checking the header.
fn csv_rows(dir: &Path) -> Vec<Vec<String>> {
    let text = std::fs::read_to_string(dir.join("bench.csv")).expect("bench.csv");
    let mut lines = text.lines();
    assert_eq!(lines.next(), Some(CSV_HEADER));
    let columns = CSV_HEADER.split(',').count();
    lines
        .map(|l| {
            let fields: Vec<String> = l.split(',').map(str::to_string).collect();
            assert_eq!(fields.len(), columns, "row {l:?}");
            fields
        })
        .collect()
}

fn field(header: &str) -> usize {
    CSV_HEADER.split(',').position(|h| h == header).unwrap()
}

fn assert_svg(path: &Path, labels: &[&str]) {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let start = text.trim_start();
    assert!(start.starts_with("<svg") || start.starts_with("<?xml"), "{} is not SVG: {:.80}", path.display(), start);
    assert!(text.trim_end().ends_with("</svg>"), "{} is cut short", path.display());
    for label in labels {
        assert!(text.contains(label), "{} lacks {label:?}", path.display());
    }
}

#[test]
fn sweep_writes_csv_rows_and_svg_plots() {
    let work = tempfile::tempdir().unwrap();
    let img = work.path().join("disk.img");
    write_file(&img, &vec![0u8; 8 << 20]);
    let s = Sluice::start(&["--export", &format!("disk={}", img.display())]);
    let out = work.path().join("results");
    let args = [
        "--write",
        "--ops",
        "read,write",
        "--sizes",
        "4K,64K",
        "--depths",
        "1,4",
        "--runtime",
        "0.2",
        "--warmup",
        "0",
        "--out",
        out.to_str().unwrap(),
        &s.uri_for("disk"),
    ];
    let r = bench(work.path(), &args);
    assert_eq!(r.code, Some(0), "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);

    // 2 ops x 2 patterns x 2 depths x 2 sizes, each with requests counted.
    let rows = csv_rows(&out);
    assert_eq!(rows.len(), 16, "{rows:?}");
    for row in &rows {
        let num = |h: &str| row[field(h)].parse::<f64>().unwrap_or_else(|_| panic!("{h} in {row:?}"));
        assert!(num("ios") > 0.0 && num("mb_per_s") > 0.0 && num("iops") > 0.0, "{row:?}");
        assert!(num("lat_p50_us") > 0.0 && num("lat_p99_us") >= num("lat_p50_us"), "{row:?}");
        assert_eq!(num("bytes"), num("ios") * num("size_bytes"), "{row:?}");
    }
    for (op, pattern, size, depth) in [("read", "seq", "4096", "1"), ("write", "rand", "65536", "4")] {
        assert!(
            rows.iter().any(|r| r[0] == op && r[1] == pattern && r[2] == size && r[3] == depth),
            "no {op} {pattern} {size} QD{depth} row"
        );
    }
    // The table went to stdout as it ran, one line per point, and the end says where.
    assert_eq!(r.stdout.lines().filter(|l| l.starts_with("read ") || l.starts_with("write ")).count(), 16, "{}", r.stdout);
    assert!(r.stdout.contains(out.to_str().unwrap()), "{}", r.stdout);

    assert_svg(&out.join("bandwidth.svg"), &["request size", "bandwidth (MB/s)", "QD 1", "QD 4", "random write"]);
    assert_svg(&out.join("latency.svg"), &["request size", "latency", "p99"]);
    assert_svg(&out.join("latency-vs-depth.svg"), &["queue depth", "latency", "64K"]);

    // The writes carried a pattern, not zeros.
    let data = std::fs::read(&img).unwrap();
    assert!(data.iter().any(|&b| b != 0), "no data was written");
}

#[test]
fn writes_are_refused_without_the_write_flag() {
    let work = tempfile::tempdir().unwrap();
    let img = work.path().join("disk.img");
    let original = pattern(1 << 20, 11);
    write_file(&img, &original);
    let s = Sluice::start(&["--export", &format!("disk={}", img.display())]);
    for ops in ["write", "read,write"] {
        let out = work.path().join("results");
        let r = bench(
            work.path(),
            &["--ops", ops, "--sizes", "4K", "--depths", "1", "--runtime", "0.1", "--out", out.to_str().unwrap(), &s.uri_for("disk")],
        );
        assert_eq!(r.code, Some(2), "--ops {ops}: {}", r.stderr);
        assert!(r.stderr.contains("--write"), "{}", r.stderr);
        assert!(!out.exists(), "refused run still created {}", out.display());
    }
    assert!(std::fs::read(&img).unwrap() == original, "the export changed");
}

#[test]
fn write_to_a_read_only_export_fails_before_measuring() {
    let work = tempfile::tempdir().unwrap();
    let s = Sluice::start(&["--export", "ro=memory:8M,ro"]);
    let out = work.path().join("results");
    let r = bench(
        work.path(),
        &["--write", "--sizes", "4K", "--depths", "1", "--runtime", "0.1", "--out", out.to_str().unwrap(), &s.uri_for("ro")],
    );
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("read-only"), "{}", r.stderr);
    assert!(!out.join("bench.csv").exists(), "it measured anyway");
    assert!(!r.stdout.lines().any(|l| l.starts_with("read ")), "{}", r.stdout);
}

#[test]
fn quick_sweep_finishes() {
    let work = tempfile::tempdir().unwrap();
    let s = Sluice::start(&["--export", "disk=memory:64M"]);
    let out = work.path().join("quick");
    let r = bench(work.path(), &["--quick", "--out", out.to_str().unwrap(), &s.uri_for("disk")]);
    assert_eq!(r.code, Some(0), "stdout:\n{}\nstderr:\n{}", r.stdout, r.stderr);
    // 4 sizes x 2 depths x 2 patterns, reads only.
    assert_eq!(csv_rows(&out).len(), 16);
    assert_svg(&out.join("bandwidth.svg"), &["request size"]);
}

#[test]
fn default_output_directory_is_new_and_multi_conn_is_recorded() {
    let work = tempfile::tempdir().unwrap();
    let s = Sluice::start(&["--export", "disk=memory:8M"]);
    let args = ["--sizes", "64K", "--depths", "2", "--patterns", "rand", "--runtime", "0.1", "--connections", "2", &s.uri_for("disk")];
    let r = bench(work.path(), &args);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let dirs: Vec<_> = std::fs::read_dir(work.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.file_name().unwrap().to_str().unwrap().starts_with("sluice-bench-"))
        .collect();
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    let rows = csv_rows(&dirs[0]);
    assert_eq!(rows.len(), 1);
    // sluice allows multi-conn, so both connections were opened.
    assert_eq!(rows[0][field("connections")], "2");

    // A second run, even within the same second, gets a directory of its own.
    let r = bench(work.path(), &args);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let count = std::fs::read_dir(work.path())
        .unwrap()
        .filter(|e| e.as_ref().unwrap().file_name().to_str().unwrap().starts_with("sluice-bench-"))
        .count();
    assert_eq!(count, 2);
}

#[test]
fn unreachable_server_and_bad_uri_fail() {
    let work = tempfile::tempdir().unwrap();
    let port = free_port();
    let out = work.path().join("results");
    let r = bench(work.path(), &["--quick", "--out", out.to_str().unwrap(), &format!("nbd://127.0.0.1:{port}/")]);
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.starts_with("sluice bench: "), "{}", r.stderr);
    assert!(!out.exists());

    let r = bench(work.path(), &["--quick", "http://example.com/"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    let r = bench(work.path(), &["--sizes", "4Q", "nbd://127.0.0.1/"]);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
}

#[test]
fn a_failing_request_stops_the_run() {
    require!("nbdkit");
    let work = tempfile::tempdir().unwrap();
    let sock = work.path().join("nbdkit.sock");
    let pidfile = work.path().join("nbdkit.pid");
    // Every read fails with EIO.
    let mut nbdkit = Command::new("nbdkit")
        .args(["-f", "-U", sock.to_str().unwrap(), "-P", pidfile.to_str().unwrap(), "--filter=error", "memory", "16M"])
        .args(["error=EIO", "error-pread-rate=100%"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn nbdkit");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while !pidfile.exists() && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = work.path().join("results");
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let r = bench(
        work.path(),
        &["--sizes", "4K", "--depths", "4", "--patterns", "rand", "--runtime", "0.2", "--out", out.to_str().unwrap(), &uri],
    );
    let _ = nbdkit.kill();
    let _ = nbdkit.wait();
    assert_eq!(r.code, Some(1), "{}", r.stderr);
    assert!(r.stderr.contains("read of 4096 bytes") && r.stderr.contains("EIO"), "{}", r.stderr);
    assert!(csv_rows(&out).is_empty(), "a failed point was recorded");
}
