//! Member faults: deaths the shell reports, deaths seen as failed operations, hangs the
//! core must time out, silent restarts (all zeros, the same connection), reconnects that
//! keep the member's memory (reported up, never down), old slot writes landing again,
//! slots another gateway wrote (whole or torn: bytes that are some block's valid data, of
//! this volume or another), dropped pages (an elastic member giving memory back), and a page
//! of a slot zeroed or replaced by another fill's while a hit reads it.

use super::model::{sector_bytes, SECTOR};
use super::store::{self, Cmd};
use crate::api::MemberCmd;
use crate::limits::PAGE_BYTES;
use super::World;
use crate::api::Outcome;

impl World {
    pub(super) fn fault(&mut self) {
        if self.knobs.only_torn_hits || self.rng.below(150) != 0 {
            return;
        }
        let m = self.rng.below(self.members.len() as u64) as usize;
        if !self.members[m].alive {
            return;
        }
        match self.rng.below(9) {
            0 => {
                self.members[m].alive = false;
                self.log.push(format!("{} member {m} dies, reported", self.now));
                self.cache.handle_member_down(self.now, m);
                self.schedule_restart(m);
            }
            1 => {
                self.log.push(format!("{} member {m} hangs", self.now));
                self.members[m].hung = true;
            }
            2 => {
                self.log.push(format!("{} member {m} restarts empty, unreported", self.now));
                self.members[m].bytes.fill(0);
            }
            3 => self.replay_write(m),
            7 => self.foreign_slot(m),
            4 => {
                // The shell lost the connection and got it back at once, never reporting it
                // down; the old connection's operations may still land.
                let slots = self.members[m].bytes.len() as u64 / self.cache.slot_bytes();
                self.members[m].restart(slots, self.cache.slot_bytes(), true);
                self.log.push(format!("{} member {m} reconnects, memory kept, reported up", self.now));
                self.cache.handle_member_up(self.now, m, slots);
            }
            _ => self.drop_pages(m),
        }
    }

    fn drop_pages(&mut self, m: usize) {
        let pages = self.members[m].bytes.len() / 4096;
        if pages == 0 {
            return;
        }
        let n = 1 + self.rng.below(pages as u64 / 4 + 1);
        for _ in 0..n {
            let p = self.rng.below(pages as u64) as usize;
            self.members[m].bytes[p * 4096..(p + 1) * 4096].fill(0);
        }
        self.log.push(format!("{} member {m} drops {n} pages", self.now));
    }

    /// Another gateway writes a block of its own over one of our slots, whole or only its
    /// first page (torn): another gateway caching this volume (the backing's bytes of some
    /// block as they are now: the block our slot holds or another, a newer version of it or
    /// the one we filled), or one caching another volume (bytes no client of ours wrote).
    /// Each is some block's valid data, which only the gateway's sums tell from ours.
    fn foreign_slot(&mut self, m: usize) {
        let bs = self.p.block_bytes as usize;
        let slots = self.members[m].bytes.len() / bs;
        if slots == 0 {
            return;
        }
        let at = self.rng.below(slots as u64) as usize * bs;
        let this_volume = self.rng.below(2) == 0;
        let data = if this_volume {
            let b = self.rng.below(self.p.volume_bytes.div_ceil(bs as u64)) as usize;
            let mut d = self.backing[b * bs..((b + 1) * bs).min(self.backing.len())].to_vec();
            d.resize(bs, 0);
            d
        } else {
            sector_bytes(u64::MAX - self.rng.below(1000)).repeat(bs / SECTOR as usize)
        };
        let torn = self.rng.below(2) == 0;
        let len = if torn { PAGE_BYTES as usize } else { bs };
        self.members[m].bytes[at..at + len].copy_from_slice(&data[..len]);
        self.log.push(format!("{} member {m}: a foreign slot lands at {at} (this volume: {this_volume}, torn: {torn})", self.now));
    }

    /// Member `m` is about to answer a hit's read of `len` bytes at `offset`: now and then
    /// one of those pages is zeroed (dropped) or replaced by the same page of another fill
    /// (another generation of this slot when the member had one, else of another slot)
    /// while the read is in flight.
    pub(super) fn page_under_hit(&mut self, m: usize, offset: u64, len: u64) {
        let odds = if self.knobs.only_torn_hits { 2 } else { 16 };
        if !self.knobs.faults || len < PAGE_BYTES || self.rng.below(odds) != 0 {
            return;
        }
        let slot_bytes = self.cache.slot_bytes();
        let page = offset + self.rng.below(len / PAGE_BYTES) * PAGE_BYTES;
        let slot_at = page / slot_bytes * slot_bytes;
        let replacement = match self.rng.below(4) {
            0 => None,
            _ => self.other_fill_page(m, slot_at, page - slot_at),
        };
        let what = if replacement.is_some() { "replaced by another fill's" } else { "dropped" };
        let bytes = replacement.unwrap_or_else(|| vec![0; PAGE_BYTES as usize]);
        self.members[m].bytes[page as usize..(page + PAGE_BYTES) as usize].copy_from_slice(&bytes);
        self.log.push(format!("{} member {m}: the page at {page} {what} while a hit reads it", self.now));
    }

    /// The page at `within` of a slot write member `m` took earlier for another fill than
    /// the one its slot at `slot_at` holds now (told apart by that page's bytes, the only
    /// difference a hit could see): of the same slot if it had one, else of another slot.
    fn other_fill_page(&mut self, m: usize, slot_at: u64, within: u64) -> Option<Vec<u8>> {
        let page = |b: &[u8], at: u64| b[(at + within) as usize..(at + within + PAGE_BYTES) as usize].to_vec();
        let now = page(&self.members[m].bytes, slot_at);
        let write = |i: usize| match &self.past_writes[i] {
            (wm, Cmd::Member(MemberCmd::Write { offset, data })) if *wm == m && page(data, 0) != now => Some((*offset, data)),
            _ => None,
        };
        let olds: Vec<usize> = (0..self.past_writes.len()).filter(|&i| write(i).is_some()).collect();
        let same: Vec<usize> = olds.iter().copied().filter(|&i| write(i).is_some_and(|(o, _)| o == slot_at)).collect();
        let from = if same.is_empty() { olds } else { same };
        if from.is_empty() {
            return None;
        }
        let i = from[self.rng.below(from.len() as u64) as usize];
        let (_, data) = write(i).expect("listed");
        Some(page(data, 0))
    }

    /// A slot write done earlier lands again (an old connection's copy arriving late):
    /// the slot then holds an older fill, of this block or another.
    fn replay_write(&mut self, m: usize) {
        let mine: Vec<usize> = (0..self.past_writes.len()).filter(|&i| self.past_writes[i].0 == m).collect();
        if mine.is_empty() {
            return;
        }
        let cmd = self.past_writes[mine[self.rng.below(mine.len() as u64) as usize]].1.clone();
        if store::apply(&mut self.members[m].bytes, &cmd).is_ok() {
            self.log.push(format!("{} member {m}: an old slot write lands again", self.now));
        }
    }

    pub(super) fn remember_write(&mut self, m: usize, cmd: Cmd) {
        const PAST_WRITES_MAX: usize = 64;
        if self.past_writes.len() == PAST_WRITES_MAX {
            let i = self.rng.below(PAST_WRITES_MAX as u64) as usize;
            self.past_writes[i] = (m, cmd);
        } else {
            self.past_writes.push((m, cmd));
        }
    }

    /// Carries out a backing operation; now and then (in runs with faults) it fails, a
    /// write having landed or not. Whether it was applied.
    pub(super) fn backing_op(&mut self, cmd: &Cmd) -> (Outcome, bool) {
        if !self.knobs.faults || self.rng.below(300) != 0 {
            let out = store::apply(&mut self.backing, cmd);
            let applied = out.is_ok();
            return (out, applied);
        }
        let applied = self.rng.below(2) == 0 && store::apply(&mut self.backing, cmd).is_ok();
        self.log.push(format!("{} the backing fails an operation (applied: {applied})", self.now));
        (Err(super::INJECTED.into()), applied)
    }

    pub(super) fn schedule_restart(&mut self, m: usize) {
        if self.restart_at[m].is_none() {
            self.restart_at[m] = Some(self.now + 100_000 + self.rng.below(2_000_000));
        }
    }

    /// Members whose restart is due come back, empty, and are reported up.
    pub(super) fn restarts(&mut self) {
        for m in 0..self.members.len() {
            if self.restart_at[m].is_some_and(|t| t <= self.now) {
                self.restart_at[m] = None;
                let (slots, keep) = (self.member_slots(), self.rng.below(2) == 0);
                let slot_bytes = self.cache.slot_bytes();
                self.members[m].restart(slots, slot_bytes, keep);
                self.log.push(format!("{} member {m} up with {slots} slots (memory kept: {keep})", self.now));
                self.cache.handle_member_up(self.now, m, slots);
            }
        }
    }
}
