//! Transmission conformance over raw sockets: reply framing, request validation and errors, pipelining, disconnects.
mod common;
mod raw;

use std::collections::HashMap;
use std::io::Write;
use std::thread::JoinHandle;

use common::{pattern, Sluice};
use raw::*;

const SIZE: u64 = 64 << 20;

/// "" (64 MiB), "ro" (1 MiB, read-only) and "other" (1 MiB), all in memory.
fn server() -> Sluice {
    Sluice::start(&["memory:64M", "--export", "ro=memory:1M,ro", "--export", "other=memory:1M"])
}

/// Structured replies and base:allocation on the default export.
fn structured(s: &Sluice) -> (Client, Export) {
    Client::connect(&s.socket, "", true, true)
}

/// Simple replies only.
fn simple(s: &Sluice) -> (Client, Export) {
    Client::connect(&s.socket, "", false, false)
}

/// Sends `bytes` from another thread, so the server's replies can be read while a large
/// request (or many) is still going out.
fn send_in_background(c: &Client, bytes: Vec<u8>) -> JoinHandle<()> {
    let mut w = c.writer();
    std::thread::spawn(move || w.write_all(&bytes).expect("sending requests"))
}

/// Proves the stream is still in step after whatever came before.
fn assert_usable(c: &mut Client) {
    let data = pattern(4096, 0xfeed);
    c.write(SIZE - 4096, &data);
    assert_eq!(c.read(SIZE - 4096, 4096), data);
}

// Rules 43, 64, 65: a READ of data is one OFFSET_DATA chunk, flagged DONE, at the request offset.
#[test]
fn structured_read_is_one_offset_data_chunk_with_done_rule_65() {
    let s = server();
    let (mut c, _) = structured(&s);
    let data = pattern(65536, 1);
    c.write(4096, &data);
    let r = c.call(0, CMD_READ, 4096, 65536);
    let [Msg::Chunk(chunk)] = r.msgs.as_slice() else { panic!("expected one chunk: {r:?}") };
    assert_eq!(chunk.kind, CHUNK_OFFSET_DATA);
    assert_eq!(chunk.flags, REPLY_FLAG_DONE);
    assert_eq!(chunk.handle, r.handle);
    assert_eq!(chunk.payload.len(), 8 + 65536);
    assert_eq!(be64(&chunk.payload[0..8]), 4096, "OFFSET_DATA offset is absolute");
    assert_eq!(&chunk.payload[8..], &data[..]);
    // An unwritten range may come back as data or holes, but must cover the request.
    assert_eq!(c.read(SIZE / 2, 1 << 20), vec![0u8; 1 << 20]);
    // A read that straddles written and unwritten bytes.
    let got = c.read(0, 8192);
    assert_eq!(&got[..4096], &[0u8; 4096][..]);
    assert_eq!(&got[4096..], &data[..4096]);
}

// Rules 56 and 64: zero-length requests get a well-formed reply and do not end the connection.
#[test]
fn zero_length_requests_get_well_formed_replies_rule_56() {
    let s = server();
    for structured_mode in [true, false] {
        let (mut c, _) = Client::connect(&s.socket, "", structured_mode, structured_mode);
        let r = c.call(0, CMD_READ, 4096, 0);
        if r.error().is_none() {
            assert!(r.read_data().is_empty());
        } else if structured_mode {
            assert!(!r.is_simple(), "READ errors are structured (rule 52)");
        }
        let h = c.req_write(0, 4096, &[]);
        c.reply(h).error(); // parsed and checked, whatever the outcome
        for kind in [CMD_TRIM, CMD_WRITE_ZEROES, CMD_CACHE, CMD_BLOCK_STATUS] {
            c.call(0, kind, 4096, 0).error();
        }
        assert_usable(&mut c);
    }
}

// Rule 56 leaves zero-length requests unspecified, but a READ of 0 bytes succeeds, and an
// empty WRITE or WRITE_ZEROES touches no storage: EIO would tell the client its disk failed.
#[test]
fn zero_length_write_and_write_zeroes_are_not_io_errors_rule_56() {
    let s = server();
    let (mut c, _) = structured(&s);
    let h = c.req_write(0, 4096, &[]);
    let write = c.reply(h).error();
    let zero = c.call(0, CMD_WRITE_ZEROES, 4096, 0).error();
    let zero_no_hole = c.call(F_NO_HOLE, CMD_WRITE_ZEROES, 4096, 0).error();
    assert_eq!(
        [write, zero, zero_no_hole].map(|e| e == Some(EIO)),
        [false; 3],
        "empty WRITE → {write:?}, WRITE_ZEROES → {zero:?}, WRITE_ZEROES|NO_HOLE → {zero_no_hole:?} (5 = EIO)"
    );
}

// Rule 52: once structured replies are on, every READ reply is structured, errors included,
// and (rule 68) errors are ERROR or ERROR_OFFSET chunks.
#[test]
fn read_errors_are_structured_error_chunks_never_simple_replies_rule_52() {
    let s = server();
    let (mut c, _) = structured(&s);
    let cases = [
        (0, SIZE - 512, 1024, EINVAL),         // past the end
        (0, SIZE, 1, EINVAL),                  // starting at the end
        (0, u64::MAX - 511, 1024, EINVAL),     // offset + length overflows u64
        (0, 0, PAYLOAD_MAX + 1, EINVAL),       // over the maximum payload
        (F_DF, 0, PAYLOAD_MAX + 1, EOVERFLOW), // the same, unfragmented
        (0x40, 0, 512, EINVAL),                // unknown flag
        (F_NO_HOLE, 0, 512, EINVAL),           // a flag of another command
    ];
    for (flags, offset, length, errno) in cases {
        let r = c.call(flags, CMD_READ, offset, length);
        for m in &r.msgs {
            let Msg::Chunk(ch) = m else { panic!("simple reply to READ {flags:#x} {offset} {length}: {r:?}") };
            assert!(matches!(ch.kind, CHUNK_ERROR | CHUNK_ERROR_OFFSET), "{r:?}");
        }
        r.assert_structured_error(errno);
    }
    assert_usable(&mut c);
}

// Rules 75, 77: one BLOCK_STATUS chunk under the negotiated context id; extents are
// non-empty, consecutive from the request offset, and stay within the request.
#[test]
fn block_status_reports_extents_under_the_negotiated_context_rule_75() {
    let s = server();
    let (mut c, e) = structured(&s);
    let id = e.context.expect("base:allocation selected");
    let written = (1u64 << 20, 65536u32);
    c.write(written.0, &pattern(written.1 as usize, 3));
    for (offset, length) in
        [(0u64, 4u32 << 20), (0, 100), (written.0 + 4096, 8192), (SIZE - 4096, 4096), (0, SIZE as u32)]
    {
        let r = c.call(0, CMD_BLOCK_STATUS, offset, length);
        let (got_id, extents) = r.block_status();
        assert_eq!(got_id, id, "context id from SET_META_CONTEXT");
        assert!(!extents.is_empty());
        let mut at = offset;
        for (i, &(len, flags)) in extents.iter().enumerate() {
            assert_ne!(len, 0, "empty extent (rule 75)");
            assert_eq!(flags & !(STATE_HOLE | STATE_ZERO), 0, "reserved status bits");
            let end = at + len as u64;
            if i + 1 < extents.len() {
                assert!(end < offset + length as u64, "only the last extent may reach the end (rule 77)");
            }
            // Written bytes are not zeros, whatever else the server may say about them.
            if at < written.0 + written.1 as u64 && end > written.0 {
                assert_eq!(flags & STATE_ZERO, 0, "written data reported as zeros: [{at}, {end})");
            }
            at = end;
        }
        assert!(at <= offset + length as u64, "extents sum past the request: {extents:?}");
        // REQ_ONE: exactly one extent, no longer than the request (rule 76).
        let (got_id, one) = c.call(F_REQ_ONE, CMD_BLOCK_STATUS, offset, length).block_status();
        assert_eq!(got_id, id);
        assert_eq!(one.len(), 1, "REQ_ONE gives one extent: {one:?}");
        assert!(one[0].0 > 0 && one[0].0 <= length);
    }
    // Rule 79: past the end is misuse.
    c.call(0, CMD_BLOCK_STATUS, SIZE - 4096, 8192).assert_structured_error(EINVAL);
}

// Rules 48 and 74: BLOCK_STATUS without a context for this export is EINVAL, in a
// structured reply when those were negotiated.
#[test]
fn block_status_without_a_context_is_einval_rule_74() {
    let s = server();
    let (mut c, _) = Client::connect(&s.socket, "", true, false);
    c.call(0, CMD_BLOCK_STATUS, 0, 4096).assert_structured_error(EINVAL);
    assert_usable(&mut c);

    // A context chosen for another export does not carry over.
    let mut c = Client::unix(&s.socket);
    c.start();
    assert_eq!(c.ask(OPT_STRUCTURED_REPLY, &[])[0].kind, REP_ACK);
    c.structured = true;
    let r = c.ask(OPT_SET_META_CONTEXT, &meta_data("other", &["base:allocation"]));
    assert_eq!(r.last().unwrap().kind, REP_ACK);
    c.go("", false, false);
    c.call(0, CMD_BLOCK_STATUS, 0, 4096).assert_structured_error(EINVAL);

    let (mut c, _) = simple(&s);
    assert_eq!(c.call(0, CMD_BLOCK_STATUS, 0, 4096).error(), Some(EINVAL));
    assert_usable(&mut c);
}

// Rule 54: an unknown command is EINVAL and the connection goes on.
#[test]
fn unknown_command_is_einval_and_connection_stays_usable_rule_54() {
    let s = server();
    for structured_mode in [true, false] {
        let (mut c, _) = Client::connect(&s.socket, "", structured_mode, structured_mode);
        for kind in [8u16, 9, 42, 0x7fff, 0xffff] {
            assert_eq!(c.call(0, kind, 0, 4096).error(), Some(EINVAL), "command {kind}");
        }
        assert_usable(&mut c);
    }
}

// Rules 55 and 82: a flag unknown, or not documented for the command, is EINVAL; a rejected
// WRITE's payload is still consumed and never written.
#[test]
fn unknown_or_misplaced_flag_is_einval_rule_55() {
    let s = server();
    let (mut c, _) = structured(&s);
    let cases = [
        (0x20u16, CMD_READ),
        (0x8000, CMD_READ),
        (F_REQ_ONE, CMD_READ),
        (F_REQ_ONE, CMD_FLUSH),
        (F_DF, CMD_TRIM),
        (F_DF, CMD_CACHE),
        (F_NO_HOLE, CMD_CACHE),
        (F_DF, CMD_WRITE_ZEROES),
        (F_DF, CMD_BLOCK_STATUS),
    ];
    for (flags, kind) in cases {
        let length = if kind == CMD_FLUSH { 0 } else { 4096 };
        assert_eq!(c.call(flags, kind, 0, length).error(), Some(EINVAL), "flags {flags:#x} on command {kind}");
    }
    for flags in [F_NO_HOLE, F_DF, F_FAST_ZERO, 0x100] {
        let h = c.req_write(flags, 8192, &pattern(4096, 7));
        assert_eq!(c.reply(h).error(), Some(EINVAL), "WRITE with flags {flags:#x}");
    }
    assert_eq!(c.read(8192, 4096), vec![0u8; 4096], "a rejected WRITE wrote");
    assert_usable(&mut c);
}

// Rule 55: with SEND_FUA advertised, FUA is accepted on every command.
#[test]
fn fua_is_accepted_on_every_command_rule_55() {
    let s = server();
    let (mut c, e) = structured(&s);
    assert_ne!(e.flags & SEND_FUA, 0);
    let data = pattern(4096, 4);
    let h = c.req_write(F_FUA, 0, &data);
    c.reply(h).assert_ok();
    let r = c.call(F_FUA, CMD_READ, 0, 4096);
    assert_eq!(r.read_data(), data);
    c.call(F_FUA, CMD_FLUSH, 0, 0).assert_ok();
    c.call(F_FUA, CMD_CACHE, 0, 4096).assert_ok();
    c.call(F_FUA, CMD_TRIM, 65536, 4096).assert_ok();
    c.call(F_FUA, CMD_WRITE_ZEROES, 0, 1024).assert_ok();
    c.call(F_FUA | F_NO_HOLE, CMD_WRITE_ZEROES, 1024, 1024).assert_ok();
    c.call(F_FUA, CMD_BLOCK_STATUS, 0, 4096).block_status();
    let mut expected = data.clone();
    expected[..2048].fill(0);
    assert_eq!(c.read(0, 4096), expected);
    let h = c.handle();
    c.send(&request(F_FUA, CMD_DISC, h, 0, 0));
    assert!(c.expect_close().is_empty());
}

// Rule 57: writes past the end are ENOSPC (payload skipped), reads and trims EINVAL, and
// nothing inside the export changes.
#[test]
fn write_past_end_is_enospc_and_read_past_end_is_einval_rule_57() {
    let s = server();
    let (mut c, _) = structured(&s);
    let tail = pattern(512, 5);
    c.write(SIZE - 512, &tail);
    let h = c.req_write(0, SIZE - 512, &pattern(1024, 6));
    assert_eq!(c.reply(h).error(), Some(ENOSPC));
    let h = c.req_write(0, SIZE, &[1]);
    assert_eq!(c.reply(h).error(), Some(ENOSPC));
    assert_eq!(c.call(0, CMD_WRITE_ZEROES, SIZE - 512, 1024).error(), Some(ENOSPC));
    c.call(0, CMD_READ, SIZE - 512, 1024).assert_structured_error(EINVAL);
    assert_eq!(c.call(0, CMD_TRIM, SIZE - 512, 1024).error(), Some(EINVAL));
    assert_eq!(c.call(0, CMD_CACHE, SIZE - 512, 1024).error(), Some(EINVAL));
    assert_eq!(c.read(SIZE - 512, 512), tail, "a refused request changed data");
}

// Rule 57: offset + length beyond u64 is refused, never wrapped around to the start.
#[test]
fn offset_plus_length_overflowing_u64_is_an_error_rule_57() {
    let s = server();
    let (mut c, _) = structured(&s);
    let head = pattern(4096, 8);
    c.write(0, &head);
    let offset = u64::MAX - 1023;
    let h = c.req_write(0, offset, &pattern(4096, 9));
    assert_eq!(c.reply(h).error(), Some(ENOSPC));
    c.call(0, CMD_READ, offset, 4096).assert_structured_error(EINVAL);
    for kind in [CMD_TRIM, CMD_WRITE_ZEROES, CMD_CACHE, CMD_BLOCK_STATUS] {
        assert!(c.call(0, kind, offset, 4096).error().is_some(), "command {kind} accepted an overflowing range");
        assert!(c.call(0, kind, u64::MAX, 1).error().is_some(), "command {kind} accepted offset u64::MAX");
    }
    assert_eq!(c.read(0, 4096), head, "an overflowing request wrapped around");
}

// Rules 57 and 58: a WRITE over 32 MiB is EINVAL without a disconnect; its payload is read
// and dropped so the next request is parsed in step.
#[test]
fn oversize_write_is_einval_and_its_payload_is_skipped_rule_58() {
    let s = server();
    for structured_mode in [true, false] {
        let (mut c, _) = Client::connect(&s.socket, "", structured_mode, structured_mode);
        let len = PAYLOAD_MAX + 1;
        // Non-zero payload that would look like requests if parsed as headers.
        let mut payload = Vec::with_capacity(len as usize);
        while payload.len() < len as usize {
            payload.extend_from_slice(&request(0, CMD_WRITE, 0x4141, 0, 16));
        }
        payload.truncate(len as usize);
        let big = c.handle();
        c.expect(big, Sent { kind: CMD_WRITE, offset: 0, length: len });
        let next = c.handle();
        c.expect(next, Sent { kind: CMD_READ, offset: 0, length: 4096 });
        let mut bytes = request(0, CMD_WRITE, big, 0, len).to_vec();
        bytes.extend_from_slice(&payload);
        bytes.extend_from_slice(&request(0, CMD_READ, next, 0, 4096));
        let writer = send_in_background(&c, bytes);
        let replies = c.replies(2);
        writer.join().unwrap();
        assert_eq!(replies[&big].error(), Some(EINVAL));
        assert_eq!(replies[&next].read_data(), vec![0u8; 4096], "oversize payload was written or misparsed");
        // Exactly the maximum is fine.
        let data = pattern(PAYLOAD_MAX as usize, 10);
        let h = c.handle();
        c.expect(h, Sent { kind: CMD_WRITE, offset: 4096, length: PAYLOAD_MAX });
        let mut bytes = request(0, CMD_WRITE, h, 4096, PAYLOAD_MAX).to_vec();
        bytes.extend_from_slice(&data);
        let writer = send_in_background(&c, bytes);
        c.reply(h).assert_ok();
        writer.join().unwrap();
        assert_eq!(c.read(4096, PAYLOAD_MAX), data);
    }
}

// Rules 57, 61, 67: a READ over 32 MiB is EINVAL, or EOVERFLOW with DF; a DF read within
// the limit comes as one content chunk.
#[test]
fn oversize_read_is_einval_and_eoverflow_with_df_rule_67() {
    let s = server();
    let (mut c, e) = structured(&s);
    assert_ne!(e.flags & SEND_DF, 0, "DF is supported with structured replies");
    c.call(0, CMD_READ, 0, PAYLOAD_MAX + 1).assert_structured_error(EINVAL);
    c.call(F_DF, CMD_READ, 0, PAYLOAD_MAX + 1).assert_structured_error(EOVERFLOW);
    c.call(F_DF, CMD_READ, 0, u32::MAX).assert_structured_error(EOVERFLOW);
    let data = pattern(65536, 11);
    c.write(1 << 20, &data);
    for (offset, length) in [(1u64 << 20, 65536u32), (0, PAYLOAD_MAX)] {
        let r = c.call(F_DF, CMD_READ, offset, length);
        let content = r
            .msgs
            .iter()
            .filter(|m| matches!(m, Msg::Chunk(ch) if ch.kind == CHUNK_OFFSET_DATA || ch.kind == CHUNK_OFFSET_HOLE))
            .count();
        assert_eq!(content, 1, "DF read in {content} chunks");
        assert!(
            matches!(&r.msgs[0], Msg::Chunk(ch) if ch.kind == CHUNK_OFFSET_DATA),
            "DF gives OFFSET_DATA with zeros written out"
        );
        let got = r.read_data();
        assert_eq!(&got[(1 << 20) - offset as usize..][..65536], &data[..]);
    }
    assert_usable(&mut c);
}

// Rules 42 and 67: SEND_DF only with structured replies; without them DF is an unknown flag.
#[test]
fn df_is_advertised_only_with_structured_replies_rule_42() {
    let s = server();
    let (_, e) = structured(&s);
    assert_ne!(e.flags & SEND_DF, 0);
    let (mut c, e) = simple(&s);
    assert_eq!(e.flags & SEND_DF, 0, "SEND_DF without structured replies");
    let r = c.call(F_DF, CMD_READ, 0, 4096);
    assert!(r.is_simple());
    assert_eq!(r.error(), Some(EINVAL));
    assert_usable(&mut c);
}

// Rules 51 and 62: without STRUCTURED_REPLY, read data follows a simple reply, and an error
// is a simple reply with no data after it.
#[test]
fn simple_reply_mode_sends_data_after_header_and_errors_without_data_rule_62() {
    let s = server();
    let (mut c, _) = simple(&s);
    let data = pattern(65536, 12);
    c.write(12345, &data);
    let h = c.req(0, CMD_READ, 12345, 65536);
    let head = c.recv(16);
    assert_eq!(&head[0..4], &SIMPLE_REPLY_MAGIC);
    assert_eq!(be32(&head[4..8]), 0);
    assert_eq!(be64(&head[8..16]), h);
    assert_eq!(c.recv(65536), data);
    let r = c.call(0, CMD_READ, SIZE - 10, 20);
    assert!(r.is_simple());
    assert_eq!(r.error(), Some(EINVAL));
    // msg() would have read 20 data bytes had the server sent them; the next reply must be
    // a fresh header.
    assert_eq!(c.read(12345, 16), data[..16]);
    for (kind, length) in [(CMD_FLUSH, 0), (CMD_TRIM, 4096), (CMD_WRITE_ZEROES, 4096), (CMD_CACHE, 4096)] {
        let r = c.call(0, kind, if length == 0 { 0 } else { 1 << 20 }, length);
        assert!(r.is_simple());
        r.assert_ok();
    }
    c.disconnect();
}

// Rules 50 and 73: many requests sent without waiting are all answered once, each with its
// own handle, in any order.
#[test]
fn pipelined_requests_are_all_answered_with_matching_handles_rule_50() {
    let s = server();
    for structured_mode in [true, false] {
        let (mut c, _) = Client::connect(&s.socket, "", structured_mode, false);
        const N: u64 = 200;
        const LEN: u32 = 4096;
        let mut bytes = Vec::new();
        let mut writes = HashMap::new();
        let mut reads = HashMap::new();
        for i in 0..N {
            let h = c.handle();
            c.expect(h, Sent { kind: CMD_WRITE, offset: i * 8192, length: LEN });
            bytes.extend_from_slice(&request(0, CMD_WRITE, h, i * 8192, LEN));
            bytes.extend_from_slice(&pattern(LEN as usize, i));
            writes.insert(h, i);
        }
        // Reads of the same blocks, plus one that fails, in a second wave.
        let second = bytes.len();
        for i in 0..N {
            let h = c.handle();
            c.expect(h, Sent { kind: CMD_READ, offset: i * 8192, length: LEN });
            bytes.extend_from_slice(&request(0, CMD_READ, h, i * 8192, LEN));
            reads.insert(h, i);
        }
        let bad = c.handle();
        c.expect(bad, Sent { kind: CMD_READ, offset: SIZE, length: LEN });
        bytes.extend_from_slice(&request(0, CMD_READ, bad, SIZE, LEN));
        // The writes must land before the reads are sent, or the reads race them.
        let writer = send_in_background(&c, bytes[..second].to_vec());
        let got = c.replies(N as usize);
        writer.join().unwrap();
        for (h, r) in &got {
            assert!(writes.contains_key(h), "reply to a handle never sent");
            r.assert_ok();
        }
        let writer = send_in_background(&c, bytes[second..].to_vec());
        let got = c.replies(N as usize + 1);
        writer.join().unwrap();
        for (h, i) in &reads {
            assert_eq!(got[h].read_data(), pattern(LEN as usize, *i), "read {i}");
        }
        assert_eq!(got[&bad].error(), Some(EINVAL));
        c.disconnect();
    }
}

// Rule 60: a read-only export refuses WRITE, TRIM and WRITE_ZEROES with EPERM.
#[test]
fn read_only_export_refuses_writes_with_eperm_rule_60() {
    let s = server();
    for structured_mode in [true, false] {
        let (mut c, e) = Client::connect(&s.socket, "ro", structured_mode, false);
        assert_ne!(e.flags & READ_ONLY, 0);
        assert_eq!(
            e.flags & (SEND_TRIM | SEND_WRITE_ZEROES | SEND_FAST_ZERO),
            0,
            "write features on a read-only export"
        );
        let h = c.req_write(0, 0, &pattern(4096, 13));
        assert_eq!(c.reply(h).error(), Some(EPERM));
        let h = c.req_write(F_FUA, 4096, &pattern(4096, 14));
        assert_eq!(c.reply(h).error(), Some(EPERM));
        assert_eq!(c.call(0, CMD_TRIM, 0, 4096).error(), Some(EPERM));
        assert_eq!(c.call(0, CMD_WRITE_ZEROES, 0, 4096).error(), Some(EPERM));
        assert_eq!(c.call(F_NO_HOLE, CMD_WRITE_ZEROES, 0, 4096).error(), Some(EPERM));
        assert_eq!(c.read(0, 8192), vec![0u8; 8192]);
        c.call(0, CMD_FLUSH, 0, 0).assert_ok();
        c.disconnect();
    }
}

// Rule 84: FAST_ZERO with NO_HOLE on a memory export (zeroing there means writing zeros)
// fails fast with ENOTSUP and leaves the data alone.
#[test]
fn fast_zero_with_no_hole_on_memory_is_enotsup_and_data_untouched_rule_84() {
    let s = server();
    let (mut c, e) = structured(&s);
    assert_ne!(e.flags & SEND_WRITE_ZEROES, 0);
    assert_ne!(e.flags & SEND_FAST_ZERO, 0);
    let data = pattern(65536, 15);
    c.write(0, &data);
    let r = c.call(F_NO_HOLE | F_FAST_ZERO, CMD_WRITE_ZEROES, 0, 65536);
    assert_eq!(r.error(), Some(ENOTSUP));
    assert_eq!(c.read(0, 65536), data, "a failed FAST_ZERO changed data");
    // Without FAST_ZERO the same request must not be ENOTSUP (rule 84) and must zero.
    c.call(F_NO_HOLE, CMD_WRITE_ZEROES, 0, 4096).assert_ok();
    assert_eq!(c.read(0, 4096), vec![0u8; 4096]);
}

// Rule 83: after WRITE_ZEROES, with or without NO_HOLE, the range reads back as zeros and
// nothing around it changes.
#[test]
fn write_zeroes_reads_back_as_zeros_rule_83() {
    let s = server();
    let (mut c, _) = structured(&s);
    let data = pattern(1 << 20, 16);
    c.write(0, &data);
    let mut expected = data.clone();
    for (flags, offset, length) in
        [(0u16, 4096u64, 4096u32), (F_NO_HOLE, 20000, 3001), (0, 100, 7), (F_FAST_ZERO, 65536, 131072)]
    {
        let r = c.call(flags, CMD_WRITE_ZEROES, offset, length);
        if flags & F_FAST_ZERO != 0 && r.error() == Some(ENOTSUP) {
            continue; // allowed to refuse, and then must not touch the data (checked below)
        }
        r.assert_ok();
        expected[offset as usize..][..length as usize].fill(0);
    }
    assert_eq!(c.read(0, 1 << 20), expected);
}

// Rule 85: DISC lets earlier requests finish and be answered, then the server closes.
#[test]
fn disc_answers_earlier_requests_then_closes_rule_85() {
    let s = server();
    for structured_mode in [true, false] {
        let (mut c, _) = Client::connect(&s.socket, "", structured_mode, false);
        let data = pattern(1 << 20, 17);
        let mut bytes = Vec::new();
        let w = c.handle();
        c.expect(w, Sent { kind: CMD_WRITE, offset: 0, length: 1 << 20 });
        bytes.extend_from_slice(&request(F_FUA, CMD_WRITE, w, 0, 1 << 20));
        bytes.extend_from_slice(&data);
        let mut reads = Vec::new();
        for i in 0..4u64 {
            let h = c.handle();
            c.expect(h, Sent { kind: CMD_READ, offset: (8 << 20) * i, length: 4 << 20 });
            bytes.extend_from_slice(&request(0, CMD_READ, h, (8 << 20) * i, 4 << 20));
            reads.push(h);
        }
        let f = c.handle();
        c.expect(f, Sent { kind: CMD_FLUSH, offset: 0, length: 0 });
        bytes.extend_from_slice(&request(0, CMD_FLUSH, f, 0, 0));
        let d = c.handle();
        bytes.extend_from_slice(&request(0, CMD_DISC, d, 0, 0));
        let writer = send_in_background(&c, bytes);
        let got = c.replies(6);
        writer.join().unwrap();
        got[&w].assert_ok();
        got[&f].assert_ok();
        for h in &reads {
            assert_eq!(got[h].read_data().len(), 4 << 20);
        }
        assert!(c.expect_close().is_empty(), "DISC has no reply");
    }
    let (mut c, _) = simple(&s);
    assert_eq!(c.read(0, 4096), pattern(1 << 20, 17)[..4096]);
}

// Rule 53: a request without the request magic cannot be framed; the server disconnects
// (after answering what came before).
#[test]
fn bad_request_magic_disconnects_rule_53() {
    let s = server();
    // The old request magic, the reply magics, and the reserved transaction-log magic.
    for magic in [0x1256_0953u32, 0x6744_6698, 0x668e_33ef, 0x2560_9514, 0] {
        let (mut c, _) = structured(&s);
        let h = c.req(0, CMD_READ, 0, 4096);
        let mut bad = request(0, CMD_READ, 99, 0, 4096);
        bad[0..4].copy_from_slice(&magic.to_be_bytes());
        c.send(&bad);
        assert_eq!(c.reply(h).read_data(), vec![0u8; 4096]);
        assert!(c.expect_close().is_empty(), "magic {magic:#x} was answered");
    }
    assert!(Client::connect(&s.socket, "", true, true).0.read(0, 512).len() == 512);
}
