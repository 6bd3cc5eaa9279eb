//! Option data whose lengths do not add up. The option header's length field keeps the
//! stream in sync, so every one of these is a syntax error in one option: ERR_INVALID, and
//! the handshake goes on (Next::Read(16)) — never a panic, a close or a transmission.

mod common;

use common::*;
use sluice_proto::limits::{META_QUERIES_MAX, STRING_MAX_BYTES};
use sluice_proto::wire::*;

/// Sends `data` as option `opt` (after negotiating structured replies, so SET_META_CONTEXT
/// is allowed) and checks the result is a lone ERR_INVALID with the handshake continuing.
fn assert_invalid(opt: u32, data: &[u8]) {
    let mut d = Driver::fixed();
    d.structured();
    let replies = d.option(opt, data);
    assert_eq!(replies.len(), 1, "option {opt}, data {data:02x?}: {replies:?}");
    assert_eq!((replies[0].option, replies[0].kind), (opt, REP_ERR_INVALID), "data {data:02x?}");
    d.assert_continues();
    // The machine is still usable: a well-formed option afterwards succeeds.
    assert_eq!(d.option(OPT_LIST, &[]).last(), Some(&ack(OPT_LIST)));
}

/// Each pair shares one request layout, so every malformation is tried on both.
const INFO_OPTIONS: [u32; 2] = [OPT_INFO, OPT_GO];
const META_OPTIONS: [u32; 2] = [OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT];

// ---------------------------------------------------------------------------------------
// INFO and GO
// ---------------------------------------------------------------------------------------

#[test]
fn info_and_go_truncated_at_every_byte_count_are_invalid() {
    let full = info_data(b"disk", &[INFO_NAME, INFO_BLOCK_SIZE]);
    for opt in INFO_OPTIONS {
        for cut in 0..full.len() {
            assert_invalid(opt, &full[..cut]);
        }
    }
}

#[test]
fn info_and_go_with_trailing_garbage_are_invalid() {
    for opt in INFO_OPTIONS {
        for extra in [&[0u8][..], &[0, 0], &[0, 1, 2]] {
            let mut data = info_data(b"disk", &[INFO_NAME]);
            data.extend_from_slice(extra);
            assert_invalid(opt, &data);
        }
    }
}

#[test]
fn info_and_go_name_length_past_the_end_is_invalid() {
    // The name length is the first thing read; each of these points beyond the option.
    let rest = [&b"disk"[..], &[0, 0]].concat();
    for name_len in [rest.len() as u32 - 1, rest.len() as u32, 5000, u32::MAX / 2, u32::MAX] {
        for opt in INFO_OPTIONS {
            let mut data = name_len.to_be_bytes().to_vec();
            data.extend_from_slice(&rest);
            assert_invalid(opt, &data);
        }
    }
}

#[test]
fn info_and_go_request_count_that_disagrees_with_the_data_is_invalid() {
    for opt in INFO_OPTIONS {
        for count in [1u16, 3, u16::MAX] {
            let mut data = info_data(b"disk", &[INFO_NAME, INFO_DESCRIPTION]);
            let at = data.len() - 6;
            data[at..at + 2].copy_from_slice(&count.to_be_bytes());
            assert_invalid(opt, &data);
        }
    }
}

#[test]
fn info_and_go_names_over_the_string_limit_or_not_utf8_are_invalid() {
    let long = vec![b'a'; STRING_MAX_BYTES + 1];
    for opt in INFO_OPTIONS {
        for name in [&long[..], b"\xff", b"disk\xe2\x82", b"\xc0\x80"] {
            assert_invalid(opt, &info_data(name, &[]));
        }
    }
}

// ---------------------------------------------------------------------------------------
// LIST_META_CONTEXT and SET_META_CONTEXT
// ---------------------------------------------------------------------------------------

#[test]
fn meta_context_truncated_at_every_byte_count_is_invalid() {
    let full = meta_data(b"disk", &[b"base:allocation", b"x-a:b"]);
    for opt in META_OPTIONS {
        for cut in 0..full.len() {
            assert_invalid(opt, &full[..cut]);
        }
    }
}

#[test]
fn meta_context_with_trailing_garbage_is_invalid() {
    for opt in META_OPTIONS {
        for extra in [&[0u8][..], &[0, 0, 0], &[0, 0, 0, 0]] {
            let mut data = meta_data(b"disk", &[b"base:allocation"]);
            data.extend_from_slice(extra);
            assert_invalid(opt, &data);
        }
    }
}

#[test]
fn meta_context_query_length_past_the_end_is_invalid() {
    for opt in META_OPTIONS {
        for query_len in [16u32, 1000, u32::MAX] {
            let mut data = meta_data(b"disk", &[b"base:allocation"]);
            let at = 4 + 4 + 4;
            data[at..at + 4].copy_from_slice(&query_len.to_be_bytes());
            assert_invalid(opt, &data);
        }
    }
}

#[test]
fn meta_context_query_count_above_the_limit_is_invalid() {
    // All queries present: it is the count, not missing data, that is refused.
    let queries: Vec<&[u8]> = vec![b"base:allocation"; META_QUERIES_MAX as usize + 1];
    for opt in META_OPTIONS {
        assert_invalid(opt, &meta_data(b"disk", &queries));
        // A count far past anything the data could hold, with no queries at all.
        let mut data = meta_data(b"disk", &[]);
        let at = data.len() - 4;
        data[at..].copy_from_slice(&u32::MAX.to_be_bytes());
        assert_invalid(opt, &data);
    }
}

#[test]
fn meta_context_query_count_at_the_limit_is_accepted() {
    let queries: Vec<&[u8]> = vec![b"base:allocation"; META_QUERIES_MAX as usize];
    for opt in META_OPTIONS {
        let mut d = Driver::fixed();
        d.structured();
        let replies = d.option(opt, &meta_data(b"disk", &queries));
        // One context however often it is named.
        assert_eq!(replies.iter().map(|r| r.kind).collect::<Vec<_>>(), vec![REP_META_CONTEXT, REP_ACK]);
    }
}

#[test]
fn meta_context_names_and_queries_over_the_limit_or_not_utf8_are_invalid() {
    let long = vec![b'a'; STRING_MAX_BYTES + 1];
    let long_query = [&b"base:"[..], &vec![b'a'; STRING_MAX_BYTES]].concat();
    for opt in META_OPTIONS {
        for name in [&long[..], b"\xff", b"di\xf0sk"] {
            assert_invalid(opt, &meta_data(name, &[]));
        }
        for query in [&long_query[..], b"base:\xff", b"\xed\xa0\x80"] {
            assert_invalid(opt, &meta_data(b"disk", &[b"base:allocation", query]));
        }
    }
}

#[test]
fn failed_set_meta_context_leaves_no_context_selected() {
    let mut d = Driver::fixed();
    d.structured();
    d.option(OPT_SET_META_CONTEXT, &meta_data(b"disk", &[b"base:allocation"]));
    let full = meta_data(b"disk", &[b"base:allocation"]);
    let replies = d.option(OPT_SET_META_CONTEXT, &full[..full.len() - 1]);
    assert_eq!(replies[0].kind, REP_ERR_INVALID);
    d.option(OPT_GO, &info_data(b"disk", &[]));
    assert_eq!(d.negotiated().base_allocation, None);
}
