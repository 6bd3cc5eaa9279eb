//! `sluice pool grow`: a served stripe (2 -> 4) and raid10 (4 -> 6) reshaped onto new
//! members with a fio write+verify load (sluice copy without fio) acknowledged mid-reshape,
//! the coordinator SIGKILLed twice and restarted, then every byte verified again, the size
//! grown and (raid10) the copies equal; a stripe grown where no one serves it; a mirror
//! given a third copy; the refusals; and a client reading past the size it negotiated.
mod common;
use common::*;

use common::pool::{all_in_sync, Coordinator, Member, Pool, MIB};
use sluice_client::{Client, Options, Uri};

const MEMBER_DATA: u64 = 16 * MIB;

fn copy(from: &str, to: &str) {
    let (ok, out, err) = run(SLUICE, &["copy", from, to]);
    assert!(ok, "copy {from} -> {to}: {out}{err}");
}

/// Writes a pattern over the first `len` bytes of `target` and returns it.
fn fill(target: &str, len: u64, seed: u64) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src");
    let data = pattern(len as usize, seed);
    write_file(&src, &data);
    copy(src.to_str().unwrap(), target);
    data
}

fn read_back(source: &str) -> Vec<u8> {
    let dir = tempfile::tempdir().unwrap();
    let back = dir.path().join("back");
    copy(source, back.to_str().unwrap());
    std::fs::read(&back).unwrap()
}

/// A pool file of `layout` over `n` new members, initialised.
fn pool(layout: &str, n: usize, extra: &str) -> Pool {
    let dir = tempfile::tempdir().unwrap();
    let members: Vec<Member> = (0..n).map(|i| Member::new(dir.path(), i, MEMBER_DATA)).collect();
    let uris: Vec<String> = members.iter().map(|m| format!("{:?}", m.uri())).collect();
    let file = dir.path().join("pool.toml");
    std::fs::write(&file, format!("# keep this comment\nlayout = \"{layout}\"\nmembers = [{}]\n{extra}\n", uris.join(", "))).unwrap();
    let spec = format!("pool:{}", file.display());
    let (ok, out, err) = run(SLUICE, &["pool", "init", &spec]);
    assert!(ok, "pool init: {out}{err}");
    Pool { members, spec, dir }
}

/// fio's write+verify job over the first `size` bytes (`verify_only`: check what the same
/// job wrote before); panics with fio's output when it fails.
fn fio(uri: &str, size: u64, verify_only: bool) {
    let (uri_arg, size_arg) = (format!("--uri={uri}"), format!("--size={size}"));
    let mut args = vec!["--name=grow", "--ioengine=nbd", &uri_arg, "--rw=randwrite", "--iodepth=16", &size_arg, "--bssplit=4k/50:64k/50"];
    args.extend(["--verify=crc32c", "--do_verify=1", "--verify_state_save=0", "--randrepeat=1"]);
    if verify_only {
        args.push("--verify_only");
    }
    let (ok, out, err) = run("fio", &args);
    let text = format!("{out}{err}");
    let bad = !ok || !text.contains("err= 0") || text.lines().any(|l| l.contains("verify:") || l.contains("bad magic"));
    assert!(!bad, "fio (verify_only: {verify_only}) on {uri} failed:\n{text}");
}

/// The load written while a reshape runs: fio's write+verify job when fio is installed,
/// else a pattern copied with `sluice copy`.
enum Load {
    Fio,
    Copy(Vec<u8>),
}

impl Load {
    fn write(uri: &str, size: u64) -> Load {
        if have("fio") {
            fio(uri, size, false);
            return Load::Fio;
        }
        eprintln!("SKIPPED fio load: fio is not installed; writing with sluice copy instead");
        Load::Copy(fill(uri, size, 42))
    }

    /// Checks that the volume at `uri` still holds what was written.
    fn check(&self, uri: &str, size: u64) {
        match self {
            Load::Fio => fio(uri, size, true),
            Load::Copy(data) => assert!(read_back(uri)[..data.len()] == data[..], "the volume lost acknowledged writes in the reshape"),
        }
    }
}

fn reshape_done_bytes(s: &serde_json::Value) -> Option<u64> {
    s["reshape"]["done_bytes"].as_u64()
}

/// Adds `count` members to a served pool (`sluice pool grow`, then SIGHUP), then kills
/// the coordinator twice mid-reshape, with a load written and acknowledged in between;
/// returns the last coordinator, the load and the old size.
fn grow_served_with_two_kills(p: &mut Pool, count: usize, flags: &[&str]) -> (Coordinator, Load, u64) {
    let mut c = p.serve();
    let before = p.status()["size"].as_u64().unwrap();
    fill(&c.uri(), before, 41);
    let first = p.members.len();
    for i in first..first + count {
        p.members.push(Member::new(p.dir.path(), i, MEMBER_DATA));
    }
    let added: Vec<String> = p.members[first..].iter().map(Member::uri).collect();
    let mut args = vec!["pool", "grow", &p.spec];
    args.extend(flags);
    args.push("--add");
    args.extend(added.iter().map(String::as_str));
    let (ok, out, err) = run(SLUICE, &args);
    assert!(ok && out.contains("reload that server"), "pool grow of a served pool: {out}{err}");
    let text = std::fs::read_to_string(p.spec.strip_prefix("pool:").unwrap()).unwrap();
    assert!(text.starts_with("# keep this comment\n") && added.iter().all(|a| text.contains(a.as_str())), "{text}");
    signal(c.pid(), libc::SIGHUP);
    wait_until("the reload", std::time::Duration::from_secs(30), || c.log_text().contains("reloaded"), || c.log_text());
    assert!(c.log_text().contains("pool grows by"), "{}", c.log_text());

    // Killed once the superblocks record progress, and again after a write acknowledged
    // mid-reshape: both must survive.
    let moved = p.wait_status("the reshape under way", |s| reshape_done_bytes(s).is_some_and(|d| d > 4 * MIB));
    let (ok, text, err) = run(SLUICE, &["pool", "status", &p.spec]);
    let line = format!("reshape:  {first} -> {} members, ", first + count);
    assert!(ok && text.contains(&line) && text.contains("moved"), "pool status during a reshape: {text}{err}");
    c.kill();
    let c2 = Coordinator::start(p.dir.path(), &p.spec);
    let load = Load::write(&c2.uri(), before);
    let at_kill = reshape_done_bytes(&moved).unwrap();
    let s = p.wait_status("the reshape going on", |s| reshape_done_bytes(s).is_some_and(|d| d > at_kill));
    assert!(reshape_done_bytes(&s).unwrap() < before, "the reshape ended before the second kill: {s}");
    let mut c2 = c2;
    c2.kill();
    c = Coordinator::start(p.dir.path(), &p.spec);
    (c, load, before)
}

#[test]
fn a_served_stripe_grows_from_two_to_four_members_through_two_coordinator_crashes() {
    let mut p = pool("stripe", 2, "stripe-unit = \"64K\"\nresync-rate = \"2M\"");
    let (c, load, before) = grow_served_with_two_kills(&mut p, 2, &["--served"]);
    let s = p.wait_status("the reshape done", |s| s["reshape"].is_null() && s["size"].as_u64() == Some(4 * MEMBER_DATA));
    assert!(all_in_sync(&s), "{s}");
    let back = read_back(&c.uri());
    assert_eq!(back.len() as u64, 4 * MEMBER_DATA, "a new connection sees the grown size");
    assert!(back[before as usize..].iter().all(|&b| b == 0), "the grown part does not read as zeros");
    load.check(&c.uri(), before);
    c.stop_clean();
}

#[test]
fn a_served_raid10_grows_from_four_to_six_members_through_two_coordinator_crashes() {
    let mut p = pool("raid10", 4, "stripe-unit = \"64K\"\nmember-timeout = \"2s\"\nresync-rate = \"2M\"");
    // No flag: the serving coordinator's lease tells the command to leave the work to it.
    let (c, load, before) = grow_served_with_two_kills(&mut p, 2, &[]);
    let s = p.wait_status("the reshape done", |s| s["reshape"].is_null() && s["size"].as_u64() == Some(3 * MEMBER_DATA) && all_in_sync(s));
    assert_eq!(s["members"].as_array().unwrap().len(), 6, "{s}");
    let back = read_back(&c.uri());
    assert_eq!(back.len() as u64, 3 * MEMBER_DATA, "a new connection sees the grown size");
    assert!(back[before as usize..].iter().all(|&b| b == 0), "the grown part does not read as zeros");
    load.check(&c.uri(), before);
    c.stop_clean();
    for set in 0..3 {
        assert!(p.members[2 * set].data() == p.members[2 * set + 1].data(), "the copies of set {set} differ");
    }
}

#[test]
fn a_stripe_no_one_serves_grows_here_with_offline() {
    let mut p = pool("stripe", 2, "stripe-unit = \"64K\"\nresync-rate = \"1G\"");
    let data = fill(&p.spec, 2 * MEMBER_DATA, 44);
    for i in 2..4 {
        p.members.push(Member::new(p.dir.path(), i, MEMBER_DATA));
    }
    let (a, b) = (p.members[2].uri(), p.members[3].uri());
    let (ok, out, err) = run(SLUICE, &["pool", "grow", &p.spec, "--offline", "--add", &a, &b]);
    assert!(ok && out.contains(&format!("the volume is {} bytes", 4 * MEMBER_DATA)), "pool grow --offline: {out}{err}");
    let s = p.status();
    assert!(s["reshape"].is_null() && s["members"].as_array().unwrap().len() == 4, "{s}");
    let back = read_back(&p.spec);
    assert!(back.len() as u64 == 4 * MEMBER_DATA && back[..data.len()] == data[..], "the grown stripe reads back other bytes");
    assert!(back[data.len()..].iter().all(|&b| b == 0), "the grown part does not read as zeros");
}

#[test]
fn a_mirror_gets_a_third_copy_when_no_one_serves_it() {
    let mut p = pool("mirror", 2, "resync-rate = \"1G\"");
    let data = fill(&p.spec, MEMBER_DATA, 43);
    p.members.push(Member::new(p.dir.path(), 2, MEMBER_DATA));
    let new = p.members[2].uri();
    let (ok, out, err) = run(SLUICE, &["pool", "grow", &p.spec, "--add", &new]);
    assert!(ok && out.contains("every member in sync"), "pool grow of a mirror: {out}{err}");
    let text = std::fs::read_to_string(p.spec.strip_prefix("pool:").unwrap()).unwrap();
    assert!(text.contains("copies = 3") && text.contains(&new) && text.starts_with("# keep this comment"), "{text}");
    let s = p.status();
    assert!(all_in_sync(&s) && s["copies"] == 3, "{s}");
    assert!(read_back(&p.spec) == data, "the mirror reads back other bytes");
    assert!(p.members[0].data() == p.members[2].data(), "the new copy differs from the first");
}

#[test]
fn a_served_mirror_gets_a_third_copy_after_its_reload() {
    let mut p = pool("mirror", 2, "resync-rate = \"1G\"");
    let c = p.serve();
    let data = fill(&c.uri(), MEMBER_DATA, 45);
    p.members.push(Member::new(p.dir.path(), 2, MEMBER_DATA));
    let (ok, out, err) = run(SLUICE, &["pool", "grow", &p.spec, "--add", &p.members[2].uri()]);
    assert!(ok && out.contains("reload that server"), "pool grow of a served mirror: {out}{err}");
    signal(c.pid(), libc::SIGHUP);
    wait_until("the reload", std::time::Duration::from_secs(30), || c.log_text().contains("reloaded"), || c.log_text());
    let s = p.wait_status("the third copy in sync", |s| s["copies"] == 3 && s["members"].as_array().unwrap().len() == 3 && all_in_sync(s));
    assert_eq!(s["size"].as_u64(), Some(MEMBER_DATA), "{s}");
    assert!(read_back(&c.uri()) == data, "the served mirror reads back other bytes");
    c.stop_clean();
    assert!(p.members[0].data() == p.members[2].data(), "the new copy differs from the first");
}

#[test]
fn grows_that_cannot_work_are_refused_before_anything_changes() {
    let p = pool("raid10", 4, "stripe-unit = \"64K\"");
    let file = p.spec.strip_prefix("pool:").unwrap().to_owned();
    let before = std::fs::read_to_string(&file).unwrap();
    let one = Member::new(p.dir.path(), 8, MEMBER_DATA);
    let (ok, _, err) = run(SLUICE, &["pool", "grow", &p.spec, "--add", &one.uri()]);
    assert!(!ok && err.contains("whole mirror sets"), "{err}");
    let small = Member::new(p.dir.path(), 9, MEMBER_DATA / 2);
    let (ok, _, err) = run(SLUICE, &["pool", "grow", &p.spec, "--add", &one.uri(), &small.uri()]);
    assert!(!ok && err.contains("needs"), "{err}");
    let (ok, _, err) = run(SLUICE, &["pool", "grow", &p.spec, "--add", &one.uri(), &p.members[0].uri()]);
    assert!(!ok && err.contains("listed twice"), "{err}");
    let stripe = pool("stripe", 2, "");
    let (ok, _, err) = run(SLUICE, &["pool", "grow", &stripe.spec, "--add", &one.uri()]);
    assert!(!ok && err.contains("--offline"), "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap(), before, "a refused grow leaves the pool file alone");
}

/// A pool client whose pool grew serves past the size it negotiated: an unaligned read there
/// (split into whole blocks) must bring the data, never what the caller's buffer held (the
/// client does not zero it first).
const GROWN_MEMBER_DATA: u64 = 4 * MIB;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unaligned_read_past_the_negotiated_size_of_a_grown_pool_returns_the_data() {
    let dir = tempfile::tempdir().unwrap();
    let mut members: Vec<Member> = (0..2).map(|i| Member::new(dir.path(), i, GROWN_MEMBER_DATA)).collect();
    let uris: Vec<String> = members.iter().map(|m| format!("{:?}", m.uri())).collect();
    let file = dir.path().join("pool.toml");
    let text = format!("layout = \"stripe\"\nstripe-unit = \"64K\"\nresync-rate = \"1G\"\nmembers = [{}]\n", uris.join(", "));
    std::fs::write(&file, text).unwrap();
    let spec = format!("pool:{}", file.display());
    let (ok, out, err) = run(SLUICE, &["pool", "init", &spec]);
    assert!(ok, "pool init: {out}{err}");

    let pool = Client::connect_with(&Uri::parse(&spec).unwrap(), &Options::default()).await.expect("open the pool");
    let old = pool.export().size;
    assert_eq!(old, 2 * GROWN_MEMBER_DATA);
    for i in 2..4 {
        members.push(Member::new(dir.path(), i, GROWN_MEMBER_DATA));
    }
    let added: Vec<Uri> = members[2..].iter().map(|m| Uri::parse(&m.uri()).unwrap()).collect();
    pool.grow_pool(&added).await.expect("grow the pool");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while pool.size() != 4 * GROWN_MEMBER_DATA {
        assert!(std::time::Instant::now() < deadline, "the reshape did not finish: size {}", pool.size());
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    assert_eq!(pool.export().size, old, "export() keeps the negotiated size");

    // Data in the grown part, written aligned (the fast path).
    pool.write(old, &[0x5a; 4096], false).await.expect("write past the old size");
    assert_eq!(pool.read_owned(old, vec![0; 4096]).await.unwrap(), vec![0x5a; 4096], "aligned read of the grown part");

    // Unaligned, crossing the old end: the tail must be the data, not the buffer's old bytes.
    let got = pool.read_owned(old - 100, vec![0xaa; 200]).await.expect("read across the old end");
    assert!(got[..100].iter().all(|&b| b == 0), "before the old end: {:?}", &got[..100]);
    assert!(got[100..].iter().all(|&b| b == 0x5a), "past the old end the read returned {:#x?} (0xaa: the buffer's old contents)", &got[100..110]);

    // Unaligned, wholly inside the grown part's first block: no piece is read at all.
    let got = pool.read_owned(old + 100, vec![0xaa; 100]).await.expect("read inside the grown part");
    assert!(got.iter().all(|&b| b == 0x5a), "inside the grown part the read returned {:#x?}", &got[..10]);
    pool.disconnect().await;
}
