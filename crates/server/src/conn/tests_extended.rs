//! The core under extended headers: 32-byte request framing, every reply an extended
//! chunk that echoes the request's offset, 64-bit effect lengths reaching the backend
//! whole, BLOCK_STATUS_EXT, and the PAYLOAD_LEN rules (a payload read then refused, a
//! request that cannot be framed hung up on).

use sluice_proto::client::{decode_block_status_ext, decode_error_chunk, ChunkHeader};
use sluice_proto::reply::Extent;
use sluice_proto::wire::*;
use sluice_proto::RawRequest;

use super::tests::Rig;
use crate::backend::StorageOp;
use crate::engine::{Held, Pipes};
use crate::export::{Chunking, DataPath};

const BIG: u64 = 8 << 30;

/// An extended session over an 8 GiB export with base:allocation selected.
fn rig() -> Rig {
    Rig::build_with(Chunking::Fixed(4096), DataPath::Copy, Pipes::new(0, 0), |s| {
        s.structured = true;
        s.extended = true;
        s.size = BIG;
        s.base_allocation = Some(1);
    })
}

fn request(kind: u16, flags: u16, handle: u64, offset: u64, length: u64) -> [u8; EXTENDED_REQUEST_BYTES] {
    RawRequest { flags, kind, handle, offset, length }.encode_extended()
}

/// The chunk at the front of `wire`, checked to carry the extended magic, and its payload.
fn chunk(wire: &[u8]) -> (ChunkHeader, &[u8]) {
    assert_eq!(wire[..4], EXTENDED_REPLY_MAGIC.to_be_bytes(), "an extended reply");
    let h = ChunkHeader::decode_extended(wire[4..32].try_into().unwrap());
    (h, &wire[32..32 + h.len as usize])
}

#[test]
fn a_32_byte_header_split_across_receives_is_one_request_answered_with_none() {
    let mut rig = rig();
    let flush = request(CMD_FLUSH, 0, 7, 0, 0);
    rig.deliver(&flush[..29]);
    assert!(rig.storage.is_empty(), "nothing runs on part of an extended header");
    rig.deliver(&flush[29..]);
    let t = rig.storage[0].0;
    rig.complete(t, 0);
    let (h, payload) = chunk(&rig.wire);
    assert_eq!((h.handle, h.kind, h.done(), payload.len()), (7, REPLY_TYPE_NONE, true, 0));
    assert_eq!(rig.wire.len(), 32, "no simple replies under extended headers");
}

#[test]
fn read_chunks_carry_extended_headers_that_echo_the_request_offset() {
    let mut rig = rig();
    rig.deliver(&request(CMD_READ, 0, 5, 8192, 2 * 4096));
    let slot = rig.storage[0].0.slot;
    rig.complete(super::Tag { slot, chunk: 1 }, 0xbb);
    rig.complete(super::Tag { slot, chunk: 0 }, 0xaa);
    let (first, data) = chunk(&rig.wire);
    assert_eq!((first.kind, first.offset, first.done()), (REPLY_TYPE_OFFSET_DATA, 8192, false));
    assert_eq!(u64::from_be_bytes(data[..8].try_into().unwrap()), 8192 + 4096, "the second chunk landed first");
    let (last, data) = chunk(&rig.wire[32 + first.len as usize..]);
    assert_eq!((last.offset, last.done(), data[8]), (8192, true, 0xaa));
}

#[test]
fn a_trim_past_32_bits_reaches_the_backend_whole() {
    let mut rig = rig();
    rig.deliver(&request(CMD_TRIM, 0, 3, 4096, BIG - 4096));
    assert!(matches!(rig.storage[..], [(_, StorageOp::Trim { offset: 4096, len }) ] if len == BIG - 4096));
    let t = rig.storage[0].0;
    rig.complete(t, 0);
    let (h, _) = chunk(&rig.wire);
    assert_eq!((h.handle, h.kind, h.offset), (3, REPLY_TYPE_NONE, 4096));
}

#[test]
fn block_status_past_32_bits_is_answered_with_block_status_ext() {
    let mut rig = rig();
    rig.deliver(&request(CMD_BLOCK_STATUS, 0, 9, 0, BIG));
    let (tag, len) = match &rig.storage[..] {
        [(tag, StorageOp::Extents { len, .. })] => (*tag, *len),
        other => panic!("{} operations", other.len()),
    };
    assert_eq!(len, BIG, "the backend is asked about the whole range");
    let extents = vec![Extent { length: 6 << 30, flags: STATE_HOLE | STATE_ZERO }, Extent { length: 2 << 30, flags: 0 }];
    rig.storage.clear();
    rig.with(|c, env| c.handle_storage(env, tag, 0, Held::Extents(extents)));
    let (h, payload) = chunk(&rig.wire);
    assert_eq!((h.kind, h.done()), (REPLY_TYPE_BLOCK_STATUS_EXT, true));
    assert_eq!(decode_block_status_ext(payload), Ok((1, vec![(6 << 30, 3), (2 << 30, 0)])));
}

#[test]
fn a_payload_on_a_trim_is_read_and_dropped_then_refused() {
    let mut rig = rig();
    let mut bytes = request(CMD_TRIM, CMD_FLAG_PAYLOAD_LEN, 1, 0, 100).to_vec();
    bytes.extend_from_slice(&[0x21; 100]);
    bytes.extend_from_slice(&request(CMD_FLUSH, 0, 2, 0, 0));
    rig.deliver(&bytes[..60]);
    assert!(rig.wire.is_empty(), "answered only once the payload is gone");
    rig.deliver(&bytes[60..]);
    let (h, payload) = chunk(&rig.wire);
    assert_eq!((h.handle, h.kind), (1, REPLY_TYPE_ERROR));
    assert_eq!(decode_error_chunk(h.kind, payload).unwrap().code, 22, "EINVAL");
    assert!(matches!(rig.storage[..], [(_, StorageOp::Flush)]), "the stream stayed in step");
}

#[test]
fn writes_frame_by_payload_len() {
    let mut rig = rig();
    let mut bytes = request(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 4, 0, 512).to_vec();
    bytes.extend_from_slice(&[0x42; 512]);
    rig.deliver(&bytes);
    assert!(matches!(rig.storage[..], [(_, StorageOp::Write { len: 512, .. })]));
}

#[test]
fn a_write_without_payload_len_frames_like_one_with_it() {
    // As qemu 10 sends them: the length is the payload all the same.
    let mut rig = rig();
    let mut bytes = request(CMD_WRITE, 0, 4, 0, 512).to_vec();
    bytes.extend_from_slice(&[0x42; 512]);
    bytes.extend_from_slice(&request(CMD_FLUSH, 0, 5, 0, 0));
    rig.deliver(&bytes);
    assert!(matches!(rig.storage[..], [(_, StorageOp::Write { len: 512, .. }), (_, StorageOp::Flush)]));
}

#[test]
fn a_payload_past_the_maximum_is_hung_up_on_not_read() {
    let mut rig = rig();
    rig.deliver(&request(CMD_WRITE, CMD_FLAG_PAYLOAD_LEN, 4, 0, (32 << 20) + 1));
    assert_eq!(rig.conn.ended.as_deref(), Some("protocol error"));
    assert!(rig.wire.is_empty());
}

#[test]
fn compact_headers_are_out_of_step_under_extended_headers() {
    let mut rig = rig();
    let mut compact = RawRequest { flags: 0, kind: CMD_FLUSH, handle: 1, offset: 0, length: 0 }.encode().to_vec();
    compact.extend_from_slice(&[0; 4]);
    rig.deliver(&compact);
    assert_eq!(rig.conn.ended.as_deref(), Some("protocol error"), "a compact magic is a bad magic here");
    assert!(rig.wire.is_empty());
}
