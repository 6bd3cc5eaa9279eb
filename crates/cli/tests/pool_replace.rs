//! `sluice pool replace`: a dead member replaced while no one serves the pool (rebuilt
//! there and then), a live one replaced under a serving coordinator (copied while it
//! serves, after the reload), one whose set partner dies during that copy, the pool file edited in place, every byte read back and the copies equal; and
//! the refusals (a stripe, the last copy of a set, a new member that belongs to a pool).
mod common;
use common::*;

use common::pool::{all_in_sync, Member, Pool, MIB};

const MEMBER_DATA: u64 = 8 * MIB;

/// Copies a pattern filling the pool in with `sluice copy`, and returns it.
fn fill(target: &str, seed: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let data = pattern((2 * MEMBER_DATA) as usize, seed);
    write_file(&src, &data);
    let (ok, out, err) = run(SLUICE, &["copy", src.to_str().unwrap(), target]);
    assert!(ok, "copy into {target}: {out}{err}");
    data
}

fn read_back(source: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("back");
    let (ok, out, err) = run(SLUICE, &["copy", source, back.to_str().unwrap()]);
    assert!(ok, "copy out of {source}: {out}{err}");
    std::fs::read(&back).unwrap()
}

fn pool_file(p: &Pool) -> std::path::PathBuf {
    std::path::PathBuf::from(p.spec.strip_prefix("pool:").unwrap())
}

#[test]
fn a_dead_member_is_replaced_and_rebuilt_when_no_one_serves_the_pool() {
    let mut p = Pool::raid10(MEMBER_DATA, "member-timeout = \"2s\"");
    let file = pool_file(&p);
    let text = format!("# rack 2's volume: keep this comment\n{}", std::fs::read_to_string(&file).unwrap());
    std::fs::write(&file, &text).unwrap();
    let data = fill(&p.spec, 31);
    p.members[1].kill();
    let new = Member::new(p.dir.path(), 9, MEMBER_DATA);
    let (old_uri, new_uri) = (p.members[1].uri(), new.uri());

    let (ok, out, err) = run(SLUICE, &["pool", "replace", &p.spec, &old_uri, &new_uri]);
    assert!(ok && out.contains("is in sync"), "pool replace: {out}{err}");
    let edited = std::fs::read_to_string(&file).unwrap();
    assert_eq!(edited, text.replace(&format!("{old_uri:?}"), &format!("{new_uri:?}")), "only the member's entry changes");
    let status = p.status();
    assert!(all_in_sync(&status), "{status}");
    assert!(read_back(&p.spec) == data, "the pool reads back other bytes after the replacement");
    assert!(p.members[0].data() == new.data(), "the new member differs from its partner");
}

#[test]
fn a_live_member_is_replaced_under_a_serving_coordinator_after_its_reload() {
    let p = Pool::raid10(MEMBER_DATA, "member-timeout = \"2s\"");
    let c = p.serve();
    let data = fill(&c.uri(), 32);
    let new = Member::new(p.dir.path(), 9, MEMBER_DATA);
    let (old_uri, new_uri) = (p.members[2].uri(), new.uri());

    let (ok, out, err) = run(SLUICE, &["pool", "replace", &p.spec, &old_uri, &new_uri]);
    assert!(ok && out.contains("reload that server"), "pool replace of a served pool: {out}{err}");
    signal(c.pid(), libc::SIGHUP);
    wait_until("the reload", std::time::Duration::from_secs(30), || c.log_text().contains("reloaded"), || c.log_text());
    assert!(c.log_text().contains("pool member 3 is now"), "{}", c.log_text());
    p.wait_status("the new member rebuilt", all_in_sync);
    let log = c.log_text();
    assert!(log.contains("is being replaced by") && log.contains(&format!("took {old_uri}'s place")), "the live member was not copied from: {log}");
    assert!(read_back(&c.uri()) == data, "the served pool reads back other bytes after the replacement");
    c.stop_clean();
    assert!(p.members[3].data() == new.data(), "the new member differs from its partner");
}

#[test]
fn replacements_that_would_lose_data_are_refused() {
    let mut p = Pool::raid10(MEMBER_DATA, "member-timeout = \"2s\"");
    let new = Member::new(p.dir.path(), 9, MEMBER_DATA);
    // The last in-sync copy of its set.
    p.members[1].kill();
    let (ok, out, err) = run(SLUICE, &["pool", "replace", &p.spec, &p.members[0].uri(), &new.uri()]);
    assert!(!ok && err.contains("no other member") && out.is_empty(), "{out}{err}");
    // A new member that belongs to a pool (here: to this one).
    let (ok, _, err) = run(SLUICE, &["pool", "replace", &p.spec, &p.members[1].uri(), &p.members[2].uri()]);
    assert!(!ok && err.contains("a member of the pool already"), "{err}");
    let other = Pool::raid10(MEMBER_DATA, "");
    let (ok, _, err) = run(SLUICE, &["pool", "replace", &p.spec, &p.members[1].uri(), &other.members[0].uri()]);
    assert!(!ok && err.contains("carries the metadata of pool") && err.contains("--force"), "{err}");

    // A stripe has nothing to rebuild from.
    let dir = tempfile::tempdir().unwrap();
    let mut members: Vec<Member> = (0..2).map(|i| Member::new(dir.path(), i, MEMBER_DATA)).collect();
    let file = dir.path().join("stripe.toml");
    let uris: Vec<String> = members.iter().map(|m| format!("{:?}", m.uri())).collect();
    std::fs::write(&file, format!("layout = \"stripe\"\nstripe-unit = \"64K\"\nmembers = [{}]\n", uris.join(", "))).unwrap();
    let spec = format!("pool:{}", file.display());
    let (ok, out, err) = run(SLUICE, &["pool", "init", &spec]);
    assert!(ok, "{out}{err}");
    members[1].kill();
    let (ok, _, err) = run(SLUICE, &["pool", "replace", &spec, &members[1].uri(), &new.uri()]);
    assert!(!ok && err.contains("a stripe keeps one copy"), "{err}");
    let before = std::fs::read_to_string(&file).unwrap();
    assert!(before.contains(&members[1].uri()), "a refused replacement leaves the pool file alone");
}

#[test]
fn a_live_member_keeps_serving_its_set_while_it_is_replaced() {
    // Member 2 is replaced while served, and its partner (member 3) dies during the copy:
    // member 2 goes on serving the set alone, writes reach it and the new member both, and
    // the new member takes its place in sync, so the set is never without a copy. The
    // partner comes back and is rebuilt. Nothing is lost, and the copies end equal.
    let mut p = Pool::raid10(MEMBER_DATA, "member-timeout = \"1s\"");
    let c = p.serve();
    let data = fill(&c.uri(), 33);
    let new = Member::new(p.dir.path(), 9, MEMBER_DATA);
    let (old_uri, new_uri) = (p.members[2].uri(), new.uri());
    let (ok, out, err) = run(SLUICE, &["pool", "replace", &p.spec, &old_uri, &new_uri]);
    assert!(ok && out.contains("reload that server"), "pool replace of a served pool: {out}{err}");

    // The copy cannot finish while the new member answers nothing.
    new.pause();
    signal(c.pid(), libc::SIGHUP);
    let limit = std::time::Duration::from_secs(60);
    wait_until("the copy to begin", limit, || c.log_text().contains("is being replaced by"), || c.log_text());
    p.members[3].kill();
    let partner_gone = || c.log_text().lines().any(|l| l.contains("pool member 3 (") && l.contains("declared missing"));
    wait_until("the partner declared missing", limit, partner_gone, || c.log_text());
    new.resume();
    assert!(read_back(&c.uri()) == data, "the set's old member did not serve it alone");
    let data = fill(&c.uri(), 34);
    let took = format!("took {old_uri}'s place, in sync");
    wait_until("the new member in its place", limit, || c.log_text().contains(&took), || c.log_text());
    assert!(read_back(&c.uri()) == data, "the new member in place, with the partner away, reads back other bytes");

    p.members[3].start();
    p.wait_status("the partner rebuilt and every copy in sync", |s| all_in_sync(s) && s["members"][2]["uri"] == new_uri.as_str());
    assert!(read_back(&c.uri()) == data, "the pool reads back other bytes after the replacement");
    c.stop_clean();
    assert!(p.members[3].data() == new.data(), "the new member differs from its partner");
}

#[test]
fn a_live_member_is_copied_from_when_no_one_serves_the_pool() {
    let p = Pool::raid10(MEMBER_DATA, "member-timeout = \"2s\"");
    let data = fill(&p.spec, 35);
    let new = Member::new(p.dir.path(), 9, MEMBER_DATA);
    let (old_uri, new_uri) = (p.members[0].uri(), new.uri());
    let (ok, out, err) = run(SLUICE, &["pool", "replace", &p.spec, &old_uri, &new_uri]);
    assert!(ok && out.contains("is in sync"), "pool replace: {out}{err}");
    assert!(err.contains(&format!("copying to {new_uri} while {old_uri} serves")), "the live member was not copied from: {err}");
    let status = p.status();
    assert!(all_in_sync(&status) && status["members"][0]["uri"] == new_uri.as_str(), "{status}");
    assert!(read_back(&p.spec) == data, "the pool reads back other bytes after the replacement");
    assert!(p.members[1].data() == new.data(), "the new member differs from its partner");
}
