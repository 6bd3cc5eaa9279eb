//! Transmission requests: decoding the fixed header, and the one function that decides
//! whether a request is valid for the negotiated session. Handlers downstream trust its
//! output and never check again.

use crate::errno::Errno;
use crate::wire::*;

/// A request header as it came off the wire, not yet checked. `length` is 32 bits on the
/// wire in compact requests and 64 bits in extended ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawRequest {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub length: u64,
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

/// Bytes of a request header: 32 once extended headers were negotiated, else 28.
pub fn header_bytes(extended: bool) -> usize {
    if extended {
        EXTENDED_REQUEST_BYTES
    } else {
        REQUEST_BYTES
    }
}

fn be<const N: usize>(b: &[u8], at: usize) -> [u8; N] {
    b[at..at + N].try_into().expect("a fixed field inside a fixed header")
}

impl RawRequest {
    /// A compact (28-byte) header.
    pub fn decode(b: &[u8; REQUEST_BYTES]) -> Result<RawRequest, BadMagic> {
        RawRequest::decode_fields(b, REQUEST_MAGIC)
    }

    /// An extended (32-byte) header: the same fields with a 64-bit length.
    pub fn decode_extended(b: &[u8; EXTENDED_REQUEST_BYTES]) -> Result<RawRequest, BadMagic> {
        RawRequest::decode_fields(b, EXTENDED_REQUEST_MAGIC)
    }

    /// Either header; `b` holds exactly `header_bytes(extended)` bytes.
    pub fn decode_as(b: &[u8], extended: bool) -> Result<RawRequest, BadMagic> {
        debug_assert_eq!(b.len(), header_bytes(extended));
        RawRequest::decode_fields(b, if extended { EXTENDED_REQUEST_MAGIC } else { REQUEST_MAGIC })
    }

    fn decode_fields(b: &[u8], want: u32) -> Result<RawRequest, BadMagic> {
        let magic = u32::from_be_bytes(be(b, 0));
        if magic != want {
            return Err(BadMagic(magic));
        }
        let length = match b.len() {
            REQUEST_BYTES => u32::from_be_bytes(be(b, 24)) as u64,
            _ => u64::from_be_bytes(be(b, 24)),
        };
        Ok(RawRequest {
            flags: u16::from_be_bytes(be(b, 4)),
            kind: u16::from_be_bytes(be(b, 6)),
            handle: u64::from_be_bytes(be(b, 8)),
            offset: u64::from_be_bytes(be(b, 16)),
            length,
        })
    }

    fn encode_fields(&self, b: &mut [u8], magic: u32) {
        b[0..4].copy_from_slice(&magic.to_be_bytes());
        b[4..6].copy_from_slice(&self.flags.to_be_bytes());
        b[6..8].copy_from_slice(&self.kind.to_be_bytes());
        b[8..16].copy_from_slice(&self.handle.to_be_bytes());
        b[16..24].copy_from_slice(&self.offset.to_be_bytes());
    }

    /// A compact header. The caller keeps the length within 32 bits.
    pub fn encode(&self) -> [u8; REQUEST_BYTES] {
        let length = u32::try_from(self.length).expect("a compact request's length fits in 32 bits");
        let mut b = [0u8; REQUEST_BYTES];
        self.encode_fields(&mut b, REQUEST_MAGIC);
        b[24..28].copy_from_slice(&length.to_be_bytes());
        b
    }

    pub fn encode_extended(&self) -> [u8; EXTENDED_REQUEST_BYTES] {
        let mut b = [0u8; EXTENDED_REQUEST_BYTES];
        self.encode_fields(&mut b, EXTENDED_REQUEST_MAGIC);
        b[24..32].copy_from_slice(&self.length.to_be_bytes());
        b
    }

    /// Bytes of payload that follow this header on the wire, valid or not: a WRITE's
    /// length, or with extended headers the length of any request with PAYLOAD_LEN. (A
    /// WRITE carries its payload with or without the flag: qemu 10 sends none, libnbd does.)
    pub fn payload_len(&self, extended: bool) -> u64 {
        let flagged = extended && self.flags & CMD_FLAG_PAYLOAD_LEN != 0;
        if self.kind == CMD_WRITE || flagged {
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
    /// Extended headers: 32-byte requests with 64-bit lengths, every reply an extended
    /// chunk. Implies `structured`.
    pub extended: bool,
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
    /// At most the payload maximum for READ and WRITE; up to 64 bits for the commands
    /// without payload once extended headers were negotiated.
    pub length: u64,
}

impl Range {
    pub fn end(&self) -> u64 {
        self.offset + self.length
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
    pub discard: u64,
    pub reason: &'static str,
}

/// Why a request is not carried out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// Answer with an error (after dropping the payload) and go on with the next request.
    Reply(Rejection),
    /// Hang up: the stream cannot be kept in step, or the payload is too large to swallow.
    Disconnect(&'static str),
}

impl Refusal {
    /// The rejection, for callers that know the request could not end the connection.
    pub fn rejection(self) -> Option<Rejection> {
        match self {
            Refusal::Reply(r) => Some(r),
            Refusal::Disconnect(_) => None,
        }
    }
}

/// Flags the spec documents for a command in this session; None for an unknown command.
fn allowed_flags(kind: u16, s: &Session) -> Option<u16> {
    let own = match kind {
        CMD_READ if s.flags & FLAG_SEND_DF != 0 => CMD_FLAG_DF,
        CMD_READ | CMD_WRITE | CMD_TRIM | CMD_FLUSH | CMD_CACHE | CMD_DISC => 0,
        CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
        CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
        _ => return None,
    };
    // PAYLOAD_LEN exists only with extended headers; a compact request must not use it.
    Some(CMD_FLAG_FUA | own | if s.extended { CMD_FLAG_PAYLOAD_LEN } else { 0 })
}

/// The framing rule of extended headers that no error reply answers (doc/proto.md,
/// "Request message"): a payload longer than the maximum, which a 64-bit length makes
/// possible, is hung up on rather than read.
fn framing(raw: &RawRequest, s: &Session) -> Result<(), Refusal> {
    if s.extended && raw.payload_len(true) > s.payload_max_bytes as u64 {
        return Err(Refusal::Disconnect("payload longer than the maximum payload"));
    }
    Ok(())
}

/// The boundary check: everything a client controls in a request header is judged here.
pub fn validate(raw: &RawRequest, s: &Session) -> Result<Request, Refusal> {
    framing(raw, s)?;
    let discard = raw.payload_len(s.extended);
    let reject = |errno, reason| Refusal::Reply(Rejection { handle: raw.handle, errno, discard, reason });
    let Some(allowed) = allowed_flags(raw.kind, s) else { return Err(reject(Errno::Inval, "unknown command")) };
    if raw.flags & !allowed != 0 {
        return Err(reject(Errno::Inval, "flag not valid for this command"));
    }
    if raw.flags & CMD_FLAG_FAST_ZERO != 0 && s.flags & FLAG_SEND_FAST_ZERO == 0 {
        return Err(reject(Errno::Inval, "FAST_ZERO was not advertised"));
    }
    if raw.kind != CMD_WRITE && raw.flags & CMD_FLAG_PAYLOAD_LEN != 0 {
        // Consumed in full, then refused: the spec's graceful answer to an unexpected payload.
        return Err(reject(Errno::Inval, "payload on a command that takes none"));
    }
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
    if matches!(raw.kind, CMD_READ | CMD_WRITE) && raw.length > s.payload_max_bytes as u64 {
        let errno = if raw.kind == CMD_READ && raw.flags & CMD_FLAG_DF != 0 { Errno::Overflow } else { Errno::Inval };
        return Err(reject(errno, "request larger than the maximum payload"));
    }
    let in_bounds = raw.offset.checked_add(raw.length).is_some_and(|end| end <= s.size);
    if !in_bounds {
        let errno = if matches!(raw.kind, CMD_WRITE | CMD_WRITE_ZEROES) { Errno::NoSpc } else { Errno::Inval };
        return Err(reject(errno, "request beyond the end of the export"));
    }
    let command = typed(raw, s).map_err(|reason| reject(Errno::Inval, reason))?;
    Ok(Request { handle: raw.handle, command })
}

/// The typed command of a request that passed every generic check.
fn typed(raw: &RawRequest, s: &Session) -> Result<Command, &'static str> {
    let range = Range { offset: raw.offset, length: raw.length };
    let fua = raw.flags & CMD_FLAG_FUA != 0;
    Ok(match raw.kind {
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
            let Some(context_id) = s.base_allocation else { return Err("no metadata context was negotiated") };
            if raw.length == 0 {
                return Err("block status of zero bytes");
            }
            Command::BlockStatus { range, context_id, one: raw.flags & CMD_FLAG_REQ_ONE != 0 }
        }
        _ => unreachable!("command kinds were matched by allowed_flags"),
    })
}
