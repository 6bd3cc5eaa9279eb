//! Background work: copying regions to members that lack them (at a bounded rate, with
//! writes to the range being copied held back), cleaning dirty bits once every copy is
//! known to hold the data, and the clean stop.

use super::api::{Action, CopyId, Data, MemberCmd};
use super::state::{Cleaning, JobKind, Lock, Phase, Purpose, Stopping};
use super::source::Source;
use super::Coordinator;
use crate::limits::{CLEAN_DELAY_MS, META_BLOCK_BYTES, META_BYTES, RESYNC_CHUNK_BYTES, RESYNC_STEPS_MAX};
use crate::meta::Role;

impl Coordinator {
    /// The end of the copy chunk that starts at member offset `start`.
    pub(super) fn chunk_end(&self, start: u64) -> u64 {
        let region_end = (start / self.region_bytes + 1) * self.region_bytes;
        (start + RESYNC_CHUNK_BYTES).min(region_end).min(self.map.member_bytes)
    }

    /// Starts what the copy jobs may start now; finishes jobs that are through.
    pub(super) fn run_jobs(&mut self) -> bool {
        if self.jobs.iter().all(Option::is_none) {
            self.pace_origin = self.now;
            self.paced_bytes = 0;
            return false;
        }
        let mut moved = self.finish_jobs();
        if self.stopping != Stopping::Running || self.fenced.is_some() {
            // Copies not started yet are dropped; the regions stay dirty for next time.
            let dropped: Vec<Lock> = self.locks.iter().filter(|l| !l.held).copied().collect();
            for l in dropped {
                self.locks.retain(|x| x != &l);
                if let Some(job) = self.jobs[l.job].as_mut() {
                    job.chunks.remove(&l.start);
                }
                moved = true;
            }
            return moved;
        }
        moved |= self.start_held_locks();
        for j in 0..self.jobs.len() {
            while self.locks.len() < RESYNC_STEPS_MAX {
                let Some(job) = self.jobs[j].as_ref() else { break };
                let Some(start) = job.cursor.filter(|_| !job.flushing) else { break };
                let source = self.source_of(j, start);
                if source == Source::Nothing {
                    break;
                }
                let end = self.chunk_end(start);
                let copies = source != Source::Itself;
                if copies && !self.pace_allows(end - start) {
                    return moved;
                }
                let set = self.map.set_at(job.place, start);
                let next = if !end.is_multiple_of(self.region_bytes) && end < self.map.member_bytes {
                    Some(end)
                } else {
                    job.todo.range(start / self.region_bytes + 1..).next().map(|&r| r * self.region_bytes)
                };
                let job = self.jobs[j].as_mut().expect("checked above");
                job.cursor = next;
                moved = true;
                if job.chunks.contains(&start) {
                    // Still being copied from before a rewind: nothing to start again.
                    continue;
                }
                if !copies {
                    self.chunk_done(j, start);
                    continue;
                }
                job.chunks.insert(start);
                self.paced_bytes += end - start;
                self.locks.push(Lock { set, start, end, job: j, held: false });
            }
        }
        moved | self.start_held_locks()
    }

    /// Locks whose range no running write touches any more start copying.
    fn start_held_locks(&mut self) -> bool {
        let mut moved = false;
        let waiting: Vec<(usize, u64)> = self.locks.iter().filter(|l| !l.held).map(|l| (l.job, l.start)).collect();
        for (job, start) in waiting {
            let Some(i) = self.locks.iter().position(|l| l.job == job && l.start == start) else { continue };
            let l = self.locks[i];
            // A reshape copy could land on the range between this copy's read and write.
            if self.running_write_overlaps(l.set, l.start, l.end) || self.reshape_copying() {
                continue;
            }
            // A source that took over from a failed one may still be receiving a chunk
            // copied from it: read it once that has landed.
            if let Source::Member(s) = self.source_of(l.job, l.start) {
                if self.copy_lands_on(s, l.start, l.end) {
                    continue;
                }
            }
            moved = true;
            let source = match self.source_of(l.job, l.start) {
                Source::Member(m) => m,
                Source::Nothing => {
                    // No copy to read from (the set's last in-sync member is away): let
                    // writes through to fail, and copy this chunk again later.
                    self.drop_lock(job, start);
                    continue;
                }
                Source::Itself => {
                    // The target became its set's source since: nothing to copy.
                    self.locks.remove(i);
                    if let Some(job) = self.jobs[job].as_mut() {
                        job.chunks.remove(&start);
                    }
                    self.chunk_done(job, start);
                    continue;
                }
            };
            self.locks[i].held = true;
            let copy = CopyId(self.fresh_id());
            let cmd = MemberCmd::Read { offset: META_BYTES + l.start, len: l.end - l.start };
            self.issue(source, cmd, Data::Copy(copy), Purpose::CopyRead { job: l.job, chunk: l.start, copy });
            moved = true;
        }
        moved
    }

    /// Gives up a chunk that has not started copying; the job comes back to it.
    fn drop_lock(&mut self, j: usize, start: u64) {
        self.locks.retain(|l| !(l.job == j && l.start == start));
        if let Some(job) = self.jobs[j].as_mut() {
            job.chunks.remove(&start);
            job.cursor = Some(job.cursor.map_or(start, |c| c.min(start)));
        }
    }

    pub(super) fn running_write_overlaps(&self, set: usize, start: u64, end: u64) -> bool {
        self.requests.values().filter(|r| r.phase == Phase::Running && r.cmd.is_write()).any(|r| {
            r.pieces.iter().any(|p| p.set == set && p.member_offset < end && start < p.member_offset + p.len)
        })
    }

    pub(super) fn settle_copy_read(&mut self, job: usize, chunk: u64, copy: CopyId, ok: bool) {
        let target = self.jobs.get(job).and_then(Option::as_ref).map(|j| j.target);
        match target {
            Some(t) if ok && self.target_live(t) && self.fenced.is_none() => {
                let cmd = MemberCmd::Write { offset: META_BYTES + chunk, len: self.chunk_end(chunk) - chunk, fua: false };
                self.issue(t, cmd, Data::Copy(copy), Purpose::CopyWrite { job, chunk, copy });
            }
            _ => self.chunk_over(job, chunk, copy, false),
        }
    }

    pub(super) fn settle_copy_write(&mut self, job: usize, chunk: u64, copy: CopyId, ok: bool) {
        self.chunk_over(job, chunk, copy, ok);
    }

    /// A chunk is finished (copied, or not: then it is copied again later).
    fn chunk_over(&mut self, j: usize, chunk: u64, copy: CopyId, copied: bool) {
        self.actions.push_back(Action::Release { copy });
        self.locks.retain(|l| !(l.job == j && l.start == chunk));
        let Some(job) = self.jobs.get_mut(j).and_then(Option::as_mut) else { return };
        job.chunks.remove(&chunk);
        if !copied {
            job.cursor = Some(job.cursor.map_or(chunk, |c| c.min(chunk)));
            return;
        }
        self.chunk_done(j, chunk);
    }

    /// The target holds chunk `chunk` now (copied, or its own copy is the source's).
    fn chunk_done(&mut self, j: usize, chunk: u64) {
        let (len, region_bytes) = (self.chunk_end(chunk) - chunk, self.region_bytes);
        let Some(job) = self.jobs.get_mut(j).and_then(Option::as_mut) else { return };
        job.done_bytes += len;
        self.resynced_bytes += len;
        let r = chunk / region_bytes;
        // Only a region the cursor has moved beyond is through: a rewind (a chunk to copy
        // again) may have put the cursor before it.
        let cursor_past = job.cursor.is_none_or(|c| c / region_bytes > r);
        if cursor_past && !job.chunks.iter().any(|c| c / region_bytes == r) {
            job.todo.remove(&r);
        }
    }

    /// Jobs with nothing left: a rebuilt member is flushed, then in sync again.
    fn finish_jobs(&mut self) -> bool {
        let mut moved = false;
        for j in 0..self.jobs.len() {
            let Some(job) = self.jobs[j].as_mut() else { continue };
            if !job.todo.is_empty() || !job.chunks.is_empty() || job.flushing || job.cursor.is_some() {
                continue;
            }
            moved = true;
            match job.kind {
                JobKind::Reconcile | JobKind::CatchUp => self.end_job(j),
                JobKind::Rebuild => {
                    job.flushing = true;
                    let t = job.target;
                    self.issue(t, MemberCmd::Flush, Data::None, Purpose::JobFlush { job: j });
                }
            }
        }
        moved
    }

    pub(super) fn settle_job_flush(&mut self, j: usize, ok: bool) {
        let Some(job) = self.jobs.get(j).and_then(Option::as_ref) else { return };
        let t = job.target;
        if self.is_shadow(t) {
            return if ok { self.shadow_copied(j) } else { self.shadow_lost("its flush failed") };
        }
        if ok && self.members[t].live() {
            self.members[t].role = Role::Active;
            self.events += 1;
            self.gen[0] += 1;
            self.log_member(t, "is in sync again");
            self.end_job(j);
        }
    }

    fn end_job(&mut self, j: usize) {
        if let Some(job) = self.jobs[j].take() {
            if job.kind != JobKind::Rebuild {
                self.log_member(job.target, "agrees with its set again");
            }
            if job.kind == JobKind::CatchUp {
                // Its superblock no longer says it is behind.
                self.gen[0] += 1;
            }
        }
        self.locks.retain(|l| l.job != j);
    }

    /// A member failed: jobs copying to it end; chunks it was the source of were settled
    /// as failed and go again from another source.
    pub(super) fn jobs_lost_member(&mut self, member: usize) {
        for j in 0..self.jobs.len() {
            if self.jobs[j].as_ref().is_some_and(|job| job.target == member) {
                self.jobs[j] = None;
                self.locks.retain(|l| l.job != j);
            }
        }
    }

    fn pace_allows(&self, len: u64) -> bool {
        let elapsed = self.now.saturating_sub(self.pace_origin);
        let allowed = self.spec.resync_rate_bytes_per_s.saturating_mul(elapsed) / 1000 + RESYNC_CHUNK_BYTES;
        self.paced_bytes + len <= allowed
    }

    pub(super) fn pace_wakeup(&self) -> Option<u64> {
        let waiting = self.jobs.iter().flatten().any(|j| j.cursor.is_some() && !j.flushing);
        if !waiting || self.locks.len() >= RESYNC_STEPS_MAX {
            return None;
        }
        let at = self.pace_origin + self.paced_bytes.saturating_mul(1000).div_ceil(self.spec.resync_rate_bytes_per_s);
        (at > self.now).then_some(at)
    }

    /// Every copy is known to hold every write: dirty bits may be cleaned.
    fn all_in_sync(&self) -> bool {
        // A replacement's copy needs every region written since it began kept dirty.
        self.members.iter().all(|m| m.in_sync()) && self.jobs.iter().all(Option::is_none) && self.handover.is_none()
    }

    /// Starts cleaning idle dirty regions when it is time.
    pub(super) fn clean_due(&mut self) {
        if !self.redundant() || self.fenced.is_some() || self.cleaning.is_some() || self.now < self.next_clean {
            return;
        }
        if self.stopping != Stopping::Running {
            return;
        }
        self.next_clean = self.now + CLEAN_DELAY_MS / 2;
        if !self.all_in_sync() {
            return;
        }
        let idle_since = self.now.saturating_sub(CLEAN_DELAY_MS);
        let regions: Vec<u64> = self
            .dirty_regions()
            .into_iter()
            .filter(|r| self.uses.get(r).is_none_or(|u| u.writes == 0 && u.last <= idle_since))
            .collect();
        self.begin_clean(regions, self.now);
    }

    /// Flushes every member; when all have flushed, the regions no write touched since
    /// `started` are cleared.
    fn begin_clean(&mut self, regions: Vec<u64>, started: u64) {
        if regions.is_empty() {
            return;
        }
        let live: Vec<usize> = (0..self.members.len()).filter(|&m| self.members[m].live()).collect();
        self.cleaning = Some(Cleaning { regions, started, flushes_out: live.len(), failed: false });
        for m in live {
            self.issue(m, MemberCmd::Flush, Data::None, Purpose::CleanFlush);
        }
    }

    pub(super) fn clean_wakeup(&self) -> Option<u64> {
        let dirty = self.bits.iter().any(|&w| w != 0);
        let possible = self.redundant() && self.fenced.is_none() && self.cleaning.is_none() && self.stopping == Stopping::Running;
        (possible && dirty && self.all_in_sync()).then_some(self.next_clean)
    }

    pub(super) fn settle_clean_flush(&mut self, ok: bool) {
        let Some(c) = self.cleaning.as_mut() else { return };
        c.flushes_out -= 1;
        c.failed |= !ok;
        if c.flushes_out > 0 {
            return;
        }
        let c = self.cleaning.take().expect("checked above");
        if c.failed || !self.all_in_sync() {
            return;
        }
        for r in c.regions {
            // Only regions no write touched since the flush started.
            if self.uses.get(&r).is_some_and(|u| u.writes > 0 || u.last >= c.started) {
                continue;
            }
            self.uses.remove(&r);
            let word = &mut self.bits[(r / 64) as usize];
            if *word >> (r % 64) & 1 == 1 {
                *word &= !(1 << (r % 64));
                self.gen[1 + (r / (META_BLOCK_BYTES * 8)) as usize] += 1;
            }
        }
    }

    /// Moves a clean stop along.
    pub(super) fn step_stop(&mut self) -> bool {
        match self.stopping {
            Stopping::Running | Stopping::Stopped => false,
            Stopping::Draining => {
                let busy = !self.requests.is_empty() || !self.locks.is_empty() || self.cleaning.is_some() || self.fence_reads_out > 0 || self.scrub_busy() || self.reshape_copying();
                let flushing = self.jobs.iter().flatten().any(|j| j.flushing);
                if busy || flushing {
                    return false;
                }
                // Copies a crash left unequal and not yet reconciled must not be taken for
                // equal by the next coordinator: it finds the pool owned, as after a crash,
                // and reconciles them again.
                let reconciling = self.jobs.iter().flatten().any(|j| j.kind != JobKind::Rebuild);
                self.jobs.iter_mut().for_each(|j| *j = None);
                if let Some(h) = self.handover.take() {
                    let text = format!("stopping before the copy to {} was through: it did not take member {}'s place", h.uri, h.member);
                    self.actions.push_back(Action::Log { text });
                }
                if reconciling && self.fenced.is_none() {
                    self.actions.push_back(Action::Log {
                        text: "stopping before the copies a crash left unequal were reconciled: the pool stays owned, and the next start reconciles them".into(),
                    });
                }
                if !self.meta_kept || self.fenced.is_some() || reconciling {
                    self.stopping = Stopping::Stopped;
                    return true;
                }
                self.stopping = Stopping::Flushing;
                if self.all_in_sync() {
                    // Nothing is being written: every dirty region can be cleaned now.
                    let all = self.dirty_regions().into_iter().collect();
                    self.begin_clean(all, self.now + 1);
                }
                true
            }
            Stopping::Flushing => {
                if self.cleaning.is_some() {
                    return false;
                }
                self.gen[0] += 1;
                self.stopping = Stopping::Releasing { gen: self.gen[0] };
                true
            }
            Stopping::Releasing { gen } => {
                let all = (1..self.gen.len()).all(|b| self.durable(b, self.gen[b]));
                let live = self.members.iter().any(|m| m.live());
                if (self.durable(0, gen) && all) || !live {
                    self.stopping = Stopping::Stopped;
                    return true;
                }
                false
            }
        }
    }

    /// The superblock no longer names an owner.
    pub(super) fn stopping_released(&self) -> bool {
        matches!(self.stopping, Stopping::Releasing { .. } | Stopping::Stopped)
    }
}
