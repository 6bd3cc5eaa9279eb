//! Transmission replies, byte for byte against the layouts in the spec's "Simple reply
//! message" and "Structured reply chunk message" sections.

use sluice_proto::errno::Errno;
use sluice_proto::limits::STRING_MAX_BYTES;
use sluice_proto::reply::{self, Extent, ReplyTo};
use sluice_proto::wire::*;

const HANDLE: u64 = 0x0102_0304_0506_0708;
const TO: ReplyTo = ReplyTo::compact(HANDLE);
const OFFSET_DATA_HEADER_BYTES: usize = CHUNK_HEADER_BYTES + 8;
const HANDLE_BYTES: [u8; 8] = [1, 2, 3, 4, 5, 6, 7, 8];
/// 0x67446698.
const SIMPLE_MAGIC: [u8; 4] = [0x67, 0x44, 0x66, 0x98];
/// 0x668e33ef.
const STRUCTURED_MAGIC: [u8; 4] = [0x66, 0x8e, 0x33, 0xef];

fn cat(parts: &[&[u8]]) -> Vec<u8> {
    parts.concat()
}

const ALL_ERRNOS: [(Errno, u32, &str); 8] = [
    (Errno::Perm, 1, "EPERM"),
    (Errno::Io, 5, "EIO"),
    (Errno::NoMem, 12, "ENOMEM"),
    (Errno::Inval, 22, "EINVAL"),
    (Errno::NoSpc, 28, "ENOSPC"),
    (Errno::Overflow, 75, "EOVERFLOW"),
    (Errno::NotSup, 95, "ENOTSUP"),
    (Errno::Shutdown, 108, "ESHUTDOWN"),
];

// ---------------------------------------------------------------------------------------
// Error numbers
// ---------------------------------------------------------------------------------------

#[test]
fn errno_codes_are_the_spec_values_and_round_trip() {
    for (errno, code, name) in ALL_ERRNOS {
        assert_eq!(errno.code(), code);
        assert_eq!(errno.name(), name);
        assert_eq!(errno.to_string(), name);
        assert_eq!(Errno::from_code(code), Some(errno));
    }
}

#[test]
fn errno_zero_is_success_and_unknown_codes_read_as_einval() {
    // Spec: a client treats an error value it does not know as EINVAL.
    assert_eq!(Errno::from_code(0), None);
    for code in [2, 4, 13, 100, 0xffff_ffff] {
        assert_eq!(Errno::from_code(code), Some(Errno::Inval), "code {code}");
    }
}

// ---------------------------------------------------------------------------------------
// Simple replies
// ---------------------------------------------------------------------------------------

#[test]
fn simple_reply_success_is_magic_zero_error_and_handle() {
    let expected = cat(&[&SIMPLE_MAGIC, &[0, 0, 0, 0], &HANDLE_BYTES]);
    assert_eq!(reply::simple(HANDLE, None).to_vec(), expected);
}

#[test]
fn simple_reply_carries_each_error_code() {
    for (errno, code, _) in ALL_ERRNOS {
        let expected = cat(&[&SIMPLE_MAGIC, &code.to_be_bytes(), &HANDLE_BYTES]);
        assert_eq!(reply::simple(HANDLE, Some(errno)).to_vec(), expected, "{errno}");
    }
}

// ---------------------------------------------------------------------------------------
// Structured chunks
// ---------------------------------------------------------------------------------------

#[test]
fn chunk_header_lays_out_flags_type_handle_and_length() {
    let done = reply::chunk_header(TO, REPLY_TYPE_BLOCK_STATUS, true, 0x0a0b_0c0d);
    let expected = cat(&[&STRUCTURED_MAGIC, &[0, 1], &[0, 5], &HANDLE_BYTES, &[0x0a, 0x0b, 0x0c, 0x0d]]);
    assert_eq!(done.to_vec(), expected);

    let more = reply::chunk_header(TO, REPLY_TYPE_ERROR_OFFSET, false, 0);
    let expected = cat(&[&STRUCTURED_MAGIC, &[0, 0], &[0x80, 0x02], &HANDLE_BYTES, &[0, 0, 0, 0]]);
    assert_eq!(more.to_vec(), expected);
}

#[test]
fn done_none_is_an_empty_final_chunk_of_type_none() {
    let expected = cat(&[&STRUCTURED_MAGIC, &[0, 1], &[0, 0], &HANDLE_BYTES, &[0, 0, 0, 0]]);
    assert_eq!(reply::done_none(TO).to_vec(), expected);
}

#[test]
fn offset_data_header_counts_the_offset_in_the_chunk_length() {
    // 4096 data bytes + 8 offset bytes = 0x1008.
    let h = reply::offset_data_header(TO, 0x1122_3344_5566_7788, 4096, false);
    let expected = cat(&[
        &STRUCTURED_MAGIC,
        &[0, 0],
        &[0, 1],
        &HANDLE_BYTES,
        &[0, 0, 0x10, 0x08],
        &[0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88],
    ]);
    assert_eq!(h.to_vec(), expected);
    assert_eq!(OFFSET_DATA_HEADER_BYTES, 28);

    let last = reply::offset_data_header(TO, 0, 1, true);
    assert_eq!(last[4..6], [0, 1], "DONE flag");
    assert_eq!(last[16..20], [0, 0, 0, 9]);
}

#[test]
fn offset_hole_is_a_twelve_byte_payload_of_offset_and_size() {
    let h = reply::offset_hole(TO, 0x8000, 0x0200, true);
    let expected = cat(&[
        &STRUCTURED_MAGIC,
        &[0, 1],
        &[0, 2],
        &HANDLE_BYTES,
        &[0, 0, 0, 12],
        &[0, 0, 0, 0, 0, 0, 0x80, 0],
        &[0, 0, 0x02, 0],
    ]);
    assert_eq!(h.to_vec(), expected);
}

#[test]
fn error_chunk_without_offset_is_type_error() {
    let mut out = Vec::new();
    reply::error_chunk(&mut out, TO, Errno::Inval, "bad", None);
    // error(4) msg_len(2) msg(3) = 9.
    let expected = cat(&[
        &STRUCTURED_MAGIC,
        &[0, 1],
        &[0x80, 0x01],
        &HANDLE_BYTES,
        &[0, 0, 0, 9],
        &[0, 0, 0, 22],
        &[0, 3],
        b"bad",
    ]);
    assert_eq!(out, expected);
}

#[test]
fn error_chunk_with_offset_is_type_error_offset_with_the_offset_last() {
    let mut out = Vec::new();
    reply::error_chunk(&mut out, TO, Errno::Io, "io", Some(0x1000));
    // error(4) msg_len(2) msg(2) offset(8) = 16.
    let expected = cat(&[
        &STRUCTURED_MAGIC,
        &[0, 1],
        &[0x80, 0x02],
        &HANDLE_BYTES,
        &[0, 0, 0, 16],
        &[0, 0, 0, 5],
        &[0, 2],
        b"io",
        &[0, 0, 0, 0, 0, 0, 0x10, 0],
    ]);
    assert_eq!(out, expected);
}

#[test]
fn error_chunk_with_an_empty_message_is_six_bytes() {
    let mut out = Vec::new();
    reply::error_chunk(&mut out, TO, Errno::NoSpc, "", None);
    assert_eq!(out[16..], [0, 0, 0, 6, 0, 0, 0, 28, 0, 0]);
}

#[test]
fn error_chunk_appends_to_what_is_already_in_the_buffer() {
    let mut out = vec![0xee; 3];
    reply::error_chunk(&mut out, TO, Errno::Perm, "x", None);
    assert_eq!(out[..3], [0xee; 3]);
    assert_eq!(out[3..7], STRUCTURED_MAGIC);
}

/// Splits an ERROR/ERROR_OFFSET chunk into (header length, msg_len, message).
fn error_message(chunk: &[u8]) -> (usize, usize, &str) {
    let len = u32::from_be_bytes(chunk[16..20].try_into().unwrap()) as usize;
    let msg_len = u16::from_be_bytes(chunk[24..26].try_into().unwrap()) as usize;
    assert_eq!(chunk.len(), 20 + len, "chunk length field covers the payload exactly");
    (len, msg_len, std::str::from_utf8(&chunk[26..26 + msg_len]).expect("message is UTF-8"))
}

#[test]
fn error_chunk_message_is_cut_to_the_string_limit() {
    let long = "m".repeat(STRING_MAX_BYTES + 100);
    for offset in [None, Some(7)] {
        let mut out = Vec::new();
        reply::error_chunk(&mut out, TO, Errno::Io, &long, offset);
        let (len, msg_len, msg) = error_message(&out);
        assert_eq!(msg_len, STRING_MAX_BYTES);
        assert_eq!(msg, &long[..STRING_MAX_BYTES]);
        assert_eq!(len, 6 + STRING_MAX_BYTES + if offset.is_some() { 8 } else { 0 });
    }
}

#[test]
fn error_chunk_message_of_exactly_the_limit_is_kept_whole() {
    let exact = "é".repeat(STRING_MAX_BYTES / 2);
    let mut out = Vec::new();
    reply::error_chunk(&mut out, TO, Errno::Io, &exact, None);
    assert_eq!(error_message(&out).2, exact);
}

#[test]
fn error_chunk_message_is_cut_at_a_utf8_boundary() {
    // A character straddling byte 4096 is dropped whole rather than split: two-, three- and
    // four-byte characters starting one, two and three bytes before the limit.
    for (pad, ch) in [
        (STRING_MAX_BYTES - 1, "é"),
        (STRING_MAX_BYTES - 2, "€"),
        (STRING_MAX_BYTES - 1, "€"),
        (STRING_MAX_BYTES - 3, "😀"),
    ] {
        let message = format!("{}{ch}tail", "a".repeat(pad));
        let mut out = Vec::new();
        reply::error_chunk(&mut out, TO, Errno::Io, &message, Some(0));
        let (_, msg_len, msg) = error_message(&out);
        assert_eq!(msg_len, pad, "{ch} after {pad} bytes");
        assert_eq!(msg, "a".repeat(pad));
        // The offset still follows the (shortened) message.
        assert_eq!(out[26 + msg_len..], [0u8; 8]);
    }
}

#[test]
fn block_status_chunk_lists_context_then_length_and_flags_pairs() {
    let mut out = Vec::new();
    let extents = [Extent { length: 4096, flags: STATE_HOLE | STATE_ZERO }, Extent { length: 0x2000, flags: 0 }];
    reply::block_status(&mut out, TO, 1, &extents);
    // context(4) + 2 × (length(4) flags(4)) = 20.
    let expected = cat(&[
        &STRUCTURED_MAGIC,
        &[0, 1],
        &[0, 5],
        &HANDLE_BYTES,
        &[0, 0, 0, 20],
        &[0, 0, 0, 1],
        &[0, 0, 0x10, 0],
        &[0, 0, 0, 3],
        &[0, 0, 0x20, 0],
        &[0, 0, 0, 0],
    ]);
    assert_eq!(out, expected);
}

#[test]
fn block_status_chunk_with_one_extent_is_twelve_payload_bytes() {
    let mut out = Vec::new();
    reply::block_status(&mut out, ReplyTo::compact(0), 0xdead_beef, &[Extent { length: 1, flags: STATE_ZERO }]);
    assert_eq!(out[16..], [0, 0, 0, 12, 0xde, 0xad, 0xbe, 0xef, 0, 0, 0, 1, 0, 0, 0, 2]);
}
