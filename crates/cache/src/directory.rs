//! The gateway's map of what the members hold: block -> (member, slot, generation), the
//! members' slot tables with their CLOCK hands and the page sums of the blocks their slots
//! hold, and placement by rendezvous hashing.
//!
//! Memory is bounded by the members' capacity: one `SlotMeta` (32 bytes) per slot a member
//! lends, at most one `Entry` (a hash map slot of about 40 bytes) per slot, since an entry
//! exists only for a slot that holds its block, so about 72 bytes per lent slot; and one
//! page sum (8 bytes) per 4 KiB page of the slots' blocks, 0.2% of the memory lent (128
//! bytes a slot of 64 KiB). The slot tables and the sums are allocated when a member comes
//! up, whether its slots hold blocks or not, none per fill or hit; the entries' map grows as
//! blocks are installed, up to one entry per slot. `limits::member_slots_max` bounds all of
//! it whatever size a member claims. Blocks the cache does not hold cost nothing more;
//! slots dropped and waiting to be trimmed, 4 bytes each while they wait (`Member::trims`).

use std::collections::{HashMap, VecDeque};

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::limits::{member_slots_max, MEMBER_TRIMS_INFLIGHT_MAX};

/// Where a block that may be read from the cache lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Entry {
    pub member: usize,
    pub slot: u32,
    pub generation: u64,
    /// Filled by prefetch or a hint and not read since: counts as wasted if evicted so.
    pub prefetched: bool,
}

#[derive(Clone, Copy, Debug, Default)]
struct SlotMeta {
    block: Option<u64>,
    generation: u64,
    /// CLOCK's reference bit: set by a hit, cleared as the hand passes.
    referenced: bool,
    /// Reads of the slot in flight: the slot is not reused under them.
    busy: u32,
    /// A fill's write is in flight: not yet in the map, and not reusable.
    filling: bool,
    /// Dropped while holding bytes no entry reads: the core trims it (once the last read
    /// pinning it is done), and it is not reusable until the trim is reported, so the trim
    /// never lands after a later fill's write (see `Cache::trim_slot`).
    trimming: bool,
}

/// A member as the directory sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    Up,
    /// Failed; `failures` in a row since it last answered an operation (for the reconnect
    /// backoff: a member that comes back and fails at once waits longer each time).
    Down { failures: u32 },
}

struct Member {
    seed: u64,
    state: MemberState,
    /// Failures since the member last answered an operation: a member that comes up and
    /// fails again at once keeps counting, so its reconnects back off.
    failures: u32,
    slots: Vec<SlotMeta>,
    /// The page sums of the block each slot holds, `pages` a slot from slot 0: what a hit
    /// checks the pages it reads against. A slot's sums are written only when its block is
    /// installed (`install`), and left as they are when it is freed, until the next install.
    sums: Vec<u64>,
    /// Slots holding a block (settled or filling): counted, since `/metrics` asks often and
    /// a member may lend millions of slots.
    held: u64,
    hand: usize,
    /// Slots dropped, unpinned and waiting for their trim to be sent: at most
    /// `MEMBER_TRIMS_INFLIGHT_MAX` are in flight (`trims_sent`), and a slot dropped past
    /// them waits here, once (a slot is dropped again only after its trim is done).
    trims: VecDeque<u32>,
    /// Trims sent and not yet reported (the core's `SlotTrim` operations on this member).
    trims_sent: usize,
}

/// A block pushed out of its slot to make room.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Evicted {
    pub block: u64,
    pub prefetched: bool,
}

pub struct Directory {
    blocks: HashMap<u64, Entry>,
    members: Vec<Member>,
    /// Pages in a block: the page sums each slot has.
    pages: usize,
}

impl Directory {
    /// Members start down with no slots: the shell reports each up with its capacity.
    /// Blocks have `pages` pages.
    pub fn new(names: &[String], pages: usize) -> Directory {
        assert!(pages > 0, "a block is at least a page");
        let members = names
            .iter()
            .map(|n| Member {
                seed: xxh3_64(n.as_bytes()),
                state: MemberState::Down { failures: 0 },
                failures: 0,
                slots: Vec::new(),
                sums: Vec::new(),
                held: 0,
                hand: 0,
                trims: VecDeque::new(),
                trims_sent: 0,
            })
            .collect();
        Directory { blocks: HashMap::new(), members, pages }
    }

    pub fn get(&self, block: u64) -> Option<Entry> {
        self.blocks.get(&block).copied()
    }

    /// The cached blocks in `first..end`.
    pub fn blocks_in(&self, first: u64, end: u64) -> Vec<u64> {
        self.blocks.keys().copied().filter(|b| (first..end).contains(b)).collect()
    }

    pub fn len(&self) -> usize {
        self.blocks.len()
    }

    pub fn is_empty(&self) -> bool {
        self.blocks.is_empty()
    }

    pub fn capacity(&self) -> u64 {
        self.members.iter().map(|m| m.slots.len() as u64).sum()
    }

    pub fn member_count(&self) -> usize {
        self.members.len()
    }

    pub fn state(&self, member: usize) -> MemberState {
        self.members[member].state
    }

    /// (slots lent, slots holding a block) of a member.
    pub fn usage(&self, member: usize) -> (u64, u64) {
        let m = &self.members[member];
        (m.slots.len() as u64, m.held)
    }

    /// The member a block belongs on: the up member with slots whose hash of (block,
    /// member) is highest, so adding or removing a member moves only its own blocks.
    pub fn place(&self, block: u64) -> Option<usize> {
        let key = block.to_le_bytes();
        let up = self.members.iter().enumerate().filter(|(_, m)| m.state == MemberState::Up && !m.slots.is_empty());
        up.max_by_key(|(_, m)| xxh3_64_with_seed(&key, m.seed)).map(|(i, _)| i)
    }

    /// A hit's slot read starts: the slot is referenced and kept from reuse until
    /// `read_done`. True when the block was prefetched and this is its first use.
    pub fn read_started(&mut self, block: u64) -> bool {
        let e = self.blocks.get_mut(&block).expect("a hit has an entry");
        let s = &mut self.members[e.member].slots[e.slot as usize];
        s.referenced = true;
        s.busy += 1;
        std::mem::replace(&mut e.prefetched, false)
    }

    /// A hit's slot read is done. True when it was the last read pinning a slot dropped
    /// meanwhile: the slot's trim is due now.
    pub fn read_done(&mut self, member: usize, slot: u32) -> bool {
        let Some(s) = self.members.get_mut(member).and_then(|m| m.slots.get_mut(slot as usize)) else { return false };
        s.busy = s.busy.saturating_sub(1);
        s.busy == 0 && s.trimming
    }

    /// Whether a slot just dropped (by `release` or `invalidate`) is to be trimmed now:
    /// false while a read pins it (`read_done` says when).
    pub fn trim_due(&self, member: usize, slot: u32) -> bool {
        self.members[member].slots[slot as usize].busy == 0
    }

    /// A dropped slot's trim is due (`trim_due`): it waits its turn (`next_trim`).
    pub fn queue_trim(&mut self, member: usize, slot: u32) {
        let m = &mut self.members[member];
        let s = &m.slots[slot as usize];
        assert!(s.trimming && s.busy == 0 && s.block.is_none(), "a trim's slot is dropped and unpinned: {s:?}");
        m.trims.push_back(slot);
    }

    /// The next slot of `member` whose trim is to be sent now, if fewer than
    /// `MEMBER_TRIMS_INFLIGHT_MAX` are in flight; it counts as sent.
    pub fn next_trim(&mut self, member: usize) -> Option<u32> {
        let m = &mut self.members[member];
        if m.trims_sent >= MEMBER_TRIMS_INFLIGHT_MAX {
            return None;
        }
        let slot = m.trims.pop_front()?;
        m.trims_sent += 1;
        Some(slot)
    }

    /// Trims of `member` sent and not yet reported.
    pub fn trims_sent(&self, member: usize) -> usize {
        self.members[member].trims_sent
    }

    /// The slot's trim is reported (done): it may be allocated again.
    pub fn trim_done(&mut self, member: usize, slot: u32) {
        let m = &mut self.members[member];
        let s = &mut m.slots[slot as usize];
        assert!(s.trimming && s.busy == 0 && s.block.is_none(), "a trim's slot is dropped and unpinned: {s:?}");
        assert!(m.trims_sent > 0, "a trim reported that was not sent");
        s.trimming = false;
        m.trims_sent -= 1;
    }

    /// Whether `member`'s slot `slot` waits on its trim (for the core's `check`).
    pub fn trimming(&self, member: usize, slot: u32) -> bool {
        self.members.get(member).and_then(|m| m.slots.get(slot as usize)).is_some_and(|s| s.trimming)
    }

    /// A slot on `member` for a fill of `block`, by CLOCK: the hand passes referenced slots
    /// (clearing their bit) and slots in use, and takes the first other one, evicting its
    /// block. None when every slot is in use (the fill is dropped: a miss, not a wait).
    pub fn allocate(&mut self, member: usize, block: u64, generation: u64) -> Option<(u32, Option<Evicted>)> {
        let m = &mut self.members[member];
        let n = m.slots.len();
        if n == 0 {
            return None;
        }
        for _ in 0..2 * n {
            let i = m.hand;
            m.hand = (m.hand + 1) % n;
            let s = &mut m.slots[i];
            if s.busy > 0 || s.filling || s.trimming {
                continue;
            }
            if s.block.is_some() && s.referenced {
                s.referenced = false;
                continue;
            }
            let evicted = s.block.map(|b| {
                let e = self.blocks.remove(&b).expect("a settled slot's block has its entry");
                Evicted { block: b, prefetched: e.prefetched }
            });
            m.held += u64::from(s.block.is_none());
            *s = SlotMeta { block: Some(block), generation, referenced: false, busy: 0, filling: true, trimming: false };
            return Some((i as u32, evicted));
        }
        None
    }

    /// A fill's slot write is done and still wanted: the block reads from the cache now,
    /// checked against `sums`, the page sums the fill wrote.
    ///
    /// The sums become the slot's in this same step, never before: a hit checks against
    /// the sums of the slot its entry names when its read comes back, and that must be the
    /// fill the entry names. No hit of an older entry of this slot can be in flight here
    /// (`allocate` takes no slot a read pins, and a hit pins its slot until it is checked),
    /// so none sees these sums. Were one to, it would still fail safe: its page is checked
    /// under a seed with its own entry's generation (and offset), under which no page of
    /// this fill hashes to these sums.
    pub fn install(&mut self, member: usize, slot: u32, generation: u64, prefetched: bool, sums: &[u64]) {
        assert_eq!(sums.len(), self.pages, "a sum for every page of the block");
        let m = &mut self.members[member];
        let s = &mut m.slots[slot as usize];
        assert!(s.filling && s.generation == generation, "installing a slot that is not this fill's");
        s.filling = false;
        let at = slot as usize * self.pages;
        m.sums[at..at + self.pages].copy_from_slice(sums);
        let block = s.block.expect("a filling slot names its block");
        let old = self.blocks.insert(block, Entry { member, slot, generation, prefetched });
        assert!(old.is_none(), "block {block} installed twice");
    }

    /// The page sums of the block `member`'s slot `slot` holds (its fill's, from when it was
    /// installed); None once the member went down.
    pub fn sums(&self, member: usize, slot: u32) -> Option<&[u64]> {
        let at = slot as usize * self.pages;
        self.members.get(member)?.sums.get(at..at + self.pages)
    }

    /// A fill's slot write is done and not wanted: the slot holds its bytes, which no entry
    /// reads, so it waits on its trim (`trim_done`) before it is reused.
    pub fn release(&mut self, member: usize, slot: u32, generation: u64) {
        let m = &mut self.members[member];
        let s = &mut m.slots[slot as usize];
        assert!(s.filling && s.generation == generation, "releasing a slot that is not this fill's");
        *s = SlotMeta { busy: s.busy, trimming: true, ..SlotMeta::default() };
        m.held -= 1;
    }

    /// The block's cached copy is no longer good (written, or failed its check): forget it
    /// and drop its slot, which waits on its trim (`trim_done`) before it is reused (and
    /// reads of it in flight keep it from reuse until they finish).
    pub fn invalidate(&mut self, block: u64) -> Option<Entry> {
        let e = self.blocks.remove(&block)?;
        let m = &mut self.members[e.member];
        let s = &mut m.slots[e.slot as usize];
        *s = SlotMeta { busy: s.busy, trimming: true, ..SlotMeta::default() };
        m.held -= 1;
        Some(e)
    }

    /// The member failed: every block it held is forgotten. Returns the entries dropped.
    pub fn member_down(&mut self, member: usize) -> Vec<Entry> {
        let m = &mut self.members[member];
        m.failures = m.failures.saturating_add(1);
        m.state = MemberState::Down { failures: m.failures };
        let gone: Vec<u64> = m.slots.iter().filter(|s| !s.filling).filter_map(|s| s.block).collect();
        m.slots = Vec::new();
        m.sums = Vec::new();
        m.held = 0;
        m.hand = 0;
        m.trims = VecDeque::new();
        m.trims_sent = 0;
        gone.iter().filter_map(|b| self.blocks.remove(b)).collect()
    }

    /// The member answered an operation: its failures in a row are over.
    pub fn member_answered(&mut self, member: usize) {
        self.members[member].failures = 0;
    }

    /// The member answers again, empty, lending `slots` slots (bounded in slots and in
    /// pages, so in the gateway memory they take).
    pub fn member_up(&mut self, member: usize, slots: u64) {
        let slots = slots.min(member_slots_max(self.pages as u64)) as usize;
        let m = &mut self.members[member];
        assert!(m.slots.is_empty(), "a member comes up only after it went down");
        m.state = MemberState::Up;
        m.slots = vec![SlotMeta::default(); slots];
        m.sums = vec![0; slots * self.pages];
        m.hand = 0;
    }

    /// The directory's invariants (for tests and the simulation): every entry's slot holds
    /// its block at its generation and is settled; entries never outnumber slots.
    pub fn check(&self) -> Result<(), String> {
        for (&b, e) in &self.blocks {
            let s = self.members.get(e.member).and_then(|m| m.slots.get(e.slot as usize)).ok_or("entry past its member's slots")?;
            if s.block != Some(b) || s.generation != e.generation || s.filling {
                return Err(format!("block {b}: entry {e:?} but slot {s:?}"));
            }
        }
        for (i, m) in self.members.iter().enumerate() {
            if m.sums.len() != m.slots.len() * self.pages {
                return Err(format!("member {i}: {} page sums for {} slots of {} pages", m.sums.len(), m.slots.len(), self.pages));
            }
            let held = m.slots.iter().filter(|s| s.block.is_some()).count() as u64;
            if held != m.held {
                return Err(format!("member {i}: {held} slots hold a block, {} counted", m.held));
            }
            if let Some(s) = m.slots.iter().find(|s| s.trimming && (s.block.is_some() || s.filling)) {
                return Err(format!("member {i}: a slot waiting on its trim holds a block: {s:?}"));
            }
            let waiting = m.slots.iter().filter(|s| s.trimming && s.busy == 0).count();
            if m.trims_sent > MEMBER_TRIMS_INFLIGHT_MAX || m.trims.len() + m.trims_sent != waiting {
                let (queued, sent) = (m.trims.len(), m.trims_sent);
                return Err(format!("member {i}: {queued} trims queued and {sent} sent, for {waiting} dropped unpinned slots"));
            }
        }
        if self.blocks.len() as u64 > self.capacity() {
            return Err(format!("{} entries for {} slots", self.blocks.len(), self.capacity()));
        }
        Ok(())
    }

    /// With nothing in flight: no slot is kept from reuse by a read, a fill that ended or a
    /// trim (sent or waiting).
    #[cfg(test)]
    pub fn check_idle(&self) -> Result<(), String> {
        for (m, member) in self.members.iter().enumerate() {
            if let Some((i, s)) = member.slots.iter().enumerate().find(|(_, s)| s.busy > 0 || s.filling || s.trimming) {
                return Err(format!("idle, yet member {m} slot {i} is held: {s:?}"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dir(members: usize, slots: u64) -> Directory {
        let names: Vec<String> = (0..members).map(|i| format!("nbd://node{i}/ram")).collect();
        let mut d = Directory::new(&names, 1);
        (0..members).for_each(|m| d.member_up(m, slots));
        d
    }

    /// A dropped slot's trim is queued, sent and reported.
    fn trimmed(d: &mut Directory, m: usize, slot: u32) {
        d.queue_trim(m, slot);
        assert_eq!(d.next_trim(m), Some(slot));
        d.trim_done(m, slot);
    }

    fn fill(d: &mut Directory, m: usize, block: u64, generation: u64) -> Option<Evicted> {
        let (slot, ev) = d.allocate(m, block, generation).expect("a slot");
        d.install(m, slot, generation, false, &[generation]);
        ev
    }

    #[test]
    fn placement_moves_only_the_blocks_of_the_member_that_comes_or_goes() {
        let mut d = dir(3, 1);
        let before: Vec<Option<usize>> = (0..3000).map(|b| d.place(b)).collect();
        for m in 0..3 {
            let share = before.iter().filter(|&&p| p == Some(m)).count();
            assert!((800..1200).contains(&share), "member {m} got {share} of 3000");
        }
        d.member_down(1);
        for (b, &was) in before.iter().enumerate() {
            let now = d.place(b as u64);
            assert!(was == Some(1) || now == was, "block {b} moved from {was:?} to {now:?}");
        }
        d.member_up(1, 1);
        assert!((0..3000).all(|b| d.place(b) == before[b as usize]), "coming back restores the placement");
    }

    #[test]
    fn clock_evicts_unreferenced_blocks_first() {
        let mut d = dir(1, 3);
        for b in 0..3 {
            assert_eq!(fill(&mut d, 0, b, b + 1), None);
        }
        assert!(!d.read_started(0));
        d.read_done(0, d.get(0).unwrap().slot);
        assert_eq!(fill(&mut d, 0, 10, 11), Some(Evicted { block: 1, prefetched: false }));
        assert!(d.get(0).is_some() && d.get(1).is_none() && d.get(10).is_some());
        d.check().unwrap();
    }

    #[test]
    fn slots_in_use_are_not_taken() {
        let mut d = dir(1, 2);
        fill(&mut d, 0, 0, 1);
        d.read_started(0);
        let (s, _) = d.allocate(0, 1, 2).unwrap();
        assert_eq!(d.allocate(0, 2, 3), None, "one slot being read, the other filling");
        d.release(0, s, 2);
        assert_eq!(d.allocate(0, 2, 3), None, "a released slot waits on its trim");
        trimmed(&mut d, 0, s);
        assert!(d.allocate(0, 2, 3).is_some());
    }

    #[test]
    fn usage_counts_slots_holding_a_block() {
        let mut d = dir(1, 4);
        fill(&mut d, 0, 0, 1);
        fill(&mut d, 0, 1, 2);
        let (s, _) = d.allocate(0, 2, 3).unwrap();
        assert_eq!(d.usage(0), (4, 3), "a filling slot holds its block");
        d.release(0, s, 3);
        let e = d.invalidate(0).unwrap();
        assert_eq!(d.usage(0), (4, 1));
        trimmed(&mut d, 0, s);
        trimmed(&mut d, 0, e.slot);
        for b in 10..20 {
            let (s, _) = d.allocate(0, b, b + 10).unwrap();
            d.install(0, s, b + 10, false, &[b]);
        }
        assert_eq!(d.usage(0), (4, 4), "evictions keep the count");
        d.check().unwrap();
        d.member_down(0);
        d.member_up(0, 2);
        assert_eq!(d.usage(0), (2, 0));
    }

    /// A slot's sums are its fill's from the install on, stay while the slot is free, and go
    /// with the member.
    #[test]
    fn sums_are_the_installed_fills() {
        let mut d = Directory::new(&["nbd://a/ram".into()], 4);
        d.member_up(0, 2);
        let (s, _) = d.allocate(0, 7, 1).unwrap();
        assert_eq!(d.sums(0, s), Some(&[0; 4][..]), "not the fill's while its write is in flight");
        d.install(0, s, 1, false, &[1, 2, 3, 4]);
        assert_eq!(d.sums(0, s), Some(&[1, 2, 3, 4][..]));
        d.invalidate(7);
        assert_eq!(d.sums(0, s), Some(&[1, 2, 3, 4][..]), "kept until the next install");
        trimmed(&mut d, 0, s);
        d.check().unwrap();
        d.member_down(0);
        assert_eq!(d.sums(0, s), None);
    }

    #[test]
    fn a_member_going_down_forgets_its_blocks() {
        let mut d = dir(2, 4);
        for b in 0..4 {
            fill(&mut d, (b % 2) as usize, b, b + 1);
        }
        let gone = d.member_down(1);
        assert_eq!(gone.len(), 2);
        assert!(d.get(1).is_none() && d.get(0).is_some());
        assert_eq!(d.state(1), MemberState::Down { failures: 1 });
        assert_eq!(d.place(1), Some(0));
        d.check().unwrap();
    }
}
