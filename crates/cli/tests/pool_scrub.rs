//! `sluice pool check` / `repair`: a byte flipped in one mirror member's file is found
//! (exactly that region and byte, exit status 1), repaired from the other copy, and a
//! second check finds nothing; the member files are then byte-equal. Also: a stripe has
//! nothing to compare, `--from` must name a member, the scrub's result is in `pool
//! status`, and a served pool is checked and repaired by its coordinator, reached through
//! its control socket (gone once it stops).
mod common;
use common::*;

use common::pool::{Member, MIB, META_BYTES};
use std::io::{Read, Seek, SeekFrom, Write};

const MEMBER_DATA: u64 = 8 * MIB;

/// A two-member mirror of file-backed members, initialized and filled with a pattern.
struct Mirror {
    members: Vec<Member>,
    spec: String,
    dir: tempfile::TempDir,
}

fn mirror(layout: &str) -> Mirror {
    let dir = tempfile::tempdir().unwrap();
    let members: Vec<Member> = (0..2).map(|i| Member::new(dir.path(), i, MEMBER_DATA)).collect();
    let uris: Vec<String> = members.iter().map(|m| format!("{:?}", m.uri())).collect();
    let text = format!("layout = {layout:?}\nmembers = [{}]\nmember-timeout = \"2s\"\nscrub-interval = \"7d\"\n", uris.join(", "));
    let file = dir.path().join("pool.toml");
    std::fs::write(&file, text).unwrap();
    let spec = format!("pool:{}", file.display());
    let (ok, out, err) = run(SLUICE, &["pool", "init", &spec]);
    assert!(ok, "pool init: {out}{err}");
    let src = dir.path().join("src");
    write_file(&src, &pattern(MEMBER_DATA as usize, 77));
    let (ok, out, err) = run(SLUICE, &["copy", src.to_str().unwrap(), &spec]);
    assert!(ok, "copy into the pool: {out}{err}");
    Mirror { members, spec, dir }
}

/// Flips every bit of the data byte at `at` in a member's backing file, behind the pool.
fn flip(m: &Member, at: u64) {
    let mut f = std::fs::OpenOptions::new().read(true).write(true).open(&m.file).unwrap();
    let mut b = [0u8];
    f.seek(SeekFrom::Start(META_BYTES + at)).unwrap();
    f.read_exact(&mut b).unwrap();
    f.seek(SeekFrom::Start(META_BYTES + at)).unwrap();
    f.write_all(&[!b[0]]).unwrap();
    f.sync_all().unwrap();
}

/// Runs `sluice ARGS` and returns its exit code, stdout and stderr.
fn sluice(args: &[&str]) -> (i32, String, String) {
    let out = output(std::process::Command::new(SLUICE).args(args));
    (out.status.code().unwrap_or(-1), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn a_flipped_byte_is_found_repaired_and_gone() {
    let p = mirror("mirror");
    let at = 5 * MIB + 123;
    flip(&p.members[1], at);

    let (code, out, err) = sluice(&["pool", "check", &p.spec]);
    assert_eq!(code, 1, "check of diverged copies: {out}{err}");
    assert!(out.contains("mismatched regions: 1\n"), "{out}");
    assert!(out.contains(&format!("set 0 member data bytes {at}..{}", at + 1)), "{out}");
    assert!(err.contains("pool check:"), "no progress line on stderr: {err}");

    let (code, out, err) = sluice(&["pool", "check", "--json", &p.spec]);
    assert_eq!(code, 1, "{out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}"));
    assert_eq!((v["kind"].as_str(), v["mismatched_regions"].as_u64()), (Some("check"), Some(1)), "{v}");
    assert_eq!((v["ranges"][0]["start"].as_u64(), v["ranges"][0]["end"].as_u64()), (Some(at), Some(at + 1)), "{v}");

    let (code, out, err) = sluice(&["pool", "repair", &p.spec]);
    assert_eq!(code, 0, "repair: {out}{err}");
    assert!(out.contains("repaired regions: 1\n"), "{out}");

    let (code, out, err) = sluice(&["pool", "check", &p.spec]);
    assert_eq!(code, 0, "check after the repair: {out}{err}");
    assert!(out.contains("mismatched regions: 0\n"), "{out}");
    assert!(p.members[0].data() == p.members[1].data(), "the member files differ after the repair");
    assert!(p.members[0].data() == pattern(MEMBER_DATA as usize, 77), "the repair did not keep the first copy's bytes");

    // The last scrub is recorded in the superblocks: status shows it without assembling.
    let (code, out, err) = sluice(&["pool", "status", "--json", &p.spec]);
    assert_eq!(code, 0, "{out}{err}");
    let s: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((s["scrub"]["kind"].as_str(), s["scrub"]["mismatched_regions"].as_u64()), (Some("check"), Some(0)), "{s}");
    assert!(s["scrub"]["finished_unix_ms"].as_u64().unwrap_or(0) > 1_600_000_000_000, "{s}");
}

#[test]
fn repair_from_a_named_copy_and_the_refusals() {
    let p = mirror("mirror");
    flip(&p.members[0], 3 * MIB);
    let stranger = "nbd+unix:///?socket=/nonexistent.sock";
    let (code, out, err) = sluice(&["pool", "repair", "--from", stranger, &p.spec]);
    assert_ne!(code, 0, "{out}{err}");
    assert!(err.contains("is not a member of the pool"), "{err}");

    let from = p.members[0].uri();
    let (code, out, err) = sluice(&["pool", "repair", "--from", &from, &p.spec]);
    assert_eq!(code, 0, "repair --from: {out}{err}");
    assert!(p.members[0].data() == p.members[1].data(), "the copies differ after repair --from");
    assert!(p.members[0].data() != pattern(MEMBER_DATA as usize, 77), "--from's (flipped) copy was not the source");

    let dir = tempfile::tempdir().unwrap();
    let m = Member::new(dir.path(), 5, MEMBER_DATA);
    let file = dir.path().join("stripe.toml");
    std::fs::write(&file, format!("layout = \"stripe\"\nmembers = [{:?}]\n", m.uri())).unwrap();
    let spec = format!("pool:{}", file.display());
    assert!(run(SLUICE, &["pool", "init", &spec]).0);
    let (code, out, err) = sluice(&["pool", "check", &spec]);
    assert_eq!(code, 2, "check of a stripe: {out}{err}");
    assert!(err.contains("nothing to compare"), "{err}");
    drop(p.dir);
}

#[test]
fn a_served_pool_is_checked_and_repaired_by_its_coordinator() {
    let p = mirror("mirror");
    let at = 6 * MIB + 4095;
    flip(&p.members[0], at);
    let c = common::pool::Coordinator::start(p.dir.path(), &p.spec);
    let (code, out, err) = sluice(&["pool", "check", "--json", &p.spec]);
    assert_eq!(code, 1, "check through the coordinator: {out}{err}\n{}", c.log_text());
    let v: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("bad JSON ({e}): {out}"));
    assert_eq!(v["mismatched_regions"].as_u64(), Some(1), "{v}");
    assert_eq!((v["ranges"][0]["start"].as_u64(), v["ranges"][0]["end"].as_u64()), (Some(at), Some(at + 1)), "{v}");
    assert!(c.log_text().contains("scrub: check ended: 1 mismatched region(s)"), "the coordinator did not run it: {}", c.log_text());

    let (code, out, err) = sluice(&["pool", "repair", "--from", &p.members[1].uri(), &p.spec]);
    assert_eq!(code, 0, "repair through the coordinator: {out}{err}\n{}", c.log_text());
    let (code, out, err) = sluice(&["pool", "check", &p.spec]);
    assert_eq!(code, 0, "check after the repair: {out}{err}");
    // pool status asks the serving coordinator (and its record is in the superblocks).
    let s = wait_scrub_record(&p.spec);
    assert_eq!(s["scrub"]["kind"].as_str(), Some("check"), "{s}");
    assert_eq!(s["scrubs_completed"].as_u64(), Some(3), "pool status does not ask the serving coordinator: {s}");
    let id = s["pool_id"].as_str().unwrap().to_owned();
    let socket = c.log_text().lines().find_map(|l| l.split_once(&format!("pool {id}: control socket ")).map(|(_, p)| p.trim().to_owned()));
    let socket = socket.unwrap_or_else(|| panic!("the log does not name the control socket: {}", c.log_text()));
    assert!(std::path::Path::new(&socket).exists(), "{socket} is not there while the pool is served");
    hostile_requests_get_errors(&socket);
    let status = ask(&socket, b"{\"op\":\"status\"}\n");
    assert!(status.contains("\"scrubs_completed\":3"), "{status}");
    c.stop_clean();
    assert!(!std::path::Path::new(&socket).exists(), "{socket} is left after the server stopped");
    assert!(p.members[0].data() == p.members[1].data(), "the member files differ after the repair");
    assert!(p.members[0].data() == pattern(MEMBER_DATA as usize, 77), "--from's copy was not the source");
}

/// One request on the control socket; everything it answers until it closes (bounded).
fn ask(socket: &str, request: &[u8]) -> String {
    let mut s = std::os::unix::net::UnixStream::connect(socket).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(20))).unwrap();
    let _ = s.write_all(request);
    // Done asking: a request without its newline then meets the end of the stream.
    let _ = s.shutdown(std::net::Shutdown::Write);
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// Junk, an over-long line, an unknown op, a bad source: clear errors, and the coordinator
/// goes on serving.
fn hostile_requests_get_errors(socket: &str) {
    let long = format!("{{\"op\":\"check\",\"pad\":\"{}\"}}\n", "x".repeat(10_000));
    let cases: [(&[u8], &str); 5] = [
        (b"hello\n", "not JSON"),
        (long.as_bytes(), "one line of at most 4096 bytes"),
        (b"{\"op\":\"format\"}\n", "must be"),
        (b"{\"op\":\"repair\",\"from\":\"nbd://nowhere/x\"}\n", "is not a member"),
        (b"{\"op\":\"check\"", "one line"),
    ];
    for (request, want) in cases {
        let got = ask(socket, request);
        assert!(got.starts_with("{\"error\":") && got.contains(want), "{:?} got {got:?}", String::from_utf8_lossy(&request[..request.len().min(40)]));
    }
}

/// `pool status --json` once it shows a completed check in the superblocks.
fn wait_scrub_record(spec: &str) -> serde_json::Value {
    common::pool::wait_for("the scrub record in the superblocks", || {
        let (code, out, err) = sluice(&["pool", "status", "--json", spec]);
        let s: serde_json::Value = serde_json::from_str(&out).map_err(|e| format!("{code} {e}: {out}{err}"))?;
        match s["scrub"]["kind"].as_str() {
            Some("check") => Ok(s),
            _ => Err(s.to_string()),
        }
    })
}
