//! The fixed-newstyle handshake, one message at a time, checked against bytes worked out by
//! hand from the layouts in the NBD spec (doc/proto.md, "Option haggling").

mod common;

use common::*;
use sluice_proto::handshake::{Handshake, Next, BASE_ALLOCATION_ID};
use sluice_proto::limits::{OPTIONS_PER_HANDSHAKE_MAX, OPTION_DATA_MAX_BYTES, STRING_MAX_BYTES};
use sluice_proto::wire::*;

/// 1 MiB as a big-endian u64.
const DISK_SIZE_BYTES: [u8; 8] = [0, 0, 0, 0, 0, 0x10, 0, 0];
/// HAS_FLAGS | SEND_FLUSH | SEND_FUA.
const DISK_TFLAGS: [u8; 2] = [0x00, 0x0d];
/// The same plus SEND_DF (bit 7), once structured replies are negotiated.
const DISK_TFLAGS_DF: [u8; 2] = [0x00, 0x8d];

// ---------------------------------------------------------------------------------------
// Greeting and client flags
// ---------------------------------------------------------------------------------------

#[test]
fn greeting_is_nbdmagic_ihaveopt_then_fixed_newstyle_and_no_zeroes() {
    let mut expected = b"NBDMAGIC".to_vec();
    expected.extend_from_slice(b"IHAVEOPT");
    expected.extend_from_slice(&[0x00, 0x03]);
    assert_eq!(Handshake::greeting().to_vec(), expected);
}

#[test]
fn handshake_starts_by_reading_four_bytes_of_client_flags() {
    assert_eq!(Handshake::start(), Next::Read(4));
}

#[test]
fn fixed_newstyle_client_flags_lead_to_an_option_header_read() {
    for flags in [FLAG_C_FIXED_NEWSTYLE, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES] {
        let d = Driver::fixed_with(TestCatalog::standard(), flags);
        d.assert_continues();
    }
}

#[test]
fn non_fixed_newstyle_client_is_closed() {
    // Without the fixed bit a client could only use EXPORT_NAME and we could never send an
    // error; sluice does not serve such clients.
    for flags in [0u32, FLAG_C_NO_ZEROES] {
        let mut d = Driver::new(TestCatalog::standard());
        let out = d.send(&flags.to_be_bytes());
        assert!(out.is_empty());
        d.assert_closed();
    }
}

#[test]
fn unknown_client_flags_close_the_connection() {
    // Spec: an unknown client flag bit means the client expects something we cannot give.
    for extra in [1u32 << 2, 1 << 15, 1 << 31] {
        let mut d = Driver::new(TestCatalog::standard());
        let out = d.send(&(FLAG_C_FIXED_NEWSTYLE | extra).to_be_bytes());
        assert!(out.is_empty());
        d.assert_closed();
    }
}

#[test]
fn bad_option_magic_closes_without_a_reply() {
    let mut d = Driver::fixed();
    let mut header = option(OPT_LIST, &[]);
    header[0..8].copy_from_slice(b"IHAVEOPS");
    let out = d.send(&header);
    assert!(out.is_empty(), "no reply can be trusted to reach an out-of-sync client");
    d.assert_closed();
}

#[test]
fn wrong_sized_input_is_closed_rather_than_misparsed() {
    // The caller must pass exactly what Read asked for; anything else is a caller bug that
    // the machine reports instead of panicking.
    let mut hs = Handshake::new();
    let mut out = Vec::new();
    let catalog = TestCatalog::standard();
    assert!(matches!(hs.input(&[0, 0, 1], &catalog, &mut out), Next::Close { .. }));

    let mut d = Driver::fixed();
    let mut out = Vec::new();
    assert!(matches!(d.hs.input(&option(OPT_LIST, &[])[..15], &d.catalog, &mut out), Next::Close { .. }));
    assert!(out.is_empty());
}

// ---------------------------------------------------------------------------------------
// EXPORT_NAME
// ---------------------------------------------------------------------------------------

#[test]
fn export_name_reply_is_size_flags_and_124_zero_bytes() {
    let mut d = Driver::fixed();
    let out = d.send(&option(OPT_EXPORT_NAME, b"disk"));
    let mut expected = DISK_SIZE_BYTES.to_vec();
    expected.extend_from_slice(&DISK_TFLAGS);
    expected.extend_from_slice(&[0u8; 124]);
    assert_eq!(out, expected);
    assert_eq!(out.len(), 134);

    let n = d.negotiated();
    assert_eq!(n.export, "disk");
    assert_eq!(n.summary.size, DISK_SIZE);
    assert_eq!(n.flags, 0x000d);
    assert!(!n.structured);
    assert_eq!(n.base_allocation, None);
}

#[test]
fn export_name_reply_drops_the_zero_bytes_when_the_client_sent_no_zeroes() {
    // The server always advertises NO_ZEROES, so the client's flag alone decides.
    let mut d = Driver::fixed_with(TestCatalog::standard(), FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let out = d.send(&option(OPT_EXPORT_NAME, b"disk"));
    let mut expected = DISK_SIZE_BYTES.to_vec();
    expected.extend_from_slice(&DISK_TFLAGS);
    assert_eq!(out, expected);
    assert_eq!(d.negotiated().export, "disk");
}

#[test]
fn export_name_empty_selects_the_default_export() {
    let mut d = Driver::fixed_with(TestCatalog::standard(), FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let out = d.send(&option(OPT_EXPORT_NAME, b""));
    // 4096 bytes, HAS_FLAGS | READ_ONLY.
    assert_eq!(out, [0, 0, 0, 0, 0, 0, 0x10, 0, 0x00, 0x03]);
    assert_eq!(d.negotiated().export, "");
}

#[test]
fn export_name_after_structured_reply_carries_send_df_and_structured() {
    let mut d = Driver::fixed_with(TestCatalog::standard(), FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    d.structured();
    let out = d.send(&option(OPT_EXPORT_NAME, b"disk"));
    let mut expected = DISK_SIZE_BYTES.to_vec();
    expected.extend_from_slice(&DISK_TFLAGS_DF);
    assert_eq!(out, expected);
    assert!(d.negotiated().structured);
    assert_eq!(d.negotiated().flags, 0x008d);
}

#[test]
fn export_name_for_an_unknown_export_closes_without_a_reply() {
    // EXPORT_NAME has no error reply: the spec requires a hard disconnect.
    let mut d = Driver::fixed();
    let out = d.send(&option(OPT_EXPORT_NAME, b"nope"));
    assert!(out.is_empty());
    d.assert_closed();
}

#[test]
fn export_name_that_is_not_utf8_or_too_long_closes() {
    let long = "a".repeat(STRING_MAX_BYTES);
    let catalog = || TestCatalog::with(vec![(long.as_str(), summary(512, 0, None))]);

    // The longest name the spec allows is served...
    let mut d = Driver::fixed_with(catalog(), FLAG_C_FIXED_NEWSTYLE);
    d.send(&option(OPT_EXPORT_NAME, long.as_bytes()));
    assert_eq!(d.negotiated().export, long);

    // ...one byte more, or a byte that is not UTF-8, ends the connection.
    let longer = "a".repeat(STRING_MAX_BYTES + 1);
    for name in [longer.as_bytes(), b"\xff\xfe", b"disk\xc3"] {
        let mut d = Driver::fixed_with(catalog(), FLAG_C_FIXED_NEWSTYLE);
        let out = d.send(&option(OPT_EXPORT_NAME, name));
        assert!(out.is_empty());
        d.assert_closed();
    }
}

// ---------------------------------------------------------------------------------------
// LIST
// ---------------------------------------------------------------------------------------

#[test]
fn list_sends_one_server_reply_per_export_with_description_then_ack() {
    let mut d = Driver::fixed();
    let out = d.send(&option(OPT_LIST, &[]));

    // REP_SERVER data: name_len(4) name description.
    let mut disk = vec![0, 0, 0, 4];
    disk.extend_from_slice(b"disk");
    disk.extend_from_slice(DISK_DESCRIPTION.as_bytes());
    let mut expected = reply_bytes(OPT_LIST, REP_SERVER, &disk);
    expected.extend(reply_bytes(OPT_LIST, REP_SERVER, &[0, 0, 0, 0]));
    expected.extend(reply_bytes(OPT_LIST, REP_ACK, &[]));
    assert_eq!(out, expected);
    d.assert_continues();
}

#[test]
fn list_of_an_empty_catalog_is_just_ack() {
    let mut d = Driver::fixed_with(TestCatalog::with(vec![]), FLAG_C_FIXED_NEWSTYLE);
    assert_eq!(d.option(OPT_LIST, &[]), vec![ack(OPT_LIST)]);
    d.assert_continues();
}

#[test]
fn list_with_data_is_invalid_and_the_handshake_continues() {
    let mut d = Driver::fixed();
    let replies = d.option(OPT_LIST, b"x");
    assert_single_error(&replies, OPT_LIST, REP_ERR_INVALID);
    d.assert_continues();
}

// ---------------------------------------------------------------------------------------
// INFO and GO
// ---------------------------------------------------------------------------------------

/// REP_INFO INFO_EXPORT for "disk": type(2) size(8) flags(2).
fn disk_info_export(tflags: [u8; 2]) -> Vec<u8> {
    let mut data = vec![0, 0];
    data.extend_from_slice(&DISK_SIZE_BYTES);
    data.extend_from_slice(&tflags);
    data
}

/// REP_INFO INFO_BLOCK_SIZE for the test catalog's exports: type 3, then min 1, preferred
/// 4096 and max 32 MiB (33554432), each a big-endian u32.
const BLOCK_SIZE_INFO: [u8; 14] = [0, 3, 0, 0, 0, 1, 0, 0, 0x10, 0, 0x02, 0, 0, 0];

/// The info type of each REP_INFO in `replies`, in order.
fn info_types(replies: &[OptReply]) -> Vec<u16> {
    replies.iter().filter(|r| r.kind == REP_INFO).map(|r| u16::from_be_bytes([r.data[0], r.data[1]])).collect()
}

#[test]
fn info_without_requests_sends_info_export_and_block_size_then_ack() {
    // The 32 MiB maximum is stricter than the spec's default, so the sizes are advertised
    // even to a client that did not ask for them.
    let mut d = Driver::fixed();
    let out = d.send(&option(OPT_INFO, &info_data(b"disk", &[])));
    let mut expected = reply_bytes(OPT_INFO, REP_INFO, &disk_info_export(DISK_TFLAGS));
    expected.extend(reply_bytes(OPT_INFO, REP_INFO, &BLOCK_SIZE_INFO));
    expected.extend(reply_bytes(OPT_INFO, REP_ACK, &[]));
    assert_eq!(out, expected);
    d.assert_continues();
}

#[test]
fn info_sends_requested_name_and_description_before_the_block_size() {
    // The order of the replies is fixed, whatever the order of the requests.
    let mut expected = reply_bytes(OPT_INFO, REP_INFO, &disk_info_export(DISK_TFLAGS));
    expected.extend(reply_bytes(OPT_INFO, REP_INFO, &[&[0, 1][..], b"disk"].concat()));
    expected.extend(reply_bytes(OPT_INFO, REP_INFO, &[&[0, 2][..], DISK_DESCRIPTION.as_bytes()].concat()));
    expected.extend(reply_bytes(OPT_INFO, REP_INFO, &BLOCK_SIZE_INFO));
    expected.extend(reply_bytes(OPT_INFO, REP_ACK, &[]));
    for requests in [
        &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE][..],
        &[INFO_BLOCK_SIZE, INFO_DESCRIPTION, INFO_NAME],
        &[INFO_DESCRIPTION, INFO_NAME],
    ] {
        let mut d = Driver::fixed();
        let out = d.send(&option(OPT_INFO, &info_data(b"disk", requests)));
        assert_eq!(out, expected, "requests {requests:?}");
        d.assert_continues();
    }
}

#[test]
fn info_sends_name_and_description_only_when_requested_and_block_size_always() {
    // Name and description appear exactly when asked for, never as a side effect of
    // another request; the block size appears every time, once, last.
    for (request, types) in [
        (INFO_NAME, vec![INFO_EXPORT, INFO_NAME, INFO_BLOCK_SIZE]),
        (INFO_DESCRIPTION, vec![INFO_EXPORT, INFO_DESCRIPTION, INFO_BLOCK_SIZE]),
        (INFO_BLOCK_SIZE, vec![INFO_EXPORT, INFO_BLOCK_SIZE]),
    ] {
        let mut d = Driver::fixed();
        let replies = d.option(OPT_INFO, &info_data(b"disk", &[request]));
        assert_eq!(info_types(&replies), types, "request {request}");
        assert_eq!(replies[replies.len() - 2].data, BLOCK_SIZE_INFO);
        assert_eq!(replies.last(), Some(&ack(OPT_INFO)));
    }
}

#[test]
fn info_ignores_unknown_and_repeated_requests() {
    // Spec: unknown info requests MUST be ignored; each item SHOULD be sent at most once,
    // so INFO_EXPORT and the block size come once each however often they are named.
    let mut d = Driver::fixed();
    let requests = [INFO_NAME, 99, INFO_BLOCK_SIZE, INFO_NAME, 0xffff, INFO_EXPORT, INFO_BLOCK_SIZE];
    let replies = d.option(OPT_INFO, &info_data(b"disk", &requests));
    let kinds: Vec<(u32, Vec<u8>)> = replies.into_iter().map(|r| (r.kind, r.data)).collect();
    assert_eq!(
        kinds,
        vec![
            (REP_INFO, disk_info_export(DISK_TFLAGS)),
            (REP_INFO, [&[0, 1][..], b"disk"].concat()),
            (REP_INFO, BLOCK_SIZE_INFO.to_vec()),
            (REP_ACK, vec![]),
        ]
    );
}

#[test]
fn info_description_is_left_out_when_the_export_has_none() {
    let mut d = Driver::fixed();
    let replies = d.option(OPT_INFO, &info_data(b"", &[INFO_DESCRIPTION]));
    // Default export: 4096 bytes, HAS_FLAGS | READ_ONLY.
    let export = [0, 0, 0, 0, 0, 0, 0, 0, 0x10, 0, 0x00, 0x03];
    assert_eq!(
        replies,
        vec![
            OptReply { option: OPT_INFO, kind: REP_INFO, data: export.to_vec() },
            OptReply { option: OPT_INFO, kind: REP_INFO, data: BLOCK_SIZE_INFO.to_vec() },
            ack(OPT_INFO),
        ]
    );
}

#[test]
fn info_and_go_send_the_block_size_unrequested_for_every_export() {
    // With or without structured replies, for INFO and GO alike.
    for opt in [OPT_INFO, OPT_GO] {
        for structured in [false, true] {
            for name in [&b"disk"[..], b""] {
                let mut d = Driver::fixed();
                if structured {
                    d.structured();
                }
                let replies = d.option(opt, &info_data(name, &[]));
                assert_eq!(info_types(&replies), vec![INFO_EXPORT, INFO_BLOCK_SIZE], "option {opt}, export {name:?}");
                assert_eq!(replies[1], OptReply { option: opt, kind: REP_INFO, data: BLOCK_SIZE_INFO.to_vec() });
                assert_eq!(replies[2..], [ack(opt)]);
            }
        }
    }
}

#[test]
fn block_size_reply_reports_the_catalog_values() {
    // The sizes come from the export, not from constants in the handshake.
    let mut s = summary(1 << 20, 0, None);
    (s.block_min, s.block_preferred, s.block_max) = (512, 65536, 1 << 20);
    let mut d = Driver::fixed_with(TestCatalog::with(vec![("odd", s)]), FLAG_C_FIXED_NEWSTYLE);
    let replies = d.option(OPT_INFO, &info_data(b"odd", &[]));
    let block = [0, 3, 0, 0, 0x02, 0, 0, 0x01, 0, 0, 0, 0x10, 0, 0];
    assert_eq!(replies[1].data, block);
}

#[test]
fn go_sends_info_then_ack_and_enters_transmission_without_padding() {
    let mut d = Driver::fixed();
    let out = d.send(&option(OPT_GO, &info_data(b"disk", &[])));
    // No 124 zero bytes after GO's ACK, whatever NO_ZEROES says.
    let mut expected = reply_bytes(OPT_GO, REP_INFO, &disk_info_export(DISK_TFLAGS));
    expected.extend(reply_bytes(OPT_GO, REP_INFO, &BLOCK_SIZE_INFO));
    expected.extend(reply_bytes(OPT_GO, REP_ACK, &[]));
    assert_eq!(out, expected);

    let n = d.negotiated();
    assert_eq!(n.export, "disk");
    assert_eq!(n.flags, 0x000d);
    assert_eq!(n.summary, TestCatalog::standard().exports[0].1);
    assert!(!n.structured);
    assert_eq!(n.base_allocation, None);
}

#[test]
fn go_after_info_returns_the_same_information() {
    // Spec: a GO with the same parameters as a successful INFO MUST return the same items.
    for requests in [&[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE][..], &[]] {
        let mut d = Driver::fixed();
        d.structured();
        let data = info_data(b"disk", requests);
        let info: Vec<_> = d.option(OPT_INFO, &data).into_iter().map(|r| (r.kind, r.data)).collect();
        let go: Vec<_> = d.option(OPT_GO, &data).into_iter().map(|r| (r.kind, r.data)).collect();
        assert_eq!(info, go, "requests {requests:?}");
        assert_eq!(d.negotiated().flags, 0x008d);
    }
}

#[test]
fn info_and_go_for_an_unknown_export_are_err_unknown_and_continue() {
    for opt in [OPT_INFO, OPT_GO] {
        let mut d = Driver::fixed();
        let replies = d.option(opt, &info_data(b"missing", &[INFO_NAME]));
        // No REP_INFO before the error, as the spec recommends.
        assert_single_error(&replies, opt, REP_ERR_UNKNOWN);
        d.assert_continues();
        // The client can try again with a name that exists.
        let replies = d.option(opt, &info_data(b"disk", &[]));
        assert_eq!(replies.last(), Some(&ack(opt)));
    }
}

#[test]
fn unknown_export_error_message_stays_within_the_string_limit() {
    // The name is echoed in the error text; with quoting, a 4096-byte name would make the
    // text longer than the 4096 bytes the spec allows any string to be.
    let name = "\n".repeat(STRING_MAX_BYTES);
    for opt in [OPT_INFO, OPT_GO, OPT_LIST_META_CONTEXT] {
        let mut d = Driver::fixed();
        let data = if opt == OPT_LIST_META_CONTEXT {
            meta_data(name.as_bytes(), &[])
        } else {
            info_data(name.as_bytes(), &[])
        };
        let replies = d.option(opt, &data);
        assert_single_error(&replies, opt, REP_ERR_UNKNOWN);
        assert!(replies[0].data.len() <= STRING_MAX_BYTES, "message of {} bytes", replies[0].data.len());
    }
}

#[test]
fn info_accepts_a_name_of_exactly_the_string_limit() {
    let long = "b".repeat(STRING_MAX_BYTES);
    let catalog = TestCatalog::with(vec![(long.as_str(), summary(512, 0, None))]);
    let mut d = Driver::fixed_with(catalog, FLAG_C_FIXED_NEWSTYLE);
    let replies = d.option(OPT_INFO, &info_data(long.as_bytes(), &[INFO_NAME]));
    assert_eq!(info_types(&replies), vec![INFO_EXPORT, INFO_NAME, INFO_BLOCK_SIZE]);
    assert_eq!(replies[1].data[2..], *long.as_bytes());
    assert_eq!(replies[2].data, BLOCK_SIZE_INFO);
    assert_eq!(replies.len(), 4);
}

// ---------------------------------------------------------------------------------------
// STRUCTURED_REPLY and SEND_DF
// ---------------------------------------------------------------------------------------

#[test]
fn structured_reply_is_acked_once_then_invalid() {
    let mut d = Driver::fixed();
    let out = d.send(&option(OPT_STRUCTURED_REPLY, &[]));
    // Fully spelled out once: magic, option 8, ACK (1), length 0.
    let expected = [0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9, 0, 0, 0, 8, 0, 0, 0, 1, 0, 0, 0, 0];
    assert_eq!(out, expected);

    let replies = d.option(OPT_STRUCTURED_REPLY, &[]);
    assert_single_error(&replies, OPT_STRUCTURED_REPLY, REP_ERR_INVALID);
    d.assert_continues();

    // Still negotiated: the repeat changed nothing.
    d.option(OPT_GO, &info_data(b"disk", &[]));
    assert!(d.negotiated().structured);
}

#[test]
fn structured_reply_with_data_is_invalid_and_not_negotiated() {
    let mut d = Driver::fixed();
    let replies = d.option(OPT_STRUCTURED_REPLY, &[0]);
    assert_single_error(&replies, OPT_STRUCTURED_REPLY, REP_ERR_INVALID);
    d.assert_continues();
    d.option(OPT_GO, &info_data(b"disk", &[]));
    assert!(!d.negotiated().structured);
    assert_eq!(d.negotiated().flags & FLAG_SEND_DF, 0);
}

#[test]
fn send_df_is_advertised_only_once_structured_replies_are_negotiated() {
    // A catalog that (wrongly) lists SEND_DF itself must not leak it to a client that
    // cannot receive structured replies: the spec makes that a MUST.
    let flags = FLAG_SEND_FLUSH | FLAG_SEND_DF;
    let catalog = || TestCatalog::with(vec![("df", summary(4096, flags, None))]);

    let mut d = Driver::fixed_with(catalog(), FLAG_C_FIXED_NEWSTYLE);
    let before = d.option(OPT_INFO, &info_data(b"df", &[]));
    assert_eq!(before[0].data[10..12], [0x00, 0x05], "HAS_FLAGS | SEND_FLUSH, no DF");
    d.structured();
    let after = d.option(OPT_INFO, &info_data(b"df", &[]));
    assert_eq!(after[0].data[10..12], [0x00, 0x85], "DF appears with structured replies");

    let mut d = Driver::fixed_with(catalog(), FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    let out = d.send(&option(OPT_EXPORT_NAME, b"df"));
    assert_eq!(out[8..10], [0x00, 0x05]);
    assert_eq!(d.negotiated().flags, 0x0005);
}

// ---------------------------------------------------------------------------------------
// LIST_META_CONTEXT and SET_META_CONTEXT
// ---------------------------------------------------------------------------------------

fn meta_reply(option: u32, id: u32) -> Vec<u8> {
    let mut data = id.to_be_bytes().to_vec();
    data.extend_from_slice(b"base:allocation");
    reply_bytes(option, REP_META_CONTEXT, &data)
}

#[test]
fn list_meta_context_reports_base_allocation_with_id_zero() {
    // Spec: ids in LIST replies SHOULD be 0; they only mean something once SET picks them.
    let mut d = Driver::fixed();
    d.structured();
    let out = d.send(&option(OPT_LIST_META_CONTEXT, &meta_data(b"disk", &[b"base:allocation"])));
    let mut expected = meta_reply(OPT_LIST_META_CONTEXT, 0);
    expected.extend(reply_bytes(OPT_LIST_META_CONTEXT, REP_ACK, &[]));
    assert_eq!(out, expected);
    d.assert_continues();
}

#[test]
fn list_meta_context_treats_base_colon_and_no_queries_as_wildcards() {
    for queries in [&[&b"base:"[..]][..], &[]] {
        let mut d = Driver::fixed();
        d.structured();
        let out = d.send(&option(OPT_LIST_META_CONTEXT, &meta_data(b"disk", queries)));
        let mut expected = meta_reply(OPT_LIST_META_CONTEXT, 0);
        expected.extend(reply_bytes(OPT_LIST_META_CONTEXT, REP_ACK, &[]));
        assert_eq!(out, expected, "queries {queries:?}");
    }
}

#[test]
fn list_meta_context_ignores_unknown_contexts_silently() {
    // Unknown namespaces and unknown base: leaves are not errors: just no match.
    let mut d = Driver::fixed();
    d.structured();
    let queries: &[&[u8]] = &[b"qemu:dirty-bitmap:x", b"base:other", b"nonsense", b""];
    assert_eq!(d.option(OPT_LIST_META_CONTEXT, &meta_data(b"disk", queries)), vec![ack(OPT_LIST_META_CONTEXT)]);
}

#[test]
fn list_meta_context_works_before_structured_reply() {
    // The spec only says a server MAY refuse LIST here; listing is harmless.
    let mut d = Driver::fixed();
    let replies = d.option(OPT_LIST_META_CONTEXT, &meta_data(b"disk", &[]));
    assert_eq!(replies.len(), 2);
    assert_eq!(replies[0].kind, REP_META_CONTEXT);
}

#[test]
fn set_meta_context_before_structured_reply_is_invalid() {
    let mut d = Driver::fixed();
    let replies = d.option(OPT_SET_META_CONTEXT, &meta_data(b"disk", &[b"base:allocation"]));
    assert_single_error(&replies, OPT_SET_META_CONTEXT, REP_ERR_INVALID);
    d.assert_continues();
    // Negotiating structured replies afterwards does not revive the refused SET.
    d.structured();
    d.option(OPT_GO, &info_data(b"disk", &[]));
    assert_eq!(d.negotiated().base_allocation, None);
}

#[test]
fn set_meta_context_selects_base_allocation_for_the_go_export() {
    let mut d = Driver::fixed();
    d.structured();
    let out = d.send(&option(OPT_SET_META_CONTEXT, &meta_data(b"disk", &[b"base:allocation"])));
    let mut expected = meta_reply(OPT_SET_META_CONTEXT, BASE_ALLOCATION_ID);
    expected.extend(reply_bytes(OPT_SET_META_CONTEXT, REP_ACK, &[]));
    assert_eq!(out, expected);
    assert_ne!(BASE_ALLOCATION_ID, 0, "0 is the LIST placeholder");

    d.option(OPT_GO, &info_data(b"disk", &[]));
    assert_eq!(d.negotiated().base_allocation, Some(BASE_ALLOCATION_ID));
}

#[test]
fn set_meta_context_also_carries_over_to_export_name() {
    let mut d = Driver::fixed_with(TestCatalog::standard(), FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    d.structured();
    d.option(OPT_SET_META_CONTEXT, &meta_data(b"disk", &[b"base:allocation"]));
    d.send(&option(OPT_EXPORT_NAME, b"disk"));
    assert_eq!(d.negotiated().base_allocation, Some(BASE_ALLOCATION_ID));
}

#[test]
fn set_meta_context_for_another_export_is_dropped_at_go() {
    // Spec: contexts count only for the export SET named.
    let mut d = Driver::fixed();
    d.structured();
    let replies = d.option(OPT_SET_META_CONTEXT, &meta_data(b"", &[b"base:allocation"]));
    assert_eq!(replies[0].kind, REP_META_CONTEXT);
    d.option(OPT_GO, &info_data(b"disk", &[]));
    assert_eq!(d.negotiated().base_allocation, None);
}

#[test]
fn set_meta_context_ignores_bare_base_and_empty_query_lists() {
    // Spec: a bare "base:" MUST be ignored in SET; zero queries select nothing.
    for queries in [&[&b"base:"[..]][..], &[]] {
        let mut d = Driver::fixed();
        d.structured();
        assert_eq!(d.option(OPT_SET_META_CONTEXT, &meta_data(b"disk", queries)), vec![ack(OPT_SET_META_CONTEXT)]);
        d.option(OPT_GO, &info_data(b"disk", &[]));
        assert_eq!(d.negotiated().base_allocation, None);
    }
}

#[test]
fn set_meta_context_replaces_the_previous_selection_even_when_it_fails() {
    let mut d = Driver::fixed();
    d.structured();
    d.option(OPT_SET_META_CONTEXT, &meta_data(b"disk", &[b"base:allocation"]));
    let replies = d.option(OPT_SET_META_CONTEXT, &meta_data(b"missing", &[b"base:allocation"]));
    assert_single_error(&replies, OPT_SET_META_CONTEXT, REP_ERR_UNKNOWN);
    d.option(OPT_GO, &info_data(b"disk", &[]));
    assert_eq!(d.negotiated().base_allocation, None);
}

#[test]
fn meta_context_for_an_unknown_export_is_err_unknown() {
    for opt in [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT] {
        let mut d = Driver::fixed();
        d.structured();
        let replies = d.option(opt, &meta_data(b"missing", &[]));
        assert_single_error(&replies, opt, REP_ERR_UNKNOWN);
        d.assert_continues();
    }
}

// ---------------------------------------------------------------------------------------
// ABORT, STARTTLS, unknown options, limits
// ---------------------------------------------------------------------------------------

#[test]
fn abort_is_acked_then_the_connection_closes() {
    // Spec: data sent with ABORT SHOULD be ignored, not refused.
    for data in [&[][..], b"ignored"] {
        let mut d = Driver::fixed();
        let out = d.send(&option(OPT_ABORT, data));
        assert_eq!(out, reply_bytes(OPT_ABORT, REP_ACK, &[]));
        d.assert_closed();
    }
}

#[test]
fn starttls_is_refused_by_policy() {
    let mut d = Driver::fixed();
    assert_single_error(&d.option(OPT_STARTTLS, &[]), OPT_STARTTLS, REP_ERR_POLICY);
    d.assert_continues();
    assert_single_error(&d.option(OPT_STARTTLS, b"junk"), OPT_STARTTLS, REP_ERR_INVALID);
    d.assert_continues();
}

#[test]
fn unknown_options_are_unsupported_and_the_handshake_continues() {
    // Option 4 is the withdrawn PEEK_EXPORT; 12 is the next one the spec has not defined.
    let mut d = Driver::fixed();
    for (opt, data) in [(0u32, &b""[..]), (4, b""), (12, b""), (0xdead_beef, b"some payload to skip")] {
        assert_single_error(&d.option(opt, data), opt, REP_ERR_UNSUP);
        d.assert_continues();
    }
    // The data of the skipped option did not desynchronise the stream.
    d.option(OPT_GO, &info_data(b"disk", &[]));
    assert_eq!(d.negotiated().export, "disk");
}

#[test]
fn option_without_data_asks_for_a_zero_byte_read() {
    let mut d = Driver::fixed();
    let mut out = Vec::new();
    let next = d.hs.input(&option(OPT_LIST, &[]), &d.catalog, &mut out);
    assert_eq!(next, Next::Read(0));
    assert!(out.is_empty(), "the reply waits for the (empty) data");
    let next = d.hs.input(&[], &d.catalog, &mut out);
    assert_eq!(next, Next::Read(16));
    assert!(!out.is_empty());
}

#[test]
fn option_data_up_to_the_limit_is_read() {
    let mut d = Driver::fixed();
    let mut out = Vec::new();
    let header = option_with_len(0x7777, OPTION_DATA_MAX_BYTES, &[]);
    assert_eq!(d.hs.input(&header, &d.catalog, &mut out), Next::Read(OPTION_DATA_MAX_BYTES as usize));
    assert!(out.is_empty());
}

#[test]
fn option_data_above_the_limit_is_too_big_and_closes() {
    // Reading the data would let a client pin up to 4 GiB; the server refuses and leaves.
    for len in [OPTION_DATA_MAX_BYTES + 1, u32::MAX] {
        let mut d = Driver::fixed();
        let out = d.send(&option_with_len(OPT_GO, len, &[]));
        assert_single_error(&parse_replies(&out), OPT_GO, REP_ERR_TOO_BIG);
        d.assert_closed();
    }
}

#[test]
fn too_many_options_are_too_big_and_close() {
    let mut d = Driver::fixed();
    for _ in 0..OPTIONS_PER_HANDSHAKE_MAX {
        assert_single_error(&d.option(OPT_STARTTLS, &[]), OPT_STARTTLS, REP_ERR_POLICY);
    }
    let out = d.send(&option(OPT_STARTTLS, &[]));
    assert_single_error(&parse_replies(&out), OPT_STARTTLS, REP_ERR_TOO_BIG);
    d.assert_closed();
}

#[test]
fn input_after_the_handshake_ended_is_refused() {
    // Whatever way the handshake ended, the machine must not start parsing options again.
    let mut endings: Vec<Driver> = Vec::new();

    let mut d = Driver::fixed();
    d.send(&option(OPT_EXPORT_NAME, b"nope"));
    endings.push(d);

    let mut d = Driver::fixed();
    d.send(&option(OPT_EXPORT_NAME, b"disk"));
    endings.push(d);

    let mut d = Driver::fixed();
    d.send(&option(OPT_GO, &info_data(b"disk", &[])));
    endings.push(d);

    let mut d = Driver::fixed();
    d.send(&option(OPT_ABORT, &[]));
    endings.push(d);

    let mut d = Driver::new(TestCatalog::standard());
    d.send(&0u32.to_be_bytes());
    endings.push(d);

    for mut d in endings {
        assert!(!matches!(d.next, Next::Read(_)));
        let mut out = Vec::new();
        let next = d.hs.input(&option(OPT_LIST, &[])[..16], &d.catalog, &mut out);
        assert!(matches!(next, Next::Close { .. }), "after {:?}: {next:?}", d.next);
        assert!(out.is_empty());
    }
}
