//! Fills: a block read from the backing goes into a slot on the member placement picks,
//! and into the directory when the slot write is done, unless it went stale on the way
//! (see `state::Fill`). Prefetch and NBD_CMD_CACHE fills are paced: at most
//! `paced_fills_max` of them (backing read and slot write) at once, none started while
//! `PREFETCH_DEMAND_READS_MAX` demand reads are at the backing, and each queued behind the
//! demand work of the same call. Consecutive blocks go to the backing as one read of up to
//! `PREFETCH_RUN_BYTES_MAX`.

use super::state::{Fill, Hint, OpKind, Source, Stage};
use super::Cache;
use crate::api::{Action, BackingCmd, MemberCmd, Outcome, ReqId};
use crate::directory::Entry;
use crate::limits::{paced_fills_max, paced_run_blocks, PREFETCH_DEMAND_READS_MAX, PREFETCH_WINDOW_BLOCKS_MAX, STREAMS_MAX};
use crate::slot;

impl Cache {
    /// A fill for `block` if it may start one: not cached, no fill already, no write in
    /// flight to it (its data could be older than that write) nor one that failed (see
    /// `write`), and a member to put it on.
    pub(super) fn try_fill(&mut self, block: u64, source: Source) -> Option<u64> {
        let writing = self.writes.values().any(|&(a, b)| (a..b).contains(&block));
        if writing || self.doubtful.contains(block) || self.fill_of.contains_key(&block) || self.dir.get(block).is_some() || self.dir.place(block).is_none() {
            return None;
        }
        let f = self.next_fill;
        self.next_fill += 1;
        self.fills.insert(f, Fill { block, stale: false, source, waiters: Vec::new(), served: false, stage: Stage::Reading });
        self.fill_of.insert(block, f);
        if source.paced() {
            self.paced += 1;
        }
        Some(f)
    }

    /// A fill's backing read is done (`None`: it failed). Waiters get the data; the block
    /// goes to a slot unless the fill is stale or no member has room.
    pub(super) fn fill_read_done(&mut self, f: u64, data: Option<Vec<u8>>) {
        let fill = self.fills.get_mut(&f).expect("a live fill");
        let (block, source, waiters) = (fill.block, fill.source, std::mem::take(&mut fill.waiters));
        let Some(data) = data else {
            waiters.into_iter().for_each(|w| self.reread(w, block));
            return self.end_fill(f, false);
        };
        let served = !waiters.is_empty();
        for w in waiters {
            self.count_miss(w, block);
            let used = self.copy_into(w, block * self.p.block_bytes, &data[..self.block_len(block) as usize]);
            if source.paced() {
                self.counters.prefetched_used_bytes += used;
            }
            self.part_done(w, None);
        }
        self.fills.get_mut(&f).expect("a live fill").served |= served;
        let stale = self.fills[&f].stale;
        let placed = self.dir.place(block);
        let generation = self.next_generation;
        let Some((member, slot, evicted)) = placed.filter(|_| !stale).and_then(|m| {
            self.dir.allocate(m, block, generation).map(|(s, ev)| (m, s, ev))
        }) else {
            return self.end_fill(f, false);
        };
        self.next_generation += 1;
        if let Some(ev) = evicted {
            self.counters.evictions += 1;
            if ev.prefetched {
                self.counters.prefetched_wasted_bytes += self.p.block_bytes;
            }
        }
        // A prefetch a waiting read used already counted as used: not again, nor as wasted.
        let entry = Entry { member, slot, generation, prefetched: source.paced() && !served };
        let sums = slot::page_sums(&self.origin(block, generation), &data);
        self.fills.get_mut(&f).expect("a live fill").stage = Stage::Writing(entry, sums);
        let offset = slot as u64 * self.slot_bytes();
        self.member_op(member, OpKind::SlotWrite { fill: f }, MemberCmd::Write { offset, data });
    }

    pub(super) fn slot_write_done(&mut self, f: u64, outcome: Outcome) {
        let fill = &self.fills[&f];
        let Stage::Writing(e, sums) = &fill.stage else { unreachable!("a slot write of a fill not writing") };
        let e = *e;
        if outcome.is_ok() {
            self.dir.member_answered(e.member);
        }
        match outcome {
            Ok(_) if !fill.stale => {
                self.dir.install(e.member, e.slot, e.generation, e.prefetched, sums);
                self.counters.fills += 1;
                self.end_fill(f, true);
            }
            Ok(_) => {
                self.dir.release(e.member, e.slot, e.generation);
                self.trim_slot(e.member, e.slot);
                self.end_fill(f, false);
            }
            Err(_) => {
                self.dir.release(e.member, e.slot, e.generation);
                self.end_fill(f, false);
                self.member_failed(e.member, true);
            }
        }
    }

    /// Member `member`'s slot `slot` was just dropped holding bytes no entry reads (its
    /// entry invalidated, or a fill that a write overtook): it is trimmed whole, so the
    /// member gives its memory back (CLOCK's evictions need none: the new fill overwrites
    /// the slot). The slot is not allocated again until the trim is reported, since a trim
    /// and a later fill's write, on different connections, may land in either order.
    ///
    /// A slot a hit's read pins is trimmed when the last such read is done (`read_done`
    /// says so), never under a read: the slot cannot be allocated meanwhile either, so it is
    /// trimmed exactly once, with nothing else of this cache in flight on it. Trims go out
    /// at most `MEMBER_TRIMS_INFLIGHT_MAX` at a time per member (`send_trims`).
    pub(super) fn trim_slot(&mut self, member: usize, slot: u32) {
        if !self.dir.trim_due(member, slot) {
            return;
        }
        self.dir.queue_trim(member, slot);
        self.send_trims(member);
    }

    /// Sends the trims of `member` that wait, while fewer than `MEMBER_TRIMS_INFLIGHT_MAX`
    /// are in flight.
    fn send_trims(&mut self, member: usize) {
        let len = self.slot_bytes();
        while let Some(slot) = self.dir.next_trim(member) {
            self.counters.member_trims += 1;
            self.member_op(member, OpKind::SlotTrim { slot }, MemberCmd::Trim { offset: slot as u64 * len, len });
        }
    }

    /// A slot's trim is reported. A failed trim fails its member, as any failed member
    /// operation does: one rule for what a member's error means (its connection, or the
    /// member, is broken), and it costs nothing here, since every member the shell keeps
    /// supports TRIM or is answered Ok without sending (a RAM export always can).
    pub(super) fn slot_trim_done(&mut self, member: usize, slot: u32, outcome: Outcome) {
        match outcome {
            Ok(_) => {
                self.dir.member_answered(member);
                self.dir.trim_done(member, slot);
                self.send_trims(member);
            }
            Err(_) => self.member_failed(member, true),
        }
    }

    /// The fill is over, `installed` or not: paced fills not installed are wasted, a hint
    /// counts it done.
    pub(super) fn end_fill(&mut self, f: u64, installed: bool) {
        let fill = self.fills.remove(&f).expect("a live fill");
        self.fill_of.remove(&fill.block);
        if fill.source.paced() {
            self.paced -= 1;
        }
        if !installed && !fill.served && fill.source.paced() {
            self.counters.prefetched_wasted_bytes += self.p.block_bytes;
        }
        if let Source::Hint(req) = fill.source {
            if let Some(h) = self.hints.iter_mut().find(|h| h.req == req) {
                h.outstanding -= 1;
            }
        }
    }

    /// A write to blocks `first..end` starts: fills of them go stale, and reads waiting on
    /// those fills read the backing themselves (issued now, after the write started).
    pub(super) fn stale_fills(&mut self, first: u64, end: u64) {
        #[cfg(test)]
        if self.break_stale_rule {
            return;
        }
        let hit: Vec<u64> = if end - first <= self.fills.len() as u64 {
            (first..end).filter_map(|b| self.fill_of.get(&b).copied()).collect()
        } else {
            self.fills.iter().filter(|(_, x)| (first..end).contains(&x.block)).map(|(&f, _)| f).collect()
        };
        for f in hit {
            let fill = self.fills.get_mut(&f).expect("a live fill");
            self.counters.fills_overtaken += u64::from(!fill.stale);
            fill.stale = true;
            let (block, waiters) = (fill.block, std::mem::take(&mut fill.waiters));
            waiters.into_iter().for_each(|w| self.reread(w, block));
        }
    }

    pub(super) fn note_stream(&mut self, offset: u64, len: u64) {
        if !self.p.prefetch {
            return;
        }
        let (bs, window, blocks) = (self.p.block_bytes, self.p.prefetch_window_blocks, self.blocks());
        if let Some(ahead) = self.streams.note(offset, len, bs, window, blocks) {
            self.prefetch_queue.extend(ahead);
            let max = STREAMS_MAX * PREFETCH_WINDOW_BLOCKS_MAX as usize;
            while self.prefetch_queue.len() > max {
                self.prefetch_queue.pop_front();
            }
        }
    }

    pub(super) fn start_hint(&mut self, req: ReqId, offset: u64, len: u64) {
        let bs = self.p.block_bytes;
        self.hints.push_back(Hint { req, next: offset / bs, end: (offset + len).div_ceil(bs), outstanding: 0 });
    }

    /// Starts paced fills while there is room: hints first (a client asked), then prefetch.
    /// Replies to hints that are done.
    pub(super) fn pump(&mut self) {
        let mut i = 0;
        while i < self.hints.len() {
            while self.room_to_pace() && self.hints[i].next < self.hints[i].end {
                let (req, first, end) = (self.hints[i].req, self.hints[i].next, self.hints[i].end);
                let (tried, started) = self.paced_run(first, end, Source::Hint(req));
                self.hints[i].next += tried;
                self.hints[i].outstanding += started;
            }
            let h = &self.hints[i];
            if h.next == h.end && h.outstanding == 0 {
                let req = h.req;
                self.hints.remove(i);
                self.actions.push_back(Action::Reply { req, result: Ok(Vec::new()) });
            } else {
                i += 1;
            }
        }
        while self.room_to_pace() {
            let Some(&first) = self.prefetch_queue.front() else { break };
            // The queue's next blocks, while they follow on from `first`.
            let queued = self.prefetch_queue.iter().zip(first..).take_while(|(&b, want)| b == *want).count();
            let (tried, _) = self.paced_run(first, first + queued as u64, Source::Prefetch);
            self.prefetch_queue.drain(..tried as usize);
        }
    }

    fn room_to_pace(&self) -> bool {
        self.paced < paced_fills_max(self.p.block_bytes) && self.demand_reads < PREFETCH_DEMAND_READS_MAX
    }

    /// Fills for blocks from `first` (before `end`) as one read of the backing: as many
    /// consecutive blocks as a fill may start for, the run and the pace allow. Returns how
    /// many blocks it went past (at least one) and how many fills it started.
    fn paced_run(&mut self, first: u64, end: u64, source: Source) -> (u64, u32) {
        let most = paced_run_blocks(self.p.block_bytes).min(end - first);
        let mut fills = Vec::new();
        while (fills.len() as u64) < most && (fills.is_empty() || self.room_to_pace()) {
            match self.try_fill(first + fills.len() as u64, source) {
                Some(f) => fills.push(Some(f)),
                None => break,
            }
        }
        if fills.is_empty() {
            return (1, 0);
        }
        let bs = self.p.block_bytes;
        let n = fills.len() as u64;
        let start = first * bs;
        // Not `(first + n) * bs`: the last block's end may lie past u64::MAX.
        let len = (n * bs).min(self.p.volume_bytes - start);
        self.backing(OpKind::BackingRead { req: None, first, start, len, fills }, BackingCmd::Read { offset: start, len });
        // At most `paced_run_blocks`, a few hundred.
        (n, n as u32)
    }
}
