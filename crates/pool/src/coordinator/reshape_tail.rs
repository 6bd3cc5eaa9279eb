//! The end of a reshape: the part of each member past the last moved unit is zeroed
//! before the volume grows over it. It held units in the old layout (or whatever a new
//! member held before), and a grown volume reads zeros in its new part, like a grown file.
//! Zeroing again after a crash does no harm: nothing is written there before the volume
//! has its new size.

use super::api::{Action, Data, MemberCmd};
use super::reshape_state::Tail;
use super::state::Purpose;
use super::Coordinator;
use crate::limits::{META_BYTES, RESHAPE_ZERO_CHUNK_BYTES};

impl Coordinator {
    /// Per set, the member range `start..member_bytes` that no moved unit uses.
    fn tail_ranges(&self) -> Vec<(usize, u64)> {
        let r = self.reshape.as_ref().expect("called while reshaping");
        let (units, m, unit) = (r.layout.units(), r.layout.to.sets as u64, r.layout.to.unit);
        (0..m)
            .map(|s| {
                let first = units + (s + m - units % m) % m;
                (s as usize, first / m * unit)
            })
            .filter(|&(_, start)| start < self.map.member_bytes)
            .collect()
    }

    /// Moves the zeroing along; true when it is done.
    pub(super) fn run_tail(&mut self, may_copy: bool) -> bool {
        let tail = self.reshape.as_ref().map(|r| r.tail.clone());
        match tail {
            Some(Tail::Todo) if may_copy => {
                let ranges = self.tail_ranges();
                let mut regions = Vec::new();
                if self.redundant() {
                    for &(_, start) in &ranges {
                        regions.extend(start / self.region_bytes..self.regions);
                    }
                    regions.sort_unstable();
                    regions.dedup();
                }
                let marks = self.mark_regions(&regions);
                self.reshape.as_mut().expect("checked above").tail = Tail::Marked { regions, marks };
                false
            }
            Some(Tail::Marked { regions, marks }) if marks.iter().all(|&(b, g)| self.durable(b, g)) => {
                if !may_copy {
                    self.release_regions(&regions);
                    self.reshape.as_mut().expect("checked above").tail = Tail::Todo;
                    return false;
                }
                let out = self.issue_zeroes();
                self.reshape.as_mut().expect("checked above").tail = Tail::Zeroing { regions, out, failed: false };
                out == 0
            }
            Some(Tail::Done) => true,
            _ => false,
        }
    }

    fn issue_zeroes(&mut self) -> usize {
        let mut out = 0;
        for (set, start) in self.tail_ranges() {
            let mut at = start;
            while at < self.map.member_bytes {
                let len = (self.map.member_bytes - at).min(RESHAPE_ZERO_CHUNK_BYTES);
                let cmd = MemberCmd::Zero { offset: META_BYTES + at, len, fua: true, may_trim: true };
                for m in self.map.members_at(set, at).filter(|&m| self.members[m].live()).collect::<Vec<_>>() {
                    self.issue(m, cmd, Data::None, Purpose::ReshapeZero);
                    out += 1;
                }
                at += len;
            }
        }
        out
    }

    pub(super) fn settle_reshape_zero(&mut self, ok: bool) {
        let Some(r) = self.reshape.as_mut() else { return };
        let Tail::Zeroing { regions, out, failed } = &mut r.tail else { return };
        *out -= 1;
        *failed |= !ok;
        if *out > 0 {
            return;
        }
        let (regions, failed) = (std::mem::take(regions), *failed);
        // A member that failed is rebuilt; the zeroing goes again once all are in sync.
        r.tail = if failed { Tail::Todo } else { Tail::Done };
        self.release_regions(&regions);
        if !failed {
            self.actions.push_back(Action::Log { text: "pool reshape: the space the volume grows into is zeroed".into() });
        }
    }
}
