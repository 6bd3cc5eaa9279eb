//! The core's bookkeeping: client requests being served, fills on their way into the
//! cache, and operations the shell is carrying out.

use crate::api::{Failure, Nanos, ReqId};
use crate::directory::Entry;

/// A client request not yet replied.
pub struct Pending {
    pub offset: u64,
    /// A read's reply, filled in piece by piece; empty for other requests.
    pub buf: Vec<u8>,
    /// Pieces still outstanding: slot reads, backing reads, waits on fills.
    pub parts: u32,
    pub error: Option<Failure>,
}

/// Why a fill was started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Source {
    /// A client read missed: the fill rides on its backing read.
    Demand,
    /// A sequential stream's read-ahead.
    Prefetch,
    /// NBD_CMD_CACHE request `req`.
    Hint(ReqId),
}

impl Source {
    /// Prefetch and hints are paced and counted as prefetched bytes.
    pub fn paced(self) -> bool {
        self != Source::Demand
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Stage {
    /// The block is being read from the backing.
    Reading,
    /// Its slot is being written: `Entry` says where (not in the directory yet), with the
    /// page sums the slot write carries, which the directory takes when it installs the
    /// block (and not before: see `Directory::install`).
    Writing(Entry, Vec<u64>),
}

/// A block on its way into the cache. `stale` is the race rule: a write (or zero, trim)
/// to the block that starts while the fill is in flight sets it, and a stale fill never
/// installs, since its data may predate that write. A fill is never started while a write
/// to its block is in flight.
pub struct Fill {
    pub block: u64,
    pub stale: bool,
    pub source: Source,
    /// Client reads that missed this block while its backing read was in flight: they get
    /// its data instead of reading the backing again (only while not stale).
    pub waiters: Vec<ReqId>,
    /// Some waiter got its data (a prefetch that was used, even if it never installs).
    pub served: bool,
    pub stage: Stage,
}

/// What an operation the shell carries out is for.
#[derive(Clone, Debug)]
pub enum OpKind {
    /// Blocks `first..first + fills.len()` read from the backing: `len` bytes from volume
    /// offset `start`, for client read `req` (None for prefetch and hints), each with the fill it
    /// carries (if any).
    BackingRead { req: Option<ReqId>, first: u64, start: u64, len: u64, fills: Vec<Option<u64>> },
    /// A write, zero or trim for `req` (its blocks are in `Cache::writes`).
    BackingWrite { req: ReqId },
    BackingFlush { req: ReqId },
    /// A hit's read of the pages it needs from its slot.
    SlotRead(Hit),
    /// Fill `fill`'s slot write.
    SlotWrite { fill: u64 },
    /// The trim of slot `slot`, dropped (see `Cache::trim_slot`); its member is the op's.
    SlotTrim { slot: u32 },
}

pub struct Op {
    pub kind: OpKind,
    /// The member it runs on; None for the backing.
    pub member: Option<usize>,
    pub started: Nanos,
}

/// An NBD_CMD_CACHE in progress: blocks `next..end` still to consider.
pub struct Hint {
    pub req: ReqId,
    pub next: u64,
    pub end: u64,
    pub outstanding: u32,
}

/// A hit in flight: `req`'s block `block`, pages `first..end` of it read from the slot
/// `entry` names, in one member read. The slot stays pinned (`Directory::read_started`)
/// until the pages are back and checked.
#[derive(Clone, Debug)]
pub struct Hit {
    pub req: ReqId,
    pub block: u64,
    pub entry: Entry,
    pub prefetched: bool,
    pub first: u64,
    pub end: u64,
}
