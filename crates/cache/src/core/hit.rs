//! Hits: a cached block is read from its slot as two pieces, the header's start (the fixed
//! fields and the sums of the pages up to the last one needed) and the pages the request
//! covers (whole pages: a partial page at a request's edge is read whole), in two member
//! reads in flight at once, or in one when little lies between them for what it reads
//! (`SLOT_READ_MERGE_DIVISOR`). The slot stays pinned until both are back; then the header
//! and just those pages are checked. A failed read or check is a miss, read again from
//! the backing.

use super::state::{Hit, OpKind, Part};
use super::Cache;
use crate::api::{MemberCmd, Outcome, ReqId};
use crate::directory::Entry;
use crate::limits::PAGE_BYTES;
use crate::slot::{self, Header, SlotError};

impl Cache {
    pub(super) fn read_slot(&mut self, req: ReqId, block: u64, entry: Entry) {
        let prefetched = self.dir.read_started(block);
        let p = self.reqs.get_mut(&req).expect("a pending read");
        p.parts += 1;
        let start = block * self.p.block_bytes;
        let lo = p.offset.max(start) - start;
        let hi = (p.offset + p.buf.len() as u64).min(start + self.block_len(block)) - start;
        let (first, end) = (lo / PAGE_BYTES, hi.div_ceil(PAGE_BYTES));
        let hit = self.next_hit;
        self.next_hit += 1;
        self.hits.insert(hit, Hit { req, block, entry, prefetched, first, end, head: None, pages: None });
        let at = entry.slot as u64 * self.slot_bytes();
        let (head_len, pages_at) = layout(self.p.block_bytes, first, end);
        let pages_len = (end - first) * PAGE_BYTES;
        if (pages_at - head_len).saturating_mul(self.read_merge_divisor) <= pages_len {
            self.slot_read(entry.member, hit, Part::Both, at, pages_at + pages_len);
        } else {
            self.slot_read(entry.member, hit, Part::Header, at, head_len);
            self.slot_read(entry.member, hit, Part::Pages, at + pages_at, pages_len);
        }
    }

    fn slot_read(&mut self, member: usize, hit: u64, part: Part, offset: u64, len: u64) {
        self.counters.hit_reads += 1;
        self.counters.hit_read_bytes += len;
        self.member_op(member, OpKind::SlotRead { hit, part }, MemberCmd::Read { offset, len });
    }

    pub(super) fn slot_read_done(&mut self, hit: u64, part: Part, outcome: Outcome) {
        let h = self.hits.get_mut(&hit).expect("a hit with a read in flight");
        let member = h.entry.member;
        let Ok(mut bytes) = outcome else {
            let h = self.hits.remove(&hit).expect("just seen");
            self.dir.read_done(member, h.entry.slot);
            self.member_failed(member, true);
            return self.reread(h.req, h.block);
        };
        self.dir.member_answered(member);
        match part {
            Part::Header => h.head = Some(bytes),
            Part::Pages => h.pages = Some(bytes),
            Part::Both => {
                let (head_len, pages_at) = layout(self.p.block_bytes, h.first, h.end);
                h.pages = Some(bytes.get(pages_at as usize..).unwrap_or_default().to_vec());
                bytes.truncate(head_len as usize);
                h.head = Some(bytes);
            }
        }
        if h.head.is_some() && h.pages.is_some() {
            let h = self.hits.remove(&hit).expect("just seen");
            self.dir.read_done(member, h.entry.slot);
            self.hit_read(h);
        }
    }

    /// Both pieces of a hit are back: serve the pages if they check, else read the backing.
    fn hit_read(&mut self, h: Hit) {
        let (head, pages) = (h.head.as_deref().expect("read"), h.pages.as_deref().expect("read"));
        let e = h.entry;
        #[cfg(test)]
        let e = Entry { generation: if self.break_generation { slot::claimed_generation(head) } else { e.generation }, ..e };
        let want = self.header(h.block, e.generation);
        #[cfg(test)]
        let want = if self.break_identity { Header { volume: slot::claimed_volume(head), ..want } } else { want };
        if self.verify_hit(head, &want, h.first, h.end, pages).is_err() {
            self.counters.verify_failures += 1;
            if h.prefetched {
                self.counters.prefetched_wasted_bytes += self.p.block_bytes;
            }
            if self.dir.get(h.block).is_some_and(|now| (now.member, now.slot, now.generation) == (e.member, e.slot, e.generation)) {
                self.dir.invalidate(h.block);
            }
            return self.reread(h.req, h.block);
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

    fn verify_hit(&self, head: &[u8], want: &Header, first: u64, end: u64, pages: &[u8]) -> Result<(), SlotError> {
        if head.len() as u64 != slot::header_prefix_bytes(end) || pages.len() as u64 != (end - first) * PAGE_BYTES {
            return Err(SlotError::Length);
        }
        #[cfg(test)]
        if self.break_verify {
            return Ok(());
        }
        slot::verify_header(head, want)?;
        #[cfg(test)]
        if self.break_pages {
            return Ok(());
        }
        slot::verify_pages(head, want, first, pages)
    }
}

/// For pages `first..end` of a block of `block_bytes`: the bytes of the header a hit
/// reads, and where in the slot the first page lies.
fn layout(block_bytes: u64, first: u64, end: u64) -> (u64, u64) {
    (slot::header_prefix_bytes(end), slot::header_bytes(block_bytes) + first * PAGE_BYTES)
}
