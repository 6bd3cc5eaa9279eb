//! An export as the handshake negotiated it: what the server said about it (size, flags,
//! block sizes) and what the connection agreed (structured replies, base:allocation).

use crate::limits::REQUEST_DEFAULT_MAX_BYTES;
use sluice_proto::wire::*;

/// The transmission flags a connected client relies on: what it may send, and whether
/// its connections share one cache. ROTATIONAL is only a hint, and may change.
const FLAGS_RELIED_ON: u16 = FLAG_HAS_FLAGS
    | FLAG_READ_ONLY
    | FLAG_SEND_FLUSH
    | FLAG_SEND_FUA
    | FLAG_SEND_TRIM
    | FLAG_SEND_WRITE_ZEROES
    | FLAG_SEND_DF
    | FLAG_CAN_MULTI_CONN
    | FLAG_SEND_CACHE
    | FLAG_SEND_FAST_ZERO;

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
    /// Extended headers were negotiated: 64-bit lengths for TRIM, WRITE_ZEROES, CACHE and
    /// BLOCK_STATUS, and 32-byte headers both ways.
    pub extended: bool,
    /// base:allocation was negotiated: block status reports holes and zeros.
    pub base_allocation: bool,
    /// The connection is TLS: its version and cipher suite, as OpenSSL names them
    /// ("TLSv1.3, TLS_AES_128_GCM_SHA256").
    pub tls: Option<String>,
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

    /// What differs in `now` that requests already checked against `self` rely on: the
    /// size, the flags above, block sizes, structured replies or base:allocation. `None`
    /// when nothing does; the description may change freely.
    pub(crate) fn change(&self, now: &Export) -> Option<String> {
        let (was, is) = (self.flags & FLAGS_RELIED_ON, now.flags & FLAGS_RELIED_ON);
        if self.size != now.size {
            Some(format!("its size was {} bytes and is now {}", self.size, now.size))
        } else if was != is {
            Some(format!("its flags were {was:#06x} and are now {is:#06x}"))
        } else if (self.block_min, self.block_preferred, self.block_max) != (now.block_min, now.block_preferred, now.block_max) {
            let before = format!("{}/{}/{}", self.block_min, self.block_preferred, self.block_max);
            Some(format!("its block sizes were {before} and are now {}/{}/{}", now.block_min, now.block_preferred, now.block_max))
        } else if (self.structured, self.extended, self.base_allocation) != (now.structured, now.extended, now.base_allocation) {
            Some("structured replies, extended headers or base:allocation were not negotiated as before".into())
        } else {
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn export() -> Export {
        let flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_TRIM;
        let (block_min, block_preferred, block_max) = (512, 4096, 1 << 20);
        Export { name: "d".into(), description: None, size: 1 << 20, flags, block_min, block_preferred, block_max, structured: true, extended: false, base_allocation: true, tls: None }
    }

    #[test]
    fn change_names_what_requests_rely_on_and_nothing_else() {
        let was = export();
        let hint = Export { description: Some("new".into()), flags: was.flags | FLAG_ROTATIONAL, ..export() };
        assert_eq!(was.change(&hint), None);
        assert!(was.change(&Export { size: 2 << 20, ..export() }).unwrap().contains("size"));
        assert!(was.change(&Export { flags: was.flags | FLAG_READ_ONLY, ..export() }).unwrap().contains("flags"));
        assert!(was.change(&Export { flags: FLAG_HAS_FLAGS, ..export() }).unwrap().contains("flags"));
        assert!(was.change(&Export { block_min: 4096, ..export() }).unwrap().contains("block sizes"));
        assert!(was.change(&Export { base_allocation: false, ..export() }).unwrap().contains("base:allocation"));
    }
}
