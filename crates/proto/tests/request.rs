//! Request headers: decoding every field from its spec offset, and `validate`, the single
//! place that judges a request against what was negotiated.

use sluice_proto::errno::Errno;
use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::request::{validate, BadMagic, Command, Range, RawRequest, Refusal, Rejection, Request, Session};
use sluice_proto::wire::*;

const SIZE: u64 = 1 << 20;
const HANDLE: u64 = 0x0102_0304_0506_0708;

/// Every feature advertised, base:allocation selected: only the request can be at fault.
fn full_session() -> Session {
    Session {
        size: SIZE,
        flags: FLAG_HAS_FLAGS
            | FLAG_SEND_FLUSH
            | FLAG_SEND_FUA
            | FLAG_SEND_TRIM
            | FLAG_SEND_WRITE_ZEROES
            | FLAG_SEND_DF
            | FLAG_SEND_CACHE
            | FLAG_SEND_FAST_ZERO,
        structured: true,
        extended: false,
        base_allocation: Some(7),
        payload_max_bytes: REQUEST_PAYLOAD_MAX_BYTES,
    }
}

fn raw(kind: u16, flags: u16, offset: u64, length: u32) -> RawRequest {
    RawRequest { flags, kind, handle: HANDLE, offset, length: length.into() }
}

fn rejected(r: &RawRequest, s: &Session) -> Rejection {
    match validate(r, s) {
        Err(Refusal::Reply(rejection)) => rejection,
        Err(Refusal::Disconnect(why)) => panic!("{r:?} ended the connection: {why}"),
        Ok(req) => panic!("{r:?} was accepted as {req:?}"),
    }
}

fn accepted(r: &RawRequest, s: &Session) -> Command {
    match validate(r, s) {
        Ok(req) => {
            assert_eq!(req.handle, r.handle, "the handle is echoed unchanged");
            req.command
        }
        Err(rejection) => panic!("{r:?} was rejected: {rejection:?}"),
    }
}

fn errno(r: &RawRequest, s: &Session) -> Errno {
    rejected(r, s).errno
}

const ALL_COMMANDS: [u16; 8] =
    [CMD_READ, CMD_WRITE, CMD_DISC, CMD_FLUSH, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS];

// ---------------------------------------------------------------------------------------
// Decoding
// ---------------------------------------------------------------------------------------

#[test]
fn decode_reads_every_field_from_its_spec_offset() {
    // magic(4) flags(2) type(2) handle(8) offset(8) length(4), each field a distinct value.
    #[rustfmt::skip]
    let bytes: [u8; 28] = [
        0x25, 0x60, 0x95, 0x13,
        0x00, 0x11,
        0x00, 0x06,
        0xa1, 0xa2, 0xa3, 0xa4, 0xa5, 0xa6, 0xa7, 0xa8,
        0xb1, 0xb2, 0xb3, 0xb4, 0xb5, 0xb6, 0xb7, 0xb8,
        0xc1, 0xc2, 0xc3, 0xc4,
    ];
    let r = RawRequest::decode(&bytes).unwrap();
    assert_eq!(
        r,
        RawRequest {
            flags: 0x0011,
            kind: CMD_WRITE_ZEROES,
            handle: 0xa1a2_a3a4_a5a6_a7a8,
            offset: 0xb1b2_b3b4_b5b6_b7b8,
            length: 0xc1c2_c3c4,
        }
    );
    assert_eq!(r.encode(), bytes);
}

#[test]
fn decode_rejects_anything_but_the_request_magic() {
    // The retired request magic, the simple reply magic, the structured reply magic,
    // zeros, and the right magic off by one bit.
    for magic in [0x1256_0953u32, 0x6744_6698, 0x668e_33ef, 0, 0x2560_9512, 0xa560_9513] {
        let mut bytes = raw(CMD_READ, 0, 0, 512).encode();
        bytes[0..4].copy_from_slice(&magic.to_be_bytes());
        assert_eq!(RawRequest::decode(&bytes), Err(BadMagic(magic)));
    }
}

#[test]
fn bad_magic_displays_the_magic_in_hex() {
    assert_eq!(BadMagic(0x1256_0953).to_string(), "bad request magic 0x12560953");
}

#[test]
fn encode_then_decode_is_the_identity() {
    for r in [
        raw(CMD_READ, 0, 0, 0),
        raw(0xffff, 0xffff, u64::MAX, u32::MAX),
        RawRequest { flags: 1, kind: CMD_WRITE, handle: 0, offset: 1 << 40, length: 4096 },
    ] {
        assert_eq!(RawRequest::decode(&r.encode()), Ok(r));
    }
}

#[test]
fn only_writes_carry_a_payload() {
    for kind in ALL_COMMANDS.into_iter().chain([8, 0xffff]) {
        let expected = if kind == CMD_WRITE { 4096 } else { 0 };
        assert_eq!(raw(kind, 0, 0, 4096).payload_len(false), expected, "command {kind}");
    }
}

// ---------------------------------------------------------------------------------------
// Commands and flags
// ---------------------------------------------------------------------------------------

/// The flags the spec documents for each command when every feature is advertised. FUA is
/// in every set: a server that advertises SEND_FUA MUST accept it on any command.
fn documented_flags(kind: u16) -> u16 {
    CMD_FLAG_FUA
        | match kind {
            CMD_READ => CMD_FLAG_DF,
            CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
            _ => 0,
        }
}

#[test]
fn every_flag_combination_is_accepted_exactly_when_documented_for_the_command() {
    // All 2^16 flag words for each command: an undocumented bit anywhere means EINVAL.
    let s = full_session();
    for kind in ALL_COMMANDS {
        let allowed = documented_flags(kind);
        for flags in 0..=u16::MAX {
            let r = raw(kind, flags, 0, 512);
            let result = validate(&r, &s);
            if flags & !allowed == 0 {
                assert!(result.is_ok(), "command {kind} flags {flags:#06x}: {result:?}");
            } else {
                let rejection = result.expect_err("undocumented flag accepted").rejection().unwrap();
                assert_eq!(rejection.errno, Errno::Inval, "command {kind} flags {flags:#06x}");
                assert_eq!(rejection.discard, r.payload_len(false));
            }
        }
    }
}

#[test]
fn commands_decode_to_the_matching_typed_command() {
    let s = full_session();
    let range = Range { offset: 4096, length: 512 };
    let cases = [
        (raw(CMD_READ, 0, 4096, 512), Command::Read { range, whole: false }),
        (raw(CMD_READ, CMD_FLAG_DF | CMD_FLAG_FUA, 4096, 512), Command::Read { range, whole: true }),
        (raw(CMD_WRITE, 0, 4096, 512), Command::Write { range, fua: false }),
        (raw(CMD_WRITE, CMD_FLAG_FUA, 4096, 512), Command::Write { range, fua: true }),
        (raw(CMD_TRIM, CMD_FLAG_FUA, 4096, 512), Command::Trim { range, fua: true }),
        (raw(CMD_CACHE, 0, 4096, 512), Command::Cache { range }),
        (raw(CMD_WRITE_ZEROES, 0, 4096, 512), Command::WriteZeroes { range, fua: false, may_trim: true, fast: false }),
        (
            raw(CMD_WRITE_ZEROES, CMD_FLAG_FUA | CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO, 4096, 512),
            Command::WriteZeroes { range, fua: true, may_trim: false, fast: true },
        ),
        (raw(CMD_BLOCK_STATUS, 0, 4096, 512), Command::BlockStatus { range, context_id: 7, one: false }),
        (raw(CMD_BLOCK_STATUS, CMD_FLAG_REQ_ONE, 4096, 512), Command::BlockStatus { range, context_id: 7, one: true }),
        (raw(CMD_FLUSH, 0, 0, 0), Command::Flush),
        (raw(CMD_DISC, 0, 0, 0), Command::Disconnect),
    ];
    for (r, expected) in cases {
        assert_eq!(validate(&r, &s), Ok(Request { handle: HANDLE, command: expected }));
    }
}

#[test]
fn flush_and_disconnect_ignore_offset_and_length() {
    // The spec asks clients for zeros here; a sloppy client is still served.
    let s = full_session();
    assert_eq!(accepted(&raw(CMD_FLUSH, 0, u64::MAX, u32::MAX), &s), Command::Flush);
    assert_eq!(accepted(&raw(CMD_DISC, 0, u64::MAX, u32::MAX), &s), Command::Disconnect);
}

#[test]
fn unknown_commands_are_einval_and_discard_nothing() {
    // 8 is the experimental RESIZE, never advertised by sluice.
    for kind in [8u16, 9, 0x100, 0xffff] {
        let rej = rejected(&raw(kind, 0, 0, 4096), &full_session());
        assert_eq!((rej.errno, rej.discard, rej.handle), (Errno::Inval, 0, HANDLE), "command {kind}");
    }
}

#[test]
fn df_is_accepted_only_when_send_df_was_advertised() {
    let mut s = full_session();
    assert!(validate(&raw(CMD_READ, CMD_FLAG_DF, 0, 512), &s).is_ok());
    s.flags &= !FLAG_SEND_DF;
    assert_eq!(errno(&raw(CMD_READ, CMD_FLAG_DF, 0, 512), &s), Errno::Inval);
    assert!(validate(&raw(CMD_READ, 0, 0, 512), &s).is_ok());
}

#[test]
fn fast_zero_is_accepted_only_when_advertised() {
    let mut s = full_session();
    assert!(validate(&raw(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 512), &s).is_ok());
    s.flags &= !FLAG_SEND_FAST_ZERO;
    assert_eq!(errno(&raw(CMD_WRITE_ZEROES, CMD_FLAG_FAST_ZERO, 0, 512), &s), Errno::Inval);
    assert!(validate(&raw(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 0, 512), &s).is_ok());
}

#[test]
fn commands_that_were_not_advertised_are_einval() {
    for (kind, flag) in [
        (CMD_TRIM, FLAG_SEND_TRIM),
        (CMD_WRITE_ZEROES, FLAG_SEND_WRITE_ZEROES),
        (CMD_CACHE, FLAG_SEND_CACHE),
        (CMD_FLUSH, FLAG_SEND_FLUSH),
    ] {
        let mut s = full_session();
        s.flags &= !flag;
        assert_eq!(errno(&raw(kind, 0, 0, 512), &s), Errno::Inval, "command {kind}");
    }
}

#[test]
fn read_write_and_disconnect_need_no_advertisement() {
    let s = Session { flags: FLAG_HAS_FLAGS, structured: false, base_allocation: None, ..full_session() };
    for kind in [CMD_READ, CMD_WRITE, CMD_DISC] {
        assert!(validate(&raw(kind, 0, 0, 512), &s).is_ok(), "command {kind}");
    }
}

// ---------------------------------------------------------------------------------------
// Ranges
// ---------------------------------------------------------------------------------------

#[test]
fn requests_ending_exactly_at_the_end_of_the_export_are_accepted() {
    let s = full_session();
    for kind in [CMD_READ, CMD_WRITE, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS] {
        assert!(validate(&raw(kind, 0, SIZE - 512, 512), &s).is_ok(), "command {kind}");
        assert!(validate(&raw(kind, 0, 0, SIZE as u32), &s).is_ok(), "command {kind}");
    }
}

#[test]
fn out_of_range_is_einval_for_reads_and_enospc_for_writes() {
    // Spec: READ, TRIM, BLOCK_STATUS past the end SHOULD be EINVAL; WRITE and WRITE_ZEROES
    // ENOSPC, as a full disk would say.
    let s = full_session();
    let expected = [
        (CMD_READ, Errno::Inval),
        (CMD_TRIM, Errno::Inval),
        (CMD_CACHE, Errno::Inval),
        (CMD_BLOCK_STATUS, Errno::Inval),
        (CMD_WRITE, Errno::NoSpc),
        (CMD_WRITE_ZEROES, Errno::NoSpc),
    ];
    for (kind, want) in expected {
        for (offset, length) in [(SIZE - 511, 512), (SIZE, 1), (SIZE + 1, 0), (0, SIZE as u32 + 1), (1 << 62, 512)] {
            assert_eq!(errno(&raw(kind, 0, offset, length), &s), want, "command {kind} at {offset}+{length}");
        }
    }
}

#[test]
fn offset_plus_length_overflowing_u64_is_rejected_not_wrapped() {
    // A huge export so that only the overflow, not the size, can be the reason.
    let s = Session { size: u64::MAX, ..full_session() };
    for kind in [CMD_READ, CMD_WRITE, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS] {
        assert!(validate(&raw(kind, 0, u64::MAX, 1), &s).is_err(), "command {kind}");
        assert!(validate(&raw(kind, 0, u64::MAX - 1, 2), &s).is_err(), "command {kind}");
        assert!(validate(&raw(kind, 0, u64::MAX - 4095, u32::MAX), &s).is_err(), "command {kind}");
        // Ending exactly at 2^64 - 1 does not overflow.
        assert!(validate(&raw(kind, 0, u64::MAX - 512, 512), &s).is_ok(), "command {kind}");
    }
}

#[test]
fn length_zero_reads_are_accepted_even_at_the_end() {
    // Spec: behaviour is unspecified but the server SHOULD NOT disconnect; an empty read
    // is harmless.
    let s = full_session();
    assert!(validate(&raw(CMD_READ, 0, 0, 0), &s).is_ok());
    assert!(validate(&raw(CMD_READ, 0, SIZE, 0), &s).is_ok());
    assert!(validate(&raw(CMD_WRITE, 0, SIZE, 0), &s).is_ok());
}

#[test]
fn an_empty_export_accepts_only_empty_requests() {
    let s = Session { size: 0, ..full_session() };
    assert!(validate(&raw(CMD_READ, 0, 0, 0), &s).is_ok());
    assert_eq!(errno(&raw(CMD_READ, 0, 0, 1), &s), Errno::Inval);
    assert_eq!(errno(&raw(CMD_WRITE, 0, 0, 1), &s), Errno::NoSpc);
}

// ---------------------------------------------------------------------------------------
// Payload limit
// ---------------------------------------------------------------------------------------

#[test]
fn reads_and_writes_above_the_payload_maximum_are_einval() {
    let s = Session { size: 1 << 40, ..full_session() };
    let max = s.payload_max_bytes;
    for kind in [CMD_READ, CMD_WRITE] {
        assert!(validate(&raw(kind, 0, 0, max), &s).is_ok(), "command {kind}");
        for length in [max + 1, u32::MAX] {
            assert_eq!(errno(&raw(kind, 0, 0, length), &s), Errno::Inval, "command {kind}");
        }
    }
}

#[test]
fn df_read_above_the_payload_maximum_is_eoverflow() {
    // Spec: EOVERFLOW is the answer for a DF read too large to send in one chunk.
    let s = Session { size: 1 << 40, ..full_session() };
    let r = raw(CMD_READ, CMD_FLAG_DF, 0, s.payload_max_bytes + 1);
    assert_eq!(errno(&r, &s), Errno::Overflow);
}

#[test]
fn commands_without_payload_are_not_bound_by_the_payload_maximum() {
    let s = Session { size: 1 << 40, ..full_session() };
    for kind in [CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS] {
        assert!(validate(&raw(kind, 0, 0, u32::MAX), &s).is_ok(), "command {kind}");
    }
}

#[test]
fn the_session_payload_maximum_is_what_counts() {
    let s = Session { payload_max_bytes: 4096, ..full_session() };
    assert!(validate(&raw(CMD_READ, 0, 0, 4096), &s).is_ok());
    assert_eq!(errno(&raw(CMD_WRITE, 0, 0, 4097), &s), Errno::Inval);
}

// ---------------------------------------------------------------------------------------
// Read-only exports
// ---------------------------------------------------------------------------------------

#[test]
fn read_only_exports_refuse_every_write_with_eperm() {
    let s = Session { flags: full_session().flags | FLAG_READ_ONLY, ..full_session() };
    assert!(s.read_only());
    for kind in [CMD_WRITE, CMD_TRIM, CMD_WRITE_ZEROES] {
        assert_eq!(errno(&raw(kind, 0, 0, 512), &s), Errno::Perm, "command {kind}");
        assert_eq!(errno(&raw(kind, CMD_FLAG_FUA, 0, 512), &s), Errno::Perm, "command {kind}");
    }
    for kind in [CMD_READ, CMD_FLUSH, CMD_CACHE, CMD_BLOCK_STATUS, CMD_DISC] {
        assert!(validate(&raw(kind, 0, 0, 512), &s).is_ok(), "command {kind}");
    }
}

// ---------------------------------------------------------------------------------------
// Rejections
// ---------------------------------------------------------------------------------------

#[test]
fn rejected_writes_discard_exactly_their_payload() {
    // Whatever the reason, the payload is on the wire and must be read to stay in sync.
    let ro = Session { flags: full_session().flags | FLAG_READ_ONLY, ..full_session() };
    let s = full_session();
    let cases = [
        (raw(CMD_WRITE, CMD_FLAG_DF, 0, 512), &s),
        (raw(CMD_WRITE, 0x8000, 0, 700), &s),
        (raw(CMD_WRITE, 0, 0, 513), &ro),
        (raw(CMD_WRITE, 0, SIZE, 1234), &s),
        (raw(CMD_WRITE, 0, u64::MAX, 99), &s),
        (raw(CMD_WRITE, 0, 0, REQUEST_PAYLOAD_MAX_BYTES + 1), &s),
        (raw(CMD_WRITE, 0, 0, u32::MAX), &s),
    ];
    for (r, session) in cases {
        let rej = rejected(&r, session);
        assert_eq!(rej.discard, r.length, "{r:?}");
        assert_eq!(rej.handle, HANDLE);
    }
}

#[test]
fn rejected_non_writes_discard_nothing() {
    let s = full_session();
    let cases = [
        raw(CMD_READ, 0, SIZE, 4096),
        raw(CMD_READ, 0x8000, 0, 4096),
        raw(CMD_TRIM, 0, SIZE, 4096),
        raw(CMD_WRITE_ZEROES, 0, SIZE, 4096),
        raw(CMD_CACHE, CMD_FLAG_DF, 0, 4096),
        raw(CMD_BLOCK_STATUS, 0, SIZE, 4096),
        raw(CMD_FLUSH, CMD_FLAG_REQ_ONE, 0, 4096),
        raw(0x4242, 0, 0, 4096),
    ];
    for r in cases {
        let rej = rejected(&r, &s);
        assert_eq!(rej.discard, 0, "{r:?}");
        assert_eq!(rej.handle, HANDLE);
        assert!(!rej.reason.is_empty());
    }
}

// ---------------------------------------------------------------------------------------
// BLOCK_STATUS
// ---------------------------------------------------------------------------------------

#[test]
fn block_status_without_a_negotiated_context_is_einval() {
    for structured in [false, true] {
        let s = Session { structured, base_allocation: None, ..full_session() };
        assert_eq!(errno(&raw(CMD_BLOCK_STATUS, 0, 0, 512), &s), Errno::Inval);
    }
}

#[test]
fn block_status_reports_the_negotiated_context_id() {
    let s = Session { base_allocation: Some(0x0a0b_0c0d), ..full_session() };
    let command = accepted(&raw(CMD_BLOCK_STATUS, 0, 0, 512), &s);
    assert!(matches!(command, Command::BlockStatus { context_id: 0x0a0b_0c0d, .. }));
}

#[test]
fn block_status_of_zero_bytes_is_einval() {
    // There is no extent to describe, and a reply needs at least one.
    assert_eq!(errno(&raw(CMD_BLOCK_STATUS, 0, 0, 0), &full_session()), Errno::Inval);
}

#[test]
fn range_end_is_offset_plus_length() {
    assert_eq!(Range { offset: u64::MAX - 10, length: 10 }.end(), u64::MAX);
    assert_eq!(Range { offset: 4096, length: 0 }.end(), 4096);
}
