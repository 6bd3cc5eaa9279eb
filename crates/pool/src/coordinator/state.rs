//! The coordinator's bookkeeping: members, requests, member operations, resync jobs.

use std::collections::{BTreeSet, HashMap};
use std::hash::{BuildHasherDefault, DefaultHasher};

use super::api::{Command, CopyId, Failure, ReqId};
use crate::meta::Role;

/// A member as the coordinator tracks it.
pub(super) struct Member {
    pub role: Role,
    /// Operations are sent to it. False once it is dropped, until it answers again.
    pub connected: bool,
    /// The event counter its superblock durably holds (what it will say if it returns).
    pub durable_events: u64,
    /// Per metadata block (0: superblock, 1..: bitmap): the generation it durably holds,
    /// and the one being written to it.
    pub written: Vec<u64>,
    pub writing: Vec<Option<u64>>,
}

impl Member {
    /// Takes writes (and its metadata must follow the pool's).
    pub fn live(&self) -> bool {
        self.connected && !matches!(self.role, Role::Missing { .. })
    }

    /// Holds every acknowledged write outside the regions a job still has to copy to it.
    pub fn in_sync(&self) -> bool {
        self.connected && self.role == Role::Active
    }
}

/// Requests by id. Hashed, as a request's state is large to move around a B-tree's nodes
/// at every step; with a fixed hasher, so that a seed replays the same run.
pub(super) type Requests = HashMap<ReqId, Request, BuildHasherDefault<DefaultHasher>>;

/// Where a request stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Phase {
    /// A write waiting for its dirty marks to be durable or for a resync lock.
    Blocked,
    Running,
}

/// A part of a request that lies on one mirror set.
pub(super) struct PieceState {
    pub set: usize,
    pub member_offset: u64,
    pub len: u64,
    pub at: u64,
    /// Members that completed it (bit per member).
    pub done: u64,
    /// Members it was sent to or failed on, so a read is not retried on them.
    pub tried: u64,
    /// Operations for it still out.
    pub out: usize,
}

impl PieceState {
    pub fn new(p: crate::layout::Piece) -> PieceState {
        PieceState { set: p.set, member_offset: p.member_offset, len: p.len, at: p.at, done: 0, tried: 0, out: 0 }
    }
}

pub(super) struct Request {
    pub cmd: Command,
    pub phase: Phase,
    pub pieces: Vec<PieceState>,
    /// Member operations still out (pieces and flushes).
    pub out: usize,
    /// For a flush: members it was sent to and completed on.
    pub flushed: u64,
    pub sent: u64,
    pub failure: Option<Failure>,
    /// Regions it dirties (writes to redundant pools).
    pub regions: Vec<u64>,
    /// Bitmap (block, generation) that must be durable on every live member first.
    pub marks: Vec<(usize, u64)>,
    /// A superblock generation that must be durable on every live member before the
    /// answer: set when the request found a member missing (or at start-up).
    pub need_sb: u64,
}

/// What a member operation is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Purpose {
    Piece { req: ReqId, piece: usize },
    Flush { req: ReqId },
    /// `events`: the event counter the block carries (superblock).
    MetaWrite { block: usize, gen: u64, events: u64 },
    /// Reading a superblock to check that no one else took the pool over.
    FenceCheck,
    /// Making everything durable before dirty bits are cleared.
    CleanFlush,
    CopyRead { job: usize, chunk: u64, copy: CopyId },
    CopyWrite { job: usize, chunk: u64, copy: CopyId },
    /// Making a rebuilt member's copy durable before it counts as in sync.
    JobFlush { job: usize },
    /// A write's piece sent to a live replacement's shadow too.
    ShadowPiece { req: ReqId },
    /// Making what the shadow took durable before it takes its member's place.
    ShadowFlush,
    /// Reading one copy of a scrub chunk, and rewriting one from the source (repair).
    ScrubRead { chunk: u64 },
    ScrubWrite { chunk: u64 },
    /// Making a repair's rewrites durable before it ends.
    ScrubFlush,
    /// Reading a stripe unit from its old place, writing it to its new one (`reshape`).
    ReshapeRead { unit: u64 },
    ReshapeWrite { unit: u64 },
    /// Zeroing the space the volume grows into.
    ReshapeZero,
}

pub(super) struct Op {
    pub member: usize,
    pub purpose: Purpose,
    pub deadline: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum JobKind {
    /// A member that lacks writes: it serves no reads until done.
    Rebuild,
    /// After a coordinator crash: the dirty regions of an in-sync member are made equal
    /// to the set's source; it serves no reads of them until then.
    Reconcile,
    /// A member that went away as the last in-sync copy of some set (kept active) is back:
    /// in its other sets, a partner that stayed holds every write it holds and those in
    /// flight when it left (or lost unflushed in a crash), so its dirty regions are made
    /// equal to that partner's. It is no set's source there until then.
    CatchUp,
}

/// Copying regions to one target member, each chunk from the first in-sync member of the
/// set that `place` belongs to there.
pub(super) struct Job {
    pub kind: JobKind,
    /// The member whose sets the target copies: the target itself, or the member that a
    /// live replacement's shadow takes over from.
    pub place: usize,
    pub target: usize,
    /// Regions still to copy (the one being copied included).
    pub todo: BTreeSet<u64>,
    /// Next chunk (member data offset) of the first region in `todo`, when started.
    pub cursor: Option<u64>,
    /// Chunks being copied.
    pub chunks: BTreeSet<u64>,
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Flushing the target before it counts as done.
    pub flushing: bool,
}

/// A range of a set's member data held back from writes while it is copied.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Lock {
    pub set: usize,
    pub start: u64,
    pub end: u64,
    pub job: usize,
    /// Copying has started (before that, running writes are drained).
    pub held: bool,
}

impl Lock {
    pub fn overlaps(&self, set: usize, start: u64, end: u64) -> bool {
        self.set == set && self.start < end && start < self.end
    }
}

/// Cleaning dirty bits: everything is flushed first, then idle regions are cleared.
pub(super) struct Cleaning {
    pub regions: Vec<u64>,
    pub started: u64,
    pub flushes_out: usize,
    pub failed: bool,
}

/// Writes touching a dirty region, for deciding when it may be cleaned.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct RegionUse {
    pub writes: u32,
    pub last: u64,
}

/// How a clean stop proceeds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stopping {
    Running,
    /// Waiting for requests and copies in flight.
    Draining,
    /// Flushing before the final clean.
    Flushing,
    /// Waiting for the released superblocks to be durable.
    Releasing { gen: u64 },
    Stopped,
}

/// When each member was first seen missing, and what the spares did.
#[derive(Debug, Default)]
pub(super) struct Spares {
    /// Per member: the time it was first seen not connected, while it stays so.
    pub missing_since: Vec<Option<u64>>,
    pub taken: u64,
}

impl Spares {
    pub fn new(members: usize) -> Spares {
        Spares { missing_since: vec![None; members], taken: 0 }
    }
}

/// A live member being replaced: its successor is copied to as a shadow (see handover.rs).
pub(super) struct Handover {
    pub member: usize,
    pub uri: String,
    /// The shadow's slot: past the members, for copy operations only.
    pub shadow: usize,
    /// The copy job, while the shadow is connected and being copied to.
    pub job: Option<usize>,
    /// The shadow answers: it gets the set's writes, from the copy's start to the swap.
    pub connected: bool,
    /// Every region was copied and flushed: it takes the place once the writes still out
    /// at it are done and flushed too.
    pub copied: bool,
    pub flushed: bool,
}
