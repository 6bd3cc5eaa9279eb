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

/// Header shared by every structured chunk; `payload_len` counts the bytes after it.
pub fn chunk_header(handle: u64, kind: u16, done: bool, payload_len: u32) -> [u8; CHUNK_HEADER_BYTES] {
    let mut b = [0u8; CHUNK_HEADER_BYTES];
    b[0..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
    let flags = if done { REPLY_FLAG_DONE } else { 0 };
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..20].copy_from_slice(&payload_len.to_be_bytes());
    b
}

/// Bytes of an OFFSET_DATA chunk before its data.
pub const OFFSET_DATA_HEADER_BYTES: usize = CHUNK_HEADER_BYTES + 8;

/// Header of an OFFSET_DATA chunk carrying `data_len` bytes read at `offset`.
pub fn offset_data_header(handle: u64, offset: u64, data_len: u32, done: bool) -> [u8; OFFSET_DATA_HEADER_BYTES] {
    let mut b = [0u8; OFFSET_DATA_HEADER_BYTES];
    // A chunk's length field is 32 bits; callers keep data within the request maximum.
    debug_assert!(data_len <= u32::MAX - 8);
    b[..CHUNK_HEADER_BYTES].copy_from_slice(&chunk_header(handle, REPLY_TYPE_OFFSET_DATA, done, data_len + 8));
    b[CHUNK_HEADER_BYTES..].copy_from_slice(&offset.to_be_bytes());
    b
}

/// A whole OFFSET_HOLE chunk: `len` bytes of zeros at `offset`.
pub fn offset_hole(handle: u64, offset: u64, len: u32, done: bool) -> [u8; CHUNK_HEADER_BYTES + 12] {
    let mut b = [0u8; CHUNK_HEADER_BYTES + 12];
    b[..CHUNK_HEADER_BYTES].copy_from_slice(&chunk_header(handle, REPLY_TYPE_OFFSET_HOLE, done, 12));
    b[CHUNK_HEADER_BYTES..CHUNK_HEADER_BYTES + 8].copy_from_slice(&offset.to_be_bytes());
    b[CHUNK_HEADER_BYTES + 8..].copy_from_slice(&len.to_be_bytes());
    b
}

/// The NONE chunk: ends a structured reply that carries nothing else.
pub fn done_none(handle: u64) -> [u8; CHUNK_HEADER_BYTES] {
    chunk_header(handle, REPLY_TYPE_NONE, true, 0)
}

/// Appends an ERROR chunk, or ERROR_OFFSET when `offset` names the failing byte. Always
/// final: sluice ends a request at its first error.
pub fn error_chunk(out: &mut Vec<u8>, handle: u64, errno: Errno, message: &str, offset: Option<u64>) {
    // The message length field is 16 bits; keep it also well under the option string limit.
    let message = truncate_utf8(message, crate::limits::STRING_MAX_BYTES);
    let kind = if offset.is_some() { REPLY_TYPE_ERROR_OFFSET } else { REPLY_TYPE_ERROR };
    let payload_len = 6 + message.len() + if offset.is_some() { 8 } else { 0 };
    out.extend_from_slice(&chunk_header(handle, kind, true, payload_len as u32));
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
    pub length: u32,
    pub flags: u32,
}

/// Appends a final BLOCK_STATUS chunk for metadata context `context_id`.
pub fn block_status(out: &mut Vec<u8>, handle: u64, context_id: u32, extents: &[Extent]) {
    debug_assert!(!extents.is_empty(), "a block status reply describes at least one extent");
    let payload_len = 4 + 8 * extents.len();
    out.extend_from_slice(&chunk_header(handle, REPLY_TYPE_BLOCK_STATUS, true, payload_len as u32));
    out.extend_from_slice(&context_id.to_be_bytes());
    for e in extents {
        out.extend_from_slice(&e.length.to_be_bytes());
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
