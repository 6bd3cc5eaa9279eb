//! `sluice copy` moves data byte-exact between files, exports, nbdkit and stdin/stdout, keeps
//! holes both ways, and refuses read-only, unknown, too-small or mistyped destinations.
mod common;
use common::*;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::process::Command;

const MIB: u64 = 1 << 20;

struct Out {
    code: i32,
    stdout: Vec<u8>,
    stderr: String,
}

/// Runs `sluice copy ARGS...` with `input` on stdin, bounded (`common::bounded`).
fn copy_with_input(args: &[&str], input: Option<Vec<u8>>) -> Out {
    let out = bounded(Command::new(SLUICE).arg("copy").args(args), input);
    Out {
        code: out.status.code().unwrap_or(-1),
        stdout: out.stdout,
        stderr: String::from_utf8_lossy(&out.stderr).into_owned(),
    }
}

fn copy(args: &[&str]) -> Out {
    copy_with_input(args, None)
}

fn copy_ok(args: &[&str]) -> Out {
    let out = copy(args);
    assert_eq!(out.code, 0, "sluice copy {args:?} failed: {}", out.stderr);
    out
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Compares contents, naming the first differing byte instead of dumping megabytes.
fn assert_same(what: &str, got: &[u8], want: &[u8]) {
    assert_eq!(got.len(), want.len(), "{what}: length differs");
    if got == want {
        return;
    }
    if let Some(i) = got.iter().zip(want).position(|(a, b)| a != b) {
        panic!("{what}: differs first at byte {i}");
    }
}

fn allocated(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

/// A file of `size` bytes: pattern data in `data` ranges, holes elsewhere. Returns its bytes.
fn sparse_file(path: &Path, size: u64, data: &[(u64, u64)], seed: u64) -> Vec<u8> {
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    let mut image = vec![0u8; size as usize];
    for (i, &(off, len)) in data.iter().enumerate() {
        let p = pattern(len as usize, seed + i as u64);
        f.write_all_at(&p, off).unwrap();
        image[off as usize..(off + len) as usize].copy_from_slice(&p);
    }
    f.sync_all().unwrap();
    image
}

#[test]
fn file_to_export_and_back_is_byte_exact_with_holes_and_odd_sizes() {
    let dir = tempfile::tempdir().unwrap();
    let size = 5 * MIB + 12345;
    let src = dir.path().join("src.img");
    let mut want = sparse_file(
        &src,
        size,
        &[
            (0, MIB + 7),
            (2 * MIB + 100, MIB + 4096),
            (4 * MIB, size - 4 * MIB),
        ],
        1,
    );
    // Zeros written as data, which the copy must still deliver as zeros.
    let zeros = vec![0u8; 200_000];
    std::fs::File::options()
        .write(true)
        .open(&src)
        .unwrap()
        .write_all_at(&zeros, 4 * MIB + 70_000)
        .unwrap();
    want[(4 * MIB + 70_000) as usize..(4 * MIB + 270_000) as usize].fill(0);

    // Old content everywhere in the export, so anything skipped shows.
    let backing = dir.path().join("backing.img");
    write_file(&backing, &pattern(size as usize, 99));
    let spec = format!("disk={}", backing.display());
    let srv = Sluice::start(&["--export", &spec]);
    let tcp = format!("nbd://127.0.0.1:{}/disk", srv.port);

    copy_ok(&[s(&src), &tcp]);
    assert_same(
        "export backing file after upload",
        &std::fs::read(&backing).unwrap(),
        &want,
    );

    // Back into a new file, with small requests so items and zero runs cross often.
    let out = dir.path().join("out.img");
    copy_ok(&[
        "--request-size",
        "64K",
        "--requests",
        "3",
        "--connections",
        "1",
        &srv.uri_for("disk"),
        s(&out),
    ]);
    assert_same("downloaded file", &std::fs::read(&out).unwrap(), &want);

    // Over an existing, longer file full of old data: cut to size, zeros really there.
    let old = dir.path().join("old.img");
    write_file(&old, &pattern((size + 3 * MIB) as usize, 7));
    copy_ok(&[&srv.uri_for("disk"), s(&old)]);
    assert_same("overwritten file", &std::fs::read(&old).unwrap(), &want);
    assert_eq!(srv.stop().code(), Some(0));
}

#[test]
fn sparse_64_mib_image_stays_sparse_both_ways() {
    let dir = tempfile::tempdir().unwrap();
    let size = 64 * MIB;
    let src = dir.path().join("sparse.img");
    let want = sparse_file(
        &src,
        size,
        &[(10 * MIB, MIB), (40 * MIB + 4096, 512 * 1024 + 3)],
        4,
    );
    let limit = 8 * MIB;
    assert!(
        allocated(&src) < limit,
        "test image did not come out sparse"
    );

    // A fresh sparse backing file, and one fully allocated with old data.
    let fresh = dir.path().join("fresh.img");
    std::fs::File::create(&fresh)
        .unwrap()
        .set_len(size)
        .unwrap();
    let full = dir.path().join("full.img");
    write_file(&full, &vec![0xffu8; size as usize]);
    assert!(allocated(&full) >= size, "test file did not get allocated");
    let (fresh_spec, full_spec) = (
        format!("fresh={}", fresh.display()),
        format!("full={}", full.display()),
    );
    let srv = Sluice::start(&["--export", &fresh_spec, "--export", &full_spec]);

    for (name, backing) in [("fresh", &fresh), ("full", &full)] {
        copy_ok(&[s(&src), &srv.uri_for(name)]);
        assert_same(name, &std::fs::read(backing).unwrap(), &want);
        assert!(
            allocated(backing) < limit,
            "{name}: backing file has {} bytes allocated after a sparse copy",
            allocated(backing)
        );
    }

    // Export to a new file, and to an existing fully allocated file: both end up sparse.
    let out = dir.path().join("out.img");
    copy_ok(&[&srv.uri_for("full"), s(&out)]);
    assert_same("downloaded", &std::fs::read(&out).unwrap(), &want);
    assert!(
        allocated(&out) < limit,
        "downloaded file has {} bytes allocated",
        allocated(&out)
    );
    let over = dir.path().join("over.img");
    write_file(&over, &vec![0xeeu8; size as usize]);
    copy_ok(&[&srv.uri_for("fresh"), s(&over)]);
    assert_same("overwritten", &std::fs::read(&over).unwrap(), &want);
    assert!(
        allocated(&over) < limit,
        "overwritten file has {} bytes allocated: holes were not punched",
        allocated(&over)
    );

    // --no-sparse writes the zeros for real.
    let dense = dir.path().join("dense.img");
    copy_ok(&["--no-sparse", s(&src), s(&dense)]);
    assert_same("dense", &std::fs::read(&dense).unwrap(), &want);
    assert!(
        allocated(&dense) >= size,
        "--no-sparse left holes: {} bytes allocated",
        allocated(&dense)
    );
    assert_eq!(srv.stop().code(), Some(0));
}

#[test]
fn stdin_to_export_and_export_to_stdout_round_trip() {
    let export_size = 4 * MIB;
    let srv = Sluice::start(&["--export", "m=memory:4M"]);
    let uri = srv.uri_for("m");
    let len = 3 * MIB as usize + 777;
    let mut data = pattern(len, 5);
    data[MIB as usize..2 * MIB as usize].fill(0);

    let up = copy_with_input(&["-", &uri], Some(data.clone()));
    assert_eq!(up.code, 0, "stdin -> export: {}", up.stderr);
    assert!(
        up.stderr.is_empty(),
        "no --progress, not a terminal: stderr should be quiet, got {:?}",
        up.stderr
    );

    let down = copy_ok(&["--progress", &uri, "-"]);
    let mut want = data.clone();
    want.resize(export_size as usize, 0);
    assert_same("export read to stdout", &down.stdout, &want);
    let last = down.stderr.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        format!("sluice copy: progress {export_size}/{export_size} bytes (100%)"),
        "stderr: {}",
        down.stderr
    );

    // Piped through, small requests: order is kept on both streams.
    let through = copy_with_input(
        &["--request-size", "4K", "--requests", "8", "-", "-"],
        Some(data.clone()),
    );
    assert_eq!(through.code, 0, "{}", through.stderr);
    assert_same("stdin -> stdout", &through.stdout, &data);

    // Input longer than the export: a clear failure, not a silent cut.
    let long = copy_with_input(&["-", &uri], Some(pattern(export_size as usize + 5000, 6)));
    assert_eq!(long.code, 1, "{}", long.stderr);
    assert!(
        long.stderr.contains("longer than the destination"),
        "{}",
        long.stderr
    );
    assert_eq!(srv.stop().code(), Some(0));
}

#[test]
fn export_to_export_copies_everything() {
    let dir = tempfile::tempdir().unwrap();
    let size = 6 * MIB + 4095;
    let src = dir.path().join("src.img");
    let want = sparse_file(
        &src,
        size,
        &[(100, 2 * MIB), (3 * MIB, MIB), (5 * MIB, size - 5 * MIB)],
        8,
    );
    let backing = dir.path().join("b.img");
    write_file(&backing, &pattern(size as usize + MIB as usize, 9));
    let a_spec = format!("a=memory:{size}");
    let b_spec = format!("b={}", backing.display());
    let one = Sluice::start(&["--export", &a_spec]);
    let two = Sluice::start(&["--export", &b_spec]);
    copy_ok(&[s(&src), &one.uri_for("a")]);
    copy_ok(&[
        &format!("nbd://127.0.0.1:{}/a", one.port),
        &two.uri_for("b"),
    ]);
    let got = std::fs::read(&backing).unwrap();
    assert_same("destination export", &got[..size as usize], &want);
    // The destination is bigger: what lies past the source's end is left alone.
    assert_same(
        "past the end",
        &got[size as usize..],
        &pattern(size as usize + MIB as usize, 9)[size as usize..],
    );
    assert_eq!(one.stop().code(), Some(0));
    assert_eq!(two.stop().code(), Some(0));
}

#[test]
fn copies_from_and_to_nbdkit() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    // The pattern plugin: each 8-byte word holds its own offset, big-endian.
    let size = 3 * MIB + 8 * 1000;
    let pat = Nbdkit::start(dir.path(), "pattern", &["pattern", &format!("size={size}")]);
    let out = dir.path().join("pattern.img");
    copy_ok(&[&pat.uri(), s(&out)]);
    let got = std::fs::read(&out).unwrap();
    assert_eq!(got.len() as u64, size);
    for (i, word) in got.chunks(8).enumerate() {
        assert_eq!(
            u64::from_be_bytes(word.try_into().unwrap()),
            i as u64 * 8,
            "wrong word at offset {}",
            i * 8
        );
    }

    // Into nbdkit's memory plugin and back out through sluice's own export.
    let mem = Nbdkit::start(dir.path(), "memory", &["memory", "16M"]);
    copy_ok(&[s(&out), &mem.uri()]);
    let back = copy_ok(&[&mem.uri(), "-"]);
    assert_same("nbdkit memory", &back.stdout[..size as usize], &got);
    assert!(
        back.stdout[size as usize..].iter().all(|&b| b == 0),
        "nbdkit memory past the copy is not zero"
    );
}

#[test]
fn read_only_destination_fails_before_copying() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    write_file(&src, &pattern(MIB as usize, 10));
    let srv = Sluice::start(&["--export", "ro=memory:1M,ro"]);
    let out = copy(&[s(&src), &srv.uri_for("ro")]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(
        out.stderr.starts_with("sluice copy:") && out.stderr.contains("read-only"),
        "{}",
        out.stderr
    );
    assert_eq!(srv.stop().code(), Some(0));
}

#[test]
fn unknown_export_and_unreachable_server_exit_1() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    write_file(&src, &pattern(4096, 11));
    let srv = Sluice::start(&["--export", "m=memory:1M"]);
    let nope = srv.uri_for("nope");
    let out_file = dir.path().join("never.img");
    for args in [[s(&src), &nope], [&nope, s(&out_file)]] {
        let out = copy(&args);
        assert_eq!(out.code, 1, "{args:?}: {}", out.stderr);
        assert!(
            out.stderr.contains("\"nope\""),
            "message should name the export: {}",
            out.stderr
        );
    }
    assert!(
        !out_file.exists(),
        "a failed source must not leave a destination file behind"
    );

    let unreachable = format!("nbd://127.0.0.1:{}/", free_port());
    let out = copy(&[&unreachable, s(&out_file)]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    let missing = copy(&[s(&dir.path().join("missing.img")), &srv.uri_for("m")]);
    assert_eq!(missing.code, 1, "{}", missing.stderr);
    assert_eq!(srv.stop().code(), Some(0));
}

#[test]
fn bad_uri_exits_2() {
    for (src, dst) in [
        ("nbd://127.0.0.1:99999/x", "/dev/null"),
        ("-", "nbd+unix:///x"),
        ("-", "nbds://host/x?tls-verify-peer=maybe"),
        ("ftp://x/", "-"),
    ] {
        let out = copy(&[src, dst]);
        assert_eq!(out.code, 2, "{src} {dst}: {}", out.stderr);
        assert!(out.stderr.contains("URI"), "{}", out.stderr);
    }
    assert_eq!(copy(&["--request-size", "0", "-", "-"]).code, 2);
}

#[test]
fn destination_smaller_than_source_fails_before_copying() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    write_file(&src, &pattern(2 * MIB as usize + 1, 12));
    let srv = Sluice::start(&["--export", "small=memory:2M"]);
    let out = copy(&[s(&src), &srv.uri_for("small")]);
    assert_eq!(out.code, 1, "{}", out.stderr);
    assert!(out.stderr.contains("smaller than"), "{}", out.stderr);
    // Nothing was written.
    let back = copy_ok(&[&srv.uri_for("small"), "-"]);
    assert!(
        back.stdout.iter().all(|&b| b == 0),
        "a refused copy wrote data"
    );
    assert_eq!(srv.stop().code(), Some(0));
}
