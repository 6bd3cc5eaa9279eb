//! Writes (write-through), flushes, and members failing. A write, zero or trim goes to the
//! backing and is replied when the backing has it (FUA and FLUSH pass through unchanged).
//! When it starts, the blocks it touches, wholly or in part, leave the directory and their
//! fills go stale, so no read that starts later finds the old data in the cache; reads
//! already under way may return the old data, which the write had not yet replaced.
//!
//! A write that fails may still land: if its connection died with the write sent, the
//! backing takes it whenever it gets to it. A block filled meanwhile would keep the old
//! bytes after the backing moved on, and reads would go back to them with no write in
//! between. Nothing in NBD says when such a write is settled, so the blocks a failed
//! write touched are never filled again: their reads go to the backing, as misses, for
//! as long as the core lives. A write the backing refused (ENOSPC, say) is treated alike:
//! what it left there is undefined.

use super::state::{OpKind, Pending, Stage};
use super::Cache;
use crate::api::{Action, BackingCmd, ReqId};
use crate::directory::MemberState;

impl Cache {
    pub(super) fn start_write(&mut self, req: ReqId, offset: u64, len: u64, cmd: BackingCmd) {
        self.reqs.insert(req, Pending { offset, buf: Vec::new(), parts: 1, error: None });
        let bs = self.p.block_bytes;
        let (first, end) = (offset / bs, (offset + len).div_ceil(bs));
        let op = self.backing(OpKind::BackingWrite { req }, cmd);
        self.writes.insert(op, (first, end));
        self.invalidate(first, end);
        self.stale_fills(first, end);
    }

    /// A backing write, zero or trim is done; `failed`: see the module's comment.
    pub(super) fn write_done(&mut self, op: crate::api::OpId, failed: bool) {
        let (first, end) = self.writes.remove(&op).expect("a write's blocks are kept while it is out");
        #[cfg(test)]
        let failed = failed && !self.break_failed_write_rule;
        if failed {
            self.counters.failed_writes += 1;
            self.doubtful.insert(first, end);
        }
    }

    /// Blocks `first..end` leave the directory (looking at whichever is fewer: the blocks
    /// or the entries).
    fn invalidate(&mut self, first: u64, end: u64) {
        let blocks: Vec<u64> = if end - first <= self.dir.len() as u64 {
            (first..end).collect()
        } else {
            self.dir.blocks_in(first, end)
        };
        for b in blocks {
            if let Some(e) = self.dir.invalidate(b) {
                if e.prefetched {
                    self.counters.prefetched_wasted_bytes += self.p.block_bytes;
                }
                self.trim_slot(e.member, e.slot);
            }
        }
    }

    pub(super) fn start_flush(&mut self, req: ReqId) {
        self.reqs.insert(req, Pending { offset: 0, buf: Vec::new(), parts: 1, error: None });
        self.backing(OpKind::BackingFlush { req }, BackingCmd::Flush);
    }

    /// The member failed: its blocks are forgotten, its reads in flight read the backing,
    /// its slot writes are abandoned. `tell` (the core saw the failure): ask the shell to
    /// reconnect it.
    pub(super) fn member_failed(&mut self, member: usize, tell: bool) {
        if self.dir.state(member) != MemberState::Up {
            return;
        }
        self.counters.member_failures += 1;
        for e in self.dir.member_down(member) {
            if e.prefetched {
                self.counters.prefetched_wasted_bytes += self.p.block_bytes;
            }
        }
        let ops: Vec<_> = self.ops.iter().filter(|(_, o)| o.member == Some(member)).map(|(&op, _)| op).collect();
        for op in ops {
            match self.ops.remove(&op).expect("listed").kind {
                OpKind::SlotRead(h) => self.hit_lost(&h),
                OpKind::SlotWrite { fill } => {
                    debug_assert!(matches!(self.fills[&fill].stage, Stage::Writing(e, _) if e.member == member));
                    self.end_fill(fill, false);
                }
                // The slot went with the member's table; a trim landing late on a member
                // that kept its bytes only zeroes pages, which fail any hit's check.
                OpKind::SlotTrim { .. } => {}
                _ => unreachable!("a backing operation on a member"),
            }
        }
        if tell {
            let MemberState::Down { failures } = self.dir.state(member) else { unreachable!("just marked down") };
            self.actions.push_back(Action::Reconnect { member, failures });
        }
    }

    pub(super) fn check_timeouts(&mut self) {
        let limit = self.p.member_timeout_ms * 1_000_000;
        let late: Vec<usize> =
            self.ops.values().take_while(|o| self.now.saturating_sub(o.started) > limit).filter_map(|o| o.member).collect();
        for m in late {
            self.member_failed(m, true);
        }
    }
}
