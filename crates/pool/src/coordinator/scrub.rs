//! Scrub (md's `check`/`repair`, ZFS scrub): compare every mirror set's in-sync copies
//! chunk by chunk, at the resync rate, and report (and, for a repair, rewrite from one
//! source copy) the regions where they differ. The chunk being compared is held back from
//! writes exactly as a resync chunk is, so copies that differ there differ for real.
//!
//! This file holds the scrub's public face (start, the driver's comparison answer, status,
//! the record kept in the superblocks, the schedule); `scrub_job` walks the chunks.

use std::collections::{BTreeMap, BTreeSet};

use super::api::{CompareId, ScrubReport};
use super::Coordinator;
use crate::meta::Superblock;
use crate::scrub_record::ScrubRecord;
use crate::spec::PoolSpec;

/// The coordinator's scrub state.
pub(super) struct Scrub {
    pub job: Option<ScrubJob>,
    /// The last scrub that ended: this coordinator's, else the one the superblocks record.
    pub last: Option<ScrubReport>,
    /// What the superblocks say (and will say) about the last completed scrub.
    pub record: Option<ScrubRecord>,
    pub completed: u64,
    /// Wall-clock milliseconds at coordinator time 0, once the driver says.
    pub wall_origin: Option<u64>,
    /// When this coordinator started (its clock), for the first scheduled scrub.
    pub started: u64,
}

/// A running scrub.
pub(super) struct ScrubJob {
    pub repair: bool,
    /// The member to repair from (its set only); others use their set's first in-sync copy.
    pub from: Option<usize>,
    /// Next chunk to start: (set, member data offset).
    pub cursor: Option<(usize, u64)>,
    /// Chunks in flight, by id.
    pub chunks: BTreeMap<u64, Chunk>,
    pub pace_origin: u64,
    pub paced_bytes: u64,
    pub report: ScrubReport,
    /// (set, region) pairs found to differ, and those rewritten.
    pub regions: BTreeSet<(usize, u64)>,
    pub repaired: BTreeSet<(usize, u64)>,
    /// Why the scrub is being cut short: it starts nothing more, and ends once the chunks
    /// in flight are through (their buffers released).
    pub cutting: Option<String>,
}

/// One chunk of one set being compared.
pub(super) struct Chunk {
    pub set: usize,
    pub start: u64,
    pub end: u64,
    /// Reading has started (before that, running writes drain).
    pub held: bool,
    /// The copies read, the source first: member, buffer, and the read's outcome once in.
    pub reads: Vec<(usize, super::api::CopyId, Option<bool>)>,
    pub compare: Option<CompareId>,
    /// Repair writes still out, and the regions they rewrite.
    pub writes_out: usize,
    pub writes_failed: bool,
    pub fixing: Vec<u64>,
}

impl Scrub {
    pub fn new(spec: &PoolSpec, sbs: &[Option<Superblock>], now: u64) -> Scrub {
        let _ = spec;
        let record = newest_record(sbs);
        Scrub { job: None, last: record.map(|r| from_record(&r)), record, completed: 0, wall_origin: None, started: now }
    }
}

/// The newest scrub record among the superblocks.
fn newest_record(sbs: &[Option<Superblock>]) -> Option<ScrubRecord> {
    sbs.iter().flatten().filter_map(|sb| sb.scrub).max_by_key(|r| r.finished_wall_ms)
}

fn from_record(r: &ScrubRecord) -> ScrubReport {
    ScrubReport {
        repair: r.repair,
        running: false,
        done_bytes: r.compared_bytes,
        total_bytes: r.compared_bytes,
        mismatched_regions: r.mismatched_regions,
        repaired_regions: r.repaired_regions,
        finished_wall_ms: Some(r.finished_wall_ms),
        error: r.partial.then(|| "it ended before every set was compared".to_string()),
        ..ScrubReport::default()
    }
}

/// The last scrub the superblocks record, for `pool status` without assembling.
pub(super) fn recorded(sbs: &[Option<Superblock>]) -> Option<ScrubReport> {
    newest_record(sbs).map(|r| from_record(&r))
}

/// Byte ranges (start, end) where `b` differs from `a`, merged; bytes past the shorter one
/// count as differing.
pub fn differing_ranges(a: &[u8], b: &[u8]) -> Vec<(u64, u64)> {
    const BLOCK: usize = 4096;
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut push = |s: usize, e: usize| match out.last_mut() {
        Some(last) if last.1 == s as u64 => last.1 = e as u64,
        _ => out.push((s as u64, e as u64)),
    };
    let n = a.len().min(b.len());
    for at in (0..n).step_by(BLOCK) {
        let end = (at + BLOCK).min(n);
        if a[at..end] == b[at..end] {
            continue;
        }
        let mut i = at;
        while i < end {
            if a[i] == b[i] {
                i += 1;
                continue;
            }
            let s = i;
            while i < end && a[i] != b[i] {
                i += 1;
            }
            push(s, i);
        }
    }
    if a.len() != b.len() {
        push(n, a.len().max(b.len()));
    }
    out
}

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
        });
        let what = if repair { "repair" } else { "check" };
        let source = from.map_or(String::new(), |m| format!(" from member {m} ({})", self.spec.members[m]));
        self.actions.push_back(super::api::Action::Log { text: format!("scrub: {what}{source} started ({total} bytes of member data)") });
    }

    /// The scrub is over (`error`: cut short): its report stays as the last one, and the
    /// superblocks record it.
    pub(super) fn end_scrub(&mut self, error: Option<String>) {
        let Some(job) = self.scrub.job.take() else { return };
        let mut report = job.report;
        report.running = false;
        report.error = error;
        let wall = self.scrub.wall_origin.map_or(0, |o| o + self.now);
        report.finished_wall_ms = Some(wall);
        self.scrub.record = Some(ScrubRecord {
            repair: report.repair,
            partial: report.error.is_some() || report.skipped_bytes > 0,
            finished_wall_ms: wall,
            compared_bytes: report.done_bytes - report.skipped_bytes,
            mismatched_regions: report.mismatched_regions,
            repaired_regions: report.repaired_regions,
        });
        self.gen[0] += 1;
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
