//! The coordinator's vocabulary: what a driver submits, what it is asked to do, and what
//! it reports back.

use sluice_proto::Errno;

use crate::spec::{Layout, Placement};

/// A request on the volume, already checked by the caller against the volume's size.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    Read { offset: u64, len: u64 },
    Write { offset: u64, len: u64, fua: bool },
    Zero { offset: u64, len: u64, fua: bool, may_trim: bool },
    Trim { offset: u64, len: u64, fua: bool },
    Flush,
}

impl Command {
    pub fn is_write(&self) -> bool {
        matches!(self, Command::Write { .. } | Command::Zero { .. } | Command::Trim { .. })
    }

    pub fn range(&self) -> (u64, u64) {
        match *self {
            Command::Read { offset, len }
            | Command::Write { offset, len, .. }
            | Command::Zero { offset, len, .. }
            | Command::Trim { offset, len, .. } => (offset, len),
            Command::Flush => (0, 0),
        }
    }
}

/// A volume request, numbered by the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u64);

/// One operation on one member, numbered by the coordinator.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// A resync buffer the driver keeps between the read from the source and the write to the
/// target.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CopyId(pub u64);

/// A comparison of scrub buffers the driver is asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CompareId(pub u64);

/// An operation on a member. Offsets are device offsets on the member (the metadata area
/// included).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberCmd {
    Read { offset: u64, len: u64 },
    Write { offset: u64, len: u64, fua: bool },
    Zero { offset: u64, len: u64, fua: bool, may_trim: bool },
    Trim { offset: u64, len: u64, fua: bool },
    Flush,
}

/// Where a member operation's bytes come from or go to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Data {
    /// No bytes (flush, trim, zero).
    None,
    /// Bytes `at..at + len` of the volume request's buffer: read into it, or write from it.
    Request { req: ReqId, at: u64 },
    /// A resync buffer: a read fills it (the driver creates it), a write sends it.
    Copy(CopyId),
    /// Metadata to write, exactly `len` bytes.
    Bytes(Vec<u8>),
    /// Metadata to read: hand the bytes back in `OpOutcome::Data`.
    Meta,
}

/// What became of a member operation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OpOutcome {
    Done,
    /// The bytes of a `Data::Meta` read.
    Data(Vec<u8>),
    /// The member failed it (an error reply, a lost connection, anything): the member is
    /// no longer trusted.
    Failed(String),
}

/// Why a volume request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub errno: Errno,
    pub message: String,
}

impl Failure {
    pub fn io(message: impl Into<String>) -> Failure {
        Failure { errno: Errno::Io, message: message.into() }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.errno.name(), self.message)
    }
}

/// What the driver should do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Carry out `cmd` on `member` and report with `handle(op, …)`.
    Member { op: OpId, member: usize, cmd: MemberCmd, data: Data },
    /// Answer a volume request. For a read, its buffer now holds the data.
    Complete { req: ReqId, result: Result<(), Failure> },
    /// Stop using the member's connections (it was declared missing); operations still in
    /// flight on it may be reported or not. Reconnect in the background and call
    /// `member_back` when it answers again.
    Drop { member: usize },
    /// The resync buffer is no longer needed.
    Release { copy: CopyId },
    /// Spare `uri` took member `member`'s place (it was `old`): the pool file must say so
    /// (its members list names `uri` there, its spares no longer do), and the member is
    /// now reached at `uri` (the driver is reconnecting it after the `Drop`).
    SpareTaken { member: usize, old: String, uri: String },
    /// The shadow at slot `shadow` takes member `member`'s place (a live replacement is
    /// through): its connection becomes the member's, the old member's is closed, and the
    /// shadow's slot is gone.
    Swap { member: usize, shadow: usize },
    /// Compare the scrub buffers `copies` (each holds the same member range, read from
    /// another copy of one set) and report with `compared(id, …)`: for each of
    /// `copies[1..]`, the byte ranges where it differs from `copies[0]`.
    Compare { id: CompareId, copies: Vec<CopyId> },
    /// Something an operator should see in the log (a member declared missing, back,
    /// resynced; the pool taken over).
    Log { text: String },
}

/// Who this coordinator is, written into the members' superblocks as their owner.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    /// Random and non-zero.
    pub id: u64,
    pub pid: u32,
    pub host: String,
}

/// What a driver found on a member when it connected.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Found {
    /// Device size in bytes.
    pub size: u64,
    /// The member's first `META_BYTES` (or all of it, when smaller).
    pub meta: Vec<u8>,
    /// The member refuses writes.
    pub read_only: bool,
}

/// A member's state as `pool status` and metrics show it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemberState {
    InSync,
    /// Not answering (declared missing, or unreachable).
    Missing,
    /// Answering, but it lacks writes and waits for a resync.
    Stale,
    Resyncing { done: u64, total: u64 },
}

impl MemberState {
    pub fn name(&self) -> &'static str {
        match self {
            MemberState::InSync => "in-sync",
            MemberState::Missing => "missing",
            MemberState::Stale => "stale",
            MemberState::Resyncing { .. } => "resyncing",
        }
    }
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub uri: String,
    pub state: MemberState,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    pub pool_id: String,
    pub layout: Layout,
    pub placement: Placement,
    pub stripe_unit: u64,
    pub copies: usize,
    /// Usable bytes of the volume.
    pub size: u64,
    pub events: u64,
    pub region_bytes: u64,
    /// Regions the write-intent bitmap marks dirty now.
    pub dirty_regions: u64,
    /// Spares not taken yet, and how many this coordinator took.
    pub spares: Vec<String>,
    pub spares_taken: u64,
    /// A live member being replaced, while everything is copied to its successor.
    pub replacing: Option<Replacing>,
    /// Bytes copied by resync since this coordinator started.
    pub resynced_bytes: u64,
    /// The coordinator that holds the pool ("HOST pid PID"), if one does.
    pub owner: Option<String>,
    pub members: Vec<MemberStatus>,
    /// The scrub running now, else the last one (this coordinator's, with its ranges, or
    /// the one the superblocks record).
    pub scrub: Option<ScrubReport>,
    /// Scrubs this coordinator completed.
    pub scrubs_completed: u64,
    /// A reshape (`pool grow`) in progress; `size` is the old size until it is done.
    pub reshape: Option<ReshapeStatus>,
}

/// Byte ranges of a set's member data (the same on every member of the set; for a mirror,
/// these are volume offsets too) where its copies differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ScrubRange {
    pub set: usize,
    pub start: u64,
    pub end: u64,
}

/// What a scrub found, so far or in the end.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ScrubReport {
    pub repair: bool,
    pub running: bool,
    /// Bytes of member data compared (per set, once), of `total_bytes`.
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Bytes left out: fewer than two copies of them could be compared.
    pub skipped_bytes: u64,
    /// Regions (the write-intent bitmap's) in which copies differ.
    pub mismatched_regions: u64,
    pub repaired_regions: u64,
    /// The differing bytes, merged, at most `limits::SCRUB_RANGES_MAX` of them.
    pub ranges: Vec<ScrubRange>,
    pub ranges_truncated: bool,
    /// When it ended (ms since the Unix epoch); None while running.
    pub finished_wall_ms: Option<u64>,
    /// Why it ended early, if it did.
    pub error: Option<String>,
}

/// A live replacement in progress: member `member` goes on serving while `done` of `total`
/// bytes are copied to the server at `uri`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Replacing {
    pub member: usize,
    pub uri: String,
    pub done: u64,
    pub total: u64,
}

/// How far a reshape is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReshapeStatus {
    pub from_members: usize,
    pub to_members: usize,
    /// Volume bytes in their new place, of `total_bytes` (the old size).
    pub done_bytes: u64,
    pub total_bytes: u64,
    /// Unix seconds; 0 when unknown.
    pub started: u64,
    /// Average copy rate of the coordinator doing it, since it began (none when not served).
    pub rate_bytes_per_s: Option<u64>,
}
