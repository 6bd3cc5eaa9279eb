//! Which members hold copies of the same bytes: the fault rules keep one fault per group of
//! copies, and the final check compares each group over the member offsets it covers.

use super::member::SECTOR;
use super::World;
use crate::layout::Map;

impl World {
    /// The layout as the coordinator has it (member data bytes of this run).
    pub(super) fn map(&self) -> Map {
        let m = &self.spec;
        let unit = if m.layout == crate::spec::Layout::Mirror { u64::MAX } else { m.stripe_unit };
        Map { layout: m.layout, placement: m.placement, unit, copies: m.copies, sets: m.sets(), member_bytes: self.member_bytes }
    }

    /// The members that share a set with `m` somewhere, `m` included: a fault of any of
    /// them while `m` is down is a second fault of one of its sets.
    pub(super) fn mates(&self, m: usize) -> Vec<usize> {
        let map = self.map();
        let mut all: Vec<usize> = map.groups_of(m).flat_map(|(set, at)| map.members_at(set, at)).collect();
        all.sort_unstable();
        all.dedup();
        all
    }

    /// Every set's copies agree, over every placement period.
    pub(super) fn copies_agree(&self) -> Result<(), String> {
        let map = self.map();
        let period = map.period().min(self.member_bytes);
        for start in (0..self.member_bytes).step_by(period as usize) {
            let sectors = start / SECTOR..(start + period).min(self.member_bytes) / SECTOR;
            for set in 0..map.sets {
                let group: Vec<usize> = map.members_at(set, start).collect();
                for &m in &group[1..] {
                    if let Some(s) = self.members[group[0]].differs_in(&self.members[m], sectors.clone()) {
                        return Err(format!("members {} and {m} differ at data sector {s} after resync", group[0]));
                    }
                }
            }
        }
        Ok(())
    }
}
