//! Walking a scrub: each set's member data in resync-sized chunks, paced at the resync
//! rate, at most `RESYNC_STEPS_MAX` chunks at a time. A chunk holds back writes to its
//! range (running ones drain first), is read from every copy of its set that holds all
//! acknowledged writes there, is compared by the driver, and (repair) is rewritten from
//! the source copy onto the copies that differ.
//!
//! Copies a copy job still has to bring up to date in a region (a rebuilding member, a
//! reconcile after a crash) are left out of that region's comparison: they may differ
//! legitimately. A chunk with fewer than two copies to compare is skipped and counted. A
//! member that fails during a scrub is dropped like after any failure; the scrub goes on
//! with the copies that remain.

use super::api::{Action, CompareId, CopyId, Data, MemberCmd, ScrubRange};
use super::scrub_state::Chunk;
use super::state::Stopping;
use super::Coordinator;
use crate::limits::{META_BYTES, RESYNC_CHUNK_BYTES, RESYNC_STEPS_MAX, SCRUB_RANGES_MAX};

impl Coordinator {
    /// Moves the scrub along: starts chunks the pace allows, ends it when through.
    pub(super) fn run_scrub(&mut self) -> bool {
        let Some(job) = self.scrub.job.as_mut() else { return false };
        if self.stopping != Stopping::Running || self.fenced.is_some() {
            job.cutting.get_or_insert_with(|| "the pool stopped".into());
        }
        if job.cutting.is_some() {
            // Chunks not reading yet are dropped; those reading finish.
            let before = job.chunks.len();
            job.chunks.retain(|_, c| c.held);
            let moved = before != job.chunks.len();
            if job.chunks.is_empty() {
                let why = job.cutting.take();
                self.end_scrub(why);
                return true;
            }
            return moved;
        }
        let mut moved = self.start_scrub_chunks();
        loop {
            let Some(job) = self.scrub.job.as_ref() else { return true };
            // A resync goes first (as md defers a check): the two never share the rate.
            let resyncing = self.resync_can_run();
            let room = job.chunks.len() < RESYNC_STEPS_MAX && job.cutting.is_none() && !resyncing;
            let Some((set, start)) = job.cursor.filter(|_| room) else { break };
            let end = self.chunk_end(start);
            if !self.scrub_pace_allows(end - start) {
                break;
            }
            let next = match (end < self.map.member_bytes, set + 1 < self.map.sets) {
                (true, _) => Some((set, end)),
                (false, true) => Some((set + 1, 0)),
                (false, false) => None,
            };
            let id = self.fresh_id();
            let job = self.scrub.job.as_mut().expect("checked above");
            job.paced_bytes += end - start;
            job.cursor = next;
            let chunk = Chunk { set, start, end, held: false, reads: Vec::new(), compare: None, writes_out: 0, writes_failed: false, fixing: Vec::new() };
            job.chunks.insert(id, chunk);
            moved = true;
        }
        moved |= self.start_scrub_chunks();
        let Some(job) = self.scrub.job.as_ref() else { return true };
        if job.cursor.is_none() && job.chunks.is_empty() && job.cutting.is_none() {
            moved |= self.finish_scrub();
        }
        moved
    }

    /// Every chunk is through: a repair that rewrote something flushes every live member
    /// first; then the scrub ends.
    fn finish_scrub(&mut self) -> bool {
        let Some(job) = self.scrub.job.as_mut() else { return false };
        match job.flushes_out {
            Some(0) => {}
            Some(_) => return false,
            None if job.repaired.is_empty() => {}
            None => {
                let live: Vec<usize> = (0..self.members.len()).filter(|&m| self.members[m].live()).collect();
                job.flushes_out = Some(live.len());
                for m in live {
                    self.issue(m, MemberCmd::Flush, Data::None, super::state::Purpose::ScrubFlush);
                }
                return true;
            }
        }
        self.end_scrub(None);
        true
    }

    /// A closing flush is back (a member that failed it is declared missing, as after any
    /// failed operation).
    pub(super) fn settle_scrub_flush(&mut self) {
        if let Some(n) = self.scrub.job.as_mut().and_then(|j| j.flushes_out.as_mut()) {
            *n = n.saturating_sub(1);
        }
    }

    /// Cuts the scrub short: nothing more starts, and it ends when the chunks in flight do.
    fn cut_scrub(&mut self, why: String) {
        if let Some(job) = self.scrub.job.as_mut() {
            job.cutting.get_or_insert(why);
        }
    }

    /// Whether a scrub chunk holds back writes to this range of a set.
    pub(super) fn scrub_holds(&self, set: usize, start: u64, end: u64) -> bool {
        self.scrub.job.as_ref().is_some_and(|j| j.chunks.values().any(|c| c.set == set && c.start < end && start < c.end))
    }

    /// A clean stop waits for the chunks being read or rewritten.
    pub(super) fn scrub_busy(&self) -> bool {
        self.scrub.job.as_ref().is_some_and(|j| j.chunks.values().any(|c| c.held) || j.flushes_out.is_some_and(|n| n > 0))
    }

    /// The members whose copy of `set` at member offset `at` holds every acknowledged
    /// write: in sync, and no copy job still has to bring it up to date there.
    fn scrub_copies(&self, set: usize, at: u64) -> Vec<usize> {
        let region = at / self.region_bytes;
        let behind = |m: usize| self.jobs.iter().flatten().any(|j| j.target == m && j.todo.contains(&region));
        self.map.members_at(set, at).filter(|&m| self.members[m].in_sync() && !behind(m)).collect()
    }

    /// Chunks whose range no running write touches start reading every copy.
    fn start_scrub_chunks(&mut self) -> bool {
        let Some(job) = self.scrub.job.as_ref() else { return false };
        let waiting: Vec<(u64, usize, u64, u64)> = job.chunks.iter().filter(|(_, c)| !c.held).map(|(&id, c)| (id, c.set, c.start, c.end)).collect();
        let from = job.from;
        let mut moved = false;
        for (id, set, start, end) in waiting {
            if self.running_write_overlaps(set, start, end) {
                continue;
            }
            moved = true;
            let mut copies = self.scrub_copies(set, start);
            if let Some(f) = from.filter(|&f| self.map.set_at(f, start) == set) {
                if !copies.contains(&f) {
                    self.cut_scrub(format!("member {f} ({}), the source of the repair, is no longer in sync", self.spec.members[f]));
                    return true;
                }
                copies.retain(|&m| m != f);
                copies.insert(0, f);
            }
            if copies.len() < 2 {
                self.scrub_chunk_over(id, true);
                continue;
            }
            let reads: Vec<(usize, CopyId, Option<bool>)> = copies.iter().map(|&m| (m, CopyId(self.fresh_id()), None)).collect();
            for &(m, copy, _) in &reads {
                let cmd = MemberCmd::Read { offset: META_BYTES + start, len: end - start };
                self.issue(m, cmd, Data::Copy(copy), super::state::Purpose::ScrubRead { chunk: id });
            }
            let chunk = self.scrub.job.as_mut().and_then(|j| j.chunks.get_mut(&id)).expect("listed above");
            chunk.held = true;
            chunk.reads = reads;
        }
        moved
    }

    /// One copy of a chunk was read (or not); with every read in, the driver compares.
    pub(super) fn settle_scrub_read(&mut self, id: u64, member: usize, ok: bool) {
        let from = self.scrub.job.as_ref().and_then(|j| j.from);
        let Some(chunk) = self.scrub.job.as_mut().and_then(|j| j.chunks.get_mut(&id)) else { return };
        if let Some(r) = chunk.reads.iter_mut().find(|r| r.0 == member && r.2.is_none()) {
            r.2 = Some(ok);
        }
        if chunk.reads.iter().any(|r| r.2.is_none()) {
            return;
        }
        let failed: Vec<CopyId> = chunk.reads.iter().filter(|r| r.2 == Some(false)).map(|r| r.1).collect();
        chunk.reads.retain(|r| r.2 == Some(true));
        let source_lost = from.is_some_and(|f| self.map.set_at(f, chunk.start) == chunk.set && chunk.reads.first().is_none_or(|r| r.0 != f));
        let (copies, enough) = (chunk.reads.iter().map(|r| r.1).collect::<Vec<_>>(), chunk.reads.len() >= 2);
        for copy in failed {
            self.actions.push_back(Action::Release { copy });
        }
        if source_lost {
            self.scrub_chunk_over(id, true);
            return self.cut_scrub("the source of the repair failed".into());
        }
        if !enough {
            return self.scrub_chunk_over(id, true);
        }
        let compare = CompareId(self.fresh_id());
        let chunk = self.scrub.job.as_mut().and_then(|j| j.chunks.get_mut(&id)).expect("found above");
        chunk.compare = Some(compare);
        self.actions.push_back(Action::Compare { id: compare, copies });
    }

    /// The driver's comparison of a chunk: mismatches are recorded, and a repair rewrites
    /// the copies that differ from the source.
    pub(super) fn settle_compare(&mut self, compare: CompareId, diffs: Result<Vec<Vec<(u64, u64)>>, String>) {
        let Some(job) = self.scrub.job.as_mut() else { return };
        let Some((&id, chunk)) = job.chunks.iter_mut().find(|(_, c)| c.compare == Some(compare)) else { return };
        let diffs = match diffs {
            Ok(d) if d.len() + 1 == chunk.reads.len() => d,
            other => {
                let why = other.err().unwrap_or_else(|| "the comparison does not match the copies".into());
                self.actions.push_back(Action::Log { text: format!("scrub: set {} bytes {}..{} not compared: {why}", chunk.set, chunk.start, chunk.end) });
                return self.scrub_chunk_over(id, true);
            }
        };
        let (set, start, end, region) = (chunk.set, chunk.start, chunk.end, self.region_bytes);
        let source = chunk.reads[0].1;
        let mut rewrite = Vec::new();
        let mut ranges = Vec::new();
        for (i, d) in diffs.iter().enumerate() {
            let d: Vec<(u64, u64)> = d.iter().map(|&(a, b)| (start + a.min(end - start), start + b.min(end - start))).filter(|(a, b)| a < b).collect();
            if !d.is_empty() {
                rewrite.push(chunk.reads[i + 1].0);
                ranges.extend(d);
            }
        }
        let regions: Vec<u64> = ranges.iter().flat_map(|&(a, b)| a / region..=(b - 1) / region).collect();
        record_ranges(&mut job.report.ranges, &mut job.report.ranges_truncated, set, &ranges);
        job.regions.extend(regions.iter().map(|&r| (set, r)));
        job.report.mismatched_regions = job.regions.len() as u64;
        if !job.repair || rewrite.is_empty() {
            return self.scrub_chunk_over(id, false);
        }
        chunk.fixing = regions;
        rewrite.retain(|&m| self.members[m].live());
        for m in rewrite {
            let chunk = self.scrub.job.as_mut().and_then(|j| j.chunks.get_mut(&id)).expect("found above");
            chunk.writes_out += 1;
            let cmd = MemberCmd::Write { offset: META_BYTES + start, len: end - start, fua: false };
            self.issue(m, cmd, Data::Copy(source), super::state::Purpose::ScrubWrite { chunk: id });
        }
        let chunk = self.scrub.job.as_mut().and_then(|j| j.chunks.get_mut(&id)).expect("found above");
        if chunk.writes_out == 0 {
            self.scrub_chunk_over(id, false);
        }
    }

    pub(super) fn settle_scrub_write(&mut self, id: u64, ok: bool) {
        let Some(job) = self.scrub.job.as_mut() else { return };
        let Some(chunk) = job.chunks.get_mut(&id) else { return };
        chunk.writes_out -= 1;
        chunk.writes_failed |= !ok;
        if chunk.writes_out > 0 {
            return;
        }
        if !chunk.writes_failed {
            let set = chunk.set;
            let fixed: Vec<(usize, u64)> = chunk.fixing.iter().map(|&r| (set, r)).collect();
            job.repaired.extend(fixed);
            job.report.repaired_regions = job.repaired.len() as u64;
        }
        self.scrub_chunk_over(id, false);
    }

    /// A chunk is through (`skipped`: fewer than two copies could be compared): its
    /// buffers go, and writes to its range may start.
    fn scrub_chunk_over(&mut self, id: u64, skipped: bool) {
        let Some(job) = self.scrub.job.as_mut() else { return };
        let Some(chunk) = job.chunks.remove(&id) else { return };
        let len = chunk.end - chunk.start;
        job.report.done_bytes += len;
        if skipped {
            job.report.skipped_bytes += len;
        }
        for (_, copy, _) in chunk.reads {
            self.actions.push_back(Action::Release { copy });
        }
    }

    /// A copy job that can move (its set has a copy to read from); one that cannot would
    /// hold a scrub back for nothing. A live replacement holds it back too (its new member
    /// would not get what a repair rewrites), and so does a reshape (it moves the data).
    fn resync_can_run(&self) -> bool {
        (0..self.jobs.len()).any(|j| self.has_source(j)) || self.handover.is_some() || self.reshape.is_some()
    }

    fn scrub_pace_allows(&self, len: u64) -> bool {
        let Some(job) = self.scrub.job.as_ref() else { return false };
        let elapsed = self.now.saturating_sub(job.pace_origin);
        let allowed = self.spec.resync_rate_bytes_per_s.saturating_mul(elapsed) / 1000 + RESYNC_CHUNK_BYTES;
        job.paced_bytes + len <= allowed
    }

    pub(super) fn scrub_pace_wakeup(&self) -> Option<u64> {
        let job = self.scrub.job.as_ref()?;
        let resyncing = self.resync_can_run();
        if job.cursor.is_none() || job.chunks.len() >= RESYNC_STEPS_MAX || self.stopping != Stopping::Running || resyncing {
            return None;
        }
        let at = job.pace_origin + job.paced_bytes.saturating_mul(1000).div_ceil(self.spec.resync_rate_bytes_per_s);
        (at > self.now).then_some(at)
    }
}

/// Adds a chunk's differing ranges to a report's, merged with their neighbours, keeping
/// at most `SCRUB_RANGES_MAX`.
fn record_ranges(all: &mut Vec<ScrubRange>, truncated: &mut bool, set: usize, ranges: &[(u64, u64)]) {
    let mut new: Vec<(u64, u64)> = ranges.to_vec();
    new.sort_unstable();
    for (start, end) in new {
        let at = all.partition_point(|r| (r.set, r.start) < (set, start));
        if at > 0 && all[at - 1].set == set && all[at - 1].end >= start {
            all[at - 1].end = all[at - 1].end.max(end);
            continue;
        }
        if at < all.len() && all[at].set == set && all[at].start <= end {
            all[at].start = start;
            all[at].end = all[at].end.max(end);
            continue;
        }
        if all.len() >= SCRUB_RANGES_MAX {
            *truncated = true;
            continue;
        }
        all.insert(at, ScrubRange { set, start, end });
    }
}
