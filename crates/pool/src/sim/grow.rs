//! The simulation's grow (`sluice pool grow`): members added at the end of the list,
//! sometimes with the coordinator crashing right after the pool file names them (the next
//! one must start the reshape itself), and coordinator crashes while it reshapes.

use super::member::{SimMember, SECTOR};
use super::World;
use crate::coordinator::Found;
use crate::spec::Layout;

impl World {
    /// Blank members join at the end: whole sets for a stripe or raid10, one copy for a
    /// mirror.
    pub(super) fn grow(&mut self) -> Result<(), String> {
        let mirror = self.spec.layout == Layout::Mirror;
        let add = if mirror { 1 } else { self.spec.copies * (1 + self.rng.below(2) as usize) };
        // Decided before the members exist: the coordinator does not know them yet.
        let crash = self.rng.below(4) == 0 && !self.power_loss_unrecorded() && !self.handover_at_risk();
        let mut added = Vec::new();
        for _ in 0..add {
            let uri = format!("sim://member{}", self.members.len());
            let m = SimMember::new(self.member_bytes);
            added.push((uri.clone(), Found { size: m.size, meta: m.meta.clone(), read_only: false }));
            self.members.push(m);
            self.spec.members.push(uri);
        }
        if mirror {
            self.spec.copies = self.spec.members.len();
        }
        self.report.grows += 1;
        self.log.push(format!("{} the pool grows by {add} members to {}", self.now, self.members.len()));
        if crash {
            self.log.push(format!("{} the coordinator crashes before it hears of the new members", self.now));
            return self.crash_coordinator();
        }
        self.coord.grow(added, 1_700_000_000, self.now)?;
        self.pump()
    }

    /// Half of the requests during a reshape go just behind or ahead of its checkpoint,
    /// where units are being moved and the checkpoint is not yet durable.
    pub(super) fn reshape_frontier(&mut self, len: u64) -> Option<u64> {
        let status = self.coord.status();
        let r = status.reshape?;
        if self.rng.below(2) == 0 {
            return None;
        }
        let near = 4 * status.stripe_unit;
        let (from, to) = (r.done_bytes.saturating_sub(near), (r.done_bytes + near).min(r.total_bytes));
        let span = to.checked_sub(from + len)?;
        Some((from + self.rng.below(span + 1)) / SECTOR * SECTOR)
    }

    /// Crashes the coordinator now and then while it reshapes, often right after it
    /// acknowledged a write (which must not depend on a checkpoint still in flight).
    pub(super) fn crash_while_reshaping(&mut self) -> Result<(), String> {
        let after_ack = std::mem::take(&mut self.crash_after_ack);
        if !after_ack && self.rng.below(300) != 0 {
            return Ok(());
        }
        if self.coord.status().reshape.is_none() || self.power_loss_unrecorded() || self.handover_at_risk() {
            return Ok(());
        }
        self.report.reshape_crashes += 1;
        self.crash_coordinator()
    }
}
