//! An export as the handshake negotiated it: what the server said about it (size, flags,
//! block sizes) and what the connection agreed (structured replies, base:allocation).

use crate::limits::REQUEST_DEFAULT_MAX_BYTES;
use sluice_proto::wire::*;

/// An export as negotiated: its size, flags and block sizes, and what the connection agreed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Export {
    pub name: String,
    pub description: Option<String>,
    pub size: u64,
    /// Transmission flags as the server sent them (NBD_FLAG_*).
    pub flags: u16,
    /// Block sizes from NBD_INFO_BLOCK_SIZE, or the spec's defaults (1, 4096, 32 MiB)
    /// when the server sends none.
    pub block_min: u32,
    pub block_preferred: u32,
    pub block_max: u32,
    /// Structured replies were negotiated.
    pub structured: bool,
    /// base:allocation was negotiated: block status reports holes and zeros.
    pub base_allocation: bool,
}

impl Export {
    fn has(&self, flag: u16) -> bool {
        self.flags & flag != 0
    }
    pub fn read_only(&self) -> bool {
        self.has(FLAG_READ_ONLY)
    }
    pub fn can_flush(&self) -> bool {
        self.has(FLAG_SEND_FLUSH)
    }
    pub fn can_fua(&self) -> bool {
        self.has(FLAG_SEND_FUA)
    }
    pub fn can_trim(&self) -> bool {
        self.has(FLAG_SEND_TRIM)
    }
    pub fn can_zero(&self) -> bool {
        self.has(FLAG_SEND_WRITE_ZEROES)
    }
    pub fn can_fast_zero(&self) -> bool {
        self.has(FLAG_SEND_FAST_ZERO)
    }
    pub fn can_df(&self) -> bool {
        self.has(FLAG_SEND_DF)
    }
    pub fn can_multi_conn(&self) -> bool {
        self.has(FLAG_CAN_MULTI_CONN)
    }
    pub fn can_cache(&self) -> bool {
        self.has(FLAG_SEND_CACHE)
    }
    pub fn rotational(&self) -> bool {
        self.has(FLAG_ROTATIONAL)
    }
    /// The largest READ or WRITE this client sends to the export: a whole number of
    /// minimum blocks.
    pub fn request_max_bytes(&self) -> u32 {
        let max = self.block_max.min(REQUEST_DEFAULT_MAX_BYTES);
        (max / self.block_min * self.block_min).max(self.block_min)
    }

    /// Whether a range starts and ends on the minimum block size (the export's end counts
    /// as a boundary, for an export whose size is not a multiple of it).
    pub fn aligned(&self, offset: u64, len: u64) -> bool {
        let b = self.block_min as u64;
        offset.is_multiple_of(b) && (len.is_multiple_of(b) || offset + len == self.size)
    }
}
