//! Transmission requests: decoding the fixed header, and the one function that decides
//! whether a request is valid for the negotiated session. Handlers downstream trust its
//! output and never check again.

use crate::errno::Errno;
use crate::wire::*;

/// A request header as it came off the wire, not yet checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRequest {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u32,
}

/// The header did not start with the request magic: the stream is out of sync and the only
/// safe answer is to disconnect.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct BadMagic(pub u32);

impl std::fmt::Display for BadMagic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "bad request magic {:#010x}", self.0)
    }
}

impl std::error::Error for BadMagic {}

impl RawRequest {
    pub fn decode(b: &[u8; REQUEST_BYTES]) -> Result<RawRequest, BadMagic> {
        let magic = u32::from_be_bytes(b[0..4].try_into().unwrap());
        if magic != REQUEST_MAGIC {
            return Err(BadMagic(magic));
        }
        Ok(RawRequest {
            flags: u16::from_be_bytes(b[4..6].try_into().unwrap()),
            kind: u16::from_be_bytes(b[6..8].try_into().unwrap()),
            handle: u64::from_be_bytes(b[8..16].try_into().unwrap()),
            offset: u64::from_be_bytes(b[16..24].try_into().unwrap()),
            length: u32::from_be_bytes(b[24..28].try_into().unwrap()),
        })
    }

    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let mut b = [0u8; REQUEST_BYTES];
        b[0..4].copy_from_slice(&REQUEST_MAGIC.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
        b[24..28].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Bytes of payload that follow this header on the wire, valid or not.
    pub fn payload_len(&self) -> u32 {
        if self.kind == CMD_WRITE {
            self.length
        } else {
            0
        }
    }
}

/// What transmission was negotiated: everything validation needs to know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Session {
    pub size: u64,
    /// Transmission flags as sent to the client.
    pub flags: u16,
    pub structured: bool,
    /// Context id of base:allocation when the client selected it.
    pub base_allocation: Option<u32>,
    pub payload_max_bytes: u32,
}

impl Session {
    pub fn read_only(&self) -> bool {
        self.flags & FLAG_READ_ONLY != 0
    }
}

/// A byte range already checked to lie inside the export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Range {
    pub offset: u64,
    pub length: u32,
}

impl Range {
    pub fn end(&self) -> u64 {
        self.offset + self.length as u64
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Command {
    /// `whole` is the DF flag: the client wants the data in one chunk.
    Read { range: Range, whole: bool },
    Write { range: Range, fua: bool },
    Flush,
    Trim { range: Range, fua: bool },
    Cache { range: Range },
    /// `may_trim` is the inverse of NO_HOLE; `fast` is FAST_ZERO.
    WriteZeroes { range: Range, fua: bool, may_trim: bool, fast: bool },
    BlockStatus { range: Range, context_id: u32, one: bool },
    Disconnect,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request {
    pub handle: u64,
    pub command: Command,
}

/// A request the server answers with an error and otherwise ignores. `discard` payload
/// bytes must still be read off the socket to stay in sync.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rejection {
    pub handle: u64,
    pub errno: Errno,
    pub discard: u32,
    pub reason: &'static str,
}

/// The boundary check: everything a client controls in a request header is judged here.
pub fn validate(raw: &RawRequest, s: &Session) -> Result<Request, Rejection> {
    let reject = |errno, reason| Rejection { handle: raw.handle, errno, discard: raw.payload_len(), reason };
    let allowed = match raw.kind {
        CMD_READ => CMD_FLAG_FUA | if s.flags & FLAG_SEND_DF != 0 { CMD_FLAG_DF } else { 0 },
        CMD_WRITE | CMD_TRIM => CMD_FLAG_FUA,
        CMD_WRITE_ZEROES => CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_FUA | CMD_FLAG_REQ_ONE,
        CMD_FLUSH | CMD_CACHE | CMD_DISC => CMD_FLAG_FUA,
        _ => return Err(reject(Errno::Inval, "unknown command")),
    };
    if raw.flags & !allowed != 0 {
        return Err(reject(Errno::Inval, "flag not valid for this command"));
    }
    if raw.flags & CMD_FLAG_FAST_ZERO != 0 && s.flags & FLAG_SEND_FAST_ZERO == 0 {
        return Err(reject(Errno::Inval, "FAST_ZERO was not advertised"));
    }
    let fua = raw.flags & CMD_FLAG_FUA != 0;
    let writes = matches!(raw.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
    if writes && s.read_only() {
        return Err(reject(Errno::Perm, "export is read-only"));
    }
    let advertised = match raw.kind {
        CMD_TRIM => s.flags & FLAG_SEND_TRIM != 0,
        CMD_WRITE_ZEROES => s.flags & FLAG_SEND_WRITE_ZEROES != 0,
        CMD_CACHE => s.flags & FLAG_SEND_CACHE != 0,
        CMD_FLUSH => s.flags & FLAG_SEND_FLUSH != 0,
        _ => true,
    };
    if !advertised {
        return Err(reject(Errno::Inval, "command was not advertised"));
    }
    if matches!(raw.kind, CMD_FLUSH | CMD_DISC) {
        // The spec asks clients to send zero offset and length here; we do not insist.
        let command = if raw.kind == CMD_FLUSH { Command::Flush } else { Command::Disconnect };
        return Ok(Request { handle: raw.handle, command });
    }
    if matches!(raw.kind, CMD_READ | CMD_WRITE) && raw.length > s.payload_max_bytes {
        let errno = if raw.kind == CMD_READ && raw.flags & CMD_FLAG_DF != 0 { Errno::Overflow } else { Errno::Inval };
        return Err(reject(errno, "request larger than the maximum payload"));
    }
    let in_bounds = raw.offset.checked_add(raw.length as u64).is_some_and(|end| end <= s.size);
    if !in_bounds {
        let errno = if matches!(raw.kind, CMD_WRITE | CMD_WRITE_ZEROES) { Errno::NoSpc } else { Errno::Inval };
        return Err(reject(errno, "request beyond the end of the export"));
    }
    let range = Range { offset: raw.offset, length: raw.length };
    let command = match raw.kind {
        CMD_READ => Command::Read { range, whole: raw.flags & CMD_FLAG_DF != 0 },
        CMD_WRITE => Command::Write { range, fua },
        CMD_TRIM => Command::Trim { range, fua },
        CMD_CACHE => Command::Cache { range },
        CMD_WRITE_ZEROES => Command::WriteZeroes {
            range,
            fua,
            may_trim: raw.flags & CMD_FLAG_NO_HOLE == 0,
            fast: raw.flags & CMD_FLAG_FAST_ZERO != 0,
        },
        CMD_BLOCK_STATUS => {
            let Some(context_id) = s.base_allocation else {
                return Err(reject(Errno::Inval, "no metadata context was negotiated"));
            };
            if raw.length == 0 {
                return Err(reject(Errno::Inval, "block status of zero bytes"));
            }
            Command::BlockStatus { range, context_id, one: raw.flags & CMD_FLAG_REQ_ONE != 0 }
        }
        _ => unreachable!("command kinds were matched above"),
    };
    Ok(Request { handle: raw.handle, command })
}
