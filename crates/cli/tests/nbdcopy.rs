//! nbdcopy moves whole images in and out of sluice byte-exact, over Unix and TCP, keeping holes.
mod common;
use common::*;
use std::os::unix::fs::MetadataExt;
use std::path::Path;

const MIB: usize = 1 << 20;
const SIZE: usize = 64 * MIB;

fn nbdcopy(from: &str, to: &str) {
    let (ok, out, err) = run("nbdcopy", &[from, to]);
    assert!(ok, "nbdcopy {from} {to} failed\n{out}\n{err}");
}

/// Compares two files, naming the first differing byte instead of dumping megabytes.
fn assert_same_file(a: &Path, b: &Path) {
    let (x, y) = (std::fs::read(a).unwrap(), std::fs::read(b).unwrap());
    assert_eq!(x.len(), y.len(), "{} and {} differ in size", a.display(), b.display());
    if let Some(i) = x.iter().zip(&y).position(|(p, q)| p != q) {
        panic!("{} and {} differ first at byte {i}", a.display(), b.display());
    }
}

fn allocated_bytes(p: &Path) -> u64 {
    std::fs::metadata(p).unwrap().blocks() * 512
}

#[test]
fn random_64_mib_file_copies_into_a_memory_export_and_back_byte_exact() {
    require!("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let (src, out) = (dir.path().join("src.img"), dir.path().join("out.img"));
    write_file(&src, &pattern(SIZE, 1));
    let s = Sluice::start(&["--export", "m=memory:64M"]);
    nbdcopy(src.to_str().unwrap(), &s.uri_for("m"));
    nbdcopy(&s.uri_for("m"), out.to_str().unwrap());
    assert_same_file(&src, &out);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn copy_into_a_file_backed_export_lands_in_the_backing_file() {
    require!("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let (src, backing) = (dir.path().join("src.img"), dir.path().join("backing.img"));
    write_file(&src, &pattern(SIZE, 2));
    // Different old content, so a copy that skipped anything shows.
    write_file(&backing, &pattern(SIZE, 3));
    let s = Sluice::start(&[backing.to_str().unwrap()]);
    nbdcopy(src.to_str().unwrap(), &s.uri());
    // nbdcopy flushes before it exits; the file must hold the data while sluice still runs.
    assert_same_file(&src, &backing);
    assert_eq!(s.stop().code(), Some(0));
    assert_same_file(&src, &backing);
}

#[test]
fn sparse_source_stays_sparse_in_a_file_backed_export() {
    require!("nbdcopy");
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("sparse.img");
    let f = std::fs::File::create(&src).unwrap();
    f.set_len(SIZE as u64).unwrap();
    f.write_all_at(&pattern(2 * MIB, 4), 10 * MIB as u64).unwrap();
    f.write_all_at(&pattern(MIB, 5), 40 * MIB as u64).unwrap();
    drop(f);
    let data_bytes = 3 * MIB as u64;

    // Into a fresh, empty sparse file, and over a fully allocated one: both end up sparse.
    let fresh = dir.path().join("fresh.img");
    std::fs::File::create(&fresh).unwrap().set_len(SIZE as u64).unwrap();
    let full = dir.path().join("full.img");
    write_file(&full, &vec![0xffu8; SIZE]);
    assert!(allocated_bytes(&full) >= SIZE as u64, "test file did not get allocated");

    let fresh_spec = format!("fresh={}", fresh.display());
    let full_spec = format!("full={}", full.display());
    let s = Sluice::start(&["--export", &fresh_spec, "--export", &full_spec]);
    for (name, path) in [("fresh", &fresh), ("full", &full)] {
        nbdcopy(src.to_str().unwrap(), &s.uri_for(name));
        assert_same_file(&src, path);
        let used = allocated_bytes(path);
        // Some slack for filesystem metadata and partly written blocks, far below 64 MiB.
        assert!(used <= data_bytes + 2 * MIB as u64, "export {name}: {used} bytes allocated for {data_bytes} of data");
    }
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn copies_over_tcp_round_trip_byte_exact() {
    require!("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let (src, out) = (dir.path().join("src.img"), dir.path().join("out.img"));
    write_file(&src, &pattern(SIZE, 6));
    let s = Sluice::start(&["--export", "=memory:64M"]);
    nbdcopy(src.to_str().unwrap(), &s.tcp_uri());
    nbdcopy(&s.tcp_uri(), out.to_str().unwrap());
    assert_same_file(&src, &out);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn copy_between_two_exports_of_one_server_over_unix_and_tcp() {
    require!("nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let (src, out) = (dir.path().join("src.img"), dir.path().join("out.img"));
    write_file(&src, &pattern(SIZE, 7));
    let s = Sluice::start(&["--export", "a=memory:64M", "--export", "b=memory:64M"]);
    let tcp_b = format!("nbd://127.0.0.1:{}/b", s.port);
    nbdcopy(src.to_str().unwrap(), &s.uri_for("a"));
    nbdcopy(&s.uri_for("a"), &tcp_b);
    nbdcopy(&tcp_b, out.to_str().unwrap());
    assert_same_file(&src, &out);
    assert_eq!(s.stop().code(), Some(0));
}
