//! The core's vocabulary: what the I/O shell hands in, what it is asked to do, and what it
//! reports back. Buffers travel by value: a read's reply owns its bytes, a slot write owns
//! the slot's bytes.

use sluice_proto::Errno;

/// Time in nanoseconds since an origin of the caller's choosing.
pub type Nanos = u64;

/// A client request, numbered by the caller (unique among those not yet replied).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReqId(pub u64);

/// An operation on the backing or a member, numbered by the core.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct OpId(pub u64);

/// A request on the cached volume, already checked by the caller against the volume's
/// size and the flags it allows.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    Read { offset: u64, len: u64 },
    Write { offset: u64, data: Vec<u8>, fua: bool },
    Zero { offset: u64, len: u64, fua: bool, may_trim: bool },
    Trim { offset: u64, len: u64, fua: bool },
    Flush,
    /// NBD_CMD_CACHE: fill the cache for the range; replied when the fills are done.
    Cache { offset: u64, len: u64 },
}

/// An operation on the backing volume; a read's completion carries its bytes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BackingCmd {
    Read { offset: u64, len: u64 },
    Write { offset: u64, data: Vec<u8>, fua: bool },
    Zero { offset: u64, len: u64, fua: bool, may_trim: bool },
    Trim { offset: u64, len: u64, fua: bool },
    Flush,
}

/// An operation on a member, at a byte offset on it: a fill writes a whole slot; a hit
/// reads the pages it needs (see `core`'s `hit`); a slot the cache drops without reusing
/// it is trimmed whole, so the member gives its memory back. A member whose export cannot
/// trim is answered Ok at once, without sending.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MemberCmd {
    Read { offset: u64, len: u64 },
    Write { offset: u64, data: Vec<u8> },
    Trim { offset: u64, len: u64 },
}

/// Why a request failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    pub errno: Errno,
    pub message: String,
}

impl Failure {
    pub fn io(message: impl Into<String>) -> Failure {
        Failure { errno: Errno::Io, message: message.into() }
    }

    /// The same failure, its message prefixed with where it happened; the errno is kept, so
    /// the backing's ENOSPC reaches the client as ENOSPC.
    pub fn context(self, what: &str) -> Failure {
        Failure { errno: self.errno, message: format!("{what}: {}", self.message) }
    }
}

/// A failure without an errno of its own (a lost connection, a short reply) is EIO.
impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure::io(message)
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        Failure::io(message)
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

/// What the shell should do next.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// Carry out `cmd` on the backing and report with `handle_backing_done(op, …)`.
    Backing { op: OpId, cmd: BackingCmd },
    /// Carry out `cmd` on member `member` and report with `handle_member_done(op, …)`.
    Member { op: OpId, member: usize, cmd: MemberCmd },
    /// Answer a client request: a read's bytes, or nothing.
    Reply { req: ReqId, result: Result<Vec<u8>, Failure> },
    /// The member failed an operation or timed out: drop its connection, reconnect after
    /// `limits::reconnect_backoff_ms(failures)` and call `handle_member_up` when it answers
    /// (it comes back empty). Its operations still in flight may be reported or not.
    Reconnect { member: usize, failures: u32 },
}

/// A completion: a read's bytes (empty for other commands), or why it failed (for the
/// backing, with the errno a client should see).
pub type Outcome = Result<Vec<u8>, Failure>;

/// How the core is set up: from the file's `Config` and what the shell learned when it
/// connected (the backing's size), with a fresh random identity each start.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Params {
    pub volume_bytes: u64,
    pub block_bytes: u64,
    /// Random and not zero, new every time the cache starts: slots of earlier runs or other
    /// volumes never validate.
    pub identity: u64,
    /// The members' names (their URIs), which seed their placement hash.
    pub members: Vec<String>,
    pub prefetch: bool,
    /// Blocks a sequential stream reads ahead (see `limits::PREFETCH_WINDOW_BYTES`).
    pub prefetch_window_blocks: u64,
    /// A member operation older than this marks its member down (the file's
    /// `member-timeout`).
    pub member_timeout_ms: u64,
}

impl Params {
    /// The parameters for a checked file, a backing of `volume_bytes`, and a fresh random
    /// `identity` (not zero).
    pub fn new(config: &crate::config::Config, volume_bytes: u64, identity: u64) -> Params {
        Params {
            volume_bytes,
            block_bytes: config.block_bytes,
            identity,
            members: config.members.clone(),
            prefetch: config.prefetch == crate::config::Prefetch::Auto,
            prefetch_window_blocks: Params::default_window_blocks(config.block_bytes),
            member_timeout_ms: config.member_timeout_ms,
        }
    }

    /// The window for `block_bytes` per the limits: `PREFETCH_WINDOW_BYTES`, bounded.
    pub fn default_window_blocks(block_bytes: u64) -> u64 {
        use crate::limits::{PREFETCH_WINDOW_BLOCKS_MAX, PREFETCH_WINDOW_BYTES};
        (PREFETCH_WINDOW_BYTES / block_bytes).clamp(1, PREFETCH_WINDOW_BLOCKS_MAX)
    }
}
