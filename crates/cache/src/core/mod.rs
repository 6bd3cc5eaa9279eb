//! The cache core: a value with `handle_*` methods for what arrived (client requests,
//! completions of backing and member operations, members going down and up, time passing)
//! and `poll_action` for what to do next. It owns no socket, clock or thread.
//!
//! - `read`: a read is cut into blocks; cached blocks are read from their slots and
//!   verified, missing ones from the backing in runs (whole blocks, so each can be filled);
//!   a block whose fill is already reading waits for it.
//! - `hit`: just the pages a read needs are read from a cached block's slot (one member
//!   read, the slot pinned until it is back) and checked against the sums the directory
//!   kept from the block's fill.
//! - `fill`: blocks read from the backing go into a slot on the member placement picks,
//!   and into the directory once the slot write is done, unless a write made them stale;
//!   prefetch and NBD_CMD_CACHE fills are paced.
//! - `write`: writes, zeroes and trims go to the backing and invalidate the blocks they
//!   touch when they start; flush passes through; members fail and come back.

mod fill;
mod hit;
mod read;
mod state;
#[cfg(test)]
mod tests;
mod write;

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::api::{Action, BackingCmd, MemberCmd, Nanos, OpId, Outcome, Params, ReqId, Request};
use crate::counters::Counters;
use crate::directory::{Directory, MemberState};
use crate::limits::PAGE_BYTES;
use crate::prefetch::Streams;
use crate::ranges::Ranges;
use crate::slot::Origin;
use state::{Fill, Hint, Op, OpKind, Pending};

pub struct Cache {
    p: Params,
    dir: Directory,
    counters: Counters,
    actions: VecDeque<Action>,
    reqs: HashMap<ReqId, Pending>,
    ops: BTreeMap<OpId, Op>,
    fills: BTreeMap<u64, Fill>,
    /// The fill of each block that has one (at most one per block).
    fill_of: HashMap<u64, u64>,
    /// Writes in flight: blocks `first..end` by operation.
    writes: BTreeMap<OpId, (u64, u64)>,
    /// Blocks a failed write touched: never filled again (see `write`).
    doubtful: Ranges,
    streams: Streams,
    /// Blocks a stream asked to read ahead, not yet started.
    prefetch_queue: VecDeque<u64>,
    hints: VecDeque<Hint>,
    /// Prefetch and hint fills in flight (backing read or slot write).
    paced: usize,
    /// Client reads' backing reads in flight: prefetch waits while there are many.
    demand_reads: usize,
    next_op: u64,
    next_fill: u64,
    next_generation: u64,
    now: Nanos,
    /// Test hook: fills ignore writes that start under them (the race rule, broken), so the
    /// simulation can show it catches the stale reads that follow.
    #[cfg(test)]
    pub(crate) break_stale_rule: bool,
    /// Test hook: a failed write's blocks are filled again at once.
    #[cfg(test)]
    pub(crate) break_failed_write_rule: bool,
    /// Test hook: the pages a hit reads are taken as they are, unchecked.
    #[cfg(test)]
    pub(crate) break_verify: bool,
    /// Test hook: a hit checks its first page only, the others are taken as they are.
    #[cfg(test)]
    pub(crate) break_pages: bool,
    /// Test hook: a hit seeds its check with another generation than its entry's.
    #[cfg(test)]
    pub(crate) break_generation: bool,
    /// Test hook: a hit seeds its check with another volume identity than the cache's.
    #[cfg(test)]
    pub(crate) break_identity: bool,
}

/// The core's in-flight state, for the simulation's bounds and for metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Inflight {
    pub requests: usize,
    pub ops: usize,
    pub fills: usize,
    pub paced: usize,
    pub prefetch_queue: usize,
    pub directory: usize,
    pub slots: u64,
}

impl Cache {
    pub fn new(p: Params) -> Cache {
        assert!(p.identity != 0 && p.block_bytes.is_power_of_two() && p.block_bytes >= PAGE_BYTES);
        Cache {
            dir: Directory::new(&p.members, (p.block_bytes / PAGE_BYTES) as usize),
            p,
            counters: Counters::default(),
            actions: VecDeque::new(),
            reqs: HashMap::new(),
            ops: BTreeMap::new(),
            fills: BTreeMap::new(),
            fill_of: HashMap::new(),
            writes: BTreeMap::new(),
            doubtful: Ranges::default(),
            streams: Streams::default(),
            prefetch_queue: VecDeque::new(),
            hints: VecDeque::new(),
            paced: 0,
            demand_reads: 0,
            next_op: 0,
            next_fill: 0,
            next_generation: 1,
            now: 0,
            #[cfg(test)]
            break_stale_rule: false,
            #[cfg(test)]
            break_failed_write_rule: false,
            #[cfg(test)]
            break_verify: false,
            #[cfg(test)]
            break_pages: false,
            #[cfg(test)]
            break_generation: false,
            #[cfg(test)]
            break_identity: false,
        }
    }

    /// Bytes of one slot on a member, the block (`slot` says why no more): what the shell
    /// divides a member's size by to get the slots it reports in `handle_member_up`.
    pub fn slot_bytes(&self) -> u64 {
        self.p.block_bytes
    }

    /// The cache block, in bytes.
    pub fn block_bytes(&self) -> u64 {
        self.p.block_bytes
    }

    /// A client request arrived (checked by the caller against the volume's size).
    pub fn handle_request(&mut self, now: Nanos, req: ReqId, r: Request) {
        self.now = self.now.max(now);
        assert!(!self.reqs.contains_key(&req), "request {req:?} is already in flight");
        match r {
            Request::Read { offset, len } => self.start_read(req, offset, len),
            Request::Write { offset, data, fua } => {
                let len = data.len() as u64;
                self.start_write(req, offset, len, BackingCmd::Write { offset, data, fua })
            }
            Request::Zero { offset, len, fua, may_trim } => {
                self.start_write(req, offset, len, BackingCmd::Zero { offset, len, fua, may_trim })
            }
            Request::Trim { offset, len, fua } => self.start_write(req, offset, len, BackingCmd::Trim { offset, len, fua }),
            Request::Flush => self.start_flush(req),
            Request::Cache { offset, len } => self.start_hint(req, offset, len),
        }
        self.pump();
    }

    /// A backing operation finished: a read's bytes, or why it failed.
    pub fn handle_backing_done(&mut self, now: Nanos, op: OpId, outcome: Outcome) {
        self.now = self.now.max(now);
        let Some(o) = self.ops.remove(&op) else { return };
        match o.kind {
            OpKind::BackingRead { req, first, start, len, fills } => {
                let outcome = outcome.and_then(|d| match d.len() as u64 == len {
                    true => Ok(d),
                    false => Err(format!("{} bytes back of {len}", d.len()).into()),
                });
                self.backing_read_done(req, first, start, fills, outcome)
            }
            OpKind::BackingWrite { req, .. } => {
                self.write_done(op, outcome.is_err());
                self.part_done(req, outcome.err().map(|e| e.context("backing")));
            }
            OpKind::BackingFlush { req } => self.part_done(req, outcome.err().map(|e| e.context("backing flush"))),
            OpKind::SlotRead { .. } | OpKind::SlotWrite { .. } | OpKind::SlotTrim { .. } => {
                unreachable!("a member operation reported as the backing's")
            }
        }
        self.pump();
    }

    /// A member operation finished. Completions of operations on a member that was marked
    /// down since are ignored (they are forgotten when it goes down).
    pub fn handle_member_done(&mut self, now: Nanos, op: OpId, outcome: Outcome) {
        self.now = self.now.max(now);
        let Some(o) = self.ops.remove(&op) else { return };
        match o.kind {
            OpKind::SlotRead(hit) => self.slot_read_done(hit, outcome),
            OpKind::SlotWrite { fill } => self.slot_write_done(fill, outcome),
            OpKind::SlotTrim { slot } => self.slot_trim_done(o.member.expect("a member's operation"), slot, outcome),
            _ => unreachable!("a backing operation reported as a member's"),
        }
        self.pump();
    }

    /// The shell lost member `member` (its connection closed): what it held is forgotten.
    pub fn handle_member_down(&mut self, now: Nanos, member: usize) {
        self.now = self.now.max(now);
        self.member_failed(member, false);
        self.pump();
    }

    /// Member `member` answers (again), empty, with room for `slots` slots.
    pub fn handle_member_up(&mut self, now: Nanos, member: usize, slots: u64) {
        self.now = self.now.max(now);
        if self.dir.state(member) == MemberState::Up {
            self.member_failed(member, false);
        }
        self.dir.member_up(member, slots);
        self.pump();
    }

    /// Time passed: member operations older than the member timeout mark their member down.
    pub fn handle_tick(&mut self, now: Nanos) {
        self.now = self.now.max(now);
        self.check_timeouts();
        self.pump();
    }

    /// When to call `handle_tick` next: when the oldest member operation would time out
    /// (the first in `ops`: see `new_op`).
    pub fn next_timeout(&self) -> Option<Nanos> {
        self.ops.values().find(|o| o.member.is_some()).map(|o| o.started + self.p.member_timeout_ms * 1_000_000 + 1)
    }

    /// How long a member operation may take before its member is marked down.
    pub fn member_timeout_ms(&self) -> u64 {
        self.p.member_timeout_ms
    }

    /// What to do next, demand work first (prefetch is queued behind it).
    pub fn poll_action(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    pub fn counters(&self) -> Counters {
        self.counters
    }

    /// Each member's state and (slots lent, slots in use).
    pub fn members(&self) -> Vec<(MemberState, (u64, u64))> {
        (0..self.dir.member_count()).map(|m| (self.dir.state(m), self.dir.usage(m))).collect()
    }

    pub fn inflight(&self) -> Inflight {
        Inflight {
            requests: self.reqs.len() + self.hints.len(),
            ops: self.ops.len(),
            fills: self.fills.len(),
            paced: self.paced,
            prefetch_queue: self.prefetch_queue.len(),
            directory: self.dir.len(),
            slots: self.dir.capacity(),
        }
    }

    /// The directory's and the fills' invariants, for tests and the simulation.
    pub fn check(&self) -> Result<(), String> {
        self.dir.check()?;
        for (f, fill) in &self.fills {
            if self.fill_of.get(&fill.block) != Some(f) {
                return Err(format!("fill {f} of block {} is not the block's fill", fill.block));
            }
        }
        if self.fill_of.len() != self.fills.len() {
            return Err(format!("{} fills, {} blocks with fills", self.fills.len(), self.fill_of.len()));
        }
        let mut trims = vec![0; self.dir.member_count()];
        for o in self.ops.values() {
            if let (OpKind::SlotTrim { slot }, Some(m)) = (&o.kind, o.member) {
                if !self.dir.trimming(m, *slot) || !self.dir.trim_due(m, *slot) {
                    return Err(format!("a trim in flight of member {m} slot {slot}, which is not dropped and unpinned"));
                }
                trims[m] += 1;
            }
        }
        match (0..trims.len()).find(|&m| trims[m] != self.dir.trims_sent(m)) {
            Some(m) => Err(format!("member {m}: {} trims in flight, {} counted", trims[m], self.dir.trims_sent(m))),
            None => Ok(()),
        }
    }

    /// With no request in flight and every operation reported: nothing is left held.
    #[cfg(test)]
    pub(crate) fn check_idle(&self) -> Result<(), String> {
        if !self.ops.is_empty() || !self.writes.is_empty() || self.demand_reads != 0 {
            let held = (self.ops.len(), self.writes.len(), self.demand_reads);
            return Err(format!("idle, yet (operations, writes, demand reads) {held:?} held"));
        }
        self.dir.check_idle()
    }

    /// Ids grow and the clock never goes back, so `ops` in id order is in the order they
    /// started: the oldest first (`next_timeout`, `check_timeouts`).
    fn new_op(&mut self, kind: OpKind, member: Option<usize>) -> OpId {
        debug_assert!(self.ops.last_key_value().is_none_or(|(_, o)| o.started <= self.now));
        let op = OpId(self.next_op);
        self.next_op += 1;
        self.ops.insert(op, Op { kind, member, started: self.now });
        op
    }

    fn backing(&mut self, kind: OpKind, cmd: BackingCmd) -> OpId {
        let op = self.new_op(kind, None);
        self.actions.push_back(Action::Backing { op, cmd });
        op
    }

    fn member_op(&mut self, member: usize, kind: OpKind, cmd: MemberCmd) {
        let op = self.new_op(kind, Some(member));
        self.actions.push_back(Action::Member { op, member, cmd });
    }

    fn blocks(&self) -> u64 {
        self.p.volume_bytes.div_ceil(self.p.block_bytes)
    }

    /// The fill of block `b` at `generation`, as its page sums are seeded.
    fn origin(&self, b: u64, generation: u64) -> Origin {
        Origin { volume: self.p.identity, offset: b * self.p.block_bytes, generation }
    }

    /// Bytes of block `b` inside the volume (the last block may be short).
    fn block_len(&self, b: u64) -> u64 {
        (self.p.volume_bytes - b * self.p.block_bytes).min(self.p.block_bytes)
    }
}
