//! The driver with a backing and members in memory (the pool's `Fake`): requests go
//! through the task, hits count once fills are done, and a member that fails is dropped,
//! connected again after its backoff, and never serves what it held before.

use super::driver::CacheDriver;
use super::status::Status;
use crate::connection::Outcome;
use crate::pool::fake::Fake;
use crate::uri::Uri;
use sluice_proto::wire::*;
use std::io::IoSlice;
use std::path::Path;
use std::time::Duration;

const BLOCK: u64 = 4096;
/// 16 blocks, spread over both members.
const RANGE: usize = 64 << 10;
/// Longest wait for the task to do something on its own (a fill, a reconnection after the
/// first 250 ms backoff); it takes milliseconds.
const SETTLE: Duration = Duration::from_secs(10);

fn backing_uri() -> Uri {
    Uri::parse("nbd://disk/vol").unwrap()
}

fn pattern(seed: u8) -> Vec<u8> {
    (0..RANGE).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
}

async fn read(d: &CacheDriver<Fake>, offset: u64, len: usize) -> Vec<u8> {
    match d.call(CMD_READ, 0, offset, len as u32, &[], vec![vec![0; len]]).await.expect("a read") {
        Outcome::Read(mut bufs) => bufs.remove(0),
        _ => panic!("a read answered without data"),
    }
}

async fn write(d: &CacheDriver<Fake>, offset: u64, data: &[u8]) {
    d.call(CMD_WRITE, CMD_FLAG_FUA, offset, data.len() as u32, &[IoSlice::new(data)], Vec::new()).await.expect("a write");
}

/// Waits (bounded) until the status satisfies `done`.
async fn wait(d: &CacheDriver<Fake>, what: &str, done: impl Fn(&Status) -> bool) -> Status {
    let deadline = tokio::time::Instant::now() + SETTLE;
    loop {
        let s = d.status().await.expect("the task answers");
        if done(&s) {
            return s;
        }
        assert!(tokio::time::Instant::now() < deadline, "waited {SETTLE:?} for {what}: {s:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

/// A volume of 4 KiB blocks (prefetch off) over two members in memory listening at
/// `nbd://{name}-a/ram` and `-b`, with a backing of 1 MiB in memory; both members up.
async fn two_members(name: &str) -> (Vec<Uri>, Vec<Fake>, Fake, CacheDriver<Fake>) {
    let uris: Vec<Uri> = ["a", "b"].iter().map(|m| Uri::parse(&format!("nbd://{name}-{m}/ram")).unwrap()).collect();
    let members: Vec<Fake> = uris.iter().map(|_| Fake::new(32 * BLOCK, true, true, true)).collect();
    for (m, u) in members.iter().zip(&uris) {
        m.listen(&u.to_string());
    }
    let names: Vec<String> = uris.iter().map(|u| format!("{:?}", u.to_string())).collect();
    let text = format!("backing = \"nbd://disk/vol\"\nmembers = [{}]\nblock = \"4K\"\nprefetch = \"off\"\n", names.join(", "));
    let config = sluice_cache::config::parse(&text).unwrap();
    let backing = Fake::new(1 << 20, true, true, true);
    let d = CacheDriver::start(Path::new("test.toml"), config, backing.clone(), &backing_uri(), uris.clone(), ());
    wait(&d, "both members up", |s| s.members.iter().all(|m| m.up && m.slots == 32)).await;
    (uris, members, backing, d)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hits_count_and_a_failed_member_comes_back_empty() {
    let (uris, members, backing, d) = two_members("cache-test").await;

    let first = pattern(1);
    write(&d, 0, &first).await;
    assert_eq!(backing.bytes(0, RANGE), first, "the write reached the backing before its answer");
    assert_eq!(read(&d, 0, RANGE).await, first);
    wait(&d, "the misses filled", |s| s.counters.fills == 16).await;
    assert_eq!(read(&d, 0, RANGE).await, first);
    let s = d.status().await.unwrap();
    assert_eq!((s.counters.hits, s.counters.misses, s.block_bytes), (16, 16, BLOCK));

    // Both members fail their next operation: the read is served from the backing, and
    // they come back (empty, though their memory still holds the old slots).
    members.iter().for_each(Fake::fail_next);
    assert_eq!(read(&d, 0, RANGE).await, first);
    wait(&d, "the members dropped", |s| s.counters.member_failures == 2).await;
    wait(&d, "the members back", |s| s.members.iter().all(|m| m.up && m.used == 0)).await;
    let second = pattern(2);
    write(&d, 0, &second).await;
    assert_eq!(read(&d, 0, RANGE).await, second);
    assert_eq!(read(&d, 0, RANGE).await, second, "no slot from before the failure is read");

    // NBD_CMD_CACHE fills a range not read yet; reading it then hits.
    let hits = d.status().await.unwrap().counters.hits;
    d.call(CMD_CACHE, 0, 256 << 10, 8 * BLOCK as u32, &[], Vec::new()).await.expect("the hint");
    assert_eq!(read(&d, 256 << 10, 8 * BLOCK as usize).await, vec![0; 8 * BLOCK as usize]);
    assert_eq!(d.status().await.unwrap().counters.hits, hits + 8);
    d.disconnect().await;
    assert!(d.status().await.is_none(), "the task stopped");
    for u in &uris {
        Fake::unlisten(&u.to_string());
    }
}

/// A volume with one member at `uri` (a fake listening there when `member` is given, else
/// nothing) and a backing of 1 MiB in memory.
fn one_member(uri: &str, member: Option<&Fake>, backing: &Fake) -> (Uri, CacheDriver<Fake>) {
    let uri = Uri::parse(uri).unwrap();
    if let Some(m) = member {
        m.listen(&uri.to_string());
    }
    let text = format!("backing = \"nbd://disk/vol\"\nmembers = [{:?}]\nblock = \"4K\"\nprefetch = \"off\"\n", uri.to_string());
    let config = sluice_cache::config::parse(&text).unwrap();
    let d = CacheDriver::start(Path::new("test.toml"), config, backing.clone(), &backing_uri(), vec![uri.clone()], ());
    (uri, d)
}

fn small_fake() -> Fake {
    Fake::new(32 * BLOCK, true, true, true)
}

/// A member that cannot be reached is retried with backoff; once the volume is
/// disconnected, no retry is made (a sleeping reconnection would otherwise wake after the
/// stop and connect to the member for nothing).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_member_is_connected_after_the_stop() {
    let (uri, d) = one_member("nbd://cache-test-gone/ram", None, &Fake::new(1 << 20, true, true, true));
    wait(&d, "the member's first connection refused", |s| s.members[0].failures >= 1).await;
    d.disconnect().await;
    let tried = Fake::connects(&uri.to_string());
    // The first retry comes 250 ms after the first refusal, the next 500 ms later.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    assert_eq!(Fake::connects(&uri.to_string()), tried, "a member was connected again after the stop");
}

/// A backing operation whose task panics fails its request (it would wait for ever, and
/// hold up the stop), and the volume goes on serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backing_operation_that_panics_fails_its_request() {
    // The member never answers: every read goes to the backing.
    let backing = Fake::new(1 << 20, true, true, true);
    let (_, d) = one_member("nbd://cache-test-absent/ram", None, &backing);
    backing.panic_next();
    let r = tokio::time::timeout(SETTLE, d.call(CMD_READ, 0, 0, BLOCK as u32, &[], vec![vec![0; BLOCK as usize]])).await;
    assert!(matches!(r, Ok(Err(crate::error::Error::Server { errno: 5, .. }))), "the read was not failed: {:?}", r.map(|r| r.map(|_| ())));
    assert_eq!(read(&d, 0, BLOCK as usize).await, vec![0; BLOCK as usize]);
    tokio::time::timeout(SETTLE, d.disconnect()).await.expect("the stop is not held up");
}

/// A member that never takes its goodbye (stalled, its socket full) holds up the stop for
/// the member timeout at most: `sluice copy` would otherwise never exit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_member_does_not_hold_up_the_stop() {
    let member = small_fake();
    let (uri, d) = one_member("nbd://cache-test-stalled/ram", Some(&member), &Fake::new(1 << 20, true, true, true));
    wait(&d, "the member up", |s| s.members[0].up).await;
    member.stall_disconnect();
    let limit = Duration::from_millis(sluice_cache::limits::MEMBER_TIMEOUT_DEFAULT_MS) + SETTLE;
    tokio::time::timeout(limit, d.disconnect()).await.expect("the stop waited on the stalled member");
    Fake::unlisten(&uri.to_string());
}

/// A member dropped while stalled (its goodbye never taken) is let go after the member
/// timeout, not held for as long as it stalls, once for every time it failed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dropped_member_is_let_go_though_it_never_takes_the_goodbye() {
    let member = small_fake();
    let (uri, d) = one_member("nbd://cache-test-dropped/ram", Some(&member), &Fake::new(1 << 20, true, true, true));
    wait(&d, "the member up", |s| s.members[0].up).await;
    // The test's, the listener's and the driver's.
    assert_eq!(member.handles(), 3);
    member.stall_disconnect();
    member.fail_next();
    read(&d, 0, BLOCK as usize).await;
    wait(&d, "the member dropped", |s| s.counters.member_failures == 1).await;
    wait(&d, "the member back", |s| s.members[0].up).await;
    let limit = Duration::from_millis(sluice_cache::limits::MEMBER_TIMEOUT_DEFAULT_MS) + SETTLE;
    let deadline = tokio::time::Instant::now() + limit;
    while member.handles() > 3 {
        assert!(tokio::time::Instant::now() < deadline, "the old connection is still held after {limit:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Fake::unlisten(&uri.to_string());
}

/// A carrier that holds the member operations it is offered, as a worker's connections
/// would until their answers come, and hands back (and counts) any of the backing's,
/// which come as the member after the last.
#[derive(Default)]
struct Holding {
    held: Vec<crate::carry::Carried>,
    members: usize,
    backing_offered: usize,
}

impl crate::carry::Carrier for Holding {
    fn carry(&mut self, op: crate::carry::Carried) -> Result<(), crate::carry::Carried> {
        if op.member >= self.members {
            self.backing_offered += 1;
            return Err(op);
        }
        self.held.push(op);
        Ok(())
    }
}

type Answer = tokio::sync::oneshot::Receiver<Result<Vec<Vec<u8>>, crate::error::Error>>;

fn submit_read(direct: &crate::carry::Direct, carrier: &mut Holding, offset: u64, len: u32) -> Answer {
    let (tx, rx) = tokio::sync::oneshot::channel();
    direct.submit(carrier, CMD_READ, 0, offset, len, None, Box::new(move |r| drop(tx.send(r)))).expect("the request is taken");
    rx
}

async fn answered(rx: Answer) -> Vec<u8> {
    match tokio::time::timeout(SETTLE, rx).await {
        Ok(Ok(Ok(pieces))) => pieces.concat(),
        other => panic!("the read was not answered well: {other:?}"),
    }
}

/// A served cache's worker carries its hits: each hit's member read is offered to the
/// carrier, and what the carrier finishes answers the request; a read of the backing is
/// not. A hit the carrier drops
/// unfinished (its worker stopped) is read again by a task; one that fails drops its
/// member, and the carrier is told to cut its connections to that member, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_carrier_reads_the_hits_and_hears_when_a_member_is_cut() {
    let (uris, members, _, d) = two_members("cache-carry").await;
    let direct = d.direct();
    let cuts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let told = cuts.clone();
    direct.on_cut(Box::new(move |m| told.lock().unwrap().push(m)));

    let data = pattern(5);
    write(&d, 0, &data).await;
    assert_eq!(read(&d, 0, RANGE).await, data);
    wait(&d, "the misses filled", |s| s.counters.fills == 16).await;

    // Every block hits: 16 member reads offered. Half are carried out here, half dropped.
    let mut carrier = Holding { members: 2, ..Holding::default() };
    let rx = submit_read(&direct, &mut carrier, 0, RANGE as u32);
    assert_eq!(carrier.held.len(), 16, "one member read per block");
    let held = std::mem::take(&mut carrier.held);
    for (i, op) in held.into_iter().enumerate() {
        match (i % 2, &op.cmd) {
            (0, crate::carry::Cmd::Read { offset, len }) => {
                let bytes = members[op.member].bytes(*offset, *len);
                op.finish(&mut carrier, Ok(Some(bytes)));
            }
            (0, _) => panic!("a hit offered something but a read"),
            _ => drop(op),
        }
    }
    assert!(carrier.held.is_empty(), "a finished hit started more member reads");
    assert_eq!(answered(rx).await, data, "the carried and re-read hits");
    assert_eq!(d.status().await.unwrap().counters.hits, 16);
    assert!(cuts.lock().unwrap().is_empty(), "a member was cut: {:?}", cuts.lock().unwrap());

    // A carried hit that fails: its member is dropped and cut; the read still answers.
    let rx = submit_read(&direct, &mut carrier, 0, BLOCK as u32);
    let op = carrier.held.pop().expect("the hit's member read");
    let member = op.member;
    op.finish(&mut carrier, Err(crate::error::Error::Protocol("member says no".into())));
    assert_eq!(carrier.backing_offered, 0, "the backing's read goes the cache's own way");
    assert_eq!(answered(rx).await, data[..BLOCK as usize], "a failed hit is read from the backing");
    assert_eq!(*cuts.lock().unwrap(), vec![member], "the failed member is cut once");
    d.disconnect().await;
    for u in &uris {
        Fake::unlisten(&u.to_string());
    }
}
