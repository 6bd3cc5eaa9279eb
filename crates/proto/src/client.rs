//! The client's half of the wire format: options it sends, and decoders for everything a
//! server sends back. Decoders never trust a length: each one checks the payload it is given
//! and returns `Malformed` rather than reading past it, so a hostile server costs a clean
//! error, not a panic.

use crate::limits::STRING_MAX_BYTES;
use crate::wire::*;

/// A server message that does not parse. The text says what was wrong, for the error the
/// user sees.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Malformed(pub String);

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for Malformed {}

fn malformed<T>(what: impl Into<String>) -> Result<T, Malformed> {
    Err(Malformed(what.into()))
}

fn be16(b: &[u8], at: usize) -> u16 {
    u16::from_be_bytes(b[at..at + 2].try_into().unwrap())
}

fn be32(b: &[u8], at: usize) -> u32 {
    u32::from_be_bytes(b[at..at + 4].try_into().unwrap())
}

fn be64(b: &[u8], at: usize) -> u64 {
    u64::from_be_bytes(b[at..at + 8].try_into().unwrap())
}

/// The server's first 18 bytes. Only fixed newstyle is spoken: oldstyle servers (magic
/// 0x00420281861253) are refused with a message naming them.
pub fn decode_greeting(b: &[u8; GREETING_BYTES]) -> Result<u16, Malformed> {
    if be64(b, 0) != NBDMAGIC {
        return malformed("not an NBD server (bad greeting magic)");
    }
    match be64(b, 8) {
        IHAVEOPT => Ok(be16(b, 16)),
        0x0000_4202_8186_1253 => malformed("the server speaks oldstyle NBD, which is not supported"),
        other => malformed(format!("unknown handshake style {other:#018x}")),
    }
}

/// Appends one option: the IHAVEOPT header then the payload.
pub fn option(out: &mut Vec<u8>, option: u32, payload: &[u8]) {
    out.extend_from_slice(&IHAVEOPT.to_be_bytes());
    out.extend_from_slice(&option.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
}

/// Appends NBD_OPT_GO or NBD_OPT_INFO for `export`, asking for the given NBD_INFO types.
pub fn info_request(out: &mut Vec<u8>, opt: u32, export: &str, infos: &[u16]) {
    let mut p = Vec::with_capacity(6 + export.len() + 2 * infos.len());
    p.extend_from_slice(&(export.len() as u32).to_be_bytes());
    p.extend_from_slice(export.as_bytes());
    p.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        p.extend_from_slice(&i.to_be_bytes());
    }
    option(out, opt, &p);
}

/// Appends NBD_OPT_SET_META_CONTEXT (or LIST_META_CONTEXT) for `export` and `queries`.
pub fn meta_context_request(out: &mut Vec<u8>, opt: u32, export: &str, queries: &[&str]) {
    let mut p = Vec::new();
    p.extend_from_slice(&(export.len() as u32).to_be_bytes());
    p.extend_from_slice(export.as_bytes());
    p.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        p.extend_from_slice(&(q.len() as u32).to_be_bytes());
        p.extend_from_slice(q.as_bytes());
    }
    option(out, opt, &p);
}

/// The fixed part of an option reply.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct OptionReply {
    pub option: u32,
    pub kind: u32,
    pub len: u32,
}

pub const OPTION_REPLY_BYTES: usize = 20;

impl OptionReply {
    pub fn decode(b: &[u8; OPTION_REPLY_BYTES]) -> Result<OptionReply, Malformed> {
        if be64(b, 0) != OPTION_REPLY_MAGIC {
            return malformed("bad option reply magic");
        }
        Ok(OptionReply { option: be32(b, 8), kind: be32(b, 12), len: be32(b, 16) })
    }

    pub fn is_error(&self) -> bool {
        self.kind & (1 << 31) != 0
    }
}

/// What an option error reply type means, in words a user can act on.
pub fn option_error_name(kind: u32) -> &'static str {
    match kind {
        REP_ERR_UNSUP => "not supported by the server",
        REP_ERR_POLICY => "refused by server policy",
        REP_ERR_INVALID => "invalid",
        REP_ERR_PLATFORM => "not available on the server's platform",
        REP_ERR_TLS_REQD => "the server requires TLS",
        REP_ERR_UNKNOWN => "no such export",
        REP_ERR_SHUTDOWN => "the server is shutting down",
        REP_ERR_BLOCK_SIZE_REQD => "the server requires block size negotiation",
        REP_ERR_TOO_BIG => "request too big",
        REP_ERR_EXT_HEADER_REQD => "extended headers are required",
        _ => "unknown error",
    }
}

/// Decodes a string field of `len` bytes at `at`, checking it fits and is sane UTF-8.
fn string(b: &[u8], at: usize, len: usize, what: &str) -> Result<String, Malformed> {
    if len > STRING_MAX_BYTES {
        return malformed(format!("{what} longer than {STRING_MAX_BYTES} bytes"));
    }
    let Some(bytes) = b.get(at..at.saturating_add(len)) else {
        return malformed(format!("{what} runs past its reply"));
    };
    // Lossy: a server's odd bytes should not make an export unreachable; NUL is refused.
    if bytes.contains(&0) {
        return malformed(format!("{what} contains NUL"));
    }
    Ok(String::from_utf8_lossy(bytes).into_owned())
}

/// One NBD_REP_SERVER reply to NBD_OPT_LIST: an export name and optional description.
pub fn decode_server_entry(p: &[u8]) -> Result<(String, Option<String>), Malformed> {
    if p.len() < 4 {
        return malformed("NBD_REP_SERVER shorter than its name length");
    }
    let n = be32(p, 0) as usize;
    let name = string(p, 4, n, "export name")?;
    let rest = p.len() - 4 - n;
    let description = if rest > 0 { Some(string(p, 4 + n, rest, "export description")?) } else { None };
    Ok((name, description))
}

/// One NBD_REP_INFO payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Info {
    Export { size: u64, flags: u16 },
    Name(String),
    Description(String),
    BlockSize { min: u32, preferred: u32, max: u32 },
    /// A type this client does not know; the spec says to ignore it.
    Unknown(u16),
}

pub fn decode_info(p: &[u8]) -> Result<Info, Malformed> {
    if p.len() < 2 {
        return malformed("NBD_REP_INFO without a type");
    }
    let kind = be16(p, 0);
    let want = |n: usize| if p.len() == n { Ok(()) } else { malformed(format!("NBD_REP_INFO type {kind} has length {}, want {n}", p.len())) };
    Ok(match kind {
        INFO_EXPORT => {
            want(12)?;
            Info::Export { size: be64(p, 2), flags: be16(p, 10) }
        }
        INFO_NAME => Info::Name(string(p, 2, p.len() - 2, "export name")?),
        INFO_DESCRIPTION => Info::Description(string(p, 2, p.len() - 2, "export description")?),
        INFO_BLOCK_SIZE => {
            want(14)?;
            let (min, preferred, max) = (be32(p, 2), be32(p, 6), be32(p, 10));
            // The spec's constraints: powers of two, min <= 64K, min <= preferred, and max a
            // multiple of min (or the whole export). A server breaking them is not believed.
            if !min.is_power_of_two() || min > 65536 || !preferred.is_power_of_two() || preferred < min || max < min.max(1) {
                return malformed(format!("impossible block sizes min={min} preferred={preferred} max={max}"));
            }
            Info::BlockSize { min, preferred, max }
        }
        other => Info::Unknown(other),
    })
}

/// One NBD_REP_META_CONTEXT: the id the server chose and the context's name.
pub fn decode_meta_context(p: &[u8]) -> Result<(u32, String), Malformed> {
    if p.len() < 4 {
        return malformed("NBD_REP_META_CONTEXT shorter than its id");
    }
    Ok((be32(p, 0), string(p, 4, p.len() - 4, "metadata context name")?))
}

/// The error message an option error reply may carry, if it is printable.
pub fn decode_option_error_message(p: &[u8]) -> Option<String> {
    let n = p.len().min(STRING_MAX_BYTES);
    let s = String::from_utf8_lossy(&p[..n]).trim().to_string();
    (!s.is_empty()).then_some(s)
}

/// The first four bytes of every reply tell its shape.
pub fn reply_magic(b: &[u8; 4]) -> u32 {
    u32::from_be_bytes(*b)
}

/// A simple reply after its magic: error code and handle.
pub fn decode_simple(rest: &[u8; SIMPLE_REPLY_BYTES - 4]) -> (u32, u64) {
    (be32(rest, 0), be64(rest, 4))
}

/// A structured or extended chunk header after its magic. `offset` is what an extended
/// header echoes of the request (0 in a compact one).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ChunkHeader {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub offset: u64,
    pub len: u64,
}

impl ChunkHeader {
    pub fn decode(rest: &[u8; CHUNK_HEADER_BYTES - 4]) -> ChunkHeader {
        ChunkHeader { flags: be16(rest, 0), kind: be16(rest, 2), handle: be64(rest, 4), offset: 0, len: be32(rest, 12) as u64 }
    }

    pub fn decode_extended(rest: &[u8; EXTENDED_REPLY_BYTES - 4]) -> ChunkHeader {
        ChunkHeader { flags: be16(rest, 0), kind: be16(rest, 2), handle: be64(rest, 4), offset: be64(rest, 12), len: be64(rest, 20) }
    }

    pub fn done(&self) -> bool {
        self.flags & REPLY_FLAG_DONE != 0
    }

    /// Error chunk types have bit 15 set; the spec lets a client treat unknown ones as
    /// errors of the request.
    pub fn is_error(&self) -> bool {
        self.kind & (1 << 15) != 0
    }
}

/// An OFFSET_HOLE payload: offset and length of the zeros.
pub fn decode_offset_hole(p: &[u8]) -> Result<(u64, u32), Malformed> {
    if p.len() != 12 {
        return malformed(format!("OFFSET_HOLE chunk of {} bytes, want 12", p.len()));
    }
    Ok((be64(p, 0), be32(p, 8)))
}

/// An error chunk's payload.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ErrorChunk {
    pub code: u32,
    pub message: String,
    /// Set for ERROR_OFFSET: the first byte that failed.
    pub offset: Option<u64>,
}

pub fn decode_error_chunk(kind: u16, p: &[u8]) -> Result<ErrorChunk, Malformed> {
    if p.len() < 6 {
        return malformed(format!("error chunk of {} bytes, shorter than 6", p.len()));
    }
    let code = be32(p, 0);
    let n = be16(p, 4) as usize;
    let message = string(p, 6, n, "error message")?;
    let tail = p.len() - 6 - n;
    let offset = match (kind, tail) {
        (REPLY_TYPE_ERROR_OFFSET, 8) => Some(be64(p, 6 + n)),
        (REPLY_TYPE_ERROR_OFFSET, _) => return malformed("ERROR_OFFSET chunk without an 8-byte offset"),
        (REPLY_TYPE_ERROR, 0) => None,
        (REPLY_TYPE_ERROR, _) => return malformed("ERROR chunk longer than its message"),
        // Unknown error types: their layout past the message is not ours to read.
        _ => None,
    };
    if code == 0 {
        return malformed("error chunk with error code 0");
    }
    Ok(ErrorChunk { code, message, offset })
}

/// A BLOCK_STATUS payload: context id, then (length, flags) descriptors.
pub fn decode_block_status(p: &[u8]) -> Result<(u32, Vec<(u64, u32)>), Malformed> {
    if p.len() < 12 || !(p.len() - 4).is_multiple_of(8) {
        return malformed(format!("BLOCK_STATUS chunk of {} bytes is not 4 + 8n with n >= 1", p.len()));
    }
    let id = be32(p, 0);
    let extents = p[4..].chunks_exact(8).map(|d| (be32(d, 0) as u64, be32(d, 4))).collect();
    Ok((id, extents))
}

/// A BLOCK_STATUS_EXT payload: context id, descriptor count, then (64-bit length, 64-bit
/// flags) descriptors. Flags past bit 31 mean nothing in base:allocation and are dropped.
pub fn decode_block_status_ext(p: &[u8]) -> Result<(u32, Vec<(u64, u32)>), Malformed> {
    if p.len() < 24 || !(p.len() - 8).is_multiple_of(16) {
        return malformed(format!("BLOCK_STATUS_EXT chunk of {} bytes is not 8 + 16n with n >= 1", p.len()));
    }
    let count = be32(p, 4) as usize;
    if count != (p.len() - 8) / 16 {
        return malformed(format!("BLOCK_STATUS_EXT counts {count} descriptors in {} bytes", p.len()));
    }
    let extents = p[8..].chunks_exact(16).map(|d| (be64(d, 0), be64(d, 8) as u32)).collect();
    Ok((be32(p, 0), extents))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::reply;

    #[test]
    fn greeting_styles() {
        let mut g = [0u8; GREETING_BYTES];
        g[..8].copy_from_slice(&NBDMAGIC.to_be_bytes());
        g[8..16].copy_from_slice(&IHAVEOPT.to_be_bytes());
        g[16..].copy_from_slice(&3u16.to_be_bytes());
        assert_eq!(decode_greeting(&g), Ok(3));
        g[8..16].copy_from_slice(&0x0000_4202_8186_1253_u64.to_be_bytes());
        assert!(decode_greeting(&g).unwrap_err().0.contains("oldstyle"));
        g[0] = 0;
        assert!(decode_greeting(&g).is_err());
    }

    #[test]
    fn info_payloads_checked() {
        let mut p = INFO_EXPORT.to_be_bytes().to_vec();
        p.extend_from_slice(&(1u64 << 30).to_be_bytes());
        p.extend_from_slice(&3u16.to_be_bytes());
        assert_eq!(decode_info(&p), Ok(Info::Export { size: 1 << 30, flags: 3 }));
        assert!(decode_info(&p[..11]).is_err());
        let mut b = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
        for v in [512u32, 4096, 1 << 25] {
            b.extend_from_slice(&v.to_be_bytes());
        }
        assert_eq!(decode_info(&b), Ok(Info::BlockSize { min: 512, preferred: 4096, max: 1 << 25 }));
        b[2..6].copy_from_slice(&3u32.to_be_bytes());
        assert!(decode_info(&b).is_err(), "min not a power of two");
        assert_eq!(decode_info(&[0, 99]), Ok(Info::Unknown(99)));
        assert!(decode_info(&[0]).is_err());
    }

    #[test]
    fn server_entry_lengths() {
        let mut p = 3u32.to_be_bytes().to_vec();
        p.extend_from_slice(b"abcdesc");
        assert_eq!(decode_server_entry(&p), Ok(("abc".into(), Some("desc".into()))));
        p[0..4].copy_from_slice(&99u32.to_be_bytes());
        assert!(decode_server_entry(&p).is_err());
        p[0..4].copy_from_slice(&u32::MAX.to_be_bytes());
        assert!(decode_server_entry(&p).is_err());
    }

    #[test]
    fn error_chunks_round_trip_with_the_server_encoder() {
        let mut out = Vec::new();
        reply::error_chunk(&mut out, reply::ReplyTo::compact(7), crate::Errno::Io, "disk on fire", Some(4096));
        let h = ChunkHeader::decode(out[4..20].try_into().unwrap());
        assert_eq!((h.handle, h.kind, h.done()), (7, REPLY_TYPE_ERROR_OFFSET, true));
        let e = decode_error_chunk(h.kind, &out[20..]).unwrap();
        assert_eq!(e, ErrorChunk { code: 5, message: "disk on fire".into(), offset: Some(4096) });
        // Message length pointing past the payload.
        let mut bad = out[20..].to_vec();
        bad[4..6].copy_from_slice(&1000u16.to_be_bytes());
        assert!(decode_error_chunk(h.kind, &bad).is_err());
        assert!(decode_error_chunk(REPLY_TYPE_ERROR, &[0, 0, 0, 5, 0]).is_err());
        assert!(decode_error_chunk(REPLY_TYPE_ERROR, &[0, 0, 0, 0, 0, 0]).is_err(), "code 0");
    }

    #[test]
    fn block_status_shapes() {
        let mut out = Vec::new();
        let extents = [reply::Extent { length: 4096, flags: 3 }, reply::Extent { length: 512, flags: 0 }];
        reply::block_status(&mut out, reply::ReplyTo::compact(1), 9, &extents);
        let (id, e) = decode_block_status(&out[20..]).unwrap();
        assert_eq!((id, e), (9, vec![(4096, 3), (512, 0)]));
        assert!(decode_block_status(&out[20..30]).is_err());
        assert!(decode_block_status(&out[20..24]).is_err(), "no descriptors");
    }

    #[test]
    fn extended_headers_round_trip_with_the_server_encoder() {
        let to = reply::ReplyTo { handle: 7, offset: 1 << 40, extended: true };
        let b = reply::offset_data_header(to, (1 << 40) + 512, 4096, true);
        assert_eq!(b.len(), EXTENDED_REPLY_BYTES + 8);
        assert_eq!(reply_magic(b[..4].try_into().unwrap()), EXTENDED_REPLY_MAGIC);
        let h = ChunkHeader::decode_extended(b[4..32].try_into().unwrap());
        assert_eq!((h.handle, h.kind, h.offset, h.len, h.done()), (7, REPLY_TYPE_OFFSET_DATA, 1 << 40, 4104, true));
        let none = reply::done_none(to);
        assert_eq!(ChunkHeader::decode_extended(none[4..32].try_into().unwrap()).len, 0);
    }

    #[test]
    fn block_status_ext_shapes() {
        let mut out = Vec::new();
        let to = reply::ReplyTo { handle: 1, offset: 0, extended: true };
        let big = reply::Extent { length: 5 << 30, flags: 3 };
        reply::block_status(&mut out, to, 9, &[big, reply::Extent { length: 512, flags: 0 }]);
        let h = ChunkHeader::decode_extended(out[4..32].try_into().unwrap());
        assert_eq!((h.kind, h.len), (REPLY_TYPE_BLOCK_STATUS_EXT, 8 + 32));
        let p = &out[32..];
        assert_eq!(decode_block_status_ext(p), Ok((9, vec![(5 << 30, 3), (512, 0)])));
        assert!(decode_block_status_ext(&p[..24]).is_err(), "count says 2, one descriptor follows");
        assert!(decode_block_status_ext(&p[..8]).is_err(), "no descriptors");
        assert!(decode_block_status_ext(&p[..30]).is_err(), "not 8 + 16n");
        let mut zero_count = p.to_vec();
        zero_count[4..8].copy_from_slice(&0u32.to_be_bytes());
        assert!(decode_block_status_ext(&zero_count).is_err());
    }

    #[test]
    fn compact_block_status_never_claims_more_than_32_bits() {
        let mut out = Vec::new();
        let big = reply::Extent { length: 5 << 30, flags: 3 };
        reply::block_status(&mut out, reply::ReplyTo::compact(1), 9, &[big, reply::Extent { length: 512, flags: 0 }]);
        let (_, e) = decode_block_status(&out[20..]).unwrap();
        assert_eq!(e.len(), 1, "the reply ends at the extent that did not fit");
        assert_eq!(e, vec![(u32::MAX as u64 & !0xffff, 3)], "cut to whole 64 KiB blocks");
    }

    #[test]
    fn hole_payload_length() {
        let b = reply::offset_hole(reply::ReplyTo::compact(1), 8192, 4096, true);
        assert_eq!(decode_offset_hole(&b[20..]), Ok((8192, 4096)));
        assert!(decode_offset_hole(&b[20..31]).is_err());
    }
}
