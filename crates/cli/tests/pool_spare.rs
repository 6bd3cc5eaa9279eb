//! Hot spares: `sluice pool add-spare` checks and blanks a spare and lists it in the pool
//! file; a serving coordinator, reloaded, puts it in the place of a member missing for
//! `spare-after`, rebuilds it, and edits the pool file to say so; every byte reads back and
//! the copies are equal. And the refusals: a stripe, a member, a spare too small.
mod common;
use common::*;

use common::pool::{all_in_sync, Member, Pool, MIB};

const MEMBER_DATA: u64 = 8 * MIB;

fn pool_file(p: &Pool) -> std::path::PathBuf {
    std::path::PathBuf::from(p.spec.strip_prefix("pool:").unwrap())
}

fn copy(from: &str, to: &str) {
    let (ok, out, err) = run(SLUICE, &["copy", from, to]);
    assert!(ok, "copy {from} {to}: {out}{err}");
}

#[test]
fn a_spare_takes_the_place_of_a_member_missing_too_long() {
    let mut p = Pool::raid10(MEMBER_DATA, "member-timeout = \"1s\"\nspare-after = \"1s\"  # quick, for the test");
    let file = pool_file(&p);
    let c = p.serve();
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src"), dir.path().join("back"));
    let data = pattern((2 * MEMBER_DATA) as usize, 41);
    write_file(&src, &data);
    copy(src.to_str().unwrap(), &c.uri());

    let spare = Member::new(p.dir.path(), 9, MEMBER_DATA);
    let (ok, out, err) = run(SLUICE, &["pool", "add-spare", &p.spec, &spare.uri()]);
    assert!(ok && out.contains("reload it"), "pool add-spare of a served pool: {out}{err}");
    assert!(std::fs::read_to_string(&file).unwrap().contains(&format!("spares = [{:?}]", spare.uri())));
    signal(c.pid(), libc::SIGHUP);
    wait_until("the reload", std::time::Duration::from_secs(30), || c.log_text().contains("pool spares are now"), || c.log_text());

    let old = p.members[1].uri();
    p.members[1].kill();
    let status = p.wait_status("the spare in the dead member's place and rebuilt", |s| {
        all_in_sync(s) && s["members"][1]["uri"] == spare.uri().as_str()
    });
    assert_eq!(status["spares"].as_array().map(Vec::len), Some(0), "{status}");
    let text = std::fs::read_to_string(&file).unwrap();
    assert!(!text.contains(&old) && text.contains("# quick, for the test"), "the pool file, edited in place:\n{text}");
    assert!(c.log_text().contains(&format!("spare {} takes its place", spare.uri())), "{}", c.log_text());
    copy(&c.uri(), back.to_str().unwrap());
    assert!(std::fs::read(&back).unwrap() == data, "the pool reads back other bytes after the spare took over");
    c.stop_clean();
    assert!(p.members[0].data() == spare.data(), "the spare differs from its partner");
}

#[test]
fn spares_that_cannot_serve_are_refused() {
    let p = Pool::raid10(MEMBER_DATA, "");
    let small = Member::new(p.dir.path(), 8, MIB);
    let (ok, _, err) = run(SLUICE, &["pool", "add-spare", &p.spec, &small.uri()]);
    assert!(!ok && err.contains("needs"), "a spare too small: {err}");
    let (ok, _, err) = run(SLUICE, &["pool", "add-spare", &p.spec, &p.members[0].uri()]);
    assert!(!ok && err.contains("is a member"), "a member as a spare: {err}");
    assert!(!std::fs::read_to_string(pool_file(&p)).unwrap().contains("spares"), "a refused spare was written to the pool file");
    let spare = Member::new(p.dir.path(), 7, MEMBER_DATA);
    let (ok, out, err) = run(SLUICE, &["pool", "add-spare", &p.spec, &spare.uri()]);
    assert!(ok, "pool add-spare: {out}{err}");
    let (ok, _, err) = run(SLUICE, &["pool", "replace", &p.spec, &p.members[1].uri(), &spare.uri()]);
    assert!(!ok && err.contains("is a spare of the pool"), "a spare named as a replacement: {err}");

    let stripe = p.dir.path().join("stripe.toml");
    std::fs::write(&stripe, format!("layout = \"stripe\"\nmembers = [{:?}]\n", p.members[0].uri())).unwrap();
    let (ok, _, err) = run(SLUICE, &["pool", "add-spare", &format!("pool:{}", stripe.display()), &small.uri()]);
    assert!(!ok && err.contains("nothing to rebuild a spare from"), "a spare for a stripe: {err}");
}
