//! The simulation's coordinator changes: a member replaced by a blank one, a coordinator
//! that stops cleanly or crashes, and the next one assembled from the members (sometimes
//! degraded, without one of them).

use super::member::{Health, SimMember};
use super::{session, World};
use crate::coordinator::{Command, Coordinator, Found, MemberState};
use crate::meta::Superblock;

impl World {
    /// Member `m` is replaced by a new, blank one at its place (`sluice pool replace`): what
    /// the old one held is gone with it, and the new one must be rebuilt before it serves.
    pub(super) fn replace(&mut self, m: usize) -> Result<(), String> {
        self.log.push(format!("{} member {m} is replaced by a blank one", self.now));
        self.report.replacements += 1;
        self.coord.replace_member(m, &format!("sim://member{m}"), self.now)?;
        let conn = self.members[m].conn + 1;
        self.members[m] = SimMember::new(self.member_bytes);
        let new = &mut self.members[m];
        new.conn = conn;
        new.dropped = true;
        new.retry_at = self.now + 50 + self.rng.below(500);
        Ok(())
    }

    /// The coordinator stops cleanly (requests in flight finish, the pool is released) and a
    /// new one is assembled, perhaps without a member (`--degraded` on a clean pool).
    pub(super) fn restart_cleanly(&mut self) -> Result<(), String> {
        self.log.push(format!("{} coordinator stops cleanly", self.now));
        self.stop_cleanly()?;
        if !self.reqs.is_empty() {
            return Err(format!("{} requests unanswered after a clean stop", self.reqs.len()));
        }
        self.report.clean_restarts += 1;
        self.report.resynced_bytes += self.coord.status().resynced_bytes;
        self.end_connections();
        self.reassemble("after a clean stop")
    }

    /// The old coordinator's connections are gone. What it had sent on them and a member
    /// has not carried out yet (everything sent to a member it dropped, a stalled one's
    /// queue) was processed or not by the time the next coordinator reaches that member:
    /// as when a dropped member is taken back, nothing of an old connection lands after
    /// the new coordinator's operations.
    fn end_connections(&mut self) {
        for m in &mut self.members {
            for p in std::mem::take(&mut m.queue) {
                if self.rng.below(2) == 0 {
                    m.apply(&p);
                }
            }
            m.dropped = false;
            m.conn += 1;
        }
    }

    /// A new coordinator, assembled from what the members hold now (perhaps degraded).
    fn reassemble(&mut self, when: &str) -> Result<(), String> {
        self.copies.clear();
        self.sessions += 1;
        let found: Vec<Option<Found>> = self.members.iter().map(|m| Some(Found { size: m.size, meta: m.meta.clone(), read_only: false })).collect();
        if !self.assemble_degraded(&found)? {
            self.coord = Coordinator::assemble(&self.spec, found, session(self.sessions), false, self.now)?;
        }
        // As the driver does: a reshape assembly started gets its start time.
        self.coord.wall_clock(1_700_000_000 + self.now / 1000);
        let states: Vec<MemberState> = self.coord.status().members.iter().map(|m| m.state).collect();
        self.log.push(format!("{} assembled again {when}: {states:?}", self.now));
        Ok(())
    }

    /// The coordinator dies: what it had sent was processed or not; unanswered writes may
    /// or may not have landed. A new one is assembled once every member answers.
    pub(super) fn crash_coordinator(&mut self) -> Result<(), String> {
        self.log.push(format!("{} coordinator crashes", self.now));
        self.report.coordinator_crashes += 1;
        self.report.resynced_bytes += self.coord.status().resynced_bytes;
        self.end_connections();
        for m in &mut self.members {
            m.health = Health::Up;
            m.fail_next = false;
        }
        for (_, r) in std::mem::take(&mut self.reqs) {
            // Unanswered writes may or may not have landed; unanswered reads are nobody's.
            match r.cmd {
                Command::Read { offset, len } => self.model.release(offset, len),
                _ => self.finish_request(r, false)?,
            }
        }
        self.reassemble("after a crash")
    }

    /// Sometimes the new coordinator starts without one member (`--degraded`), as an
    /// operator does who knows it holds nothing newer than the others: its superblock's
    /// event count is no higher than theirs. The member is taken back later, like one
    /// that was dropped. False when no member was left out (or the pool refused).
    fn assemble_degraded(&mut self, found: &[Option<Found>]) -> Result<bool, String> {
        if !self.spec.layout.redundant() || self.rng.below(3) != 0 {
            return Ok(false);
        }
        let m = self.rng.below(self.members.len() as u64) as usize;
        let events = |i: usize| Superblock::decode(&self.members[i].meta).ok().flatten().map_or(0, |sb| sb.events);
        let newest_other = (0..self.members.len()).filter(|&i| i != m).map(events).max().unwrap_or(0);
        if events(m) > newest_other {
            return Ok(false);
        }
        let mut partial = found.to_vec();
        partial[m] = None;
        match Coordinator::assemble(&self.spec, partial, session(self.sessions), true, self.now) {
            Ok(c) => {
                self.coord = c;
                self.members[m].dropped = true;
                self.members[m].retry_at = self.now + 100 + self.rng.below(1000);
                self.report.degraded_starts += 1;
                self.log.push(format!("{} assembled degraded, without member {m}", self.now));
                Ok(true)
            }
            Err(e) if e.contains("is in sync") || e.contains("did not stop cleanly") => {
                self.log.push(format!("{} degraded assembly without member {m} refused: {e}", self.now));
                Ok(false)
            }
            Err(e) => Err(format!("degraded assembly without member {m}: {e}")),
        }
    }
}
