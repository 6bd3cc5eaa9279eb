//! Scrub (md's `check`/`repair`, ZFS scrub): compare every mirror set's in-sync copies
//! chunk by chunk, at the resync rate, and report (and, for a repair, rewrite from one
//! source copy) the regions where they differ. The chunk being compared is held back from
//! writes exactly as a resync chunk is, so copies that differ there differ for real.
//!
//! This file holds the scrub's public face (start, the driver's comparison answer, status,
//! the record kept in the superblocks, the schedule); `scrub_job` walks the chunks.

use std::collections::{BTreeMap, BTreeSet};

use super::api::{CompareId, ScrubReport};
use super::scrub_state::ScrubJob;
use super::Coordinator;
use crate::scrub_record::ScrubRecord;

impl Coordinator {
    /// Starts comparing every set's in-sync copies (`repair`: and rewriting those that
    /// differ from the source: member `from` for its set, else each set's first in-sync
    /// copy). Refused for a stripe, while a scrub runs, while stopping, and for a `from`
    /// that is not an in-sync member.
    pub fn start_scrub(&mut self, repair: bool, from: Option<usize>, now: u64) -> Result<(), String> {
        self.now = self.now.max(now);
        if !self.redundant() {
            return Err("a stripe keeps one copy of every unit: there is nothing to compare".into());
        }
        if let Some(job) = &self.scrub.job {
            let r = &job.report;
            let what = if r.repair { "repair" } else { "check" };
            return Err(format!("a {what} is running already ({} of {} bytes done)", r.done_bytes, r.total_bytes));
        }
        if self.stopping != super::state::Stopping::Running || self.fenced.is_some() {
            return Err("the pool is stopping".into());
        }
        if let Some(m) = from {
            if m >= self.members.len() {
                return Err(format!("there is no member {m}"));
            }
            if !self.members[m].in_sync() || self.jobs.iter().flatten().any(|j| j.target == m) {
                return Err(format!("member {m} ({}) is not in sync, so it cannot be the source of a repair", self.spec.members[m]));
            }
        }
        self.begin_scrub(repair, from);
        self.advance();
        Ok(())
    }

    /// The driver compared the buffers of `Action::Compare { id, .. }`: for each copy after
    /// the first, the byte ranges (within the buffers) where it differs from the first; or
    /// why it could not compare them (the chunk is then counted as skipped).
    pub fn compared(&mut self, id: CompareId, diffs: Result<Vec<Vec<(u64, u64)>>, String>, now: u64) {
        self.now = self.now.max(now);
        self.settle_compare(id, diffs);
        self.advance();
    }

    /// Tells the coordinator the wall clock (ms since the Unix epoch) at its time 0, so
    /// that scrub records carry dates and a scheduled scrub survives restarts.
    pub fn set_wall_clock(&mut self, wall_ms_at_zero: u64) {
        self.scrub.wall_origin = Some(wall_ms_at_zero);
    }

    /// The running scrub, else the last one.
    pub(super) fn scrub_report(&self) -> Option<ScrubReport> {
        match &self.scrub.job {
            Some(job) => Some(job.report.clone()),
            None => self.scrub.last.clone(),
        }
    }

    fn begin_scrub(&mut self, repair: bool, from: Option<usize>) {
        let total = self.map.member_bytes * self.map.sets as u64;
        let report = ScrubReport { repair, running: true, total_bytes: total, ..ScrubReport::default() };
        self.scrub.job = Some(ScrubJob {
            repair,
            from,
            cursor: Some((0, 0)),
            chunks: BTreeMap::new(),
            pace_origin: self.now,
            paced_bytes: 0,
            report,
            regions: BTreeSet::new(),
            repaired: BTreeSet::new(),
            cutting: None,
            flushes_out: None,
        });
        let what = if repair { "repair" } else { "check" };
        let source = from.map_or(String::new(), |m| format!(" from member {m} ({})", self.spec.members[m]));
        self.actions.push_back(super::api::Action::Log { text: format!("scrub: {what}{source} started ({total} bytes of member data)") });
    }

    /// The scrub is over (`error`: cut short): its report stays as the last one, and the
    /// superblocks record it unless the pool is stopping.
    pub(super) fn end_scrub(&mut self, error: Option<String>) {
        let Some(job) = self.scrub.job.take() else { return };
        let mut report = job.report;
        report.running = false;
        report.error = error;
        let wall = self.scrub.wall_origin.map_or(0, |o| o + self.now);
        report.finished_wall_ms = Some(wall);
        // A scrub the pool's stop cut short is not recorded: it must not push the next
        // scheduled one back (a short-lived coordinator would otherwise keep doing so).
        let stopped = self.stopping != super::state::Stopping::Running || self.fenced.is_some();
        if !stopped {
            self.scrub.record = Some(ScrubRecord {
                repair: report.repair,
                partial: report.error.is_some() || report.skipped_bytes > 0,
                finished_wall_ms: wall,
                compared_bytes: report.done_bytes - report.skipped_bytes,
                mismatched_regions: report.mismatched_regions,
                repaired_regions: report.repaired_regions,
            });
            self.gen[0] += 1;
        }
        self.scrub.completed += 1;
        let what = if report.repair { "repair" } else { "check" };
        let mut text = format!("scrub: {what} ended: {} mismatched region(s), {} repaired, {} bytes skipped", report.mismatched_regions, report.repaired_regions, report.skipped_bytes);
        if let Some(e) = &report.error {
            text.push_str(&format!(" (cut short: {e})"));
        }
        self.actions.push_back(super::api::Action::Log { text });
        self.scrub.last = Some(report);
    }

    /// When the next scheduled check is due, on this coordinator's clock: one interval
    /// after the last completed scrub, or after this coordinator started if none is
    /// recorded.
    fn scrub_due_at(&self) -> Option<u64> {
        let interval = self.spec.scrub_interval_ms?;
        if self.scrub.job.is_some() || !self.redundant() || self.fenced.is_some() || self.stopping != super::state::Stopping::Running {
            return None;
        }
        let origin = self.scrub.wall_origin?;
        match self.scrub.record.filter(|r| r.finished_wall_ms > 0) {
            Some(r) => Some((r.finished_wall_ms + interval).saturating_sub(origin)),
            None => Some(self.scrub.started + interval),
        }
    }

    /// Starts the scheduled check when it is due.
    pub(super) fn scrub_due(&mut self) {
        if self.scrub_due_at().is_some_and(|t| t <= self.now) && self.heartbeat > 0 {
            self.actions.push_back(super::api::Action::Log { text: "scrub: the scrub-interval has passed since the last scrub".into() });
            self.begin_scrub(false, None);
        }
    }

    pub(super) fn scrub_wakeup(&self) -> Option<u64> {
        // Before the first heartbeat, the heartbeat's own timer wakes the coordinator.
        let due = self.scrub_due_at().filter(|_| self.heartbeat > 0);
        [due, self.scrub_pace_wakeup()].into_iter().flatten().min()
    }
}
