//! The simulation's clients: random and sequential reads, writes, zeroes, trims, flushes
//! and cache hints.

use super::model::{sector_bytes, SECTOR};
use super::{Kind, World};
use crate::api::Request;

impl World {
    /// Slots a member lends when it (re)starts: sometimes more than the volume has
    /// blocks, mostly fewer, so eviction runs.
    pub(super) fn member_slots(&mut self) -> u64 {
        let blocks = self.p.volume_bytes.div_ceil(self.p.block_bytes);
        if self.knobs.ample {
            return blocks;
        }
        1 + self.rng.below(blocks / 2 + 2)
    }

    /// A sector-aligned range inside the volume, up to three blocks long.
    fn range(&mut self) -> (u64, u64) {
        let sectors = self.p.volume_bytes / SECTOR;
        let offset = self.rng.below(sectors) * SECTOR;
        let len = (1 + self.rng.below(3 * self.p.block_bytes / SECTOR)) * SECTOR;
        (offset, len.min(self.p.volume_bytes - offset))
    }

    fn sequential(&mut self) -> (u64, u64) {
        let c = self.rng.below(self.cursors.len() as u64) as usize;
        let bs = self.p.block_bytes;
        let len = if self.rng.below(2) == 0 { bs } else { (1 + self.rng.below(2 * bs / SECTOR)) * SECTOR };
        let offset = self.cursors[c];
        let len = len.min(self.p.volume_bytes - offset);
        self.cursors[c] = if offset + len >= self.p.volume_bytes { 0 } else { offset + len };
        (offset, len)
    }

    pub(super) fn arrive(&mut self) -> Result<(), String> {
        let (roll, seq) = (self.rng.below(100), self.knobs.sequential_percent);
        let (offset, len) = if roll < seq { self.sequential() } else { self.range() };
        if roll >= seq && roll < seq + self.knobs.write_percent {
            return self.write(offset, len);
        }
        match self.rng.below(if roll < seq { 1000 } else { 40 }) {
            0 => self.submit(Kind::Other, 0, 0, Request::Flush),
            1 | 2 => self.submit(Kind::Other, offset, len, Request::Cache { offset, len }),
            _ => self.submit(Kind::Read, offset, len, Request::Read { offset, len }),
        }
    }

    fn write(&mut self, offset: u64, len: u64) -> Result<(), String> {
        let fua = self.rng.below(4) == 0;
        let kind = self.rng.below(5);
        let (id, versions) = self.model.write_started(offset, len, kind >= 3);
        self.submitting = Some(id);
        let r = match kind {
            3 => Request::Zero { offset, len, fua, may_trim: self.rng.below(2) == 0 },
            4 => Request::Trim { offset, len, fua },
            _ => Request::Write { offset, data: versions.iter().flat_map(|&v| sector_bytes(v)).collect(), fua },
        };
        self.submit(Kind::Write, offset, len, r)
    }
}
