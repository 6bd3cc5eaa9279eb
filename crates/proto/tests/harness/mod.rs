//! The two fuzz harness bodies, shared by the cargo-fuzz targets in `fuzz/fuzz_targets/`
//! (which include this file with `#[path]`) and by `tests/random_input.rs`, which runs them
//! on pseudo-random input in every `cargo test`. Each takes arbitrary bytes, must never
//! panic on its own, and asserts what must hold whatever a hostile peer sends.
//!
//! Only `std` and `sluice_proto`: the fuzz crate has no other dependency to offer.
#![allow(dead_code)] // each includer uses one of the two bodies

use sluice_proto::errno::Errno;
use sluice_proto::handshake::{Catalog, ExportSummary, Handshake, Negotiated, Next};
use sluice_proto::limits::{OPTIONS_PER_HANDSHAKE_MAX, OPTION_DATA_MAX_BYTES, STRING_MAX_BYTES};
use sluice_proto::reply;
use sluice_proto::request::{validate, Command, RawRequest, Refusal, Session};
use sluice_proto::wire::*;

// =======================================================================================
// Handshake
// =======================================================================================

/// Export names the catalog knows; input generators use them to reach the success paths.
pub const EXPORT_NAMES: [&str; 3] = ["", "disk", "ro"];

/// A couple of exports with different shapes: a default one, one with a description and a
/// SEND_DF flag the handshake must hide until structured replies are on, and an empty
/// read-only one.
pub struct FuzzCatalog;

impl Catalog for FuzzCatalog {
    fn lookup(&self, name: &str) -> Option<ExportSummary> {
        let (size, flags, description) = match name {
            "" => (1 << 20, FLAG_SEND_FLUSH | FLAG_SEND_FUA, None),
            "disk" => (1 << 40, FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_DF, Some("a disk")),
            "ro" => (0, FLAG_READ_ONLY, Some("")),
            _ => return None,
        };
        Some(ExportSummary {
            size,
            flags,
            description: description.map(str::to_owned),
            block_min: 1,
            block_preferred: 4096,
            block_max: 32 << 20,
            identity: None,
        })
    }

    fn list(&self) -> Vec<(String, Option<String>)> {
        EXPORT_NAMES.iter().map(|n| (n.to_string(), self.lookup(n).unwrap().description)).collect()
    }
}

/// What the machine was reading when it got the last input.
#[derive(Clone, Copy, Debug)]
enum Phase {
    ClientFlags,
    OptionHeader,
    OptionData { option: u32 },
}

/// Feeds `input` to a handshake the way a socket loop would, honouring every `Next::Read`,
/// and checks each reply. Stops where the input runs out, as a client hanging up would.
pub fn handshake(input: &[u8]) {
    let catalog = FuzzCatalog;
    let mut hs = Handshake::new();
    let mut next = Handshake::start();
    let mut phase = Phase::ClientFlags;
    let mut rest = input;
    let mut no_zeroes = false;
    let mut structured = false;
    let mut options = 0u32;

    while let Next::Read(n) = next {
        assert!(n <= OPTION_DATA_MAX_BYTES as usize, "asked for {n} bytes");
        if rest.len() < n {
            return;
        }
        let (now, tail) = rest.split_at(n);
        rest = tail;
        let mut out = Vec::new();
        next = hs.input(now, &catalog, &mut out);

        phase = match phase {
            Phase::ClientFlags => {
                let flags = u32::from_be_bytes(now.try_into().unwrap());
                assert!(out.is_empty(), "client flags are never answered");
                let acceptable = flags & FLAG_C_FIXED_NEWSTYLE != 0 && flags & !CLIENT_FLAGS_KNOWN == 0;
                if !acceptable {
                    assert!(matches!(next, Next::Close { .. }), "flags {flags:#x} accepted: {next:?}");
                    break;
                }
                assert_eq!(next, Next::Read(OPTION_HEADER_BYTES));
                no_zeroes = flags & FLAG_C_NO_ZEROES != 0;
                Phase::OptionHeader
            }
            Phase::OptionHeader => {
                let magic = u64::from_be_bytes(now[0..8].try_into().unwrap());
                let option = u32::from_be_bytes(now[8..12].try_into().unwrap());
                let length = u32::from_be_bytes(now[12..16].try_into().unwrap());
                if magic != IHAVEOPT {
                    assert!(out.is_empty() && matches!(next, Next::Close { .. }), "bad magic {magic:#x}: {next:?}");
                    break;
                }
                options += 1;
                if length > OPTION_DATA_MAX_BYTES || options > OPTIONS_PER_HANDSHAKE_MAX {
                    assert!(matches!(next, Next::Close { .. }), "{next:?}");
                    let replies = option_replies(&out, option);
                    assert_eq!(replies.len(), 1);
                    assert_eq!(replies[0].0, REP_ERR_TOO_BIG);
                    break;
                }
                assert!(out.is_empty(), "a header alone is never answered");
                assert_eq!(next, Next::Read(length as usize));
                Phase::OptionData { option }
            }
            Phase::OptionData { option } => {
                check_option_outcome(option, now, &out, &next, no_zeroes, &mut structured);
                Phase::OptionHeader
            }
        };
    }

    // Whatever ended the handshake, the machine must refuse to parse anything more, even a
    // well-formed option header.
    let mut header = [0u8; OPTION_HEADER_BYTES];
    header[0..8].copy_from_slice(&IHAVEOPT.to_be_bytes());
    header[8..12].copy_from_slice(&OPT_LIST.to_be_bytes());
    let mut out = Vec::new();
    let after = hs.input(&header, &catalog, &mut out);
    assert!(matches!(after, Next::Close { .. }), "input accepted after {next:?}: {after:?}");
    assert!(out.is_empty());
}

/// Checks what the machine did with one option's data.
fn check_option_outcome(option: u32, data: &[u8], out: &[u8], next: &Next, no_zeroes: bool, structured: &mut bool) {
    match next {
        Next::Read(n) => {
            assert_eq!(*n, OPTION_HEADER_BYTES, "after option {option}");
            assert!(option != OPT_EXPORT_NAME && option != OPT_ABORT, "option {option} did not end the handshake");
            let replies = option_replies(out, option);
            check_reply_sequence(option, &replies, *structured);
            if option == OPT_STRUCTURED_REPLY && replies[0].0 == REP_ACK {
                assert!(!*structured, "structured replies acknowledged twice");
                *structured = true;
            }
            if option == OPT_EXTENDED_HEADERS && replies[0].0 == REP_ACK {
                // Extended headers imply structured replies (and may upgrade them).
                *structured = true;
            }
        }
        Next::Close { .. } => match option {
            OPT_ABORT => assert_eq!(option_replies(out, option), vec![(REP_ACK, Vec::new())]),
            // A failed EXPORT_NAME can only hang up: there is no error reply for it.
            OPT_EXPORT_NAME => assert!(out.is_empty(), "EXPORT_NAME failure wrote {} bytes", out.len()),
            _ => panic!("option {option} closed the connection"),
        },
        Next::StartTls => panic!("STARTTLS accepted by a server with TLS off"),
        Next::Transmission(negotiated) => {
            check_negotiated(negotiated, *structured);
            let summary = FuzzCatalog.lookup(&negotiated.export).expect("transmission on an export that exists");
            assert_eq!(negotiated.summary, summary);
            match option {
                OPT_EXPORT_NAME => {
                    assert_eq!(data, negotiated.export.as_bytes());
                    let expected_len = if no_zeroes { 10 } else { 10 + EXPORT_NAME_PADDING_BYTES };
                    assert_eq!(out.len(), expected_len);
                    assert_eq!(out[0..8], summary.size.to_be_bytes());
                    assert_eq!(out[8..10], negotiated.flags.to_be_bytes());
                    assert!(out[10..].iter().all(|&b| b == 0));
                }
                OPT_GO => {
                    let replies = option_replies(out, option);
                    check_reply_sequence(option, &replies, *structured);
                    assert_eq!(replies.last().unwrap().0, REP_ACK, "GO succeeded without ACK");
                    // INFO_EXPORT describes exactly what transmission will use.
                    let export = &replies[0].1;
                    assert_eq!(export[2..10], summary.size.to_be_bytes());
                    assert_eq!(export[10..12], negotiated.flags.to_be_bytes());
                }
                _ => panic!("option {option} started transmission"),
            }
        }
    }
}

/// Splits output into (reply type, data), asserting the option reply magic, the echoed
/// option number and lengths that add up exactly.
fn option_replies(mut out: &[u8], option: u32) -> Vec<(u32, Vec<u8>)> {
    let mut replies = Vec::new();
    while !out.is_empty() {
        assert!(out.len() >= 20, "truncated reply header");
        assert_eq!(u64::from_be_bytes(out[0..8].try_into().unwrap()), OPTION_REPLY_MAGIC);
        assert_eq!(u32::from_be_bytes(out[8..12].try_into().unwrap()), option, "reply echoes the option");
        let kind = u32::from_be_bytes(out[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(out.len() >= 20 + len, "reply length runs past the output");
        replies.push((kind, out[20..20 + len].to_vec()));
        out = &out[20 + len..];
    }
    replies
}

fn is_error(kind: u32) -> bool {
    kind & (1 << 31) != 0
}

/// A string the server sends: UTF-8, no NUL, at most 4096 bytes.
fn check_string(bytes: &[u8]) {
    assert!(bytes.len() <= STRING_MAX_BYTES, "string of {} bytes", bytes.len());
    let s = std::str::from_utf8(bytes).expect("strings are UTF-8");
    assert!(!s.contains('\0'), "string contains NUL");
}

/// The replies to one option: informational replies, then exactly one ACK or error last.
fn check_reply_sequence(option: u32, replies: &[(u32, Vec<u8>)], structured: bool) {
    let Some(((last, last_data), informational)) = replies.split_last() else {
        panic!("option {option} got no reply");
    };
    if is_error(*last) {
        // Errors come alone: no half-sent INFO before ERR_UNKNOWN.
        assert_eq!(replies.len(), 1, "error after other replies");
        check_string(last_data);
        return;
    }
    assert_eq!(*last, REP_ACK, "option {option} ends with {last:#x}");
    assert!(last_data.is_empty(), "ACK carries data");
    let mut info_types = Vec::new();
    for (kind, data) in informational {
        match *kind {
            REP_SERVER => {
                assert_eq!(option, OPT_LIST);
                assert!(data.len() >= 4, "REP_SERVER without a name length");
                let name_len = u32::from_be_bytes(data[0..4].try_into().unwrap()) as usize;
                assert!(name_len <= data.len() - 4);
                check_string(&data[4..4 + name_len]);
                check_string(&data[4 + name_len..]);
            }
            REP_INFO => {
                assert!(option == OPT_INFO || option == OPT_GO);
                assert!(data.len() >= 2, "REP_INFO without a type");
                let info = u16::from_be_bytes(data[0..2].try_into().unwrap());
                assert!(!info_types.contains(&info), "info {info} sent twice");
                info_types.push(info);
                match info {
                    INFO_EXPORT => {
                        assert_eq!(data.len(), 12);
                        let flags = u16::from_be_bytes(data[10..12].try_into().unwrap());
                        assert_ne!(flags & FLAG_HAS_FLAGS, 0);
                        assert_eq!(flags & FLAG_SEND_DF != 0, structured, "SEND_DF iff structured replies");
                    }
                    INFO_NAME | INFO_DESCRIPTION => check_string(&data[2..]),
                    INFO_BLOCK_SIZE => {
                        // FuzzCatalog's min 1, preferred 4096, max 32 MiB.
                        let mut expected = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                        for v in [1u32, 4096, 32 << 20] {
                            expected.extend_from_slice(&v.to_be_bytes());
                        }
                        assert_eq!(*data, expected, "INFO_BLOCK_SIZE");
                    }
                    other => panic!("unknown info type {other}"),
                }
            }
            REP_META_CONTEXT => {
                assert!(option == OPT_LIST_META_CONTEXT || option == OPT_SET_META_CONTEXT);
                assert!(data.len() >= 4, "REP_META_CONTEXT without an id");
                let id = u32::from_be_bytes(data[0..4].try_into().unwrap());
                if option == OPT_SET_META_CONTEXT {
                    assert!(structured, "context set before structured replies");
                    assert_ne!(id, 0);
                } else {
                    assert_eq!(id, 0, "LIST replies carry id 0");
                }
                check_string(&data[4..]);
                assert!(std::str::from_utf8(&data[4..]).unwrap().contains(':'));
            }
            other => panic!("unexpected reply type {other:#x} to option {option}"),
        }
    }
    if option == OPT_INFO || option == OPT_GO {
        assert_eq!(info_types.first(), Some(&INFO_EXPORT), "INFO_EXPORT is always sent, first");
        // Requested or not, the block size constraints are advertised, after the rest.
        assert_eq!(info_types.last(), Some(&INFO_BLOCK_SIZE), "INFO_BLOCK_SIZE is always sent, last");
    }
}

fn check_negotiated(n: &Negotiated, structured: bool) {
    assert_eq!(n.structured, structured);
    assert_ne!(n.flags & FLAG_HAS_FLAGS, 0);
    assert_eq!(n.flags & FLAG_SEND_DF != 0, structured, "SEND_DF iff structured replies");
    assert_eq!(n.flags & !FLAG_SEND_DF, (n.summary.flags | FLAG_HAS_FLAGS) & !FLAG_SEND_DF);
    if n.base_allocation.is_some() {
        assert!(structured, "a metadata context without structured replies");
    }
}

// =======================================================================================
// Requests
// =======================================================================================

/// Bytes of input that describe the session, ahead of the requests.
pub const SESSION_BYTES: usize = 19;

/// The session layout the request harness reads: size(8) flags(2) bits(1) context_id(4)
/// payload_max(4). `bits`: 1 = structured, 2 = base:allocation selected, 4 = extended
/// headers (then structured too).
pub fn encode_session(s: &Session) -> [u8; SESSION_BYTES] {
    let mut b = [0u8; SESSION_BYTES];
    b[0..8].copy_from_slice(&s.size.to_be_bytes());
    b[8..10].copy_from_slice(&s.flags.to_be_bytes());
    b[10] = s.structured as u8 | (s.base_allocation.is_some() as u8) << 1 | (s.extended as u8) << 2;
    b[11..15].copy_from_slice(&s.base_allocation.unwrap_or(0).to_be_bytes());
    b[15..19].copy_from_slice(&s.payload_max_bytes.to_be_bytes());
    b
}

pub fn decode_session(b: &[u8; SESSION_BYTES]) -> Session {
    Session {
        size: u64::from_be_bytes(b[0..8].try_into().unwrap()),
        flags: u16::from_be_bytes(b[8..10].try_into().unwrap()),
        structured: b[10] & 5 != 0,
        extended: b[10] & 4 != 0,
        base_allocation: (b[10] & 2 != 0).then(|| u32::from_be_bytes(b[11..15].try_into().unwrap())),
        payload_max_bytes: u32::from_be_bytes(b[15..19].try_into().unwrap()),
    }
}

/// Flags the spec documents for a command, given what the session advertised.
fn documented_flags(kind: u16, s: &Session) -> u16 {
    let payload_len = if s.extended { CMD_FLAG_PAYLOAD_LEN } else { 0 };
    CMD_FLAG_FUA
        | payload_len
        | match kind {
            CMD_READ if s.flags & FLAG_SEND_DF != 0 => CMD_FLAG_DF,
            CMD_WRITE_ZEROES => CMD_FLAG_NO_HOLE | CMD_FLAG_FAST_ZERO,
            CMD_BLOCK_STATUS => CMD_FLAG_REQ_ONE,
            _ => 0,
        }
}

/// Reads a session from the start of `input`, then decodes and validates each following
/// request header (28 bytes, or 32 with extended headers) against it.
pub fn request(input: &[u8]) {
    let Some((head, body)) = input.split_first_chunk::<SESSION_BYTES>() else { return };
    let session = decode_session(head);
    let (size, want) = if session.extended {
        (EXTENDED_REQUEST_BYTES, EXTENDED_REQUEST_MAGIC)
    } else {
        (REQUEST_BYTES, REQUEST_MAGIC)
    };
    for chunk in body.chunks_exact(size) {
        let magic = u32::from_be_bytes(chunk[0..4].try_into().unwrap());
        match RawRequest::decode_as(chunk, session.extended) {
            Err(bad) => {
                assert_ne!(magic, want);
                assert_eq!(bad.0, magic);
            }
            Ok(raw) => {
                assert_eq!(magic, want);
                let again = if session.extended { raw.encode_extended().to_vec() } else { raw.encode().to_vec() };
                assert_eq!(again, chunk, "encode inverts decode");
                check_validation(&raw, &session);
            }
        }
    }
}

fn check_validation(raw: &RawRequest, s: &Session) {
    let in_bounds = raw.offset.checked_add(raw.length).is_some_and(|end| end <= s.size);
    let flag = |f: u16| raw.flags & f != 0;
    let max = s.payload_max_bytes as u64;
    match validate(raw, s) {
        Ok(req) => {
            assert_eq!(req.handle, raw.handle);
            assert_eq!(raw.flags & !documented_flags(raw.kind, s), 0, "undocumented flag accepted: {raw:?}");
            let writes =
                matches!(req.command, Command::Write { .. } | Command::Trim { .. } | Command::WriteZeroes { .. });
            assert!(!(writes && s.read_only()), "write accepted on a read-only export: {raw:?}");
            let range = match req.command {
                Command::Read { range, whole } => {
                    assert_eq!((raw.kind, whole), (CMD_READ, flag(CMD_FLAG_DF)));
                    assert!(raw.length <= max);
                    assert!(!flag(CMD_FLAG_PAYLOAD_LEN), "a read with a payload accepted");
                    Some(range)
                }
                Command::Write { range, fua } => {
                    assert_eq!((raw.kind, fua), (CMD_WRITE, flag(CMD_FLAG_FUA)));
                    assert!(raw.length <= max);
                    assert_eq!(raw.payload_len(s.extended), raw.length, "a write's payload is its length");
                    Some(range)
                }
                Command::Trim { range, fua } => {
                    assert_eq!((raw.kind, fua), (CMD_TRIM, flag(CMD_FLAG_FUA)));
                    assert_ne!(s.flags & FLAG_SEND_TRIM, 0);
                    Some(range)
                }
                Command::Cache { range } => {
                    assert_eq!(raw.kind, CMD_CACHE);
                    assert_ne!(s.flags & FLAG_SEND_CACHE, 0);
                    Some(range)
                }
                Command::WriteZeroes { range, fua, may_trim, fast } => {
                    assert_eq!(raw.kind, CMD_WRITE_ZEROES);
                    assert_eq!(
                        (fua, may_trim, fast),
                        (flag(CMD_FLAG_FUA), !flag(CMD_FLAG_NO_HOLE), flag(CMD_FLAG_FAST_ZERO))
                    );
                    assert_ne!(s.flags & FLAG_SEND_WRITE_ZEROES, 0);
                    if fast {
                        assert_ne!(s.flags & FLAG_SEND_FAST_ZERO, 0);
                    }
                    Some(range)
                }
                Command::BlockStatus { range, context_id, one } => {
                    assert_eq!((raw.kind, one), (CMD_BLOCK_STATUS, flag(CMD_FLAG_REQ_ONE)));
                    assert_eq!(Some(context_id), s.base_allocation);
                    assert_ne!(range.length, 0);
                    Some(range)
                }
                Command::Flush => {
                    assert_eq!(raw.kind, CMD_FLUSH);
                    assert_ne!(s.flags & FLAG_SEND_FLUSH, 0);
                    None
                }
                Command::Disconnect => {
                    assert_eq!(raw.kind, CMD_DISC);
                    None
                }
            };
            if let Some(range) = range {
                assert_eq!((range.offset, range.length), (raw.offset, raw.length));
                assert!(in_bounds, "accepted range outside the export: {raw:?} size {}", s.size);
                assert!(range.end() <= s.size);
            }
        }
        Err(Refusal::Disconnect(why)) => {
            // Only the framing rules of extended headers end a connection.
            assert!(s.extended, "{raw:?} ended a compact connection: {why}");
            assert!(raw.payload_len(true) > max, "{raw:?}: {why}");
        }
        Err(Refusal::Reply(rej)) => {
            assert_eq!(rej.handle, raw.handle);
            // The payload of a rejected request is still on the wire and must be skipped.
            let expected_discard = raw.payload_len(s.extended);
            assert!(expected_discard <= max || !s.extended, "a payload past the maximum is never read");
            assert_eq!(rej.discard, expected_discard, "{raw:?} -> {rej:?}");
            let write_kind = matches!(raw.kind, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES);
            match rej.errno {
                Errno::Inval => {}
                Errno::Perm => assert!(write_kind && s.read_only(), "EPERM for {raw:?}"),
                Errno::NoSpc => {
                    assert!(matches!(raw.kind, CMD_WRITE | CMD_WRITE_ZEROES) && !in_bounds, "ENOSPC for {raw:?}")
                }
                Errno::Overflow => assert!(
                    raw.kind == CMD_READ && flag(CMD_FLAG_DF) && raw.length > max,
                    "EOVERFLOW for {raw:?}"
                ),
                other => panic!("validate answered {other} to {raw:?}"),
            }
            // The error must be expressible in both reply forms.
            let simple = reply::simple(rej.handle, Some(rej.errno));
            assert_eq!(simple[4..8], rej.errno.code().to_be_bytes());
            let mut chunk = Vec::new();
            let to = reply::ReplyTo { handle: rej.handle, offset: raw.offset, extended: s.extended };
            reply::error_chunk(&mut chunk, to, rej.errno, rej.reason, None);
            assert_eq!(chunk.len(), to.header_bytes() + 6 + rej.reason.len());
        }
    }
}

// =======================================================================================
// Server messages, as the client decodes them
// =======================================================================================

/// The first byte picks a decoder of what a server sends; the rest is its input. Decoders
/// must return `Malformed` rather than panic, and whatever they accept must be sane.
pub fn server_message(input: &[u8]) {
    use sluice_proto::client::*;
    let Some((&which, p)) = input.split_first() else { return };
    match which % 8 {
        0 => {
            if let Ok(b) = <&[u8; GREETING_BYTES]>::try_from(p) {
                if let Ok(flags) = decode_greeting(b) {
                    assert_eq!(u16::from_be_bytes([p[16], p[17]]), flags);
                }
            }
        }
        1 => {
            if let Ok(b) = <&[u8; OPTION_REPLY_BYTES]>::try_from(p) {
                if let Ok(r) = OptionReply::decode(b) {
                    assert_eq!(r.is_error(), r.kind & (1 << 31) != 0);
                }
            }
        }
        2 => {
            if let Ok((name, description)) = decode_server_entry(p) {
                assert!(name.len() <= STRING_MAX_BYTES * 3 && !name.contains('\0'));
                assert!(description.is_none_or(|d| !d.is_empty() && !d.contains('\0')));
            }
        }
        3 => match decode_info(p) {
            Ok(Info::BlockSize { min, preferred, max }) => {
                assert!(min.is_power_of_two() && min <= 65536 && preferred >= min && max >= min);
            }
            Ok(Info::Export { .. }) => assert_eq!(p.len(), 12),
            Ok(Info::Name(s) | Info::Description(s)) => assert!(!s.contains('\0')),
            Ok(Info::Unknown(kind)) => assert!(kind > INFO_BLOCK_SIZE),
            Err(_) => {}
        },
        4 => {
            if let Ok((_, name)) = decode_meta_context(p) {
                assert!(!name.contains('\0'));
            }
        }
        5 => {
            for kind in [REPLY_TYPE_ERROR, REPLY_TYPE_ERROR_OFFSET, 0x8007] {
                if let Ok(e) = decode_error_chunk(kind, p) {
                    assert!(e.code != 0 && !e.message.contains('\0'));
                    assert_eq!(e.offset.is_some(), kind == REPLY_TYPE_ERROR_OFFSET);
                }
            }
        }
        6 => {
            if let Ok((_, extents)) = decode_block_status(p) {
                assert!(!extents.is_empty() && extents.len() * 8 + 4 == p.len());
            }
            if let Ok((_, extents)) = decode_block_status_ext(p) {
                assert!(!extents.is_empty() && extents.len() * 16 + 8 == p.len());
                assert_eq!(u32::from_be_bytes(p[4..8].try_into().unwrap()) as usize, extents.len());
            }
        }
        _ => {
            if let Ok((_, len)) = decode_offset_hole(p) {
                assert_eq!(p.len(), 12);
                let _ = len;
            }
            if let Ok(h) = <&[u8; CHUNK_HEADER_BYTES - 4]>::try_from(p) {
                let c = ChunkHeader::decode(h);
                assert_eq!(c.done(), c.flags & REPLY_FLAG_DONE != 0);
            }
            if let Ok(h) = <&[u8; EXTENDED_REPLY_BYTES - 4]>::try_from(p) {
                let c = ChunkHeader::decode_extended(h);
                assert_eq!(c.len, u64::from_be_bytes(p[20..28].try_into().unwrap()));
            }
        }
    }
}
