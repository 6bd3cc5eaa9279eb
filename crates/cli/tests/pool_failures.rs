//! A raid10 pool served by `sluice serve --export vol=pool:FILE` through failures: a member
//! killed during writes (no write fails; it gets back only what it missed, also while new
//! writes arrive), a coordinator killed during writes or while a member is missing (its
//! successor reads back every acknowledged write and reconciles the copies), a stalled
//! member (declared missing after the timeout; the pool goes on), and a second coordinator
//! (refused, naming the owner). Writes come from the client library, which records which
//! ones were acknowledged. Where a member returns, its partner is killed at the end and
//! everything is read back from the returned copy.
mod common;
use common::pool::*;
use common::*;

use sluice_client::{Client, Error};
use std::ops::Range;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

/// Each member's data: 4 write-intent regions of 4 MiB; two mirror sets make 32 MiB.
const MEMBER_DATA: u64 = 16 * MIB;
const VOLUME: u64 = 2 * MEMBER_DATA;
/// One write: a whole stripe unit, so every write lands in one mirror set.
const BLOCK: u64 = 64 * 1024;
const BLOCKS: u64 = VOLUME / BLOCK;
/// Writes in flight at once.
const DEPTH: usize = 8;
/// The first 8 MiB of the volume: 4 MiB of each mirror set, one region of each member.
const AREA: Range<u64> = 0..8 * MIB / BLOCK;

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build().unwrap()
}

/// What round `seed` writes to `block`: different for every block and every round.
fn block_data(seed: u64, block: u64) -> Vec<u8> {
    pattern(BLOCK as usize, seed << 32 | block)
}

fn block_range(block: u64) -> Range<usize> {
    (block * BLOCK) as usize..((block + 1) * BLOCK) as usize
}

/// Writes round `seed` to `blocks` in order, `DEPTH` at a time, telling `acks` about each
/// acknowledged one. Sends nothing new after the first failure. Returns every block sent
/// with its outcome.
async fn write_blocks(client: Client, blocks: Range<u64>, seed: u64, acks: Option<mpsc::Sender<u64>>) -> Vec<(u64, Result<(), Error>)> {
    let mut in_flight = tokio::task::JoinSet::new();
    let (mut next, mut failed, mut outcomes) = (blocks.start, false, Vec::new());
    loop {
        while !failed && in_flight.len() < DEPTH && next < blocks.end {
            let (c, b) = (client.clone(), next);
            in_flight.spawn(async move { (b, c.write(b * BLOCK, &block_data(seed, b), false).await) });
            next += 1;
        }
        let Some(done) = in_flight.join_next().await else { break };
        let (b, result) = done.expect("a write task panicked");
        match (&result, &acks) {
            (Ok(()), Some(tx)) => drop(tx.send(b)),
            (Ok(()), None) => {}
            (Err(_), _) => failed = true,
        }
        outcomes.push((b, result));
    }
    outcomes
}

/// A served pool, a library client on it, and what the volume should hold. Fields drop
/// in order: the server goes before its members.
struct Served {
    vol: Coordinator,
    pool: Pool,
    rt: tokio::runtime::Runtime,
    client: Client,
    shadow: Vec<u8>,
}

impl Served {
    /// The pool served, with the whole volume written once (round 1) and flushed.
    fn new(extra: &str) -> Served {
        let pool = Pool::raid10(MEMBER_DATA, extra);
        let vol = pool.serve();
        let rt = runtime();
        let client = rt.block_on(Client::connect(&vol.uri())).expect("connect to the served pool");
        assert_eq!(client.size(), VOLUME);
        let mut s = Served { vol, pool, rt, client, shadow: vec![0; VOLUME as usize] };
        s.write(0..BLOCKS, 1);
        s.rt.block_on(s.client.flush()).expect("flush");
        s
    }

    /// Writes round `seed` to `blocks`, every write acknowledged, and records it.
    fn write(&mut self, blocks: Range<u64>, seed: u64) {
        let outcomes = self.rt.block_on(write_blocks(self.client.clone(), blocks, seed, None));
        self.record(outcomes, seed);
    }

    /// Records writes that must all have been acknowledged.
    fn record(&mut self, outcomes: Vec<(u64, Result<(), Error>)>, seed: u64) {
        for (b, result) in outcomes {
            result.unwrap_or_else(|e| panic!("the write of round {seed} to block {b} failed although a copy was in sync: {e}"));
            self.shadow[block_range(b)].copy_from_slice(&block_data(seed, b));
        }
    }

    /// The whole volume, read through the server 1 MiB at a time.
    fn read(&self) -> Vec<u8> {
        self.rt.block_on(async {
            let mut volume = Vec::with_capacity(VOLUME as usize);
            for at in (0..VOLUME).step_by(MIB as usize) {
                let got = self.client.read_owned(at, vec![0; MIB as usize]).await;
                volume.extend(got.unwrap_or_else(|e| panic!("reading the volume at {at} failed: {e}")));
            }
            volume
        })
    }

    /// The volume reads back what was written.
    fn check(&self, what: &str) {
        let got = self.read();
        if let Some(i) = got.iter().zip(&self.shadow).position(|(a, b)| a != b) {
            panic!("{what}: first difference at byte {i} (block {})", i as u64 / BLOCK);
        }
    }

    fn wait_clean(&self, what: &str) {
        self.pool.wait_status(what, |s| all_in_sync(s) && s["dirty_regions"] == 0);
    }

    fn wait_state(&self, member: usize, state: &str) -> serde_json::Value {
        self.pool.wait_status(&format!("member {member} {state}"), |s| states(s)[member] == state)
    }

    /// Kills `member`, then checks the volume: the other copy of its set serves alone.
    fn kill_and_check(&mut self, member: usize, what: &str) {
        self.pool.members[member].kill();
        self.check(what);
    }

    /// Each mirror set's two copies hold the same bytes.
    fn assert_copies_agree(&self, when: &str) {
        for (a, b) in [(0, 1), (2, 3)] {
            assert!(self.pool.members[a].data() == self.pool.members[b].data(), "members {a} and {b} differ {when}");
        }
    }

    /// SIGKILL to the server: its client's requests fail, and the pool stays owned.
    fn kill_coordinator(&mut self) {
        self.vol.kill();
    }

    /// Serves the pool again: the new server waits out the dead one's lease, takes over
    /// and reconciles.
    fn serve_again(&mut self) {
        self.vol = self.pool.serve();
        self.client = self.rt.block_on(Client::connect(&self.vol.uri())).expect("connect to the successor");
    }

    fn finish(self) {
        self.rt.block_on(self.client.disconnect());
        self.vol.stop_clean();
    }
}

#[test]
fn a_member_killed_during_writes_costs_no_write_and_gets_back_only_what_it_missed() {
    let mut s = Served::new("");
    // Once every region is clean, the bitmap names only what is written from here on.
    s.wait_clean("every region cleaned after the first round");

    // Member 1 (mirror set 0, with member 0) dies after 32 of AREA's 128 writes are
    // acknowledged, with more in flight.
    let (tx, rx) = mpsc::channel();
    let writer = s.rt.spawn(write_blocks(s.client.clone(), AREA, 2, Some(tx)));
    for _ in 0..32 {
        rx.recv().expect("the writer stopped before 32 acknowledgements");
    }
    s.pool.members[1].kill();
    let outcomes = s.rt.block_on(writer).unwrap();
    assert_eq!(outcomes.len() as u64, AREA.end - AREA.start, "the writer stopped early");
    s.record(outcomes, 2);
    s.check("the volume with member 1 gone");

    let missing = s.wait_state(1, "missing");
    let (dirty, region) = (missing["dirty_regions"].as_u64().unwrap(), missing["region_bytes"].as_u64().unwrap());
    assert!(dirty >= 1, "writes went on without member 1 but no region is dirty: {missing}");

    // Back with its old contents: it needs only the dirty regions. Its own /metrics count
    // every byte written to it since it restarted: the resync and a little metadata.
    s.pool.members[1].start();
    s.pool.wait_status("member 1 resynced", all_in_sync);
    let resynced = s.pool.members[1].bytes_written();
    eprintln!("member 1 got {resynced} bytes back; {dirty} regions of {region} bytes were dirty");
    assert!(
        resynced > 0 && resynced <= dirty * region + META_BYTES && resynced < VOLUME / 4,
        "{resynced} bytes were written to member 1 on its return; {dirty} regions of {region} bytes were dirty"
    );
    s.kill_and_check(0, "mirror set 0 read from the resynced member alone");
    s.finish();
}

#[test]
fn writes_during_a_resync_reach_the_returning_member() {
    // At 1 MiB/s, copying the region member 1 missed takes seconds: time to write over it.
    let mut s = Served::new("resync-rate = \"1M\"");
    s.wait_clean("every region cleaned after the first round");
    s.pool.members[1].kill();
    s.write(AREA, 2);
    s.wait_state(1, "missing");

    s.pool.members[1].start();
    s.wait_state(1, "resyncing");
    s.write(AREA, 3);
    let during = s.pool.status();
    assert_eq!(states(&during)[1], "resyncing", "the resync ended before round 3 was written; the test proved nothing: {during}");
    s.pool.wait_status("member 1 resynced", all_in_sync);
    // Round 3 must be on member 1, neither lost nor overwritten by the copy.
    s.kill_and_check(0, "mirror set 0 read from the member resynced under writes");
    s.finish();
}

#[test]
fn a_killed_coordinator_is_replaced_and_every_acknowledged_write_reads_back() {
    let mut s = Served::new("");
    let old = s.shadow.clone();

    // Round 2 over the whole volume; the server is killed after 200 acknowledgements.
    let (tx, rx) = mpsc::channel();
    let writer = s.rt.spawn(write_blocks(s.client.clone(), 0..BLOCKS, 2, Some(tx)));
    for _ in 0..200 {
        rx.recv().expect("the writer stopped before 200 acknowledgements");
    }
    s.kill_coordinator();
    let outcomes = s.rt.block_on(writer).unwrap();
    let acked: Vec<u64> = outcomes.iter().filter(|(_, r)| r.is_ok()).map(|(b, _)| *b).collect();
    let cut: Vec<u64> = outcomes.iter().filter(|(_, r)| r.is_err()).map(|(b, _)| *b).collect();
    assert!(!cut.is_empty(), "every write finished before the kill; the test proved nothing");
    s.serve_again();

    let got = s.read();
    let new = |b| block_data(2, b);
    for &b in &acked {
        assert!(got[block_range(b)] == new(b), "acknowledged write to block {b} was lost");
    }
    for &b in &cut {
        let now = &got[block_range(b)];
        assert!(now == &old[block_range(b)] || now == &new(b)[..], "block {b}, cut off by the crash, is neither old nor new");
    }
    for b in (0..BLOCKS).filter(|b| !acked.contains(b) && !cut.contains(b)) {
        assert!(got[block_range(b)] == old[block_range(b)], "block {b} was never written again but changed");
    }
    let landed = cut.iter().filter(|&&b| got[block_range(b)] == new(b)).count();
    eprintln!("{} writes acknowledged, {} cut off by the crash ({landed} of them landed)", acked.len(), cut.len());

    // Once reconciled and clean, the two copies of each mirror set are the same bytes.
    s.wait_clean("the copies reconciled");
    s.assert_copies_agree("after reconciling");
    s.shadow = got;
    s.check("the volume after reconciling");
    s.finish();
}

#[test]
fn a_coordinator_killed_while_a_member_is_missing_is_replaced_and_the_member_resynced() {
    let mut s = Served::new("");
    s.pool.members[1].kill();
    s.write(AREA, 2);
    s.wait_state(1, "missing");
    s.kill_coordinator();
    // Every member must answer to assemble the pool: member 1 comes back before the new
    // server starts, with the old contents of the region it missed.
    s.pool.members[1].start();
    s.serve_again();
    s.check("the volume after the takeover");
    s.wait_clean("member 1 resynced and the copies reconciled");
    s.assert_copies_agree("after the takeover");
    s.kill_and_check(0, "mirror set 0 read from member 1 after the takeover");
    s.finish();
}

#[test]
fn a_stalled_member_is_declared_missing_after_the_timeout_and_the_pool_goes_on() {
    let mut s = Served::new("member-timeout = \"1s\"");
    let events = s.pool.status()["events"].as_u64().unwrap();

    // Member 3 (mirror set 1, with member 2) stops answering; writes and reads go on
    // after at most the timeout. Round 3 overwrites what round 2 may have left in member
    // 3's socket, which it carries out when it runs again: the resync must land after it.
    s.pool.members[3].pause();
    let started = Instant::now();
    s.write(AREA, 2);
    s.write(AREA, 3);
    s.check("the volume with member 3 stalled");
    eprintln!("writes and reads with member 3 stalled took {:?}", started.elapsed());

    // `pool status` waits for the stalled member's handshake to time out.
    let stalled = s.pool.status();
    assert_eq!(states(&stalled)[3], "missing", "{stalled}");
    assert!(stalled["events"].as_u64().unwrap() > events, "the coordinator never declared member 3 missing: {stalled}");

    s.pool.members[3].resume();
    s.pool.wait_status("member 3 resynced", all_in_sync);
    s.check("the volume after member 3 returned");
    s.kill_and_check(2, "mirror set 1 read from the returned member alone");
    s.finish();
}

#[test]
fn a_second_coordinator_is_refused_naming_the_owner() {
    let pool = Pool::raid10(MEMBER_DATA, "");
    let vol = pool.serve();
    for args in [&["copy", &pool.spec, "/dev/null"][..], &["info", &pool.spec]] {
        let started = Instant::now();
        let out = output(Command::new(SLUICE).args(args));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "sluice {args:?} while the pool is served: {err}");
        assert!(err.contains("being served by") && err.contains(&format!("pid {}", vol.pid())), "sluice {args:?}: {err}");
        assert!(started.elapsed() < Duration::from_secs(15), "sluice {args:?} took {:?} to refuse", started.elapsed());
    }
    // A second server exits 2 like serve does for any export it cannot open, and never
    // listens. (Killed if it outlives the deadline, so a failure leaves nothing behind.)
    let (socket, log) = (pool.dir.path().join("second.sock"), pool.dir.path().join("second.log"));
    let mut second = Command::new(SLUICE)
        .args(["serve", "--unix", socket.to_str().unwrap(), "--export", &format!("vol={}", pool.spec)])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .expect("spawn a second sluice serve");
    let status = wait_timeout(&mut second, Duration::from_secs(15));
    let _ = second.wait();
    let err = std::fs::read_to_string(&log).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(2), "a second sluice serve of the pool: {err}");
    assert!(err.contains("being served by") && err.contains(&format!("pid {}", vol.pid())), "{err}");
    assert!(!socket.exists(), "the second server listened");

    // The refused ones changed nothing: the first goes on serving, and owns the pool.
    let rt = runtime();
    let client = rt.block_on(Client::connect(&vol.uri())).expect("connect to the first coordinator");
    rt.block_on(client.write(0, &block_data(7, 0), true)).expect("write through the first coordinator");
    assert!(rt.block_on(client.read_owned(0, vec![0; BLOCK as usize])).unwrap() == block_data(7, 0));
    rt.block_on(client.disconnect());
    let owner = pool.status()["owner"].as_str().map(str::to_owned);
    assert!(owner.as_deref().is_some_and(|o| o.ends_with(&format!("pid {}", vol.pid()))), "owner: {owner:?}");
    vol.stop_clean();
}
