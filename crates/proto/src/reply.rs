//! Transmission replies: simple replies and structured reply chunks, encoded into caller
//! buffers. Payload data is never copied here; the caller sends it after the header.

use crate::errno::Errno;
use crate::wire::*;

/// Header of a simple reply; for a successful READ the data follows.
pub fn simple(handle: u64, error: Option<Errno>) -> [u8; SIMPLE_REPLY_BYTES] {
    let mut b = [0u8; SIMPLE_REPLY_BYTES];
    b[0..4].copy_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    b[4..8].copy_from_slice(&error.map_or(0, Errno::code).to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b
}

/// Whom a reply answers and how its chunks are framed: the request's handle and offset
/// (an extended header echoes the offset), and whether extended headers were negotiated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ReplyTo {
    pub handle: u64,
    pub offset: u64,
    pub extended: bool,
}

impl ReplyTo {
    /// A reply framed with 20-byte structured chunk headers.
    pub const fn compact(handle: u64) -> ReplyTo {
        ReplyTo { handle, offset: 0, extended: false }
    }

    /// Bytes of a chunk header in this framing.
    pub fn header_bytes(&self) -> usize {
        if self.extended {
            EXTENDED_REPLY_BYTES
        } else {
            CHUNK_HEADER_BYTES
        }
    }
}

/// The longest fixed part of a chunk sluice sends: an extended OFFSET_HOLE.
pub const HEAD_MAX_BYTES: usize = EXTENDED_REPLY_BYTES + 12;

/// A chunk header and the fixed fields after it, in either framing, without allocating.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Head {
    bytes: [u8; HEAD_MAX_BYTES],
    len: usize,
}

impl Head {
    fn push(&mut self, field: &[u8]) {
        self.bytes[self.len..self.len + field.len()].copy_from_slice(field);
        self.len += field.len();
    }
}

impl std::ops::Deref for Head {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

/// The header every chunk starts with; `payload_len` counts the bytes after it. A compact
/// header's length is 32 bits: callers keep payloads within the request maximum.
pub fn chunk_header(to: ReplyTo, kind: u16, done: bool, payload_len: u64) -> Head {
    let mut h = Head { bytes: [0; HEAD_MAX_BYTES], len: 0 };
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    let magic = if to.extended { EXTENDED_REPLY_MAGIC } else { STRUCTURED_REPLY_MAGIC };
    h.push(&magic.to_be_bytes());
    h.push(&flags.to_be_bytes());
    h.push(&kind.to_be_bytes());
    h.push(&to.handle.to_be_bytes());
    if to.extended {
        h.push(&to.offset.to_be_bytes());
        h.push(&payload_len.to_be_bytes());
    } else {
        let len = u32::try_from(payload_len).expect("a compact chunk's payload fits in 32 bits");
        h.push(&len.to_be_bytes());
    }
    h
}

/// Header of an OFFSET_DATA chunk carrying `data_len` bytes read at `offset`.
pub fn offset_data_header(to: ReplyTo, offset: u64, data_len: u32, done: bool) -> Head {
    let mut h = chunk_header(to, REPLY_TYPE_OFFSET_DATA, done, data_len as u64 + 8);
    h.push(&offset.to_be_bytes());
    h
}

/// A whole OFFSET_HOLE chunk: `len` bytes of zeros at `offset`.
pub fn offset_hole(to: ReplyTo, offset: u64, len: u32, done: bool) -> Head {
    let mut h = chunk_header(to, REPLY_TYPE_OFFSET_HOLE, done, 12);
    h.push(&offset.to_be_bytes());
    h.push(&len.to_be_bytes());
    h
}

/// The NONE chunk: ends a reply that carries nothing else. With extended headers it is
/// every successful reply without data.
pub fn done_none(to: ReplyTo) -> Head {
    chunk_header(to, REPLY_TYPE_NONE, true, 0)
}

/// Appends an ERROR chunk, or ERROR_OFFSET when `offset` names the failing byte. Always
/// final: sluice ends a request at its first error.
pub fn error_chunk(out: &mut Vec<u8>, to: ReplyTo, errno: Errno, message: &str, offset: Option<u64>) {
    // The message length field is 16 bits; keep it also well under the option string limit.
    let message = truncate_utf8(message, crate::limits::STRING_MAX_BYTES);
    let kind = if offset.is_some() { REPLY_TYPE_ERROR_OFFSET } else { REPLY_TYPE_ERROR };
    let payload_len = 6 + message.len() + if offset.is_some() { 8 } else { 0 };
    out.extend_from_slice(&chunk_header(to, kind, true, payload_len as u64));
    out.extend_from_slice(&errno.code().to_be_bytes());
    out.extend_from_slice(&(message.len() as u16).to_be_bytes());
    out.extend_from_slice(message.as_bytes());
    if let Some(offset) = offset {
        out.extend_from_slice(&offset.to_be_bytes());
    }
}

/// One base:allocation extent: `length` bytes in state `flags` (STATE_HOLE | STATE_ZERO).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub length: u64,
    pub flags: u32,
}

/// Appends a final block status chunk for metadata context `context_id`: BLOCK_STATUS_EXT
/// with extended headers (the spec allows no other there), else BLOCK_STATUS. A compact
/// reply ends before the first extent that does not fit in 32 bits: the spec lets a reply
/// describe less than was asked, never a wrong length.
pub fn block_status(out: &mut Vec<u8>, to: ReplyTo, context_id: u32, extents: &[Extent]) {
    debug_assert!(!extents.is_empty(), "a block status reply describes at least one extent");
    if to.extended {
        let payload_len = 8 + 16 * extents.len();
        out.extend_from_slice(&chunk_header(to, REPLY_TYPE_BLOCK_STATUS_EXT, true, payload_len as u64));
        out.extend_from_slice(&context_id.to_be_bytes());
        out.extend_from_slice(&(extents.len() as u32).to_be_bytes());
        for e in extents {
            out.extend_from_slice(&e.length.to_be_bytes());
            out.extend_from_slice(&(e.flags as u64).to_be_bytes());
        }
        return;
    }
    let fit = extents.iter().take_while(|e| e.length <= u32::MAX as u64).count().max(1);
    let payload_len = 4 + 8 * fit;
    out.extend_from_slice(&chunk_header(to, REPLY_TYPE_BLOCK_STATUS, true, payload_len as u64));
    out.extend_from_slice(&context_id.to_be_bytes());
    for e in &extents[..fit] {
        // Only the first can be too long here: cut to a multiple of the largest minimum
        // block size, it says less than it could, which is still true.
        let length = e.length.min(u32::MAX as u64 & !0xffff) as u32;
        out.extend_from_slice(&length.to_be_bytes());
        out.extend_from_slice(&e.flags.to_be_bytes());
    }
}

pub(crate) fn truncate_utf8(s: &str, max: usize) -> &str {
    if s.len() <= max {
        return s;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

#[cfg(test)]
mod tests {
    use super::truncate_utf8;

    #[test]
    fn truncate_utf8_keeps_short_strings_whole() {
        assert_eq!(truncate_utf8("", 0), "");
        assert_eq!(truncate_utf8("abc", 3), "abc");
        assert_eq!(truncate_utf8("abc", 100), "abc");
    }

    #[test]
    fn truncate_utf8_never_splits_a_character() {
        // "é" is 2 bytes, "€" 3, "😀" 4: every cut inside one falls back to its start.
        let s = "aé€😀";
        let boundaries = [0, 1, 3, 6, 10];
        for max in 0..s.len() {
            let cut = truncate_utf8(s, max);
            let expected = boundaries.iter().copied().filter(|&b| b <= max).max().unwrap();
            assert_eq!(cut.len(), expected, "max {max}");
        }
        assert_eq!(truncate_utf8("😀", 3), "");
    }
}
