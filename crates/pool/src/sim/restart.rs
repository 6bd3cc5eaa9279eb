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
    /// Sometimes the member is dead first; a live one is copied while it serves.
    pub(super) fn replace(&mut self, m: usize) -> Result<(), String> {
        // A second replacement of one member makes no sense.
        if self.shadow.is_some_and(|(x, _)| x == m) {
            return Ok(());
        }
        // A live member is not replaced while a reshape runs: only a dead one.
        let reshaping = self.coord.status().reshape.is_some();
        if reshaping || self.rng.below(2) == 0 {
            self.log.push(format!("{} member {m} dies before it is replaced", self.now));
            self.members[m].crash(&mut self.rng, false, u64::MAX);
            self.coord.member_lost(m, "connection reset", self.now);
        }
        self.log.push(format!("{} member {m} is replaced by a blank one", self.now));
        self.report.replacements += 1;
        match self.coord.replace_member(m, &format!("sim://member{m}"), self.now)? {
            None => self.blank_member(m),
            Some(shadow) => {
                if shadow != self.members.len() || self.shadow.is_some() {
                    return Err(format!("a shadow at slot {shadow} with {} members and {:?} already", self.members.len(), self.shadow));
                }
                self.log.push(format!("{} member {m} serves while its successor (slot {shadow}) is copied", self.now));
                self.members.push(SimMember::new(self.member_bytes));
                self.blank_member(shadow);
                self.shadow = Some((m, shadow));
            }
        }
        Ok(())
    }

    /// The shadow takes member `m`'s place; the old member is gone.
    pub(super) fn swap(&mut self, m: usize, shadow: usize) -> Result<(), String> {
        if self.shadow != Some((m, shadow)) || shadow + 1 != self.members.len() {
            return Err(format!("a swap of member {m} with slot {shadow}, expected {:?}", self.shadow));
        }
        self.log.push(format!("{} the shadow takes member {m}'s place", self.now));
        self.report.handovers += 1;
        self.members[m] = self.members.pop().expect("checked above");
        self.shadow = None;
        self.successor = Some(m);
        Ok(())
    }

    /// A coordinator that goes during a live replacement leaves the pool file naming the
    /// successor (it was edited first): the old member is out, the successor holds part of
    /// a copy and blank metadata.
    fn shadow_in_place(&mut self) {
        if let Some((m, shadow)) = self.shadow.take() {
            self.log.push(format!("{} the coordinator went during the copy: the successor is member {m} now", self.now));
            self.members[m] = self.members.remove(shadow);
        }
    }

    /// Whether the coordinator going now would leave a set without an in-sync copy: a live
    /// replacement's old member is out then, and the others of its set must hold everything.
    /// That lasts past the swap: the successor counts as in sync from then on, but its
    /// metadata stays blank until its superblock, written once it took the place, lands,
    /// and the next coordinator rebuilds a blank member in full.
    pub(super) fn handover_at_risk(&self) -> bool {
        let unrecorded = self.successor.filter(|&m| !matches!(Superblock::decode(&self.members[m].meta), Ok(Some(_))));
        let status = self.coord.status();
        self.shadow.map(|(m, _)| m).into_iter().chain(unrecorded).any(|m| {
            self.mates(m).into_iter().filter(|&x| x != m).any(|x| {
                let s = &self.members[x];
                status.members[x].state != MemberState::InSync || s.power_lost || s.fail_next || s.health != Health::Up
            })
        })
    }

    /// The coordinator put spare `uri` in member `m`'s place after `m` was missing too long:
    /// the pool file now says so, and the spare is a blank member the coordinator reaches.
    pub(super) fn take_spare(&mut self, m: usize, uri: String) {
        self.log.push(format!("{} spare {uri} takes member {m}'s place", self.now));
        self.report.spares_taken += 1;
        self.spec.spares.retain(|s| *s != uri);
        self.spec.members[m] = uri;
        self.blank_member(m);
    }

    /// A new, blank member at `m`'s place, not connected yet.
    fn blank_member(&mut self, m: usize) {
        let conn = self.members[m].conn + 1;
        self.members[m] = SimMember::new(self.member_bytes);
        let new = &mut self.members[m];
        new.conn = conn;
        new.dropped = true;
        new.retry_at = self.now + 50 + self.rng.below(500);
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
        self.shadow_in_place();
        self.successor = None;
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
