//! NBD_OPT_EXTENDED_HEADERS (doc/proto.md, "Extended headers"): it takes no data, implies
//! structured replies, may upgrade them, refuses them afterwards, rules out EXPORT_NAME,
//! and is forgotten at STARTTLS like every other plaintext choice.

mod common;

use common::*;
use sluice_proto::handshake::{Handshake, TlsMode};
use sluice_proto::wire::*;

fn go(d: &mut Driver) {
    let replies = d.option(OPT_GO, &info_data(b"disk", &[]));
    assert_eq!(replies.last(), Some(&ack(OPT_GO)));
}

#[test]
fn extended_headers_are_acked_and_imply_structured_replies() {
    let mut d = Driver::fixed();
    assert_eq!(d.option(OPT_EXTENDED_HEADERS, &[]), vec![ack(OPT_EXTENDED_HEADERS)]);
    d.assert_continues();
    go(&mut d);
    let n = d.negotiated();
    assert!(n.extended && n.structured);
    assert_ne!(n.flags & FLAG_SEND_DF, 0, "SEND_DF comes with the structured replies it implies");
}

#[test]
fn extended_headers_with_data_are_invalid_and_not_negotiated() {
    let mut d = Driver::fixed();
    assert_single_error(&d.option(OPT_EXTENDED_HEADERS, &[0]), OPT_EXTENDED_HEADERS, REP_ERR_INVALID);
    d.assert_continues();
    go(&mut d);
    assert!(!d.negotiated().extended && !d.negotiated().structured);
}

#[test]
fn a_second_extended_headers_is_invalid_and_changes_nothing() {
    let mut d = Driver::fixed();
    d.option(OPT_EXTENDED_HEADERS, &[]);
    assert_single_error(&d.option(OPT_EXTENDED_HEADERS, &[]), OPT_EXTENDED_HEADERS, REP_ERR_INVALID);
    go(&mut d);
    assert!(d.negotiated().extended);
}

#[test]
fn structured_replies_after_extended_headers_are_refused_with_ext_header_reqd() {
    let mut d = Driver::fixed();
    d.option(OPT_EXTENDED_HEADERS, &[]);
    assert_single_error(&d.option(OPT_STRUCTURED_REPLY, &[]), OPT_STRUCTURED_REPLY, REP_ERR_EXT_HEADER_REQD);
    d.assert_continues();
    go(&mut d);
    assert!(d.negotiated().extended, "the refused downgrade left extended headers on");
}

#[test]
fn extended_headers_upgrade_structured_replies() {
    let mut d = Driver::fixed();
    d.structured();
    assert_eq!(d.option(OPT_EXTENDED_HEADERS, &[]), vec![ack(OPT_EXTENDED_HEADERS)]);
    go(&mut d);
    assert!(d.negotiated().extended && d.negotiated().structured);
}

#[test]
fn a_metadata_context_can_be_set_under_extended_headers_alone() {
    let mut d = Driver::fixed();
    d.option(OPT_EXTENDED_HEADERS, &[]);
    let set = meta_data(b"disk", &[b"base:allocation"]);
    assert_eq!(d.option(OPT_SET_META_CONTEXT, &set).last(), Some(&ack(OPT_SET_META_CONTEXT)));
    go(&mut d);
    assert!(d.negotiated().base_allocation.is_some());
}

#[test]
fn export_name_after_extended_headers_hangs_up() {
    let mut d = Driver::fixed();
    d.option(OPT_EXTENDED_HEADERS, &[]);
    let out = d.send(&option(OPT_EXPORT_NAME, b"disk"));
    assert!(out.is_empty(), "EXPORT_NAME has no error reply: {out:?}");
    d.assert_closed();
}

#[test]
fn extended_headers_are_forgotten_at_starttls() {
    let mut d = Driver { hs: Handshake::with_tls(TlsMode::On), next: Handshake::start(), catalog: TestCatalog::standard() };
    d.send(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes());
    d.option(OPT_EXTENDED_HEADERS, &[]);
    d.send(&option(OPT_STARTTLS, &[]));
    d.next = d.hs.tls_started();
    go(&mut d);
    assert!(!d.negotiated().extended && !d.negotiated().structured, "plaintext choices survived STARTTLS");
}
