//! Scrub in the simulation: sectors of one copy are changed behind the coordinator's back
//! (bit rot), and then a check must report exactly the regions and bytes that differ, a
//! repair must make the copies equal, and a second check must find nothing.
//!
//! The model: a diverged volume sector may read back as either copy's version, on every
//! read, until a repair; after it, as one of them (settled by the next read). The workload
//! does not write diverged sectors (a write would make the copies equal again and the
//! expected report unknowable); reads of them go on throughout.

use std::collections::BTreeSet;

use super::member::SECTOR;
use super::{Rng, World};
use crate::coordinator::{CopyId, ScrubRange, ScrubReport};
use crate::spec::Layout;

/// Scrub steps before a scrub must have ended.
const SCRUB_STEPS_MAX: u64 = 400_000;

impl World {
    /// Compares resync buffers as the driver does, sector by sector.
    pub(super) fn compare_copies(&self, copies: &[CopyId]) -> Result<Vec<Vec<(u64, u64)>>, String> {
        let bufs: Vec<&Vec<u64>> = copies.iter().map(|c| self.copies.get(c).ok_or("a compared buffer is gone")).collect::<Result<_, _>>()?;
        let diff = |b: &Vec<u64>| {
            let mut out: Vec<(u64, u64)> = Vec::new();
            for (i, (x, y)) in bufs[0].iter().zip(b.iter()).enumerate() {
                if x == y {
                    continue;
                }
                let (s, e) = (i as u64 * SECTOR, (i as u64 + 1) * SECTOR);
                match out.last_mut() {
                    Some(last) if last.1 == s => last.1 = e,
                    _ => out.push((s, e)),
                }
            }
            out
        };
        Ok(bufs[1..].iter().map(|b| diff(b)).collect())
    }

    /// The volume offset of member data offset `at` of `set` (the inverse of the layout).
    fn volume_offset(&self, set: usize, at: u64) -> u64 {
        if self.spec.layout == Layout::Mirror {
            return at;
        }
        let (unit, sets) = (self.spec.stripe_unit, self.spec.sets() as u64);
        (at / unit * sets + set as u64) * unit + at % unit
    }

    /// Changes 1 to 4 sectors of random copies; returns what a check must report.
    fn diverge(&mut self) -> Vec<ScrubRange> {
        let member_sectors = self.coord.size() / self.spec.sets() as u64 / SECTOR;
        let mut expected = Vec::new();
        for _ in 0..1 + self.rng.below(4) {
            let set = self.rng.below(self.spec.sets() as u64) as usize;
            // Most in the hot part the workload writes, some anywhere.
            let span = if self.rng.below(2) == 0 { member_sectors / 8 } else { member_sectors };
            let s = self.rng.below(span);
            let k = self.rng.below(self.spec.copies as u64) as usize;
            let m = self.map().members_at(set, s * SECTOR).nth(k).expect("a set has its copies");
            let vs = self.volume_offset(set, s * SECTOR) / SECTOR;
            if self.diverged.contains(&vs) {
                continue;
            }
            let v = self.model.fresh();
            self.log.push(format!("{} sector {s} of member {m} (volume sector {vs}) rots to version {v}", self.now));
            self.members[m].corrupt(s, v);
            self.model.diverge(vs, v);
            self.diverged.insert(vs);
            expected.push(ScrubRange { set, start: s * SECTOR, end: (s + 1) * SECTOR });
        }
        expected.sort_by_key(|r| (r.set, r.start));
        expected
    }

    /// Runs a scrub to its end with the workload going on (and faults, if `faults`).
    fn scrub(&mut self, repair: bool, from: Option<usize>, faults: bool) -> Result<ScrubReport, String> {
        self.coord.start_scrub(repair, from, self.now)?;
        self.pump()?;
        let session = self.sessions;
        for _ in 0..SCRUB_STEPS_MAX {
            if self.sessions != session {
                // The coordinator crashed or restarted: its scrub is gone with it.
                return Ok(ScrubReport { error: Some("the coordinator restarted".into()), ..ScrubReport::default() });
            }
            let report = self.coord.status().scrub.ok_or("a scrub without a report")?;
            if !report.running {
                return Ok(report);
            }
            if self.members.iter().all(|m| m.queue.is_empty()) && self.reqs.is_empty() {
                if let Some(t) = self.coord.next_wakeup() {
                    self.now = self.now.max(t);
                }
            }
            self.step_with_load(faults)?;
        }
        Err("the scrub did not end".into())
    }

    /// A workload step; faults only when `faults`.
    fn step_with_load(&mut self, faults: bool) -> Result<(), String> {
        if faults {
            return self.step(true);
        }
        self.now += self.rng.below(4);
        if self.rng.below(2) == 0 {
            self.submit_random()?;
        }
        while self.deliver()? {}
        if self.coord.next_wakeup().is_some_and(|t| t <= self.now) {
            self.coord.tick(self.now);
        }
        self.reconnect();
        self.pump()
    }
}

/// The regions `ranges` touch.
fn regions(ranges: &[ScrubRange], region_bytes: u64) -> BTreeSet<(usize, u64)> {
    ranges.iter().flat_map(|r| (r.start / region_bytes..=(r.end - 1) / region_bytes).map(move |g| (r.set, g))).collect()
}

/// Merges adjacent ranges, as a report does.
fn merged(ranges: &[ScrubRange]) -> Vec<ScrubRange> {
    let mut out: Vec<ScrubRange> = Vec::new();
    for r in ranges {
        match out.last_mut() {
            Some(l) if l.set == r.set && l.end >= r.start => l.end = l.end.max(r.end),
            _ => out.push(*r),
        }
    }
    out
}

/// One seeded scrub run: a faulty workload, bit rot, a check under load, a repair, a
/// second check, then the usual final verification. `faults`: members fail during the
/// first check too (then it may report less, never more).
pub fn run_scrub(rng: Rng, faults: bool) -> Result<(u64, u64), String> {
    let mut w = World::new(rng, false)?;
    if !w.spec.layout.redundant() {
        let refused = w.coord.start_scrub(false, None, w.now).expect_err("a stripe has nothing to compare");
        return if refused.contains("nothing to compare") { Ok((0, 0)) } else { Err(refused) };
    }
    let body = |w: &mut World| -> Result<(u64, u64), String> {
        for _ in 0..1_000 {
            w.step(true)?;
        }
        w.settle()?;
        let expected = merged(&w.diverge());
        let region_bytes = w.coord.status().region_bytes;
        let want = regions(&expected, region_bytes);
        let check = w.scrub(false, None, faults)?;
        let got = regions(&check.ranges, region_bytes);
        if faults {
            if !got.is_subset(&want) || check.mismatched_regions != got.len() as u64 {
                return Err(format!("a check under faults reported {check:?}, but only {expected:?} differ"));
            }
            w.settle()?;
        } else if check.ranges != expected || check.mismatched_regions != want.len() as u64 || check.skipped_bytes != 0 {
            return Err(format!("the check reported {check:?}, but {expected:?} differ"));
        }
        let from = (w.rng.below(2) == 0).then(|| w.rng.below(w.spec.members.len() as u64) as usize);
        let repair = w.scrub(true, from, false)?;
        // Faults may have healed some divergence already (a member rebuilt in full from the
        // other copy), never added any.
        let fixed = regions(&repair.ranges, region_bytes);
        let exact = fixed == want || (faults && fixed.is_subset(&want));
        if !exact || repair.mismatched_regions != fixed.len() as u64 || repair.repaired_regions != fixed.len() as u64 || repair.error.is_some() {
            return Err(format!("the repair reported {repair:?}, but {expected:?} differ"));
        }
        for s in std::mem::take(&mut w.diverged) {
            w.model.converge(s);
        }
        // The repair flushed what it rewrote (the workload leaves those sectors alone).
        for r in expected.iter().filter(|_| !faults) {
            for m in w.map().members_at(r.set, r.start) {
                if !w.members[m].durable_as_read(r.start / SECTOR) {
                    return Err(format!("member {m}'s repaired sector {} is not durable after the repair", r.start / SECTOR));
                }
            }
        }
        let again = w.scrub(false, None, false)?;
        if again.mismatched_regions != 0 || !again.ranges.is_empty() {
            return Err(format!("a check after the repair still found {again:?}"));
        }
        w.settle()?;
        w.verify()?;
        Ok((want.len() as u64, w.coord.status().scrubs_completed))
    };
    body(&mut w).map_err(|e| w.explain(e))
}

/// The wall clock at sim time 0 (any date will do).
const WALL_ORIGIN_MS: u64 = 1_700_000_000_000;
const HOUR_MS: u64 = 3_600_000;

impl World {
    /// Lets time pass without a workload (jumping over idle time) until `done` or `limit`
    /// (sim time); returns whether `done` came true.
    fn run_until(&mut self, limit: u64, done: impl Fn(&World) -> bool) -> Result<bool, String> {
        for _ in 0..SCRUB_STEPS_MAX {
            if done(self) {
                return Ok(true);
            }
            if self.now >= limit {
                return Ok(false);
            }
            if self.members.iter().all(|m| m.queue.is_empty()) && self.reqs.is_empty() {
                if let Some(t) = self.coord.next_wakeup() {
                    self.now = self.now.max(t.min(limit));
                }
            }
            self.step(false)?;
        }
        Err("the run did not end".into())
    }

    /// A clean restart with a new coordinator that knows the wall clock.
    fn restart_with_clock(&mut self) -> Result<(), String> {
        self.restart_cleanly()?;
        self.coord.set_wall_clock(WALL_ORIGIN_MS);
        Ok(())
    }
}

/// A scheduled scrub starts one interval after the coordinator started (none recorded),
/// records its end in the superblocks, and after a restart the next one is due one
/// interval after that record, not earlier.
pub fn run_scheduled(rng: Rng) -> Result<bool, String> {
    let mut w = World::new(rng, false)?;
    if !w.spec.layout.redundant() {
        return Ok(false);
    }
    let body = |w: &mut World| -> Result<bool, String> {
        w.spec.scrub_interval_ms = Some(HOUR_MS);
        w.restart_with_clock()?;
        let started = w.now;
        let running = |w: &World| w.coord.status().scrub.is_some_and(|r| r.running);
        // A scrub starts in the step that observes it running, at that step's time.
        if !w.run_until(started + HOUR_MS + 5_000, running)? {
            return Err("no scheduled scrub within 5 s of its interval".into());
        }
        if w.now < started + HOUR_MS {
            return Err(format!("a scheduled scrub started at {} before its interval passed", w.now));
        }
        let ended = |w: &World| w.coord.status().scrubs_completed == 1;
        if !w.run_until(u64::MAX, ended)? {
            return Err("the scheduled scrub did not end".into());
        }
        let finished = w.coord.status().scrub.and_then(|r| r.finished_wall_ms).ok_or("no end time")?;
        if finished != WALL_ORIGIN_MS + w.now {
            return Err(format!("the scrub ended at wall {finished}, not {}", WALL_ORIGIN_MS + w.now));
        }
        w.settle()?;
        w.restart_with_clock()?;
        let recorded = w.coord.status().scrub.and_then(|r| r.finished_wall_ms);
        if recorded != Some(finished) {
            return Err(format!("after a restart the last scrub ended at {recorded:?}, not {finished}"));
        }
        let due = finished - WALL_ORIGIN_MS + HOUR_MS;
        if !w.run_until(due + 5_000, running)? {
            return Err("after a restart no scheduled scrub came when due".into());
        }
        if w.now < due {
            return Err(format!("after a restart a scheduled scrub started at {} before {due}", w.now));
        }
        // A stop that cuts it short leaves the record (and the schedule) as it was.
        w.restart_with_clock()?;
        let recorded = w.coord.status().scrub.and_then(|r| r.finished_wall_ms);
        if recorded != Some(finished) {
            return Err(format!("a scrub cut short by a stop was recorded: {recorded:?}, not {finished}"));
        }
        Ok(true)
    };
    body(&mut w).map_err(|e| w.explain(e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scheduled_scrubs_come_when_due_and_survive_restarts() {
        let ran = (0..8).filter(|&seed| run_scheduled(Rng::seeded(9000 + seed)).unwrap_or_else(|e| panic!("seed {seed}: {e}"))).count();
        assert!(ran >= 2, "only {ran} seeds had a redundant layout");
    }

    #[test]
    fn scrub_reports_exactly_the_rotten_regions_and_repair_fixes_them() {
        let seeds: u64 = std::env::var("SLUICE_POOL_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).map_or(40, |n: u64| n / 3);
        let mut found = 0;
        for seed in 0..seeds {
            found += run_scrub(Rng::seeded(1000 + seed), false).unwrap_or_else(|e| panic!("seed {seed}: {e}")).0;
        }
        assert!(found > seeds / 2, "the runs found only {found} rotten regions");
    }

    #[test]
    fn a_check_under_member_faults_reports_no_region_that_does_not_differ() {
        let seeds: u64 = std::env::var("SLUICE_POOL_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).map_or(30, |n: u64| n / 4);
        for seed in 0..seeds {
            run_scrub(Rng::seeded(5000 + seed), true).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
        }
    }
}
