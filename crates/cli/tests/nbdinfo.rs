//! nbdinfo sees what sluice advertises: sizes, flags, the export list, allocation maps, JSON.
mod common;
use common::*;

/// Every value of `"key": value` in nbdinfo's JSON, as text (quotes removed). Loose on
/// purpose: nbdinfo's layout is not a stable interface, its key names are.
fn json_values(text: &str, key: &str) -> Vec<String> {
    let needle = format!("\"{key}\":");
    text.match_indices(&needle)
        .map(|(i, _)| {
            let rest = text[i + needle.len()..].trim_start();
            if let Some(s) = rest.strip_prefix('"') {
                return s[..s.find('"').unwrap_or(s.len())].to_owned();
            }
            let end = rest.find([',', '\n', '}', ']']).unwrap_or(rest.len());
            rest[..end].trim().to_owned()
        })
        .collect()
}

/// Runs `nbdinfo --can WHAT` / `--is WHAT`: true for exit 0, false for exit 2, else panics.
fn nbdinfo_query(kind: &str, what: &str, uri: &str) -> bool {
    let path = format!("/usr/bin:/bin:{}", std::env::var("PATH").unwrap_or_default());
    let out = output(std::process::Command::new("nbdinfo").args([kind, what, uri]).env("PATH", path));
    match out.status.code() {
        Some(0) => true,
        Some(2) => false,
        other => panic!("nbdinfo {kind} {what} {uri}: exit {other:?}: {}", String::from_utf8_lossy(&out.stderr)),
    }
}

fn size_of(uri: &str) -> u64 {
    let (ok, out, err) = run("nbdinfo", &["--size", uri]);
    assert!(ok, "nbdinfo --size {uri}: {err}");
    out.trim().parse().unwrap_or_else(|_| panic!("nbdinfo --size printed {out:?}"))
}

#[test]
fn size_is_reported_for_file_memory_and_null_exports() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("odd.img");
    // An odd size, not a multiple of any block size, must come through exactly.
    let odd = 3 * 1024 * 1024 + 517;
    write_file(&file, &pattern(odd, 1));
    let file_spec = format!("f={}", file.display());
    let s = Sluice::start(&["--export", &file_spec, "--export", "m=memory:1M", "--export", "n=null:2G"]);
    assert_eq!(size_of(&s.uri_for("f")), odd as u64);
    assert_eq!(size_of(&s.uri_for("m")), 1 << 20);
    assert_eq!(size_of(&s.uri_for("n")), 2 << 30);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn writable_export_advertises_flush_fua_trim_zero_multi_conn_df_cache() {
    require!("nbdinfo");
    let s = Sluice::start(&["--export", "m=memory:1M"]);
    let uri = s.uri_for("m");
    for cap in ["flush", "fua", "trim", "zero", "fast-zero", "multi-conn", "df", "cache", "write", "read"] {
        assert!(nbdinfo_query("--can", cap, &uri), "memory export should advertise can_{cap}");
    }
    assert!(!nbdinfo_query("--is", "read-only", &uri), "memory export must not be read-only");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn read_only_export_says_so_and_advertises_no_writes() {
    require!("nbdinfo");
    let s = Sluice::start(&["--export", "rw=memory:1M", "--export", "ro=memory:1M,ro"]);
    let ro = s.uri_for("ro");
    assert!(nbdinfo_query("--is", "read-only", &ro));
    for cap in ["write", "trim", "zero", "fast-zero"] {
        assert!(!nbdinfo_query("--can", cap, &ro), "read-only export advertises can_{cap}");
    }
    // Flushing and caching a read-only export is harmless and still offered.
    assert!(nbdinfo_query("--can", "flush", &ro));
    assert!(nbdinfo_query("--can", "read", &ro));
    // `ro` on one export leaves its neighbour writable.
    assert!(!nbdinfo_query("--is", "read-only", &s.uri_for("rw")));
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn global_read_only_flag_applies_to_every_export() {
    require!("nbdinfo");
    let s = Sluice::start(&["--read-only", "--export", "a=memory:1M", "--export", "b=null:1M"]);
    for name in ["a", "b"] {
        let (ok, out, err) = run("nbdinfo", &["--json", &s.uri_for(name)]);
        assert!(ok, "{err}");
        assert_eq!(json_values(&out, "is_read_only"), ["true"], "export {name}: {out}");
        assert_eq!(json_values(&out, "can_trim"), ["false"], "export {name}: {out}");
        assert_eq!(json_values(&out, "can_zero"), ["false"], "export {name}: {out}");
    }
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn list_shows_every_named_export_with_its_description_and_size() {
    require!("nbdinfo");
    let s = Sluice::start(&[
        "--export",
        "a=memory:1M",
        "--export",
        "b=null:2M,description=hello",
        "--export",
        "c=memory:3M,ro,description=with, a comma",
    ]);
    let (ok, out, err) = run("nbdinfo", &["--list", "--json", &s.uri()]);
    assert!(ok, "nbdinfo --list: {err}");
    assert_eq!(json_values(&out, "export-name"), ["a", "b", "c"], "{out}");
    assert_eq!(json_values(&out, "description"), ["hello", "with, a comma"], "{out}");
    assert_eq!(json_values(&out, "export-size"), ["1048576", "2097152", "3145728"], "{out}");
    assert_eq!(json_values(&out, "is_read_only"), ["false", "false", "true"], "{out}");

    // The human-readable list says the same.
    let (ok, text, err) = run("nbdinfo", &["--list", &s.uri()]);
    assert!(ok, "{err}");
    for line in ["export=\"a\":", "export=\"b\":", "export=\"c\":", "description: hello", "export-size: 2097152"] {
        assert!(text.contains(line), "missing {line:?} in:\n{text}");
    }
    assert_eq!(s.stop().code(), Some(0));
}

/// One line of `nbdinfo --map`: offset, length, type (bit 0 hole, bit 1 zero).
fn parse_map(text: &str) -> Vec<(u64, u64, u32)> {
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            assert!(f.len() >= 3, "odd map line {l:?}");
            (f[0].parse().unwrap(), f[1].parse().unwrap(), f[2].parse().unwrap())
        })
        .collect()
}

#[test]
fn map_of_a_sparse_file_shows_data_exactly_where_it_was_written() {
    require!("nbdinfo");
    use std::os::unix::fs::FileExt;
    const MIB: u64 = 1 << 20;
    let size = 8 * MIB;
    let data = [(MIB, 64 * 1024), (5 * MIB, MIB), (8 * MIB - 4096, 4096)];
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sparse.img");
    let f = std::fs::File::create(&path).unwrap();
    f.set_len(size).unwrap();
    for (i, &(off, len)) in data.iter().enumerate() {
        f.write_all_at(&pattern(len as usize, 10 + i as u64), off).unwrap();
    }
    f.sync_all().unwrap();
    drop(f);

    let s = Sluice::start(&[path.to_str().unwrap()]);
    let (ok, out, err) = run("nbdinfo", &["--map", &s.uri()]);
    assert!(ok, "nbdinfo --map: {err}");
    let map = parse_map(&out);
    let mut pos = 0;
    for &(off, len, _) in &map {
        assert_eq!(off, pos, "map has a gap or overlap:\n{out}");
        pos += len;
    }
    assert_eq!(pos, size, "map does not cover the export:\n{out}");
    // Page by page: data where written, hole+zero everywhere else.
    let written = |p: u64| data.iter().any(|&(o, l)| p >= o && p < o + l);
    for &(off, len, kind) in &map {
        for page in (off..off + len).step_by(4096) {
            let want = if written(page) { 0 } else { 3 };
            assert_eq!(kind, want, "page at {page} has type {kind}, expected {want}:\n{out}");
        }
    }
    // The JSON form carries the same extents.
    let (ok, json, err) = run("nbdinfo", &["--map", "--json", &s.uri()]);
    assert!(ok, "{err}");
    let lengths: Vec<u64> = json_values(&json, "length").iter().map(|v| v.parse().unwrap()).collect();
    assert_eq!(lengths, map.iter().map(|e| e.1).collect::<Vec<_>>(), "{json}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn json_output_reports_size_flags_and_block_sizes() {
    require!("nbdinfo");
    let s = Sluice::start(&["--export", "m=memory:5M,description=scratch space"]);
    let (ok, out, err) = run("nbdinfo", &["--json", &s.uri_for("m")]);
    assert!(ok, "{err}");
    assert_eq!(json_values(&out, "export-name"), ["m"], "{out}");
    assert_eq!(json_values(&out, "export-size"), ["5242880"], "{out}");
    assert_eq!(json_values(&out, "description"), ["scratch space"], "{out}");
    for flag in ["can_flush", "can_fua", "can_trim", "can_zero", "can_multi_conn", "can_df", "can_cache"] {
        assert_eq!(json_values(&out, flag), ["true"], "{flag} in {out}");
    }
    assert_eq!(json_values(&out, "is_read_only"), ["false"], "{out}");
    assert_eq!(json_values(&out, "structured"), ["true"], "{out}");
    assert_eq!(json_values(&out, "block_size_maximum"), ["33554432"], "{out}");
    let min: u64 = json_values(&out, "block_size_minimum")[0].parse().unwrap();
    let pref: u64 = json_values(&out, "block_size_preferred")[0].parse().unwrap();
    assert!(min >= 1 && min <= pref && pref <= 33554432, "block sizes out of order: {out}");
    assert!(out.contains("\"base:allocation\""), "base:allocation context missing: {out}");
    assert_eq!(s.stop().code(), Some(0));
}
