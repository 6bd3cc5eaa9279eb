//! What the coordinator keeps about scrubs: the running one (its chunks in flight and what
//! it found so far) and the last one.

use std::collections::{BTreeMap, BTreeSet};

use super::api::{CompareId, CopyId, ScrubReport};
use super::scrub_report::{from_record, newest_record};
use crate::meta::Superblock;
use crate::scrub_record::ScrubRecord;

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
    /// A repair's closing flushes still out (None: not started), so that what it rewrote
    /// is durable when it says it is done.
    pub flushes_out: Option<usize>,
}

/// One chunk of one set being compared.
pub(super) struct Chunk {
    pub set: usize,
    pub start: u64,
    pub end: u64,
    /// Reading has started (before that, running writes drain).
    pub held: bool,
    /// The copies read, the source first: member, buffer, and the read's outcome once in.
    pub reads: Vec<(usize, CopyId, Option<bool>)>,
    pub compare: Option<CompareId>,
    /// Repair writes still out, and the regions they rewrite.
    pub writes_out: usize,
    pub writes_failed: bool,
    pub fixing: Vec<u64>,
}

impl Scrub {
    pub fn new(sbs: &[Option<Superblock>], now: u64) -> Scrub {
        let record = newest_record(sbs);
        Scrub { job: None, last: record.map(|r| from_record(&r)), record, completed: 0, wall_origin: None, started: now }
    }
}
