//! STARTTLS in the handshake, as doc/proto.md's "TLS support" section requires of a server
//! in each mode: NOTLS (`TlsMode::Off`), FORCEDTLS (`Require`) and TLS at the client's
//! choice (`On`). The TLS handshake itself is the caller's; here `tls_started` stands for it.

mod common;

use common::*;
use sluice_proto::handshake::{Handshake, Next, TlsMode};
use sluice_proto::wire::*;

fn driver(mode: TlsMode) -> Driver {
    let mut d = Driver { hs: Handshake::with_tls(mode), next: Handshake::start(), catalog: TestCatalog::standard() };
    assert!(d.send(&FLAG_C_FIXED_NEWSTYLE.to_be_bytes()).is_empty());
    d.assert_continues();
    d
}

/// Sends STARTTLS, checks the lone ACK and that nothing more is read, then stands in for a
/// successful TLS handshake.
fn start_tls(d: &mut Driver) {
    let out = d.send(&option(OPT_STARTTLS, &[]));
    assert_eq!(parse_replies(&out), vec![ack(OPT_STARTTLS)]);
    assert_eq!(d.next, Next::StartTls);
    d.next = d.hs.tls_started();
    assert!(d.hs.is_tls());
    d.assert_continues();
}

fn go(name: &[u8]) -> Vec<u8> {
    info_data(name, &[])
}

#[test]
fn notls_refuses_starttls_with_policy_and_keeps_going() {
    let mut d = driver(TlsMode::Off);
    assert_single_error(&d.option(OPT_STARTTLS, &[]), OPT_STARTTLS, REP_ERR_POLICY);
    d.assert_continues();
    assert!(!d.hs.is_tls());
    // NOTLS MUST NOT answer anything with TLS_REQD.
    let replies = d.option(OPT_LIST, &[]);
    assert!(replies.iter().all(|r| r.kind != REP_ERR_TLS_REQD), "{replies:?}");
}

#[test]
fn forced_tls_refuses_every_option_but_starttls_and_abort_with_tls_reqd() {
    for opt in [OPT_LIST, OPT_INFO, OPT_GO, OPT_STRUCTURED_REPLY, OPT_LIST_META_CONTEXT, OPT_SET_META_CONTEXT, 99] {
        let mut d = driver(TlsMode::Require);
        // A payload, valid or not, is read in full and dropped: the next option parses.
        let data = if opt == OPT_INFO || opt == OPT_GO { go(b"") } else { b"some bytes".to_vec() };
        assert_single_error(&d.option(opt, &data), opt, REP_ERR_TLS_REQD);
        d.assert_continues();
        assert_single_error(&d.option(OPT_LIST, &[]), OPT_LIST, REP_ERR_TLS_REQD);
        d.assert_continues();
    }
}

#[test]
fn forced_tls_hangs_up_on_export_name_before_tls() {
    let mut d = driver(TlsMode::Require);
    let out = d.send(&option(OPT_EXPORT_NAME, b""));
    assert!(out.is_empty(), "EXPORT_NAME has no error reply; nothing may be sent");
    d.assert_closed();
}

#[test]
fn forced_tls_still_takes_abort_before_tls() {
    let mut d = driver(TlsMode::Require);
    assert_eq!(d.option(OPT_ABORT, &[]), vec![ack(OPT_ABORT)]);
    d.assert_closed();
}

#[test]
fn starttls_with_a_payload_is_invalid_in_every_mode() {
    for mode in [TlsMode::Off, TlsMode::On, TlsMode::Require] {
        let mut d = driver(mode);
        assert_single_error(&d.option(OPT_STARTTLS, b"x"), OPT_STARTTLS, REP_ERR_INVALID);
        d.assert_continues();
        assert!(!d.hs.is_tls());
    }
}

#[test]
fn a_second_starttls_is_invalid() {
    for mode in [TlsMode::On, TlsMode::Require] {
        let mut d = driver(mode);
        start_tls(&mut d);
        assert_single_error(&d.option(OPT_STARTTLS, &[]), OPT_STARTTLS, REP_ERR_INVALID);
        d.assert_continues();
    }
}

#[test]
fn after_tls_forced_mode_serves_every_option() {
    let mut d = driver(TlsMode::Require);
    start_tls(&mut d);
    let replies = d.option(OPT_LIST, &[]);
    assert!(replies.iter().all(|r| r.kind != REP_ERR_TLS_REQD), "{replies:?}");
    assert_eq!(replies.last(), Some(&ack(OPT_LIST)));
    d.send(&option(OPT_GO, &go(b"")));
    assert_eq!(d.negotiated().export, "");
}

#[test]
fn optional_tls_serves_plaintext_clients_and_upgrades_on_request() {
    let mut plain = driver(TlsMode::On);
    plain.send(&option(OPT_GO, &go(b"")));
    assert_eq!(plain.negotiated().export, "");

    let mut upgraded = driver(TlsMode::On);
    start_tls(&mut upgraded);
    upgraded.send(&option(OPT_EXPORT_NAME, b""));
    assert_eq!(upgraded.negotiated().export, "");
}

#[test]
fn state_negotiated_before_starttls_is_forgotten() {
    // CVE-2021-3716: a man in the middle injects STRUCTURED_REPLY (and a meta context)
    // before the client's STARTTLS; none of it may stay in effect over TLS.
    let mut d = driver(TlsMode::On);
    d.structured();
    let set = meta_data(b"", &[b"base:allocation"]);
    assert_eq!(d.option(OPT_SET_META_CONTEXT, &set).last(), Some(&ack(OPT_SET_META_CONTEXT)));
    start_tls(&mut d);
    d.send(&option(OPT_GO, &go(b"")));
    let n = d.negotiated();
    assert!(!n.structured, "structured replies survived STARTTLS");
    assert_eq!(n.base_allocation, None, "a meta context survived STARTTLS");
    assert_eq!(n.flags & FLAG_SEND_DF, 0);
}

#[test]
fn structured_replies_can_be_negotiated_again_over_tls() {
    let mut d = driver(TlsMode::On);
    d.structured();
    start_tls(&mut d);
    d.structured();
    d.send(&option(OPT_GO, &go(b"")));
    assert!(d.negotiated().structured);
}

#[test]
fn nothing_after_starttls_is_parsed_before_the_tls_handshake() {
    // Bytes a client (or an attacker) sends right behind STARTTLS are not options: the
    // machine stops reading until the caller says TLS is up.
    let mut d = driver(TlsMode::Require);
    let mut bytes = option(OPT_STARTTLS, &[]);
    let out = d.send(&bytes);
    assert_eq!(d.next, Next::StartTls);
    bytes = option(OPT_GO, &go(b""));
    let mut more = Vec::new();
    assert!(matches!(d.hs.input(&bytes[..16], &d.catalog, &mut more), Next::Close { .. }));
    assert!(more.is_empty());
    assert_eq!(parse_replies(&out), vec![ack(OPT_STARTTLS)]);
}
