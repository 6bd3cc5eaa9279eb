//! `sluice pool` and `pool:PATH`: a raid10 pool of four sluice members is initialized,
//! reported, written and read back byte-exact through `sluice copy`; re-initializing is
//! refused; bad command lines and bad pool files exit 2 with a clear message, before
//! anything is written.
mod common;
use common::*;

use std::path::{Path, PathBuf};
use std::process::Command;

/// Runs `sluice ARGS...`; returns (exit code, stdout, stderr).
fn sluice(args: &[&str]) -> (i32, String, String) {
    let out = output(Command::new(SLUICE).args(args));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Writes a pool file and returns its `pool:PATH`.
fn pool_file(dir: &Path, name: &str, text: &str) -> String {
    let path: PathBuf = dir.join(name);
    std::fs::write(&path, text).unwrap();
    format!("pool:{}", path.display())
}

#[test]
fn bad_command_lines_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    let good = pool_file(dir.path(), "p.toml", "layout = \"stripe\"\nmembers = [\"nbd://127.0.0.1:1/x\"]\n");
    for args in [
        &["pool"][..],
        &["pool", "init"],
        &["pool", "status"],
        &["pool", "grow", &good],
        &["pool", "init", &good, "--json"],
        &["pool", "status", &good, "--force"],
    ] {
        let (code, _, err) = sluice(args);
        assert_eq!(code, 2, "{args:?}: {err}");
    }
    for not_a_pool in ["nbd://localhost/disk", "p.toml", "pool:"] {
        let (code, out, err) = sluice(&["pool", "status", not_a_pool]);
        assert_eq!(code, 2, "{not_a_pool}: {err}");
        assert!(err.starts_with("sluice pool status: "), "{err}");
        assert!(err.contains("pool:"), "{err}");
        assert!(out.is_empty());
    }
}

#[test]
fn bad_pool_files_exit_2_saying_why() {
    let dir = tempfile::tempdir().unwrap();
    let two = "members = [\"nbd://127.0.0.1:1/a\", \"nbd://127.0.0.1:1/b\"]";
    let three = "members = [\"nbd://127.0.0.1:1/a\", \"nbd://127.0.0.1:1/b\", \"nbd://127.0.0.1:1/c\"]";
    let cases = [
        (format!("layout = \"raid5\"\n{two}"), "raid5"),
        (format!("layout = \"stripe\"\nstripe-unit = \"48K\"\n{two}"), "power of two"),
        (format!("layout = \"raid10\"\nstripe-unit = \"1000\"\n{two}"), "power of two"),
        (format!("layout = \"mirror\"\ncopies = 3\n{two}"), "exactly 3 members"),
        (format!("layout = \"raid10\"\n{three}"), "multiple of 2"),
        (format!("layout = \"raid10\"\ncopies = 4\n{three}"), "multiple of 4"),
        ("layout = \"stripe\"\nmembers = [\"http://x/\"]".to_string(), "http://x/"),
        ("layout = \"stripe\"\nmembers = [\"pool:/other.toml\"]".to_string(), "cannot be a member"),
        ("layout = \"stripe\"\nmembers = [".to_string(), "line 2"),
    ];
    for (i, (text, why)) in cases.iter().enumerate() {
        let spec = pool_file(dir.path(), &format!("bad{i}.toml"), text);
        let file = spec.strip_prefix("pool:").unwrap();
        for args in [&["pool", "init", &spec][..], &["pool", "status", &spec], &["info", &spec], &["copy", &spec, "-"]] {
            let (code, out, err) = sluice(args);
            assert_eq!(code, 2, "{args:?} with {text:?}: {err}");
            assert!(err.contains(why), "{args:?}: {err:?} does not say {why:?}");
            // Errors in the file name the file; errors in a member name the member.
            assert!(err.contains(file) || err.contains("member"), "{args:?}: {err}");
            assert!(out.is_empty(), "{args:?}: {out}");
        }
    }
}

#[test]
fn a_missing_pool_file_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("none.toml");
    let spec = format!("pool:{}", missing.display());
    for args in [&["pool", "init", &spec][..], &["pool", "status", &spec], &["info", &spec], &["bench", &spec]] {
        let (code, _, err) = sluice(args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(missing.to_str().unwrap()), "{args:?}: {err}");
    }
}

#[test]
fn init_with_an_unreachable_member_exits_2_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let s = Sluice::start(&["memory:16M"]);
    let gone = format!("nbd+unix:///?socket={}", dir.path().join("gone.sock").display());
    let text = format!("layout = \"mirror\"\nmembers = [\"{}\", \"{gone}\"]\n", s.uri());
    let spec = pool_file(dir.path(), "p.toml", &text);
    let (code, out, err) = sluice(&["pool", "init", &spec]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("gone.sock") && err.contains("cannot be reached"), "{err}");
    assert!(out.is_empty());
}

#[test]
fn help_lists_the_commands_and_the_exit_codes() {
    let (code, top, _) = sluice(&["--help"]);
    assert_eq!(code, 0);
    assert!(top.contains("pool"), "sluice --help does not list pool:\n{top}");
    let (code, help, _) = sluice(&["pool", "--help"]);
    assert_eq!(code, 0);
    for word in ["init", "status", "layout", "stripe-unit", "copies", "members", "Exit status"] {
        assert!(help.contains(word), "pool --help does not mention {word:?}:\n{help}");
    }
    let (_, init, _) = sluice(&["pool", "init", "--help"]);
    assert!(init.contains("--force") && init.contains("pool:PATH"), "{init}");
    let (_, status, _) = sluice(&["pool", "status", "--help"]);
    assert!(status.contains("--json") && status.contains("pool:PATH"), "{status}");
}

/// Four file-backed members of `member_bytes` each, and a raid10 pool file over them.
fn raid10(dir: &Path, member_bytes: u64) -> (Vec<Sluice>, String) {
    let members: Vec<Sluice> = (0..4)
        .map(|i| {
            let file = dir.join(format!("m{i}.img"));
            std::fs::File::create(&file).unwrap().set_len(member_bytes).unwrap();
            Sluice::start(&[file.to_str().unwrap()])
        })
        .collect();
    let uris: Vec<String> = members.iter().map(|m| format!("{:?}", m.uri())).collect();
    let text = format!("layout = \"raid10\"\nstripe-unit = \"64K\"\nmembers = [{}]\n", uris.join(", "));
    let spec = pool_file(dir, "raid10.toml", &text);
    (members, spec)
}

#[test]
fn raid10_init_status_copy_in_and_out() {
    const MIB: u64 = 1 << 20;
    let dir = tempfile::tempdir().unwrap();
    let (members, spec) = raid10(dir.path(), 9 * MIB);

    let (code, out, err) = sluice(&["pool", "init", &spec]);
    assert_eq!(code, 0, "{err}");
    assert!(out.starts_with("initialized pool ") && out.contains("raid10"), "{out}");

    let (code, out, err) = sluice(&["pool", "status", "--json", &spec]);
    assert_eq!(code, 0, "{err}");
    let status: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("bad JSON ({e}):\n{out}"));
    // Two mirror sets of 8 MiB data each: the first MiB of every member is metadata.
    assert_eq!(status["size"], 16 * MIB);
    assert_eq!((status["layout"].as_str(), status["copies"].as_u64(), status["stripe_unit"].as_u64()), (Some("raid10"), Some(2), Some(65536)));
    assert_eq!(status["dirty_regions"], 0);
    let states: Vec<&str> = status["members"].as_array().unwrap().iter().map(|m| m["state"].as_str().unwrap()).collect();
    assert_eq!(states, ["in-sync"; 4]);
    assert_eq!(status["members"][2]["uri"], members[2].uri());

    // Not a whole number of stripe units, so pieces end mid-unit.
    let data = pattern((10 * MIB + 12288) as usize, 10);
    let src = dir.path().join("src.img");
    write_file(&src, &data);
    let (code, _, err) = sluice(&["copy", src.to_str().unwrap(), &spec]);
    assert_eq!(code, 0, "copy into the pool: {err}");
    let back = dir.path().join("back.img");
    let (code, _, err) = sluice(&["copy", &spec, back.to_str().unwrap()]);
    assert_eq!(code, 0, "copy out of the pool: {err}");
    let got = std::fs::read(&back).unwrap();
    assert_eq!(got.len() as u64, 16 * MIB);
    assert!(got[..data.len()] == data[..], "the pool did not read back what was written");
    assert!(got[data.len()..].iter().all(|&b| b == 0));
    // Each mirror pair holds the same data after its metadata.
    let member_data = |i: usize| std::fs::read(dir.path().join(format!("m{i}.img"))).unwrap().split_off(MIB as usize);
    assert!(member_data(0) == member_data(1) && member_data(2) == member_data(3), "mirror copies differ");

    let (code, out, err) = sluice(&["pool", "init", &spec]);
    assert_eq!(code, 1, "re-init without --force: {out} {err}");
    assert!(err.contains("already carries") && err.contains("--force"), "{err}");
    let (code, _, err) = sluice(&["pool", "init", "--force", &spec]);
    assert_eq!(code, 0, "{err}");
}
