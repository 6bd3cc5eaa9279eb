//! A reshape's bookkeeping (see `reshape` for how it proceeds and why it is safe).

use std::collections::{BTreeMap, VecDeque};

use super::api::CopyId;
use crate::layout::Reshape;

/// A reshape in progress.
pub(super) struct Reshaping {
    /// `layout.at`: units below it are copied (the in-memory checkpoint).
    pub layout: Reshape,
    /// Unix seconds; 0 until the driver tells the wall clock (a grow started by assembly).
    pub started: u64,
    /// Units claimed for copying, at or above `layout.at`.
    pub units: BTreeMap<u64, UnitCopy>,
    /// The checkpoint every live member's superblock durably holds.
    pub durable_at: u64,
    /// Superblock generations that carry a checkpoint, oldest first: (generation, `at`).
    pub checkpoints: VecDeque<(u64, u64)>,
    /// By this coordinator, since `began_ms`.
    pub moved_bytes: u64,
    pub began_ms: u64,
    pub pace_origin: u64,
    pub paced_bytes: u64,
    /// Zeroing what the volume grows into, once every unit is moved (`reshape_tail`).
    pub tail: Tail,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Tail {
    Todo,
    /// Its regions are marked dirty (redundant layouts); the zeroes wait for the marks.
    Marked { regions: Vec<u64>, marks: Vec<(usize, u64)> },
    Zeroing { regions: Vec<u64>, out: usize, failed: bool },
    Done,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// Waiting for running requests on the unit and for its dirty marks.
    Waiting,
    Reading,
    Writing { out: usize, failed: bool },
    Done,
}

pub(super) struct UnitCopy {
    pub stage: Stage,
    pub copy: CopyId,
    /// Destination regions marked dirty (redundant layouts), and the bitmap writes to wait for.
    pub regions: Vec<u64>,
    pub marks: Vec<(usize, u64)>,
}

impl Reshaping {
    /// `gen`: the superblock generation that first records the reshape at `layout.at`.
    pub fn new(layout: Reshape, started: u64, gen: u64, now: u64) -> Reshaping {
        Reshaping {
            // Nothing is assumed durable until that superblock is: units of the first row
            // never move, so the first copies onto old slots wait for it.
            durable_at: layout.from.sets as u64,
            checkpoints: VecDeque::from([(gen, layout.at)]),
            layout,
            started,
            units: BTreeMap::new(),
            moved_bytes: 0,
            began_ms: now,
            pace_origin: now,
            paced_bytes: 0,
            tail: Tail::Todo,
        }
    }
}
