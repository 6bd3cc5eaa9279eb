//! Extended request headers (doc/proto.md, "Request message"): the 32-byte layout with a
//! 64-bit length, and what `validate` makes of effect lengths, payload lengths and
//! NBD_CMD_FLAG_PAYLOAD_LEN once extended headers were negotiated.

use sluice_proto::errno::Errno;
use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::request::{header_bytes, validate, BadMagic, Command, Range, RawRequest, Refusal, Session};
use sluice_proto::wire::*;

const SIZE: u64 = 8 << 30;
const HANDLE: u64 = 0x0102_0304_0506_0708;
const MAX: u64 = REQUEST_PAYLOAD_MAX_BYTES as u64;

fn session() -> Session {
    Session {
        size: SIZE,
        flags: FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_DF | FLAG_SEND_CACHE,
        structured: true,
        extended: true,
        base_allocation: Some(1),
        payload_max_bytes: REQUEST_PAYLOAD_MAX_BYTES,
    }
}

fn raw(kind: u16, flags: u16, offset: u64, length: u64) -> RawRequest {
    RawRequest { flags, kind, handle: HANDLE, offset, length }
}

fn write(offset: u64, length: u64) -> RawRequest {
    raw(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, offset, length)
}

/// The error reply and the payload bytes dropped before it.
fn rejected(r: &RawRequest, s: &Session) -> (Errno, u64) {
    match validate(r, s) {
        Err(Refusal::Reply(rej)) => {
            assert_eq!(rej.handle, HANDLE);
            (rej.errno, rej.discard)
        }
        other => panic!("{r:?}: {other:?}"),
    }
}

fn disconnects(r: &RawRequest, s: &Session) {
    assert!(matches!(validate(r, s), Err(Refusal::Disconnect(_))), "{r:?}: {:?}", validate(r, s));
}

#[test]
fn decode_reads_every_field_from_its_spec_offset() {
    let mut b = [0u8; EXTENDED_REQUEST_BYTES];
    b[0..4].copy_from_slice(&0x21e4_1c71u32.to_be_bytes());
    b[4..6].copy_from_slice(&0x0021u16.to_be_bytes());
    b[6..8].copy_from_slice(&CMD_WRITE.to_be_bytes());
    b[8..16].copy_from_slice(&HANDLE.to_be_bytes());
    b[16..24].copy_from_slice(&(1u64 << 40).to_be_bytes());
    b[24..32].copy_from_slice(&0x0000_0001_0000_0200u64.to_be_bytes());
    let r = RawRequest::decode_extended(&b).unwrap();
    assert_eq!(r, raw(CMD_WRITE, 0x0021, 1 << 40, (1 << 32) + 512));
    assert_eq!(r.encode_extended(), b, "encode inverts decode");
    assert_eq!(RawRequest::decode_as(&b, true), Ok(r));
    assert_eq!(header_bytes(true), 32);
    assert_eq!(header_bytes(false), 28);
}

#[test]
fn each_framing_accepts_only_its_own_magic() {
    let ext = raw(CMD_READ, 0, 0, 512).encode_extended();
    let compact = raw(CMD_READ, 0, 0, 512).encode();
    assert_eq!(RawRequest::decode_as(&ext[..28], false), Err(BadMagic(EXTENDED_REQUEST_MAGIC)));
    let mut as_ext = [0u8; 32];
    as_ext[..28].copy_from_slice(&compact);
    assert_eq!(RawRequest::decode_extended(&as_ext), Err(BadMagic(REQUEST_MAGIC)));
}

#[test]
fn only_payload_len_carries_a_payload() {
    assert_eq!(write(0, 4096).payload_len(true), 4096);
    assert_eq!(raw(CMD_WRITE, 0, 0, 4096).payload_len(true), 4096, "qemu 10 sends WRITE without the flag");
    assert_eq!(raw(CMD_READ, 0, 0, 4096).payload_len(true), 0);
    assert_eq!(raw(CMD_TRIM, CMD_FLAG_PAYLOAD_LEN, 0, 8).payload_len(true), 8);
    assert_eq!(raw(CMD_WRITE, 0, 0, 4096).payload_len(false), 4096, "compact: WRITE's length");
}

#[test]
fn effect_lengths_past_32_bits_are_accepted_for_commands_without_payload() {
    let s = session();
    let whole = Range { offset: 0, length: SIZE };
    assert_eq!(validate(&raw(CMD_TRIM, 0, 0, SIZE), &s).unwrap().command, Command::Trim { range: whole, fua: false });
    assert!(matches!(validate(&raw(CMD_WRITE_ZEROES, 0, 0, SIZE), &s).unwrap().command, Command::WriteZeroes { range, .. } if range == whole));
    assert!(matches!(validate(&raw(CMD_CACHE, 0, 0, SIZE), &s).unwrap().command, Command::Cache { range } if range == whole));
    let bs = validate(&raw(CMD_BLOCK_STATUS, 0, 1 << 30, 6 << 30), &s).unwrap().command;
    assert!(matches!(bs, Command::BlockStatus { range: Range { offset: 0x4000_0000, length: 0x1_8000_0000 }, .. }));
}

#[test]
fn reads_and_writes_stay_bounded_by_the_payload_maximum() {
    let s = session();
    assert_eq!(rejected(&raw(CMD_READ, 0, 0, MAX + 1), &s), (Errno::Inval, 0));
    assert_eq!(rejected(&raw(CMD_READ, 0, 0, 1 << 33), &s), (Errno::Inval, 0));
    assert_eq!(rejected(&raw(CMD_READ, CMD_FLAG_DF, 0, 1 << 33), &s), (Errno::Overflow, 0));
    assert!(validate(&write(SIZE - MAX, MAX), &s).is_ok());
}

#[test]
fn lengths_past_the_export_are_refused_and_never_wrap() {
    let s = session();
    assert_eq!(rejected(&raw(CMD_TRIM, 0, 0, SIZE + 1), &s), (Errno::Inval, 0));
    assert_eq!(rejected(&raw(CMD_WRITE_ZEROES, 0, 4096, SIZE), &s), (Errno::NoSpc, 0));
    assert_eq!(rejected(&raw(CMD_BLOCK_STATUS, 0, 1, u64::MAX), &s), (Errno::Inval, 0));
    assert_eq!(rejected(&raw(CMD_CACHE, 0, u64::MAX, 2), &s), (Errno::Inval, 0));
    assert_eq!(rejected(&write(SIZE, 512), &s), (Errno::NoSpc, 512), "the payload is read and dropped");
}

#[test]
fn zero_lengths_follow_the_compact_rules() {
    let s = session();
    for kind in [CMD_READ, CMD_TRIM, CMD_WRITE_ZEROES, CMD_CACHE] {
        assert!(validate(&raw(kind, 0, SIZE, 0), &s).is_ok(), "command {kind}");
    }
    assert!(validate(&write(SIZE, 0), &s).is_ok());
    assert_eq!(rejected(&raw(CMD_BLOCK_STATUS, 0, 0, 0), &s), (Errno::Inval, 0));
}

#[test]
fn a_write_without_payload_len_still_carries_its_payload() {
    // The spec asks for the flag; qemu 10 leaves it out. Either way the length is payload.
    let s = session();
    let command = validate(&raw(CMD_WRITE, CMD_FLAG_FUA, 4096, 512), &s).unwrap().command;
    assert_eq!(command, Command::Write { range: Range { offset: 4096, length: 512 }, fua: true });
    disconnects(&raw(CMD_WRITE, 0, 0, MAX + 1), &s);
}

#[test]
fn a_payload_past_the_maximum_is_never_read() {
    let s = session();
    disconnects(&write(0, MAX + 1), &s);
    disconnects(&raw(CMD_TRIM, CMD_FLAG_PAYLOAD_LEN, 0, 1 << 40), &s);
    disconnects(&raw(0x4242, CMD_FLAG_PAYLOAD_LEN, 0, u64::MAX), &s);
}

#[test]
fn a_payload_on_a_command_that_takes_none_is_read_then_einval() {
    let s = session();
    for kind in [CMD_READ, CMD_TRIM, CMD_WRITE_ZEROES, CMD_CACHE, CMD_BLOCK_STATUS, CMD_FLUSH] {
        assert_eq!(rejected(&raw(kind, CMD_FLAG_PAYLOAD_LEN, 0, 16), &s), (Errno::Inval, 16), "command {kind}");
        assert_eq!(rejected(&raw(kind, CMD_FLAG_PAYLOAD_LEN, 0, 0), &s), (Errno::Inval, 0), "command {kind}");
    }
    assert_eq!(rejected(&raw(0x4242, CMD_FLAG_PAYLOAD_LEN, 0, 8), &s), (Errno::Inval, 8));
}

#[test]
fn payload_len_is_an_unknown_flag_without_extended_headers() {
    let s = Session { extended: false, ..session() };
    assert_eq!(rejected(&raw(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 0, 512), &s), (Errno::Inval, 512));
    assert_eq!(rejected(&raw(CMD_TRIM, CMD_FLAG_PAYLOAD_LEN, 0, 512), &s), (Errno::Inval, 0));
}

#[test]
fn rejected_extended_writes_discard_exactly_their_payload() {
    let ro = Session { flags: session().flags | FLAG_READ_ONLY, ..session() };
    assert_eq!(rejected(&write(0, 700), &ro), (Errno::Perm, 700));
    assert_eq!(rejected(&raw(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN | CMD_FLAG_DF, 0, 99), &session()), (Errno::Inval, 99));
}
