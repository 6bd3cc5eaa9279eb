//! Reshape (`sluice pool grow`): the volume moves from N sets onto M > N sets while it is
//! served, and grows to M sets' worth of units when it is done.
//!
//! Why this order is crash safe. Units move in increasing volume order: unit `u` goes from
//! (set `u % N`, row `u / N`) to (set `u % M`, row `u / M`). In the old layout that slot holds
//! unit `u' = (u / M) * N + u % M` when `u % M < N` (new sets hold nothing yet), and
//! `u' <= u`, with equality only in the first row, whose units stay where they are. So:
//!
//! - The checkpoint `p` (units below it are in the new layout) is kept in every live
//!   member's superblock. A unit is copied only when its destination's old occupant is
//!   below the *durable* checkpoint: no one will ever read that old slot again, not even a
//!   coordinator that resumes after a crash. The window of units in flight starts tiny
//!   (units bound for new sets only) and widens as `p` grows, so the first checkpoints come
//!   quickly, one superblock write after another.
//! - A unit's old copy is only overwritten by a unit whose occupant it is, which happens
//!   after the checkpoint passes it: until then it stays readable, and a resumed reshape
//!   copies it again from there.
//! - Copies are written with FUA, so a checkpoint never names a unit whose new copy could
//!   still be lost; the checkpoint written is the in-memory prefix of copied units.
//! - Requests: units below `p` use the new layout, the others the old one; requests that
//!   touch a unit being copied (or copied beyond a gap) wait, and a copy waits for running
//!   requests on its unit. Pieces are routed when a request starts, not when it arrives.
//! - A write to a unit below the in-memory `p` but not below the durable one is not
//!   acknowledged before a checkpoint covering it is durable: otherwise a resume would copy
//!   the unit's old copy over it.
//! - Redundant layouts: a copy marks its destination regions dirty, durably, like a volume
//!   write (a member that drops mid-copy resyncs them; a crash reconciles them); a volume
//!   write during the reshape marks its regions in both layouts. The reshape pauses while
//!   any member is missing or rebuilding, or a resync runs, and resumes when all are in
//!   sync (after a `replace`, for instance); resync copies wait for reshape copies.
//! - Assembly: the superblocks with the newest event count carry the checkpoint (the
//!   largest among them: each is at least the durable one). A pool file with more members
//!   than the superblocks name is a grow that was not started yet: it starts at once.

use super::api::{Action, CopyId, Data, Found, MemberCmd, ReshapeStatus};
use super::reshape_state::{Reshaping, Stage, UnitCopy};
use super::state::{Member, Purpose, Stopping};
use super::Coordinator;
use crate::layout::{Map, Reshape};
use crate::limits::{MEMBERS_MAX, META_BYTES, RESHAPE_STEPS_MAX, RESHAPE_WINDOW_UNITS};
use crate::meta::Role;
use crate::spec::{Layout, Placement};

impl Coordinator {
    /// Why `count` members cannot be added now, if they cannot.
    pub(super) fn grow_refusal(&self, count: usize) -> Option<String> {
        let total = self.members.len() + count;
        if count == 0 {
            return Some("no member to add".into());
        }
        if total > MEMBERS_MAX {
            return Some(format!("{total} members; at most {MEMBERS_MAX}"));
        }
        if self.reshape.is_some() {
            return Some("a reshape is already in progress; wait for it to finish".into());
        }
        if let Some(h) = &self.handover {
            return Some(format!("member {} is being replaced by {}; wait for that to finish", h.member, h.uri));
        }
        if self.spec.placement == Placement::Offset {
            // Reached from a served pool's reloaded file as well as from `pool grow`.
            return Some("a raid10 with placement = \"offset\" cannot be grown: its sets are regrouped by the member count, so growing would move every copy".into());
        }
        if self.spec.layout == Layout::Raid10 && !count.is_multiple_of(self.spec.copies) {
            return Some(format!("a raid10 with {} copies grows by whole mirror sets: add a multiple of {} members", self.spec.copies, self.spec.copies));
        }
        if self.stopping != Stopping::Running || self.fenced.is_some() {
            return Some("the pool is stopping".into());
        }
        None
    }

    /// Adds members (see `Coordinator::grow`).
    pub(super) fn start_grow(&mut self, added: Vec<(String, Found)>, unix_secs: u64) -> Result<(), String> {
        if let Some(why) = self.grow_refusal(added.len()) {
            return Err(why);
        }
        for (uri, f) in &added {
            if f.read_only {
                return Err(format!("{uri} is read-only"));
            }
            if f.size < META_BYTES + self.map.member_bytes {
                return Err(format!(
                    "{uri} is {} bytes; every member of this pool needs at least {} (1 MiB of metadata and {} of data)",
                    f.size,
                    META_BYTES + self.map.member_bytes,
                    self.map.member_bytes
                ));
            }
        }
        let first_new = self.members.len();
        for (uri, _) in added {
            self.spec.members.push(uri);
            let blocks = self.gen.len();
            self.members.push(Member { role: Role::Active, connected: true, durable_events: 0, written: vec![0; blocks], writing: vec![None; blocks] });
            self.spare.missing_since.push(None);
            self.devices.push(0);
            self.new_device(self.members.len() - 1);
        }
        self.events += 1;
        self.gen[0] += 1;
        if self.spec.layout == Layout::Mirror {
            self.add_copies(first_new);
            return Ok(());
        }
        let from = self.map;
        self.begin_reshape(from, from.sets as u64, unix_secs);
        let to = self.map.size();
        self.actions.push_back(Action::Log {
            text: format!("pool grows from {} to {} members: reshaping the volume onto them; it grows from {} to {to} bytes when done", first_new, self.members.len(), from.size()),
        });
        Ok(())
    }

    /// A mirror's new members are copies more: rebuilt in full from the others.
    fn add_copies(&mut self, first_new: usize) {
        self.spec.copies = self.members.len();
        self.map.copies = self.members.len();
        let all: std::collections::BTreeSet<u64> = (0..self.regions).collect();
        for m in first_new..self.members.len() {
            self.members[m].role = Role::Rebuilding { done: 0, total: 0, full: true };
            self.log_member(m, "added as a new copy: it is copied in full from the others");
            self.add_job(super::state::JobKind::Rebuild, m, all.clone());
        }
    }

    /// The volume starts moving from `from` onto every member, at unit `at`.
    pub(super) fn begin_reshape(&mut self, from: Map, at: u64, started: u64) {
        self.map = Map { sets: self.members.len() / self.spec.copies, ..from };
        self.meta_kept = true;
        let layout = Reshape { from, to: self.map, at };
        self.reshape = Some(Reshaping::new(layout, started, self.gen[0].max(self.startup_gen), self.now));
    }

    /// The superblock's record of the reshape.
    pub(super) fn reshape_mark(&self) -> Option<crate::meta::Reshape> {
        let r = self.reshape.as_ref()?;
        Some(crate::meta::Reshape { from_members: r.layout.from.sets * self.spec.copies, at: r.layout.at, started: r.started })
    }

    /// Where a request's bytes are now.
    pub(super) fn route(&self, offset: u64, len: u64) -> Vec<crate::layout::Piece> {
        match &self.reshape {
            Some(r) => r.layout.pieces(offset, len).collect(),
            None => self.map.pieces(offset, len).collect(),
        }
    }

    /// Where a write's bytes may be when it starts: in either layout.
    pub(super) fn route_both(&self, offset: u64, len: u64) -> Vec<crate::layout::Piece> {
        match &self.reshape {
            Some(r) => r.layout.from.pieces(offset, len).chain(r.layout.to.pieces(offset, len)).collect(),
            None => self.map.pieces(offset, len).collect(),
        }
    }

    /// Whether a request on `offset..offset + len` must wait for copies of its units.
    pub(super) fn reshape_holds(&self, offset: u64, len: u64) -> bool {
        let Some(r) = &self.reshape else { return false };
        if len == 0 {
            return false;
        }
        let unit = r.layout.to.unit;
        r.units.range(offset / unit..=(offset + len - 1) / unit).next().is_some()
    }

    /// The superblock generation a write on `offset..offset + len` waits for before its
    /// answer: one whose checkpoint covers the units it wrote in their new place.
    pub(super) fn reshape_need_sb(&mut self, offset: u64, len: u64) -> Option<u64> {
        let r = self.reshape.as_ref()?;
        let unit = r.layout.to.unit;
        let last = ((offset + len).saturating_sub(1) / unit).min(r.layout.at.checked_sub(1)?);
        if len == 0 || last < r.durable_at || offset / unit > last {
            return None;
        }
        if let Some(&(gen, _)) = r.checkpoints.iter().find(|&&(_, at)| at > last) {
            return Some(gen);
        }
        Some(self.checkpoint())
    }

    /// Records the in-memory checkpoint in the next superblock generation.
    fn checkpoint(&mut self) -> u64 {
        self.gen[0] += 1;
        let gen = self.gen[0];
        let r = self.reshape.as_mut().expect("called while reshaping");
        r.checkpoints.push_back((gen, r.layout.at));
        gen
    }

    /// Moves the reshape along: checkpoints, finished units, new copies.
    pub(super) fn run_reshape(&mut self) -> bool {
        if self.reshape.is_none() {
            return false;
        }
        self.note_durable_checkpoints();
        let mut moved = self.advance_prefix();
        let r = self.reshape.as_ref().expect("checked above");
        if r.checkpoints.is_empty() && r.layout.at > r.durable_at {
            self.checkpoint();
            moved = true;
        }
        let r = self.reshape.as_ref().expect("checked above");
        // The tail holds the old copies of the last units: it is zeroed only once no
        // resume can copy from there again.
        if r.durable_at >= r.layout.units() && r.units.is_empty() {
            let before = r.tail.clone();
            if self.run_tail(self.reshape_may_copy()) {
                return self.finish_reshape();
            }
            return moved || self.reshape.as_ref().is_some_and(|r| r.tail != before);
        }
        if !self.reshape_may_copy() {
            let r = self.reshape.as_mut().expect("checked above");
            (r.pace_origin, r.paced_bytes) = (self.now, 0);
            return self.rewind() | moved;
        }
        moved |= self.claim_units();
        moved | self.start_copies()
    }

    fn note_durable_checkpoints(&mut self) {
        while let Some(&(gen, at)) = self.reshape.as_ref().and_then(|r| r.checkpoints.front()) {
            if !self.durable(0, gen) {
                break;
            }
            let r = self.reshape.as_mut().expect("checked above");
            r.durable_at = r.durable_at.max(at);
            r.checkpoints.pop_front();
        }
    }

    /// Copied units at the checkpoint join the new layout.
    fn advance_prefix(&mut self) -> bool {
        let r = self.reshape.as_mut().expect("called while reshaping");
        let mut moved = false;
        while r.units.get(&r.layout.at).is_some_and(|u| u.stage == Stage::Done) {
            r.units.remove(&r.layout.at);
            r.layout.at += 1;
            moved = true;
        }
        moved
    }

    /// Every unit moved and the new space zeroed: the volume has its new size.
    fn finish_reshape(&mut self) -> bool {
        self.reshape = None;
        self.events += 1;
        self.gen[0] += 1;
        let text = format!("pool reshape done: the volume is now {} bytes over {} members (clients see the new size when they connect again)", self.map.size(), self.members.len());
        self.actions.push_back(Action::Log { text });
        true
    }

    /// Copies run only while every member is in sync and nothing else copies.
    fn reshape_may_copy(&self) -> bool {
        self.stopping == Stopping::Running
            && self.fenced.is_none()
            && self.members.iter().all(|m| m.in_sync())
            && self.jobs.iter().all(Option::is_none)
            // A scrub chunk read before a copy lands would be "repaired" back over it.
            && self.scrub.job.as_ref().is_none_or(|j| j.chunks.is_empty())
    }

    /// Paused: units not being copied right now go back to their old place (their old
    /// copies are intact), so that requests on them do not wait for the pause to end.
    fn rewind(&mut self) -> bool {
        let r = self.reshape.as_mut().expect("called while reshaping");
        let idle: Vec<u64> = r.units.iter().filter(|(_, u)| matches!(u.stage, Stage::Waiting | Stage::Done)).map(|(&k, _)| k).collect();
        for &k in &idle {
            self.drop_unit(k);
        }
        !idle.is_empty()
    }

    /// Forgets a claimed unit (its copy is over or never started).
    fn drop_unit(&mut self, unit: u64) {
        let Some(u) = self.reshape.as_mut().and_then(|r| r.units.remove(&unit)) else { return };
        if u.stage != Stage::Waiting {
            self.actions.push_back(Action::Release { copy: u.copy });
        }
        self.release_regions(&u.regions);
    }

    pub(super) fn release_regions(&mut self, regions: &[u64]) {
        for r in regions {
            if let Some(u) = self.uses.get_mut(r) {
                u.writes -= 1;
                u.last = self.now;
            }
        }
    }

    /// Claims the next units whose destination's old occupant is durably moved.
    fn claim_units(&mut self) -> bool {
        let r = self.reshape.as_ref().expect("called while reshaping");
        let layout = r.layout;
        let busy = r.units.values().filter(|u| u.stage != Stage::Done).count();
        let end = layout.units().min(layout.at + RESHAPE_WINDOW_UNITS);
        let free: Vec<u64> = (layout.at..end)
            .filter(|u| !r.units.contains_key(u) && layout.occupant(*u).is_none_or(|o| o < r.durable_at))
            .take(RESHAPE_STEPS_MAX.saturating_sub(busy))
            .collect();
        let mut moved = false;
        for u in free {
            if !self.reshape_pace_allows(layout.to.unit) {
                break;
            }
            let (regions, marks) = self.mark_destination(&layout, u);
            let copy = CopyId(self.fresh_id());
            let r = self.reshape.as_mut().expect("called while reshaping");
            r.paced_bytes += layout.to.unit;
            r.units.insert(u, UnitCopy { stage: Stage::Waiting, copy, regions, marks });
            moved = true;
        }
        moved
    }

    /// Marks the regions unit `u` is copied to dirty (redundant layouts).
    fn mark_destination(&mut self, layout: &Reshape, u: u64) -> (Vec<u64>, Vec<(usize, u64)>) {
        if !self.redundant() {
            return (Vec::new(), Vec::new());
        }
        let p = layout.to.pieces(u * layout.to.unit, layout.to.unit).next().expect("a whole unit");
        let regions: Vec<u64> = (p.member_offset / self.region_bytes..=(p.member_offset + p.len - 1) / self.region_bytes).collect();
        let marks = self.mark_regions(&regions);
        (regions, marks)
    }

    /// Waiting units whose range no running request touches start their read.
    fn start_copies(&mut self) -> bool {
        let r = self.reshape.as_ref().expect("called while reshaping");
        let layout = r.layout;
        let ready: Vec<(u64, CopyId)> = r
            .units
            .iter()
            .filter(|(_, c)| c.stage == Stage::Waiting && c.marks.iter().all(|&(b, g)| self.durable(b, g)))
            .map(|(&k, c)| (k, c.copy))
            .collect();
        let mut moved = false;
        for (u, copy) in ready {
            let unit = layout.to.unit;
            if self.running_request_overlaps(u * unit, unit) {
                continue;
            }
            let p = layout.from.pieces(u * unit, unit).next().expect("a whole unit");
            let Some(source) = self.reader(p.set, p.member_offset, p.len, 0) else { continue };
            let cmd = MemberCmd::Read { offset: META_BYTES + p.member_offset, len: p.len };
            self.issue(source, cmd, Data::Copy(copy), Purpose::ReshapeRead { unit: u });
            self.reshape.as_mut().expect("reshaping").units.get_mut(&u).expect("listed above").stage = Stage::Reading;
            moved = true;
        }
        moved
    }

    fn running_request_overlaps(&self, offset: u64, len: u64) -> bool {
        self.requests.values().filter(|r| r.phase == super::state::Phase::Running).any(|r| {
            let (o, l) = r.cmd.range();
            o < offset + len && offset < o + l
        })
    }

    /// A unit's old copy was read (or not): it goes to every member of its new set.
    pub(super) fn settle_reshape_read(&mut self, unit: u64, ok: bool) {
        let Some(r) = self.reshape.as_ref() else { return };
        let Some(c) = r.units.get(&unit) else { return };
        let (layout, copy) = (r.layout, c.copy);
        let p = layout.to.pieces(unit * layout.to.unit, layout.to.unit).next().expect("a whole unit");
        let targets: Vec<usize> = self.map.members_at(p.set, p.member_offset).filter(|&m| self.members[m].live()).collect();
        if !ok || targets.is_empty() || self.fenced.is_some() {
            return self.drop_unit(unit);
        }
        let cmd = MemberCmd::Write { offset: META_BYTES + p.member_offset, len: p.len, fua: true };
        for &m in &targets {
            self.issue(m, cmd, Data::Copy(copy), Purpose::ReshapeWrite { unit });
        }
        let stage = Stage::Writing { out: targets.len(), failed: false };
        self.reshape.as_mut().expect("checked above").units.get_mut(&unit).expect("checked above").stage = stage;
    }

    pub(super) fn settle_reshape_write(&mut self, unit: u64, ok: bool) {
        let unit_bytes = self.map.unit;
        let Some(r) = self.reshape.as_mut() else { return };
        let Some(c) = r.units.get_mut(&unit) else { return };
        let Stage::Writing { out, failed } = c.stage else { return };
        let failed = failed || !ok;
        if out > 1 {
            c.stage = Stage::Writing { out: out - 1, failed };
            return;
        }
        if failed {
            // Copied again once the pool is whole: its old copy is intact.
            return self.drop_unit(unit);
        }
        c.stage = Stage::Done;
        self.actions.push_back(Action::Release { copy: c.copy });
        let regions = std::mem::take(&mut c.regions);
        r.moved_bytes += unit_bytes;
        self.release_regions(&regions);
    }

    /// Reshape copies are out: resync copies wait for them.
    pub(super) fn reshape_copying(&self) -> bool {
        self.reshape.as_ref().is_some_and(|r| r.units.values().any(|u| matches!(u.stage, Stage::Reading | Stage::Writing { .. })))
    }

    fn reshape_pace_allows(&self, len: u64) -> bool {
        let Some(r) = &self.reshape else { return false };
        let elapsed = self.now.saturating_sub(r.pace_origin);
        let allowed = self.spec.resync_rate_bytes_per_s.saturating_mul(elapsed) / 1000 + len;
        r.paced_bytes + len <= allowed
    }

    pub(super) fn reshape_wakeup(&self) -> Option<u64> {
        let r = self.reshape.as_ref()?;
        if !self.reshape_may_copy() {
            return None;
        }
        let at = r.pace_origin + r.paced_bytes.saturating_mul(1000).div_ceil(self.spec.resync_rate_bytes_per_s);
        (at > self.now).then_some(at)
    }

    pub(super) fn reshape_status(&self) -> Option<ReshapeStatus> {
        let r = self.reshape.as_ref()?;
        let elapsed_ms = self.now.saturating_sub(r.began_ms);
        Some(ReshapeStatus {
            from_members: r.layout.from.sets * self.spec.copies,
            to_members: self.members.len(),
            done_bytes: r.layout.at * r.layout.to.unit,
            total_bytes: r.layout.from.size(),
            started: r.started,
            rate_bytes_per_s: (elapsed_ms > 0).then(|| r.moved_bytes.saturating_mul(1000) / elapsed_ms),
        })
    }
}
