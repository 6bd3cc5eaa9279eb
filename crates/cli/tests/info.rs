//! `sluice info` reports what the server was started with (size, flags, description, block
//! sizes), lists exports, maps allocation like `nbdinfo --map`, and fails with the right status.
mod common;
use common::*;
use serde_json::Value;
use std::os::unix::fs::FileExt;

const MIB: u64 = 1 << 20;

/// Runs `sluice info ARGS...`; returns (exit code, stdout, stderr).
fn info(args: &[&str]) -> (i32, String, String) {
    let out = output(std::process::Command::new(SLUICE).arg("info").args(args));
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn info_ok(args: &[&str]) -> String {
    let (code, out, err) = info(args);
    assert_eq!(code, 0, "sluice info {args:?} failed: {err}");
    out
}

fn info_json(args: &[&str]) -> Value {
    let out = info_ok(args);
    serde_json::from_str(&out)
        .unwrap_or_else(|e| panic!("sluice info {args:?} printed bad JSON ({e}):\n{out}"))
}

/// The value after `key:` on the line starting with it.
fn field<'a>(text: &'a str, key: &str) -> &'a str {
    let prefix = format!("{key}:");
    let line = text
        .lines()
        .find(|l| l.starts_with(&prefix))
        .unwrap_or_else(|| panic!("no {key:?} line in:\n{text}"));
    line[prefix.len()..].trim()
}

#[test]
fn fields_and_json_match_what_the_server_was_started_with() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("odd.img");
    let odd = 3 * MIB + 517;
    write_file(&file, &pattern(odd as usize, 1));
    let disk = format!(
        "disk={},description=the first disk, with a comma",
        file.display()
    );
    let s = Sluice::start(&["--export", &disk, "--export", "ro=memory:2M,ro"]);

    let text = info_ok(&[&s.uri_for("disk")]);
    assert_eq!(field(&text, "export"), "\"disk\"");
    assert_eq!(field(&text, "description"), "the first disk, with a comma");
    assert!(
        field(&text, "size").starts_with(&format!("{odd} (")),
        "{text}"
    );
    let flags = field(&text, "flags");
    for f in [
        "flush",
        "fua",
        "trim",
        "write-zeroes",
        "multi-conn",
        "cache",
    ] {
        assert!(
            flags.split_whitespace().any(|w| w == f),
            "{f} missing from flags: {flags}"
        );
    }
    assert!(
        !flags.contains("read-only"),
        "writable export shown read-only: {flags}"
    );
    assert_eq!(field(&text, "structured replies"), "yes");
    assert_eq!(field(&text, "base:allocation"), "yes");

    let j = info_json(&["--json", &s.uri_for("disk")]);
    assert_eq!(j["name"], "disk");
    assert_eq!(j["size"], odd);
    assert_eq!(j["description"], "the first disk, with a comma");
    assert_eq!(j["flags"]["read-only"], false);
    assert_eq!(j["flags"]["write-zeroes"], true);
    assert_eq!(j["block_size"]["maximum"], 32 * MIB);
    assert_eq!(j["structured_replies"], true);
    assert_eq!(j["base_allocation"], true);

    let ro = info_json(&["--json", &s.uri_for("ro")]);
    assert_eq!(ro["size"], 2 * MIB);
    assert_eq!(ro["description"], Value::Null);
    assert_eq!(ro["flags"]["read-only"], true);
    assert_eq!(ro["flags"]["trim"], false);
    assert_eq!(ro["flags"]["write-zeroes"], false);
    assert!(field(&info_ok(&[&s.uri_for("ro")]), "flags").contains("read-only"));

    // nbdinfo, asked the same questions, gets the same answers.
    if have("nbdinfo") {
        for (name, ours) in [("disk", &j), ("ro", &ro)] {
            let (ok, out, err) = run("nbdinfo", &["--json", &s.uri_for(name)]);
            assert!(ok, "nbdinfo: {err}");
            let theirs: Value = serde_json::from_str(&out).unwrap();
            let e = &theirs["exports"][0];
            assert_eq!(e["export-size"], ours["size"], "{name}");
            let pairs = [
                ("is_read_only", "read-only"),
                ("can_flush", "flush"),
                ("can_fua", "fua"),
                ("can_trim", "trim"),
                ("can_zero", "write-zeroes"),
                ("can_fast_zero", "fast-zero"),
                ("can_df", "df"),
                ("can_multi_conn", "multi-conn"),
                ("can_cache", "cache"),
                ("is_rotational", "rotational"),
            ];
            for (nbdinfo_key, our_key) in pairs {
                assert_eq!(
                    e[nbdinfo_key], ours["flags"][our_key],
                    "{name}: {nbdinfo_key} vs {our_key}"
                );
            }
            assert_eq!(
                e["block_size_preferred"], ours["block_size"]["preferred"],
                "{name}"
            );
        }
    } else {
        eprintln!("SKIPPED part: nbdinfo is not installed, no cross-check");
    }
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn list_names_every_export_with_size_and_description() {
    let s = Sluice::start(&[
        "--export",
        "a=memory:1M",
        "--export",
        "b=null:2M,description=hello",
        "--export",
        "c=memory:3M,ro,description=third one",
    ]);
    // The export in the URI does not matter for --list, even one that does not exist.
    let uri = s.uri_for("no-such-export");
    let text = info_ok(&["--list", &uri]);
    let rows: Vec<&str> = text.lines().skip(1).collect();
    assert_eq!(rows.len(), 3, "{text}");
    assert!(
        rows[0].starts_with("\"a\"") && rows[0].contains("1048576"),
        "{text}"
    );
    assert!(
        rows[1].starts_with("\"b\"") && rows[1].contains("2097152") && rows[1].ends_with("hello"),
        "{text}"
    );
    assert!(
        rows[2].starts_with("\"c\"")
            && rows[2].contains("read-only")
            && rows[2].ends_with("third one"),
        "{text}"
    );

    let j = info_json(&["--list", "--json", &uri]);
    let exports = j["exports"].as_array().expect("exports array");
    let names: Vec<&str> = exports
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["a", "b", "c"]);
    let sizes: Vec<u64> = exports
        .iter()
        .map(|e| e["size"].as_u64().unwrap())
        .collect();
    assert_eq!(sizes, [MIB, 2 * MIB, 3 * MIB]);
    assert_eq!(exports[0]["description"], Value::Null);
    assert_eq!(exports[1]["description"], "hello");
    assert_eq!(exports[2]["description"], "third one");
    assert_eq!(exports[2]["flags"]["read-only"], true);
    assert_eq!(s.stop().code(), Some(0));
}

/// (offset, length, type) from `--map` text, ours or nbdinfo's.
fn parse_map(text: &str) -> Vec<(u64, u64, u64)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 3, "odd map line {l:?}");
            (
                f[0].parse().unwrap(),
                f[1].parse().unwrap(),
                f[2].parse().unwrap(),
            )
        })
        .collect()
}

/// Merges neighbours of the same type (nbdinfo may print them apart).
fn merged(map: Vec<(u64, u64, u64)>) -> Vec<(u64, u64, u64)> {
    let mut out: Vec<(u64, u64, u64)> = Vec::new();
    for (o, l, t) in map {
        match out.last_mut() {
            Some(last) if last.2 == t && last.0 + last.1 == o => last.1 += l,
            _ => out.push((o, l, t)),
        }
    }
    out
}

#[test]
fn map_shows_holes_and_data_of_a_sparse_file() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.img");
    let size = 8 * MIB;
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(size).unwrap();
    f.write_all_at(&pattern(MIB as usize, 2), 2 * MIB).unwrap();
    f.write_all_at(&pattern(4096, 3), 5 * MIB).unwrap();
    f.sync_all().unwrap();
    drop(f);
    let s = Sluice::start(&[path.to_str().unwrap()]);

    let text = info_ok(&["--map", &s.uri()]);
    let map = parse_map(&text);
    let want = vec![
        (0, 2 * MIB, 3),
        (2 * MIB, MIB, 0),
        (3 * MIB, 2 * MIB, 3),
        (5 * MIB, 4096, 0),
        (5 * MIB + 4096, 3 * MIB - 4096, 3),
    ];
    assert_eq!(map, want, "{text}");
    assert!(
        text.lines().next().unwrap().ends_with("hole,zero")
            && text.lines().nth(1).unwrap().ends_with("data"),
        "{text}"
    );

    let j = info_json(&["--map", "--json", &s.uri()]);
    let from_json: Vec<(u64, u64, u64)> = j
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            (
                e["offset"].as_u64().unwrap(),
                e["length"].as_u64().unwrap(),
                e["type"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(from_json, want);
    assert_eq!(j[1]["description"], "data");

    if have("nbdinfo") {
        let (ok, out, err) = run("nbdinfo", &["--map", &s.uri()]);
        assert!(ok, "nbdinfo --map: {err}");
        assert_eq!(
            merged(parse_map(&out)),
            map,
            "nbdinfo --map disagrees:\n{out}\nours:\n{text}"
        );
    } else {
        eprintln!("SKIPPED part: nbdinfo is not installed, no cross-check");
    }
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn unknown_export_unreachable_server_and_bad_uri_fail_with_their_status() {
    let s = Sluice::start(&["--export", "a=memory:1M"]);
    for args in [vec![], vec!["--map"], vec!["--json"]] {
        let mut a: Vec<&str> = args.clone();
        let uri = s.uri_for("nope");
        a.push(&uri);
        let (code, out, err) = info(&a);
        assert_eq!(code, 1, "{a:?}: {err}");
        assert!(
            err.starts_with("sluice info:") && err.contains("\"nope\""),
            "message should name the export: {err}"
        );
        assert!(out.is_empty(), "{out}");
    }

    let port = free_port();
    let missing_socket = s.dir.path().join("nobody-listens.sock");
    for uri in [
        format!("nbd://127.0.0.1:{port}/"),
        format!("nbd+unix:///?socket={}", missing_socket.display()),
    ] {
        for list in [false, true] {
            let args: Vec<&str> = if list {
                vec!["--list", &uri]
            } else {
                vec![&uri]
            };
            let (code, _, err) = info(&args);
            assert_eq!(code, 1, "{args:?}: {err}");
            assert!(err.starts_with("sluice info:"), "{err}");
        }
    }

    for bad in [
        "nbd://127.0.0.1:99999/",
        "nbd+unix:///a",
        "http://example.com/",
        "disk.img",
    ] {
        let (code, _, err) = info(&[bad]);
        assert_eq!(code, 2, "{bad}: {err}");
        assert!(err.contains("URI"), "{err}");
    }
    assert_eq!(s.stop().code(), Some(0));
}

/// `sluice info ... | head` closes the pipe before info has printed everything: info ends
/// quietly with the status a SIGPIPE would give, not with a panic and a backtrace.
#[test]
fn a_reader_that_closes_the_output_early_ends_info_quietly() {
    let s = Sluice::start(&["--export", "m=memory:4M"]);
    let (reader, writer) = std::io::pipe().unwrap();
    // Closed before info starts: its first line already meets a closed pipe.
    drop(reader);
    let mut child = std::process::Command::new(SLUICE)
        .args(["info", "--map", &s.uri_for("m")])
        .stdin(std::process::Stdio::null())
        .stdout(writer)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Bounded: info needs one connection to a local server.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if std::time::Instant::now() > deadline {
            child.kill().unwrap();
            panic!("info did not end within 60 s on a closed pipe");
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert!(!err.contains("panicked"), "info panicked on a closed pipe:\n{err}");
    assert_eq!(status.code(), Some(128 + 13), "{err}");
}
