//! Where copies come from: each copy job's chunk is read from the first in-sync member of
//! the set its place belongs to there (with offset placement, a different set of members
//! in each placement period), and what changes when a reconcile's source fails.

use super::state::JobKind;
use super::Coordinator;

/// Where a copy job's chunk comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Source {
    Member(usize),
    /// The target is its set's first in-sync member there: nothing to copy.
    Itself,
    /// No member of the set is in sync: the chunk waits.
    Nothing,
}

impl Coordinator {
    /// Where job `j` copies its chunk at member offset `start` from: the first in-sync
    /// member of the set its place belongs to there. A reconcile's target that is that
    /// member already holds what the others are made equal to. When a reconcile's source
    /// fails, the next in-sync member takes over as the source (either copy of an
    /// unanswered write is a valid answer; what matters is that reads then agree).
    pub(super) fn source_of(&self, j: usize, start: u64) -> Source {
        let Some(job) = self.jobs[j].as_ref() else { return Source::Nothing };
        match self.first_in_sync(self.map.set_at(job.place, start), start) {
            None => Source::Nothing,
            Some(m) if m == job.target => Source::Itself,
            Some(m) => Source::Member(m),
        }
    }

    /// Whether job `j` can move: its next chunk has a copy to read from (or it waits only
    /// for what it has started).
    pub(super) fn has_source(&self, j: usize) -> bool {
        let Some(job) = self.jobs[j].as_ref() else { return false };
        job.cursor.is_none_or(|c| self.source_of(j, c) != Source::Nothing)
    }

    /// An in-sync member failed while copies a crash left unequal were being reconciled:
    /// it was the source of some of them, and the member that takes over as the source may
    /// hold other contents where it was not reconciled yet. What every job copied from the
    /// failed member is copied again from the new source (each job goes over the dirty
    /// regions once more), so that the copies agree with it.
    pub(super) fn copies_lost_source(&mut self) {
        if !self.jobs.iter().flatten().any(|j| j.kind == JobKind::Reconcile) {
            return;
        }
        let (dirty, region_bytes) = (self.dirty_regions(), self.region_bytes);
        let lens: Vec<u64> = dirty.iter().map(|&r| self.region_len(r)).collect();
        for job in self.jobs.iter_mut().flatten().filter(|j| !j.flushing) {
            for (&r, &len) in dirty.iter().zip(&lens) {
                if job.todo.insert(r) {
                    job.total_bytes += len;
                }
            }
            if let Some(&first) = job.todo.first() {
                job.cursor = Some(job.cursor.map_or(first * region_bytes, |c| c.min(first * region_bytes)));
            }
        }
        // Members whose reconcile is through copied from the failed member too.
        for m in 0..self.members.len() {
            let copying = self.jobs.iter().flatten().any(|j| j.target == m);
            if !copying && self.members[m].in_sync() && self.map.groups_of(m).any(|(set, at)| self.first_in_sync(set, at) != Some(m)) {
                self.add_job(JobKind::Reconcile, m, dirty.clone());
            }
        }
    }

    /// Whether a copy in flight writes to `member` in `start..end`: a chunk read from there
    /// now could miss it.
    pub(super) fn copy_lands_on(&self, member: usize, start: u64, end: u64) -> bool {
        self.locks.iter().any(|l| l.held && l.start < end && start < l.end && self.jobs[l.job].as_ref().is_some_and(|j| j.target == member))
    }

}
