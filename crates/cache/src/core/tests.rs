//! The core driven by hand, one scenario each, with every operation completed at once
//! unless the scenario holds it back.

use super::Cache;
use crate::api::{Action, BackingCmd, MemberCmd, OpId, Params, ReqId, Request};

const BS: u64 = 4096;

struct Rig {
    cache: Cache,
    backing: Vec<u8>,
    member: Vec<u8>,
    replies: Vec<(ReqId, Vec<u8>)>,
    /// Operations not yet completed, in the order they were asked for.
    held: Vec<Action>,
    reconnects: usize,
    /// The `failures` of the last reconnect asked for.
    failures: u32,
}

impl Rig {
    fn new(prefetch: bool) -> Rig {
        Rig::with(16 * BS, BS, 8, prefetch)
    }

    /// A volume of `volume` bytes in blocks of `bs`, byte `i` of the backing holding
    /// `i / BS + 1`, and one member lending `slots` slots.
    fn with(volume: u64, bs: u64, slots: u64, prefetch: bool) -> Rig {
        Rig::timed(volume, bs, slots, prefetch, crate::limits::MEMBER_TIMEOUT_DEFAULT_MS)
    }

    /// `with`, and member operations time out after `member_timeout_ms`.
    fn timed(volume: u64, bs: u64, slots: u64, prefetch: bool, member_timeout_ms: u64) -> Rig {
        let p = Params {
            volume_bytes: volume,
            block_bytes: bs,
            identity: 99,
            members: vec!["nbd://a/ram".into()],
            prefetch,
            prefetch_window_blocks: 2,
            member_timeout_ms,
        };
        let mut cache = Cache::new(p);
        cache.handle_member_up(0, 0, slots);
        let member = vec![0; (slots * cache.slot_bytes()) as usize];
        let backing = (0..volume).map(|i| ((i / BS) as u8).wrapping_add(1)).collect();
        Rig { cache, backing, member, replies: Vec::new(), held: Vec::new(), reconnects: 0, failures: 0 }
    }

    fn request(&mut self, id: u64, r: Request) {
        self.cache.handle_request(0, ReqId(id), r);
        self.collect();
    }

    fn collect(&mut self) {
        while let Some(a) = self.cache.poll_action() {
            match a {
                Action::Reply { req, result } => self.replies.push((req, result.expect("no failures here"))),
                Action::Reconnect { failures, .. } => {
                    self.reconnects += 1;
                    self.failures = failures;
                }
                other => self.held.push(other),
            }
        }
    }

    /// Completes held operations (the first `n`, in order) against the backing and member.
    fn complete(&mut self, n: usize) {
        let now: Vec<Action> = self.held.drain(..n.min(self.held.len())).collect();
        for a in now {
            match a {
                Action::Backing { op, cmd } => {
                    let out = backing_op(&mut self.backing, cmd);
                    self.cache.handle_backing_done(0, op, Ok(out));
                }
                Action::Member { op, cmd, .. } => self.member_op(op, cmd),
                _ => unreachable!(),
            }
            self.collect();
        }
    }

    fn member_op(&mut self, op: OpId, cmd: MemberCmd) {
        let out = match cmd {
            MemberCmd::Read { offset, len } => self.member[offset as usize..(offset + len) as usize].to_vec(),
            MemberCmd::Write { offset, data } => {
                self.member[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
                Vec::new()
            }
            MemberCmd::Trim { offset, len } => {
                self.member[offset as usize..(offset + len) as usize].fill(0);
                Vec::new()
            }
        };
        self.cache.handle_member_done(0, op, Ok(out));
    }

    fn settle(&mut self) {
        while !self.held.is_empty() {
            self.complete(usize::MAX);
        }
    }

    fn read(&mut self, id: u64, offset: u64, len: u64) -> Vec<u8> {
        self.request(id, Request::Read { offset, len });
        self.settle();
        let at = self.replies.iter().position(|(r, _)| *r == ReqId(id)).expect("replied");
        self.replies.remove(at).1
    }
}

fn backing_op(b: &mut [u8], cmd: BackingCmd) -> Vec<u8> {
    match cmd {
        BackingCmd::Read { offset, len } => b[offset as usize..(offset + len) as usize].to_vec(),
        BackingCmd::Write { offset, data, .. } => {
            b[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
            Vec::new()
        }
        BackingCmd::Zero { offset, len, .. } | BackingCmd::Trim { offset, len, .. } => {
            b[offset as usize..(offset + len) as usize].fill(0);
            Vec::new()
        }
        BackingCmd::Flush => Vec::new(),
    }
}

#[test]
fn a_miss_fills_and_the_next_read_hits() {
    let mut r = Rig::new(false);
    assert_eq!(r.read(1, 100, 200), vec![1; 200]);
    assert_eq!((r.cache.counters().misses, r.cache.counters().fills), (1, 1));
    assert_eq!(r.read(2, BS - 10, 20), [vec![1; 10], vec![2; 10]].concat());
    assert_eq!(r.cache.counters().hits, 1, "block 0 hit, block 1 missed");
    assert_eq!(r.read(3, 0, 2 * BS), [vec![1; BS as usize], vec![2; BS as usize]].concat());
    assert_eq!(r.cache.counters().hits, 3);
}

/// A hit reads just the pages it needs, whole, in one member read, from a slot that is just
/// the block: the sums it checks them against are the gateway's.
#[test]
fn a_hit_reads_the_pages_it_needs() {
    let bs = 64 << 10;
    let mut r = Rig::with(4 * bs, bs, 4, false);
    r.read(1, 0, bs);
    let want = |r: &Rig, from: u64, len: u64| r.backing[from as usize..(from + len) as usize].to_vec();
    let member_reads = |r: &Rig| -> Vec<MemberCmd> {
        r.held.iter().map(|a| match a {
            Action::Member { cmd, .. } => cmd.clone(),
            other => panic!("a slot read, not {other:?}"),
        }).collect()
    };
    // Bytes 5 * 4096 + 100 .. + 5000: pages 5 and 6, whole.
    r.request(2, Request::Read { offset: 5 * BS + 100, len: 5000 });
    assert_eq!(r.cache.slot_bytes(), bs, "a slot is the block");
    assert_eq!(member_reads(&r), [MemberCmd::Read { offset: 5 * BS, len: 2 * BS }]);
    r.settle();
    assert_eq!(r.replies.pop(), Some((ReqId(2), want(&r, 5 * BS + 100, 5000))));
    r.request(3, Request::Read { offset: 0, len: bs });
    assert_eq!(member_reads(&r), [MemberCmd::Read { offset: 0, len: bs }]);
    r.settle();
    assert_eq!(r.replies.pop(), Some((ReqId(3), want(&r, 0, bs))));
    let c = r.cache.counters();
    assert_eq!((c.hits, c.hit_reads, c.hit_read_bytes), (2, 2, 2 * BS + bs));
}

#[test]
fn a_fill_that_a_write_overtakes_is_not_installed() {
    let mut r = Rig::new(false);
    r.request(1, Request::Read { offset: 0, len: BS });
    // The backing read is held; a write to the same block starts and finishes first.
    r.request(2, Request::Write { offset: 0, data: vec![7; 512], fua: false });
    r.held.swap(0, 1);
    r.complete(1);
    assert!(r.replies.iter().any(|(q, _)| *q == ReqId(2)), "the write is acknowledged");
    r.settle();
    assert_eq!(r.cache.counters().fills, 0, "the stale fill stayed out");
    // The read raced the write (either is allowed); a read after the ack sees the write.
    let got = r.read(3, 0, 1024);
    assert_eq!(got, [vec![7; 512], vec![1; 512]].concat());
}

#[test]
fn dropped_pages_are_a_miss_and_never_returned() {
    let mut r = Rig::new(false);
    r.read(1, 0, BS);
    let slot = r.cache.slot_bytes() as usize;
    r.member[..slot].fill(0);
    assert_eq!(r.read(2, 0, BS), vec![1; BS as usize]);
    assert_eq!(r.cache.counters().verify_failures, 1);
    assert_eq!(r.cache.counters().member_trims, 1, "the slot that failed its check is trimmed");
    r.read(3, 0, BS);
    assert_eq!(r.cache.counters().hits, 1, "refilled after the failed check");
}

#[test]
fn a_failed_member_read_falls_back_and_asks_to_reconnect() {
    let mut r = Rig::new(false);
    r.read(1, 0, BS);
    r.request(2, Request::Read { offset: 0, len: BS });
    let Some(Action::Member { op, .. }) = r.held.pop() else { panic!("a slot read") };
    r.cache.handle_member_done(0, op, Err("connection reset".into()));
    r.collect();
    r.settle();
    assert_eq!(r.replies.pop(), Some((ReqId(2), vec![1; BS as usize])));
    assert_eq!(r.reconnects, 1);
    assert_eq!(r.cache.members()[0].0, crate::directory::MemberState::Down { failures: 1 });
}

#[test]
fn sequential_reads_prefetch_and_hints_fill() {
    let mut r = Rig::new(true);
    r.read(1, 0, BS);
    r.read(2, BS, BS);
    assert_eq!(r.cache.counters().fills, 4, "two read, two read ahead");
    r.read(3, 2 * BS, BS);
    assert_eq!(r.cache.counters().prefetched_used_bytes, BS);
    r.request(4, Request::Cache { offset: 10 * BS, len: 3 * BS });
    r.settle();
    assert!(r.replies.iter().any(|(q, _)| *q == ReqId(4)));
    r.read(5, 10 * BS, 3 * BS);
    assert_eq!(r.cache.counters().prefetched_used_bytes, 4 * BS);
}

#[test]
fn a_member_that_does_not_answer_times_out() {
    for timeout_ms in [crate::limits::MEMBER_TIMEOUT_DEFAULT_MS, 250] {
        a_member_times_out_after(timeout_ms);
    }
}

/// The file's `member-timeout` is the core's: the operation started at 0 times out just
/// after it, and not before.
fn a_member_times_out_after(timeout_ms: u64) {
    let mut r = Rig::timed(16 * BS, BS, 8, false, timeout_ms);
    r.read(1, 0, BS);
    r.request(2, Request::Read { offset: 0, len: BS });
    assert!(matches!(r.held[..], [Action::Member { .. }]), "the page");
    let at = r.cache.next_timeout().expect("a member operation in flight");
    assert_eq!(at, timeout_ms * 1_000_000 + 1);
    r.cache.handle_tick(at - 1);
    r.collect();
    assert_eq!(r.reconnects, 0);
    r.cache.handle_tick(at);
    r.collect();
    assert_eq!(r.reconnects, 1);
    r.held.drain(..1);
    r.settle();
    assert_eq!(r.replies.pop(), Some((ReqId(2), vec![1; BS as usize])), "served by the backing");
    assert_eq!(r.cache.next_timeout(), None);
}

#[test]
fn with_no_member_a_read_takes_only_what_it_asked() {
    let mut r = Rig::new(false);
    r.cache.handle_member_down(0, 0);
    r.request(1, Request::Read { offset: 100, len: 500 });
    assert_eq!(r.held, vec![Action::Backing { op: OpId(0), cmd: BackingCmd::Read { offset: 100, len: 500 } }]);
    r.settle();
    assert_eq!(r.replies.pop(), Some((ReqId(1), vec![1; 500])));
    assert_eq!(r.cache.counters().fills, 0);
}

#[test]
fn a_short_last_block_of_4m_reads_writes_and_hits() {
    let bs = 4 << 20;
    let volume = 2 * bs + 3 * 512;
    let mut r = Rig::with(volume, bs, 2, false);
    let tail = |r: &Rig, from: u64| r.backing[from as usize..volume as usize].to_vec();
    assert_eq!(r.read(1, bs - 512, bs + 2048), tail(&r, bs - 512));
    assert_eq!(r.cache.counters().fills, 2);
    r.request(2, Request::Write { offset: volume - 512, data: vec![0xee; 512], fua: true });
    r.settle();
    assert_eq!(r.read(3, volume - 1024, 1024), [tail(&r, volume - 1024)[..512].to_vec(), vec![0xee; 512]].concat());
    assert_eq!(r.read(4, volume - 700, 700), tail(&r, volume - 700));
    assert_eq!(r.cache.counters().hits, 1, "refilled after the write, then a hit");
    r.request(5, Request::Read { offset: volume, len: 0 });
    r.request(6, Request::Write { offset: volume, data: Vec::new(), fua: false });
    r.settle();
    assert!([5, 6].iter().all(|&id| r.replies.iter().any(|(q, _)| *q == ReqId(id))), "zero-length requests at the end are replied");
}

/// A volume that ends within a block of 2^64: the last block's end is past u64::MAX.
#[test]
fn the_last_block_of_a_volume_near_u64_max() {
    let volume = u64::MAX - 511;
    let p = Params { volume_bytes: volume, block_bytes: BS, identity: 7, members: vec!["nbd://a/ram".into()], prefetch: true, prefetch_window_blocks: 2, member_timeout_ms: crate::limits::MEMBER_TIMEOUT_DEFAULT_MS };
    let mut cache = Cache::new(p);
    cache.handle_member_up(0, 0, 4);
    let (last, last_len) = (volume / BS * BS, volume % BS);
    let mut member = vec![0; 4 * cache.slot_bytes() as usize];
    for (id, (offset, len)) in [(1, (volume - 1024, 1024)), (2, (volume - 512, 512)), (3, (last, last_len))] {
        cache.handle_request(0, ReqId(id), Request::Read { offset, len });
        let mut reply = None;
        while let Some(a) = cache.poll_action() {
            match a {
                Action::Backing { op, cmd: BackingCmd::Read { offset: o, len: l } } => {
                    assert!(o >= last && o.checked_add(l) == Some(volume), "reads {o}+{l}, past the volume");
                    cache.handle_backing_done(0, op, Ok(vec![9; l as usize]));
                }
                Action::Member { op, cmd: MemberCmd::Write { offset, data }, .. } => {
                    member[offset as usize..offset as usize + data.len()].copy_from_slice(&data);
                    cache.handle_member_done(0, op, Ok(Vec::new()));
                }
                Action::Member { op, cmd: MemberCmd::Read { offset, len }, .. } => {
                    cache.handle_member_done(0, op, Ok(member[offset as usize..(offset + len) as usize].to_vec()))
                }
                Action::Reply { result, .. } => reply = Some(result.expect("read")),
                other => panic!("unexpected {other:?}"),
            }
        }
        assert_eq!(reply, Some(vec![9; len as usize]));
    }
    assert_eq!((cache.counters().fills, cache.counters().hits), (1, 2));
}

/// Fails the next slot operation the rig holds (a read, a fill's write or a trim).
fn fail_member_op(r: &mut Rig) {
    let at = r.held.iter().position(|a| matches!(a, Action::Member { .. })).expect("a member operation");
    let Action::Member { op, .. } = r.held.remove(at) else { unreachable!() };
    r.cache.handle_member_done(0, op, Err("connection reset".into()));
    r.collect();
    r.settle();
}

#[test]
fn a_member_that_keeps_failing_backs_off_longer() {
    let mut r = Rig::new(false);
    r.read(1, 0, BS);
    r.request(2, Request::Read { offset: 0, len: BS });
    fail_member_op(&mut r);
    assert_eq!((r.reconnects, r.failures), (1, 1));
    for (id, failures) in [(3, 2), (4, 3)] {
        r.cache.handle_member_up(0, 0, 8);
        r.request(id, Request::Read { offset: id * BS, len: BS });
        r.complete(1);
        fail_member_op(&mut r);
        assert_eq!((r.reconnects, r.failures), (id as usize - 1, failures), "failed again without ever answering");
    }
    r.cache.handle_member_up(0, 0, 8);
    r.read(5, 5 * BS, BS);
    r.request(6, Request::Read { offset: 5 * BS, len: BS });
    fail_member_op(&mut r);
    assert_eq!(r.failures, 1, "it answered in between: the count starts again");
}

/// An old connection's completions after the member came back: a slot read that carries
/// valid bytes of an older fill, and an old slot write, are ignored (their op ids were
/// forgotten when the member went down), never taken for the new connection's.
#[test]
fn late_completions_of_an_old_connection_are_ignored() {
    let mut r = Rig::new(false);
    r.read(1, 0, BS);
    let old_page = r.member[..BS as usize].to_vec();
    r.request(2, Request::Read { offset: 0, len: BS });
    let old_reads: Vec<OpId> = r.held.drain(..).map(|a| match a {
        Action::Member { op, cmd: MemberCmd::Read { .. }, .. } => op,
        other => panic!("a slot read, not {other:?}"),
    }).collect();
    assert_eq!(old_reads.len(), 1, "the page");
    r.request(3, Request::Read { offset: BS, len: BS });
    r.complete(1);
    let Some(Action::Member { op: old_write, .. }) = r.held.pop() else { panic!("a slot write") };
    r.cache.handle_member_down(0, 0);
    r.collect();
    r.settle();
    assert_eq!(r.replies.iter().map(|(q, _)| q.0).collect::<Vec<_>>(), [3, 2], "both reads were served by the backing");
    r.request(4, Request::Write { offset: 0, data: vec![7; BS as usize], fua: false });
    r.settle();
    r.cache.handle_member_up(0, 0, 8);
    r.member.fill(0);
    assert_eq!(r.read(5, 0, BS), vec![7; BS as usize]);
    for op in old_reads {
        r.cache.handle_member_done(0, op, Ok(old_page.clone()));
    }
    r.cache.handle_member_done(0, old_write, Ok(Vec::new()));
    r.collect();
    assert!(r.held.is_empty() && r.replies.len() == 3, "nothing came of the late completions");
    r.cache.check().unwrap();
    assert_eq!(r.read(6, 0, BS), vec![7; BS as usize]);
    assert_eq!(r.read(7, BS, BS), vec![2; BS as usize]);
    assert_eq!(r.cache.counters().hits, 1, "block 0 hit its new fill; block 1 was never installed");
}

/// A read that waited on a fill and read the backing itself when a write overtook the fill
/// missed once, not twice.
#[test]
fn a_waiter_that_rereads_counts_one_miss() {
    let mut r = Rig::new(false);
    r.request(1, Request::Read { offset: 0, len: BS });
    r.request(2, Request::Read { offset: 0, len: 512 });
    r.request(3, Request::Write { offset: BS - 512, data: vec![7; 512], fua: false });
    r.settle();
    let c = r.cache.counters();
    assert_eq!((c.misses, c.miss_bytes, c.hits), (2, BS + 512, 0));
}

/// A prefetched block that a waiting read used is not wasted when it leaves the cache
/// later, nor used a second time.
#[test]
fn a_prefetch_a_waiter_used_is_used_once_and_never_wasted() {
    let mut r = Rig::new(true);
    r.read(1, 0, BS);
    r.request(2, Request::Read { offset: BS, len: BS });
    assert_eq!(r.held.len(), 2, "block 1 for the read, blocks 2 and 3 read ahead in one backing read");
    r.request(3, Request::Read { offset: 2 * BS, len: BS });
    r.settle();
    assert_eq!(r.cache.counters().prefetched_used_bytes, BS, "read 3 waited on block 2's prefetch");
    r.request(4, Request::Write { offset: 2 * BS, data: vec![7; 512], fua: false });
    r.settle();
    let c = r.cache.counters();
    assert_eq!((c.prefetched_used_bytes, c.prefetched_wasted_bytes), (BS, 0));
}

#[test]
fn a_hint_reads_the_backing_in_runs_of_consecutive_blocks() {
    // 300 blocks of 4 KiB, all uncached: one read of 1 MiB (256 blocks) and one of the rest,
    // not 300 reads of a block each (a disk with an IOPS budget serves them far slower).
    let mut r = Rig::with(300 * BS, BS, 400, false);
    r.request(1, Request::Cache { offset: 0, len: 300 * BS });
    let lens: Vec<u64> = r.held.iter().filter_map(|a| match a {
        Action::Backing { cmd: BackingCmd::Read { len, .. }, .. } => Some(*len),
        _ => None,
    }).collect();
    assert_eq!(lens, vec![256 * BS, 44 * BS]);
    r.settle();
    assert_eq!(r.replies.len(), 1, "the hint is answered once every fill is done");
    r.read(2, 0, 300 * BS);
    assert_eq!(r.cache.counters().misses, 0, "every block was filled");
}

/// The backing's errno reaches the client (ENOSPC stays ENOSPC), with where it happened.
#[test]
fn a_backing_failure_keeps_its_errno() {
    let mut r = Rig::new(false);
    r.request(1, Request::Write { offset: 0, data: vec![9; BS as usize], fua: false });
    let Some(Action::Backing { op, .. }) = r.held.pop() else { panic!("the backing write: {:?}", r.held) };
    let full = crate::api::Failure { errno: sluice_proto::Errno::NoSpc, message: "disk full".into() };
    r.cache.handle_backing_done(0, op, Err(full));
    match r.cache.poll_action() {
        Some(Action::Reply { req: ReqId(1), result: Err(f) }) => {
            assert_eq!(f.errno, sluice_proto::Errno::NoSpc);
            assert!(f.message.contains("backing") && f.message.contains("disk full"), "{}", f.message);
        }
        other => panic!("expected the write's failure, got {other:?}"),
    }
}

/// A block a hint brought in whose first read from the member fails or is forgotten (the
/// member errs, is lost, or times out) left the cache unread: wasted, as when its pages
/// fail their check, and never used.
#[test]
fn a_hinted_block_lost_on_its_first_hit_is_wasted() {
    type Lose = fn(&mut Rig);
    let fail: Lose = fail_member_op;
    let lost: Lose = |r| {
        r.cache.handle_member_down(0, 0);
        r.collect();
        r.settle();
    };
    let late: Lose = |r| {
        let at = r.cache.next_timeout().expect("the slot read in flight");
        r.cache.handle_tick(at);
        r.collect();
        r.held.retain(|a| !matches!(a, Action::Member { .. }));
        r.settle();
    };
    let damaged: Lose = |r| {
        r.member.fill(0);
        r.settle();
    };
    for (how, lose) in [("failed", fail), ("lost", lost), ("timed out", late), ("failed its check", damaged)] {
        let mut r = Rig::new(false);
        r.request(1, Request::Cache { offset: 2 * BS, len: BS });
        r.settle();
        assert_eq!(r.cache.counters().fills, 1, "the hint filled block 2");
        r.request(2, Request::Read { offset: 2 * BS, len: BS });
        lose(&mut r);
        assert_eq!(r.replies.pop(), Some((ReqId(2), vec![3; BS as usize])), "{how}: served by the backing");
        let c = r.cache.counters();
        assert_eq!((c.hits, c.prefetched_used_bytes, c.prefetched_wasted_bytes), (0, 0, BS), "{how}: wasted, never used");
    }
}

/// The member trims held, in order.
fn held_trims(r: &Rig) -> Vec<MemberCmd> {
    r.held.iter().filter_map(|a| match a {
        Action::Member { cmd: cmd @ MemberCmd::Trim { .. }, .. } => Some(cmd.clone()),
        _ => None,
    }).collect()
}

/// A write over a cached block trims its slot, whole; the slot is not refilled until the
/// trim is reported, and is after.
#[test]
fn a_write_trims_the_slot_it_invalidates_and_the_slot_waits_for_the_trim() {
    let mut r = Rig::with(16 * BS, BS, 1, false);
    r.read(1, 0, BS);
    let slot = r.cache.slot_bytes();
    r.request(2, Request::Write { offset: 0, data: vec![7; 512], fua: false });
    assert_eq!(held_trims(&r), [MemberCmd::Trim { offset: 0, len: slot }]);
    assert_eq!(r.cache.counters().member_trims, 1);
    let trim = r.held.iter().position(|a| matches!(a, Action::Member { .. })).unwrap();
    let trim = r.held.remove(trim);
    r.settle();
    assert_eq!(r.read(3, BS, BS), vec![2; BS as usize]);
    assert_eq!(r.cache.counters().fills, 1, "the only slot is being trimmed: no fill");
    r.held.push(trim);
    r.settle();
    r.cache.check().unwrap();
    assert!(r.member[..slot as usize].iter().all(|&b| b == 0), "the slot was trimmed");
    r.read(4, 2 * BS, BS);
    assert_eq!(r.cache.counters().fills, 2, "the trimmed slot is filled again");
    assert_eq!(r.read(5, 2 * BS, BS), vec![3; BS as usize]);
    assert_eq!(r.cache.counters().hits, 1);
    r.cache.check_idle().unwrap();
}

/// A slot a hit is reading is trimmed when the read is back, never under it.
#[test]
fn a_hit_in_flight_delays_the_trim_of_its_slot() {
    let mut r = Rig::with(16 * BS, BS, 1, false);
    r.read(1, 0, BS);
    r.request(2, Request::Read { offset: 0, len: BS });
    r.request(3, Request::Write { offset: 0, data: vec![7; 512], fua: false });
    assert!(held_trims(&r).is_empty(), "no trim under the hit: {:?}", r.held);
    r.cache.check().unwrap();
    r.complete(1);
    assert_eq!(held_trims(&r), [MemberCmd::Trim { offset: 0, len: r.cache.slot_bytes() }]);
    r.settle();
    assert_eq!(r.cache.counters().member_trims, 1);
    assert_eq!(r.replies.iter().find(|(q, _)| *q == ReqId(2)).map(|(_, d)| d.len()), Some(BS as usize));
    r.cache.check_idle().unwrap();
}

/// A fill whose slot write is done after a write overtook it trims the slot it wrote.
#[test]
fn a_fill_a_write_overtook_trims_the_slot_it_wrote() {
    let mut r = Rig::new(false);
    r.request(1, Request::Read { offset: 0, len: BS });
    r.complete(1);
    assert!(matches!(r.held[..], [Action::Member { cmd: MemberCmd::Write { .. }, .. }]), "the slot write");
    r.request(2, Request::Write { offset: 0, data: vec![7; 512], fua: false });
    assert!(held_trims(&r).is_empty(), "not while the slot write is in flight");
    r.complete(1);
    assert_eq!(held_trims(&r), [MemberCmd::Trim { offset: 0, len: r.cache.slot_bytes() }]);
    r.settle();
    assert_eq!((r.cache.counters().fills, r.cache.counters().member_trims), (0, 1));
    r.cache.check_idle().unwrap();
}

/// A failed trim fails its member, as any failed member operation does.
#[test]
fn a_failed_trim_fails_its_member() {
    let mut r = Rig::new(false);
    r.read(1, 0, BS);
    r.request(2, Request::Write { offset: 0, data: vec![7; 512], fua: false });
    fail_member_op(&mut r);
    assert_eq!((r.reconnects, r.cache.counters().member_failures), (1, 1));
    r.settle();
    r.cache.check_idle().unwrap();
}

/// A client's trim of the whole volume drops every slot at once; their trims go to the
/// member a few at a time, each timed from when it is sent, so a member that answers them
/// at a steady rate is not marked down for the ones still waiting, and all are trimmed.
#[test]
fn a_mass_invalidation_trims_a_few_slots_at_a_time() {
    let max = crate::limits::MEMBER_TRIMS_INFLIGHT_MAX;
    let (slots, timeout_ms) = (4 * max as u64, 10);
    let mut r = Rig::timed(slots * BS, BS, slots, false, timeout_ms);
    r.read(1, 0, slots * BS);
    assert_eq!(r.cache.counters().fills, slots);
    r.request(2, Request::Trim { offset: 0, len: slots * BS, fua: false });
    r.held.retain(|a| match a {
        Action::Backing { op, cmd } => {
            let out = backing_op(&mut r.backing, cmd.clone());
            r.cache.handle_backing_done(0, *op, Ok(out));
            false
        }
        _ => true,
    });
    r.collect();
    // The member answers `max` trims every half timeout.
    let mut now = 0;
    while !r.held.is_empty() {
        assert!(held_trims(&r).len() <= max, "{} trims in flight", held_trims(&r).len());
        now += timeout_ms * 1_000_000 / 2;
        r.cache.handle_tick(now);
        r.collect();
        let batch: Vec<Action> = r.held.drain(..max.min(r.held.len())).collect();
        for a in batch {
            let Action::Member { op, cmd: MemberCmd::Trim { offset, len }, .. } = a else { panic!("{a:?}") };
            r.member[offset as usize..(offset + len) as usize].fill(0);
            r.cache.handle_member_done(now, op, Ok(Vec::new()));
        }
        r.collect();
    }
    let c = r.cache.counters();
    assert_eq!((c.member_failures, c.member_trims), (0, slots), "every slot trimmed, none timed out");
    r.cache.check_idle().unwrap();
}
