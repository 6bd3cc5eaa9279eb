//! Hits: a cached block is read from its slot in one member read of just the pages the
//! request covers (whole pages: a partial page at a request's edge is read whole), the
//! slot pinned until they are back and checked. Each page is checked against the sum the
//! directory kept from the block's fill (`slot` says why that is enough). A failed
//! read or check is a miss, read again from the backing.

use super::state::{Hit, OpKind};
use super::Cache;
use crate::api::{MemberCmd, Outcome, ReqId};
use crate::directory::Entry;
use crate::limits::PAGE_BYTES;
use crate::slot::{self, PageError};

impl Cache {
    pub(super) fn read_slot(&mut self, req: ReqId, block: u64, entry: Entry) {
        let prefetched = self.dir.read_started(block);
        let p = self.reqs.get_mut(&req).expect("a pending read");
        p.parts += 1;
        let start = block * self.p.block_bytes;
        let lo = p.offset.max(start) - start;
        let hi = (p.offset + p.buf.len() as u64).min(start + self.block_len(block)) - start;
        let (first, end) = (lo / PAGE_BYTES, hi.div_ceil(PAGE_BYTES));
        let offset = entry.slot as u64 * self.slot_bytes() + first * PAGE_BYTES;
        let len = (end - first) * PAGE_BYTES;
        self.counters.hit_reads += 1;
        self.counters.hit_read_bytes += len;
        let hit = Hit { req, block, entry, prefetched, first, end };
        self.member_op(entry.member, OpKind::SlotRead(hit), MemberCmd::Read { offset, len });
    }

    /// A hit's pages are back: served if they check, else read from the backing.
    pub(super) fn slot_read_done(&mut self, h: Hit, outcome: Outcome) {
        let e = h.entry;
        let Ok(pages) = outcome else {
            // No trim even if the slot was dropped: the member goes down with its slots.
            self.dir.read_done(e.member, e.slot);
            self.member_failed(e.member, true);
            return self.hit_lost(&h);
        };
        self.dir.member_answered(e.member);
        let checked = self.check_hit(&h, &pages);
        if self.dir.read_done(e.member, e.slot) {
            self.trim_slot(e.member, e.slot);
        }
        if checked.is_err() {
            self.counters.verify_failures += 1;
            if self.dir.get(h.block).is_some_and(|now| (now.member, now.slot, now.generation) == (e.member, e.slot, e.generation)) {
                self.dir.invalidate(h.block);
                self.trim_slot(e.member, e.slot);
            }
            return self.hit_lost(&h);
        }
        let skip = h.first * PAGE_BYTES;
        let data = &pages[..(self.block_len(h.block) - skip).min(pages.len() as u64) as usize];
        let used = self.copy_into(h.req, h.block * self.p.block_bytes + skip, data);
        self.counters.hits += 1;
        self.counters.hit_bytes += used;
        if h.prefetched {
            self.counters.prefetched_used_bytes += used;
        }
        self.part_done(h.req, None);
    }

    /// A hit served nothing (its read failed or was forgotten with its member, or its pages
    /// failed their check): the piece reads the backing. A prefetched block's first read
    /// took its mark (`Directory::read_started`), so the block, gone or untrusted now, is
    /// counted wasted here or never.
    pub(super) fn hit_lost(&mut self, h: &Hit) {
        if h.prefetched {
            self.counters.prefetched_wasted_bytes += self.p.block_bytes;
        }
        self.reread(h.req, h.block);
    }

    /// Checks the pages a hit read against the directory's sums of its slot, which are those
    /// of the fill its entry names: the slot is pinned from the hit's start to here, so no
    /// other fill was installed in it meanwhile (see `Directory::install`).
    fn check_hit(&self, h: &Hit, pages: &[u8]) -> Result<(), PageError> {
        if pages.len() as u64 != (h.end - h.first) * PAGE_BYTES {
            return Err(PageError::Length);
        }
        #[cfg(test)]
        if self.break_verify {
            return Ok(());
        }
        let sums = self.dir.sums(h.entry.member, h.entry.slot).ok_or(PageError::Length)?;
        let want = self.origin(h.block, h.entry.generation);
        #[cfg(test)]
        let want = slot::Origin {
            generation: want.generation + u64::from(self.break_generation),
            volume: want.volume ^ u64::from(self.break_identity),
            ..want
        };
        let end = h.end;
        #[cfg(test)]
        let end = if self.break_pages { h.first + 1 } else { end };
        let n = ((end - h.first) * PAGE_BYTES) as usize;
        slot::check_pages(&want, h.first, &pages[..n], &sums[h.first as usize..end as usize])
    }
}
