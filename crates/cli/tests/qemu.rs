//! qemu's NBD client (qemu-io, qemu-img) writes, verifies, discards, zeroes and converts through sluice.
mod common;
use common::*;

/// Runs qemu-io with the given commands against a raw NBD image; returns (ok, stdout+stderr).
/// qemu-io exits non-zero when a command fails, but its messages are checked as well.
fn qemu_io(uri: &str, commands: &[&str]) -> (bool, String) {
    let mut args = vec!["-f", "raw"];
    for c in commands {
        args.extend(["-c", c]);
    }
    args.push(uri);
    let (ok, out, err) = run("qemu-io", &args);
    let text = format!("{out}{err}");
    let clean = !text.contains("failed") && !text.contains("error");
    (ok && clean, text)
}

fn qemu_io_ok(uri: &str, commands: &[&str]) {
    let (ok, text) = qemu_io(uri, commands);
    assert!(ok, "qemu-io on {uri} failed:\n{text}");
}

#[test]
fn qemu_io_patterns_discards_and_zeroes_on_file_and_memory_exports() {
    require!("qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let backing = dir.path().join("disk.img");
    write_file(&backing, &pattern(4 << 20, 1));
    let file_spec = format!("file={}", backing.display());
    let s = Sluice::start(&["--export", &file_spec, "--export", "mem=memory:4M"]);
    for name in ["file", "mem"] {
        let uri = s.uri_for(name);
        qemu_io_ok(
            &uri,
            &[
                "write -P 0xab 0 1M",
                "read -P 0xab 0 1M",
                // Unaligned: qemu sees block_size_minimum 1 and sends it as is.
                "write -P 0xcd 1000 3000",
                "read -P 0xab 0 1000",
                "read -P 0xcd 1000 3000",
                "read -P 0xab 4000 1044576",
                "discard 64k 64k",
                "read -P 0 64k 64k",
                "write -z 256k 128k",
                "read -P 0 256k 128k",
                "write -z -u 512k 128k",
                "read -P 0 512k 128k",
                "read -P 0xab 384k 128k",
                "read -P 0xab 640k 384k",
                "aio_write -P 0x11 2M 64k",
                "aio_write -P 0x12 2112k 64k",
                "aio_write -P 0x13 2176k 64k",
                "aio_write -P 0x14 2240k 100000",
                "aio_flush",
                "read -P 0x11 2M 64k",
                "read -P 0x12 2112k 64k",
                "read -P 0x13 2176k 64k",
                "read -P 0x14 2240k 100000",
                // -f: FUA.
                "write -f -P 0x77 3M 4k",
                "read -P 0x77 3M 4k",
                "flush",
            ],
        );
        // A second process, a new connection: everything is still there.
        qemu_io_ok(&uri, &["read -P 0xcd 1000 3000", "read -P 0 256k 128k", "read -P 0x13 2176k 64k", "read -P 0x77 3M 4k"]);
        // And a wrong expectation is caught, so the checks above mean something.
        let (ok, text) = qemu_io(&uri, &["read -P 0x55 0 4k"]);
        assert!(!ok && text.contains("Pattern verification failed"), "a wrong pattern was not detected:\n{text}");
    }
    let disk = std::fs::read(&backing).unwrap();
    assert!(disk[..1000].iter().all(|&b| b == 0xab), "file export: first write missing from the file");
    assert!(disk[1000..4000].iter().all(|&b| b == 0xcd), "file export: unaligned write missing from the file");
    assert!(disk[256 << 10..384 << 10].iter().all(|&b| b == 0), "file export: write -z missing from the file");
    assert!(disk[3 << 20..(3 << 20) + 4096].iter().all(|&b| b == 0x77), "file export: FUA write missing from the file");
    assert!(disk[(3 << 20) + 4096..] == pattern(4 << 20, 1)[(3 << 20) + 4096..], "file export: untouched tail changed");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn qemu_img_converts_to_and_from_exports_and_compares_them() {
    require!("qemu-img", "qemu-io");
    let dir = tempfile::tempdir().unwrap();
    let size = 16 << 20;
    let src = dir.path().join("src.img");
    // Random data with a zero gap in the middle, so qemu-img's zero detection is used too.
    let mut data = pattern(size, 2);
    data[4 << 20..8 << 20].fill(0);
    write_file(&src, &data);
    let backing = dir.path().join("disk.img");
    write_file(&backing, &pattern(size, 3));
    let file_spec = format!("file={}", backing.display());
    let s = Sluice::start(&["--export", &file_spec, "--export", "mem=memory:16M"]);
    let src = src.to_str().unwrap();
    let targets = [s.uri_for("file"), s.uri_for("mem"), format!("nbd://127.0.0.1:{}/mem", s.port)];
    for (i, uri) in targets.iter().enumerate() {
        let (ok, out, err) = run("qemu-img", &["info", "--output=json", uri]);
        assert!(ok, "qemu-img info {uri}: {err}");
        assert!(out.contains(&format!("\"virtual-size\": {size}")), "qemu-img info {uri}:\n{out}");

        let (ok, out, err) = run("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", src, uri]);
        assert!(ok, "qemu-img convert into {uri}:\n{out}{err}");
        let back = dir.path().join(format!("back{i}.img"));
        let (ok, out, err) = run("qemu-img", &["convert", "-f", "raw", "-O", "raw", uri, back.to_str().unwrap()]);
        assert!(ok, "qemu-img convert out of {uri}:\n{out}{err}");
        assert!(std::fs::read(&back).unwrap() == data, "{uri}: image read back differs from what was converted in");

        let (ok, out, err) = run("qemu-img", &["compare", "-f", "raw", "-F", "raw", src, uri]);
        assert!(ok && out.contains("Images are identical"), "qemu-img compare {uri}:\n{out}{err}");
        // Change one byte through the export: compare must notice (exit 1).
        qemu_io_ok(uri, &["write -P 0x5a 5242883 1"]);
        let compare = ["compare", "-q", "-f", "raw", "-F", "raw", src, uri];
        let status = output(std::process::Command::new("qemu-img").args(compare)).status;
        assert_eq!(status.code(), Some(1), "qemu-img compare {uri} missed a changed byte");
    }
    let mut expected = data.clone();
    expected[5242883] = 0x5a;
    assert!(std::fs::read(&backing).unwrap() == expected, "file export's backing file differs");
    assert_eq!(s.stop().code(), Some(0));
}
