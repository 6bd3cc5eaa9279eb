//! What the cache core itself costs per warm hit, without any I/O: `cargo bench -p
//! sluice-cache --bench core`. Two members in memory answer every operation at once, the
//! backing reads as a pattern, the volume is read once to fill the cache, then 4 KiB
//! random reads with 32 in flight all hit. The figure is the core's work per read:
//! request, directory, the hit's member read, the page check, the reply, and
//! `next_timeout` once per call as the shell asks.

use std::collections::VecDeque;
use std::time::Instant;

use sluice_cache::{Action, BackingCmd, Cache, MemberCmd, OpId, Outcome, Params, ReqId, Request};

const DEPTH: u64 = 32;
const VOLUME_BYTES: u64 = 64 << 20;
const BLOCK_BYTES: u64 = 64 << 10;

struct Bench {
    cache: Cache,
    members: Vec<Vec<u8>>,
    /// Operations not answered yet, oldest first: (op, a member's?, outcome).
    out: VecDeque<(OpId, bool, Outcome)>,
    replies: u64,
    now: u64,
}

impl Bench {
    fn new() -> Bench {
        let members = vec!["nbd://a/ram".to_string(), "nbd://b/ram".to_string()];
        let p = Params { volume_bytes: VOLUME_BYTES, block_bytes: BLOCK_BYTES, identity: 0x5eed, members, prefetch: false, prefetch_window_blocks: 1, member_timeout_ms: 1_000 };
        let mut cache = Cache::new(p);
        let slots = VOLUME_BYTES / BLOCK_BYTES;
        for m in 0..2 {
            cache.handle_member_up(0, m, slots);
        }
        let store = vec![0; (slots * BLOCK_BYTES) as usize];
        Bench { cache, members: vec![store.clone(), store], out: VecDeque::new(), replies: 0, now: 0 }
    }

    fn drain(&mut self) {
        while let Some(a) = self.cache.poll_action() {
            match a {
                Action::Backing { op, cmd: BackingCmd::Read { offset, len } } => {
                    let data = (offset..offset + len).map(|i| (i / 512) as u8).collect();
                    self.out.push_back((op, false, Ok(data)));
                }
                Action::Backing { op, .. } => self.out.push_back((op, false, Ok(Vec::new()))),
                Action::Member { op, member, cmd } => {
                    let store = &mut self.members[member];
                    let outcome = match cmd {
                        MemberCmd::Read { offset, len } => store[offset as usize..(offset + len) as usize].to_vec(),
                        MemberCmd::Write { offset, data } => {
                            store[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
                            Vec::new()
                        }
                        MemberCmd::Trim { offset, len } => {
                            store[offset as usize..(offset + len) as usize].fill(0);
                            Vec::new()
                        }
                    };
                    self.out.push_back((op, true, Ok(outcome)));
                }
                Action::Reply { result, .. } => {
                    result.expect("the read succeeds");
                    self.replies += 1;
                }
                Action::Reconnect { .. } => panic!("a member failed"),
            }
        }
        std::hint::black_box(self.cache.next_timeout());
    }

    fn answer_one(&mut self) {
        if let Some((op, member, outcome)) = self.out.pop_front() {
            self.now += 100;
            match member {
                true => self.cache.handle_member_done(self.now, op, outcome),
                false => self.cache.handle_backing_done(self.now, op, outcome),
            }
            self.drain();
        }
    }

    /// Runs `n` reads from `at` with DEPTH in flight; nanoseconds per read.
    fn run(&mut self, n: u64, len: u64, at: impl Fn(u64) -> u64) -> f64 {
        let (start, first) = (Instant::now(), self.replies);
        let mut sent = 0;
        while self.replies - first < n {
            while sent < n && sent - (self.replies - first) < DEPTH {
                self.now += 100;
                self.cache.handle_request(self.now, ReqId(sent + first), Request::Read { offset: at(sent), len });
                self.drain();
                sent += 1;
            }
            self.answer_one();
        }
        start.elapsed().as_nanos() as f64 / n as f64
    }
}

fn main() {
    let mut b = Bench::new();
    // Fill: every block once, sequentially.
    let blocks = VOLUME_BYTES / BLOCK_BYTES;
    b.run(blocks, BLOCK_BYTES, |i| i * BLOCK_BYTES);
    while !b.out.is_empty() {
        b.answer_one();
    }
    let misses = b.cache.counters().misses;
    let n = 300_000;
    let ns = b.run(n, 4096, |i| (i * 7919 % (VOLUME_BYTES / 4096)) * 4096);
    let c = b.cache.counters();
    assert_eq!(c.misses, misses, "every warm read hits");
    println!("warm 4K random reads, all hits: {ns:.0} ns per read ({n} reads, {DEPTH} in flight)");
}
