//! The interface between the transmission core and a backend: what a backend can do, the
//! storage operations it carries out, and their outcomes.

use std::io;

use sluice_proto::reply::Extent;

use crate::engine::{Buf, Held, Ring, StorageId};

/// What a backend can do natively; the server emulates the rest.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    /// Trimming frees space, and trimmed ranges read back as zeros.
    pub trim: bool,
    /// A zeroing primitive faster than writing zeros.
    pub zero: bool,
    /// A write can be made durable on its own (without a flush of everything after it).
    pub fua: bool,
    /// Allocation can be reported (block status tells holes from data).
    pub extents: bool,
    pub rotational: bool,
    /// Reads can go into a pipe, so the data reaches the socket by splice.
    pub splice: bool,
    /// An O_DIRECT path exists, with this offset and length alignment (a power of two).
    pub direct_align: Option<usize>,
    /// Every operation completes at once with no storage behind it: reads gain nothing
    /// from being split and pipelined.
    pub instant: bool,
    /// Writes and zeroing must start and end on multiples of this many bytes (a power of
    /// two; the storage refuses others), advertised as the export's minimum block size.
    /// None: any byte offset works.
    pub block_min: Option<u32>,
    /// What one more chunk of a pipelined read costs beyond its transfer, where that is
    /// more than a local device's (`CHUNK_COST_NS`): a remote export's chunk is a whole
    /// request to another server.
    pub chunk_cost_ns: Option<u64>,
}

/// One operation on a backend's storage. Buffers and pipes are passed by ownership and
/// come back in the outcome.
pub enum StorageOp {
    /// Reads `len` bytes at `offset` into `into`: a buffer (from byte `at` on) or a pipe.
    /// `direct` asks for the O_DIRECT path; offset and length are then aligned.
    Read { offset: u64, len: usize, into: Held, at: usize, direct: bool },
    /// Writes `buf[at..at + len]` at `offset`; `fua` makes it durable before completion.
    Write { offset: u64, buf: Buf, at: usize, len: usize, fua: bool, direct: bool },
    Flush,
    Trim { offset: u64, len: u64 },
    /// Zeroes a range natively; `may_trim` allows leaving a hole. `fast` is the client's
    /// FAST_ZERO: fail with EOPNOTSUPP rather than zero slowly (a local primitive is always
    /// fast; a remote one may not be).
    Zero { offset: u64, len: u64, may_trim: bool, fast: bool },
    /// A hint to bring the range into the cache.
    Cache { offset: u64, len: u64 },
    /// Appends allocation extents covering a prefix of the range; `one` wants just one.
    Extents { offset: u64, len: u64, one: bool, out: Vec<Extent> },
}

/// An operation's result: bytes moved (or 0), or a negative errno, with what it held.
pub struct Outcome {
    pub result: i32,
    pub held: Held,
}

impl Outcome {
    pub fn of(result: io::Result<usize>, held: Held) -> Outcome {
        let result = match result {
            Ok(n) => n.min(i32::MAX as usize) as i32,
            Err(e) => -e.raw_os_error().unwrap_or(libc::EIO),
        };
        Outcome { result, held }
    }
}

pub trait Backend: Send + Sync {
    /// "file", "block", "memory", "null", "nbd", "pool" or "cache", for logs and `info`.
    fn kind(&self) -> &'static str;
    fn size(&self) -> u64;
    fn caps(&self) -> Caps;
    /// Starts `op`: either finishes it now and returns the outcome, or submits it to
    /// `ring` under `id`, and the ring's completion for `id` carries the outcome.
    fn start(&self, op: StorageOp, id: StorageId, ring: &mut Ring) -> Option<Outcome>;

    /// A read into a pipe is cut into chunks of at most 1/N of the pipe: N here. More than
    /// one where the data is spliced from a socket, whose segments may cut pages into
    /// many pieces (a pipe holds a number of pieces, not of bytes).
    fn pipe_share(&self) -> usize {
        1
    }

    /// Lets go of what the backend holds outside this process (a remote connection, a
    /// pool's ownership), once serving has stopped and before the process exits; may block
    /// for a bounded time. Threads that still hold the export must not keep that from
    /// happening, so `serve` calls this rather than leaving it to the last drop.
    fn close(&self) {}

    /// The live state of the pool behind this backend, for metrics; `None` for anything
    /// but a pool.
    fn pool_status(&self) -> Option<sluice_client::pool::Status> {
        None
    }

    /// The counters and members of the cached volume behind this backend, for metrics;
    /// `None` for anything but a cached volume. Call it from outside any async runtime.
    fn cache_status(&self) -> Option<sluice_client::cache::Status> {
        None
    }

    /// The client of the pool behind this backend, for a reload that moves its members;
    /// `None` for anything but a pool.
    fn pool_client(&self) -> Option<&sluice_client::Client> {
        None
    }

    /// Adds members to the pool behind this backend (`sluice pool grow`, then a reload),
    /// waiting until they are connected and the pool has taken them. Call it from outside
    /// any async runtime.
    fn pool_grow(&self, _uris: &[sluice_client::Uri]) -> Result<(), String> {
        Err("not a pool".into())
    }
}
