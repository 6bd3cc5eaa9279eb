//! A raid10 pool with a member dead: refused by info, copy and serve unless --degraded (the
//! refusal names the flag), told apart by `pool status --degraded`, served degraded, and
//! whole again once the member returns; a set with no member left is refused even so.
mod common;
use common::*;

use common::pool::{all_in_sync, states, Coordinator, Pool, MIB};

const MEMBER_DATA: u64 = 8 * MIB;

#[test]
fn a_pool_starts_degraded_only_when_asked_and_rebuilds_the_member_that_returns() {
    let mut p = Pool::raid10(MEMBER_DATA, "member-timeout = \"2s\"");
    p.members[1].kill();

    let (ok, out, err) = run(SLUICE, &["pool", "status", &p.spec]);
    assert!(ok && out.contains("assembly: refused") && out.contains("--degraded"), "pool status: {out}{err}");
    let (ok, out, err) = run(SLUICE, &["pool", "status", "--degraded", &p.spec]);
    assert!(ok && out.contains("assembly: possible, degraded"), "pool status --degraded: {out}{err}");

    let (ok, _, err) = run(SLUICE, &["info", &p.spec]);
    assert!(!ok && err.contains("cannot be reached") && err.contains("--degraded"), "info without --degraded: {err}");
    let (ok, out, err) = run(SLUICE, &["info", "--degraded", &p.spec]);
    assert!(ok && out.contains(&(2 * MEMBER_DATA).to_string()), "info --degraded: {out}{err}");
    assert!(err.contains("DEGRADED"), "a degraded start says so loudly: {err}");

    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src"), dir.path().join("back"));
    let data = pattern((2 * MEMBER_DATA) as usize, 26);
    write_file(&src, &data);
    let (ok, out, err) = run(SLUICE, &["copy", src.to_str().unwrap(), &p.spec]);
    assert!(!ok, "copy into a pool with a member dead, without --degraded: {out}");
    let (ok, out, err2) = run(SLUICE, &["copy", "--degraded", src.to_str().unwrap(), &p.spec]);
    assert!(ok, "copy --degraded: {out}{err}{err2}");

    // Served degraded (the export's own option), the member returns and is rebuilt.
    let c = Coordinator::start(p.dir.path(), &format!("{},degraded", p.spec));
    assert!(c.log_text().contains("DEGRADED"), "{}", c.log_text());
    p.members[1].start();
    p.wait_status("the returned member rebuilt", all_in_sync);
    let (ok, out, err) = run(SLUICE, &["copy", &c.uri(), back.to_str().unwrap()]);
    assert!(ok, "copy out of the served pool: {out}{err}");
    assert!(std::fs::read(&back).unwrap() == data, "the pool reads back other bytes than were written");
    c.stop_clean();
    let (a, b) = (p.members[0].data(), p.members[1].data());
    assert!(a == b, "the rebuilt member differs from its partner");
}

#[test]
fn a_set_with_no_member_left_is_refused_even_degraded() {
    let mut p = Pool::raid10(MEMBER_DATA, "member-timeout = \"2s\"");
    p.members[2].kill();
    p.members[3].kill();
    let (ok, out, err) = run(SLUICE, &["info", "--degraded", &p.spec]);
    assert!(!ok && err.contains("no member of set 1 is in sync"), "info --degraded with set 1 gone: {out}{err}");
    let (ok, out, _) = run(SLUICE, &["pool", "status", "--degraded", "--json", &p.spec]);
    assert!(ok, "{out}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["assembly"]["ok"], false, "{v}");
    assert_eq!(states(&v), ["in-sync", "in-sync", "missing", "missing"]);
}
