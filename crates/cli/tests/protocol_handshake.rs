//! Handshake conformance over raw sockets: greeting, client flags, each option, and bounds on what a client may send.
mod common;
mod raw;

use std::time::{Duration, Instant};

use common::Sluice;
use raw::*;

const DEFAULT_SIZE: u64 = 1 << 20;
const DISK_SIZE: u64 = 4 << 20;

/// "" (1 MiB), "disk" (4 MiB, described) and "ro" (64 KiB, read-only), all in memory.
fn server() -> Sluice {
    Sluice::start(&["memory:1M", "--export", "disk=memory:4M,description=scratch disk", "--export", "ro=memory:64K,ro"])
}

/// A client past the greeting and client flags (FIXED_NEWSTYLE | NO_ZEROES).
fn started(s: &Sluice) -> Client {
    let mut c = Client::unix(&s.socket);
    c.start();
    c
}

/// Error replies may carry a message for humans; it must still follow the string rules.
fn assert_error_reply(r: &OptReply, option: u32, kind: u32) {
    assert_eq!((r.option, r.kind), (option, kind), "{r:?}");
    assert!(r.data.len() <= 4096 && std::str::from_utf8(&r.data).is_ok(), "error message breaks the string rules");
}

/// Proves the handshake is still in step: GO succeeds and a read works.
fn assert_go_works(c: &mut Client, export: &str) {
    let e = c.go(export, false, false);
    assert!(e.size > 0);
    assert_eq!(c.read(0, 512), vec![0u8; 512]);
}

// Rule 1 and §2.2: NBDMAGIC, IHAVEOPT, then handshake flags with only bits 0 and 1.
#[test]
fn greeting_is_nbdmagic_ihaveopt_fixed_newstyle_no_zeroes_rule_1() {
    let s = server();
    for mut c in [Client::unix(&s.socket), Client::tcp(s.port)] {
        let g = c.recv(18);
        let expected: [u8; 18] = [
            b'N', b'B', b'D', b'M', b'A', b'G', b'I', b'C', 0x49, 0x48, 0x41, 0x56, 0x45, 0x4f, 0x50, 0x54, 0x00, 0x03,
        ];
        assert_eq!(g, expected);
        // Nothing more until the client has sent its flags.
        assert_eq!(c.close_within(Duration::from_millis(200)), Err(Vec::new()));
    }
}

// Rules 5 and 6: sluice needs fixed newstyle, so a client without it is dropped unanswered.
#[test]
fn client_without_fixed_newstyle_is_closed_rule_5() {
    let s = server();
    for flags in [0, FLAG_C_NO_ZEROES] {
        let mut c = Client::unix(&s.socket);
        c.greeting();
        c.client_flags(flags);
        assert!(c.expect_close().is_empty(), "client flags {flags:#x}");
    }
}

// Rule 4: a client flag the server does not know closes the connection.
#[test]
fn unknown_client_flag_bits_close_the_connection_rule_4() {
    let s = server();
    for flags in [FLAG_C_FIXED_NEWSTYLE | 0x4, FLAG_C_FIXED_NEWSTYLE | 0x8000_0000, u32::MAX] {
        let mut c = Client::unix(&s.socket);
        c.greeting();
        c.client_flags(flags);
        assert!(c.expect_close().is_empty(), "client flags {flags:#x}");
    }
}

// Rules 19(b) and 53: an option without IHAVEOPT cannot be framed; the server hangs up.
#[test]
fn bad_option_magic_closes_rule_19() {
    let s = server();
    let mut c = started(&s);
    let mut bad = b"IHAVEOPX".to_vec();
    bad.extend_from_slice(&OPT_GO.to_be_bytes());
    bad.extend_from_slice(&0u32.to_be_bytes());
    c.send(&bad);
    assert!(c.expect_close().is_empty());
}

// Rule 8: unknown options get ERR_UNSUP, their data is skipped, and haggling goes on.
#[test]
fn unknown_option_gets_err_unsup_and_handshake_continues_rule_8() {
    let s = server();
    let mut c = started(&s);
    for (option, len) in [(999u32, 100usize), (OPT_PEEK_EXPORT, 0), (0x7fff_ffff, 7), (0xdead_beef, 64 * 1024)] {
        let r = c.ask(option, &vec![0xab; len]);
        assert_eq!(r.len(), 1, "{r:?}");
        assert_error_reply(&r[0], option, REP_ERR_UNSUP);
    }
    assert_go_works(&mut c, "disk");
}

// Rule 15: no TLS here, so STARTTLS is refused by policy; with data it is invalid (rule 10).
#[test]
fn starttls_is_refused_with_err_policy_rule_15() {
    let s = server();
    let mut c = started(&s);
    let r = c.ask(OPT_STARTTLS, &[]);
    assert_eq!(r.len(), 1);
    assert_error_reply(&r[0], OPT_STARTTLS, REP_ERR_POLICY);
    let r = c.ask(OPT_STARTTLS, b"x");
    assert_error_reply(&r[0], OPT_STARTTLS, REP_ERR_INVALID);
    assert_go_works(&mut c, "");
}

// Rule 16 and §2.5: one REP_SERVER per export (name_len ≤ length − 4, description after it), then ACK.
#[test]
fn list_sends_every_export_then_ack_rule_16() {
    let s = server();
    let mut c = started(&s);
    let replies = c.ask(OPT_LIST, &[]);
    let (last, servers) = replies.split_last().unwrap();
    assert_eq!(last.kind, REP_ACK);
    assert!(last.data.is_empty());
    let mut seen = Vec::new();
    for r in servers {
        assert_eq!(r.kind, REP_SERVER);
        assert!(r.data.len() >= 4);
        let name_len = be32(&r.data[0..4]) as usize;
        assert!(name_len <= r.data.len() - 4, "name_len overruns the reply");
        let name = std::str::from_utf8(&r.data[4..4 + name_len]).unwrap().to_owned();
        let description = std::str::from_utf8(&r.data[4 + name_len..]).unwrap().to_owned();
        seen.push((name, description));
    }
    seen.sort();
    let expected = [("", ""), ("disk", "scratch disk"), ("ro", "")].map(|(n, d)| (n.to_owned(), d.to_owned()));
    assert_eq!(seen, expected);
    // Rule 10: LIST carries no data.
    let r = c.ask(OPT_LIST, b"junk");
    assert_eq!(r.len(), 1);
    assert_error_reply(&r[0], OPT_LIST, REP_ERR_INVALID);
    assert_go_works(&mut c, "ro");
}

/// The REP_INFO items of a reply, keyed by info type, after checking each type comes once
/// (rule 33) and the reply ends in ACK.
fn infos(replies: &[OptReply]) -> Vec<(u16, Vec<u8>)> {
    let (last, items) = replies.split_last().unwrap();
    assert_eq!(last.kind, REP_ACK, "{replies:?}");
    let mut v: Vec<(u16, Vec<u8>)> = items
        .iter()
        .map(|r| {
            assert_eq!(r.kind, REP_INFO);
            (be16(&r.data[0..2]), r.data[2..].to_vec())
        })
        .collect();
    v.sort();
    let types: Vec<u16> = v.iter().map(|(t, _)| *t).collect();
    let mut unique = types.clone();
    unique.dedup();
    assert_eq!(types, unique, "an info type sent twice");
    v
}

// Rules 33, 38, 40, 41, 42: INFO and a following GO for the same export agree; INFO_EXPORT is
// always there; block sizes are sane; no padding follows GO's ACK.
#[test]
fn info_then_go_for_the_same_export_return_the_same_information_rule_40() {
    let s = server();
    let mut c = started(&s);
    // 0x7777 is no info type: rule 32 says ignore it.
    let ask = info_data("disk", &[INFO_NAME, INFO_DESCRIPTION, INFO_BLOCK_SIZE, 0x7777]);
    let info = infos(&c.ask(OPT_INFO, &ask));
    let export = &info.iter().find(|(t, _)| *t == INFO_EXPORT).expect("INFO_EXPORT is mandatory (rule 33)").1;
    assert_eq!(export.len(), 10, "INFO_EXPORT: size(8) flags(2)");
    assert_eq!(be64(&export[0..8]), DISK_SIZE);
    let flags = be16(&export[8..10]);
    assert_ne!(flags & HAS_FLAGS, 0, "HAS_FLAGS is always set (rule 42)");
    assert_eq!(flags & SEND_DF, 0, "SEND_DF without structured replies (rule 42)");
    assert!(flags & SEND_FAST_ZERO == 0 || flags & SEND_WRITE_ZEROES != 0, "FAST_ZERO without WRITE_ZEROES (rule 42)");
    for (t, body) in &info {
        match *t {
            INFO_NAME => assert_eq!(body, b"disk"),
            INFO_DESCRIPTION => assert_eq!(body, b"scratch disk"),
            INFO_BLOCK_SIZE => {
                assert_eq!(body.len(), 12, "INFO_BLOCK_SIZE: min, preferred, max");
                let (min, pref, max) = (be32(&body[0..4]), be32(&body[4..8]), be32(&body[8..12]));
                assert!(min.is_power_of_two() && min <= 64 * 1024, "min {min} (rule 38)");
                assert!(pref.is_power_of_two() && pref >= min.max(512), "preferred {pref} (rule 38)");
                assert!(max == u32::MAX || max % min == 0, "max {max} (rule 38)");
                assert!(max as u64 >= (pref as u64).min(DISK_SIZE), "max {max} (rule 38)");
            }
            INFO_EXPORT => {}
            other => panic!("unrequested info type {other}"),
        }
    }
    let go = infos(&c.ask(OPT_GO, &ask));
    assert_eq!(go, info, "GO after INFO with the same parameters (rule 40)");
    // Rule 41: transmission starts right after the ACK; the first reply is in step.
    let data = pattern(4096, 1);
    c.write(8192, &data);
    assert_eq!(c.read(8192, 4096), data);

    // Rule 42: with structured replies SEND_DF may appear, and INFO still agrees with GO.
    let mut c = started(&s);
    assert_eq!(c.ask(OPT_STRUCTURED_REPLY, &[])[0].kind, REP_ACK);
    let info = infos(&c.ask(OPT_INFO, &info_data("", &[])));
    let go = infos(&c.ask(OPT_GO, &info_data("", &[])));
    assert_eq!(go, info);
    assert_eq!(be64(&info[0].1[0..8]), DEFAULT_SIZE);
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    common::pattern(len, seed)
}

// Rule 34: GO for an unknown export is ERR_UNKNOWN without REP_INFO, and the client may try again.
#[test]
fn go_unknown_export_gets_err_unknown_and_retry_succeeds_rule_34() {
    let s = server();
    let mut c = started(&s);
    for option in [OPT_INFO, OPT_GO] {
        let r = c.ask(option, &info_data("nope", &[INFO_NAME]));
        assert_eq!(r.len(), 1, "no REP_INFO before ERR_UNKNOWN: {r:?}");
        assert_error_reply(&r[0], option, REP_ERR_UNKNOWN);
    }
    let e = c.go("disk", false, false);
    assert_eq!(e.size, DISK_SIZE);
    assert_eq!(c.read(DISK_SIZE - 512, 512), vec![0u8; 512]);
}

// Rule 12: INFO/GO whose name length or count does not add up is ERR_INVALID, not a hang-up.
#[test]
fn malformed_go_is_err_invalid_and_handshake_continues_rule_12() {
    let s = server();
    let mut c = started(&s);
    let mut long_name = info_data("disk", &[]);
    long_name[0..4].copy_from_slice(&1000u32.to_be_bytes());
    let mut trailing = info_data("disk", &[INFO_NAME]);
    trailing.push(0);
    let mut short_count = info_data("disk", &[]);
    short_count.truncate(short_count.len() - 1);
    for data in [long_name, trailing, short_count, Vec::new()] {
        let r = c.ask(OPT_GO, &data);
        assert_eq!(r.len(), 1, "{data:?} → {r:?}");
        assert_error_reply(&r[0], OPT_GO, REP_ERR_INVALID);
    }
    assert_go_works(&mut c, "disk");
}

// Rule 18: EXPORT_NAME cannot report an error, so an unknown name is a hard disconnect with
// nothing sent.
#[test]
fn export_name_unknown_is_a_hard_disconnect_rule_18() {
    let s = server();
    let mut c = started(&s);
    c.option(OPT_EXPORT_NAME, b"nope");
    assert!(c.expect_close().is_empty());
}

// Rule 88 and §2.5: EXPORT_NAME answers size(8) flags(2), then 124 zeros unless both sides
// chose NO_ZEROES; transmission follows at once.
#[test]
fn export_name_reply_is_10_bytes_with_no_zeroes_rule_88() {
    let s = server();
    let mut c = Client::unix(&s.socket);
    assert_eq!(c.greeting(), FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES);
    c.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    c.option(OPT_EXPORT_NAME, b"disk");
    let r = c.recv(10);
    assert_eq!(be64(&r[0..8]), DISK_SIZE);
    let flags = be16(&r[8..10]);
    assert_ne!(flags & HAS_FLAGS, 0);
    assert_eq!(flags & SEND_DF, 0, "no structured replies via EXPORT_NAME (rule 42)");
    // The very next bytes are the reply to this read, so no padding was sent.
    assert_eq!(c.read(0, 4096), vec![0u8; 4096]);
    c.disconnect();
}

// Rule 88: without C_NO_ZEROES the 124 zero bytes follow.
#[test]
fn export_name_reply_is_134_bytes_without_no_zeroes_rule_88() {
    let s = server();
    let mut c = Client::unix(&s.socket);
    c.greeting();
    c.client_flags(FLAG_C_FIXED_NEWSTYLE);
    c.option(OPT_EXPORT_NAME, b"");
    let r = c.recv(134);
    assert_eq!(be64(&r[0..8]), DEFAULT_SIZE);
    assert_ne!(be16(&r[8..10]) & HAS_FLAGS, 0);
    assert!(r[10..].iter().all(|&b| b == 0), "padding must be zeros");
    let data = pattern(512, 2);
    c.write(512, &data);
    assert_eq!(c.read(512, 512), data);
    c.disconnect();
}

// Rule 44: SET_META_CONTEXT needs structured replies first; the handshake continues.
#[test]
fn set_meta_context_before_structured_reply_is_err_invalid_rule_44() {
    let s = server();
    let mut c = started(&s);
    let r = c.ask(OPT_SET_META_CONTEXT, &meta_data("", &["base:allocation"]));
    assert_eq!(r.len(), 1, "no context selected: {r:?}");
    assert_error_reply(&r[0], OPT_SET_META_CONTEXT, REP_ERR_INVALID);
    // Done in order, the same request works and BLOCK_STATUS uses the context.
    let e = c.go("", true, true);
    let id = e.context.unwrap();
    let r = c.call(0, CMD_BLOCK_STATUS, 0, 4096);
    assert_eq!(r.block_status().0, id);
}

// Rules 11 and 17: ABORT is acknowledged (data or not), then the server closes.
#[test]
fn abort_is_acked_then_closed_rule_17() {
    let s = server();
    for data in [&b""[..], &b"ignored"[..]] {
        let mut c = started(&s);
        let r = c.ask(OPT_ABORT, data);
        assert_eq!(r, vec![OptReply { option: OPT_ABORT, kind: REP_ACK, data: Vec::new() }]);
        assert!(c.expect_close().is_empty());
    }
}

// Rules 14 and 19(c): an option longer than 64 KiB is refused with ERR_TOO_BIG and the server
// hangs up rather than read it.
#[test]
fn option_over_64_kib_gets_err_too_big_then_close_rule_14() {
    let s = server();
    for len in [64 * 1024 + 1, u32::MAX] {
        let mut c = started(&s);
        let mut h = IHAVEOPT.to_vec();
        h.extend_from_slice(&OPT_GO.to_be_bytes());
        h.extend_from_slice(&len.to_be_bytes());
        c.send(&h);
        let r = c.option_reply();
        assert_error_reply(&r, OPT_GO, REP_ERR_TOO_BIG);
        assert!(c.expect_close().is_empty());
    }
}

// Limits (handshake timeout): a client that sends nothing, or stops mid-option, is dropped
// after about 10 s, and clients keep being served meanwhile.
#[test]
fn silent_client_is_dropped_after_handshake_timeout_while_others_are_served() {
    let s = server();
    let started_at = Instant::now();
    let mut silent = Client::unix(&s.socket);
    silent.greeting();
    let mut stalled = Client::tcp(s.port);
    stalled.start();
    stalled.send(&IHAVEOPT[..5]);

    let socket = s.socket.clone();
    let busy = std::thread::spawn(move || {
        let mut served = 0;
        while started_at.elapsed() < Duration::from_secs(8) {
            let (mut c, _) = Client::connect(&socket, "disk", true, false);
            let data = pattern(4096, served);
            c.write(served * 4096, &data);
            assert_eq!(c.read(served * 4096, 4096), data);
            c.disconnect();
            served += 1;
            std::thread::sleep(Duration::from_millis(50));
        }
        served
    });
    for c in [&mut silent, &mut stalled] {
        let rest = c.close_within(Duration::from_secs(20)).expect("the silent client is never dropped");
        assert!(rest.is_empty(), "nothing is sent to a silent client");
    }
    let elapsed = started_at.elapsed();
    assert!(elapsed >= Duration::from_secs(9), "dropped after {elapsed:?}, before the 10 s timeout");
    assert!(elapsed <= Duration::from_secs(15), "dropped only after {elapsed:?}");
    let served = busy.join().unwrap();
    assert!(served >= 10, "only {served} clients served while two were silent");
}

// Rule 23: after EXPORT_NAME (or GO) every later byte is transmission; a client that sends
// its first request without waiting for the reply must not lose it.
#[test]
fn request_sent_right_behind_export_name_or_go_is_not_lost_rule_23() {
    let s = server();
    let mut c = started(&s);
    let mut b = IHAVEOPT.to_vec();
    b.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
    b.extend_from_slice(&4u32.to_be_bytes());
    b.extend_from_slice(b"disk");
    let h = c.handle();
    c.expect(h, Sent { kind: CMD_READ, offset: 0, length: 512 });
    b.extend_from_slice(&request(0, CMD_READ, h, 0, 512));
    c.send(&b);
    assert_eq!(be64(&c.recv(10)[0..8]), DISK_SIZE);
    assert_eq!(c.reply(h).read_data(), vec![0u8; 512]);

    let mut c = started(&s);
    let mut b = IHAVEOPT.to_vec();
    let go = info_data("", &[]);
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&(go.len() as u32).to_be_bytes());
    b.extend_from_slice(&go);
    let h = c.handle();
    c.expect(h, Sent { kind: CMD_READ, offset: 512, length: 512 });
    b.extend_from_slice(&request(0, CMD_READ, h, 512, 512));
    c.send(&b);
    assert_eq!(c.option_replies(OPT_GO).last().unwrap().kind, REP_ACK);
    assert_eq!(c.reply(h).read_data(), vec![0u8; 512]);
}

// Rule 36 (block size constraints): a server that enforces a maximum other than the default
// (unlimited) SHOULD advertise it in INFO/GO replies, and MUST unless agreed out of band.
// sluice refuses READ/WRITE over 32 MiB, so it must say so even to a GO that did not ask
// (unrequested info items are allowed, rule 32; qemu-nbd always sends INFO_BLOCK_SIZE).
#[test]
fn go_advertises_the_enforced_maximum_block_size_even_unasked_rule_36() {
    let s = server();
    let mut c = started(&s);
    let go = infos(&c.ask(OPT_GO, &info_data("disk", &[])));
    let block = go.iter().find(|(t, _)| *t == INFO_BLOCK_SIZE);
    let Some((_, body)) = block else {
        panic!("GO without an INFO_BLOCK_SIZE request got no block sizes, yet reads over 32 MiB are refused: {go:?}")
    };
    assert!(be32(&body[8..12]) <= PAYLOAD_MAX, "advertised maximum is above the enforced one");
}

// Rules 43 and 48: structured replies and a context negotiated before EXPORT_NAME (not just
// GO) apply in transmission.
#[test]
fn structured_replies_and_context_before_export_name_apply_rule_43() {
    let s = server();
    let mut c = started(&s);
    assert_eq!(c.ask(OPT_STRUCTURED_REPLY, &[])[0].kind, REP_ACK);
    c.structured = true;
    let r = c.ask(OPT_SET_META_CONTEXT, &meta_data("disk", &["base:allocation"]));
    assert_eq!(r.len(), 2, "{r:?}");
    let id = be32(&r[0].data[0..4]);
    c.option(OPT_EXPORT_NAME, b"disk");
    let flags = be16(&c.recv(10)[8..10]);
    assert_ne!(flags & SEND_DF, 0, "SEND_DF once structured replies are on");
    let r = c.call(0, CMD_READ, 0, 4096);
    assert!(matches!(&r.msgs[..], [Msg::Chunk(_), ..]), "READ reply must be structured: {r:?}");
    assert_eq!(r.read_data(), vec![0u8; 4096]);
    assert_eq!(c.call(0, CMD_BLOCK_STATUS, 0, 4096).block_status().0, id);
}

/// After STRUCTURED_REPLY, runs `sets` SET_META_CONTEXT options in turn, then GO "", and
/// returns BLOCK_STATUS's error (None when a context is active).
fn block_status_after(s: &Sluice, sets: &[Vec<u8>]) -> Option<u32> {
    let mut c = started(s);
    assert_eq!(c.ask(OPT_STRUCTURED_REPLY, &[])[0].kind, REP_ACK);
    c.structured = true;
    for data in sets {
        c.ask(OPT_SET_META_CONTEXT, data);
    }
    c.go("", false, false);
    c.call(0, CMD_BLOCK_STATUS, 0, 4096).error()
}

// Rules 45 and 47: SET replaces the active contexts, even when it fails; zero queries, a
// bare "base:" and unknown "base:" leaves select nothing and are not errors.
#[test]
fn set_meta_context_replaces_the_active_set_even_when_it_fails_rule_45() {
    let s = server();
    let good = meta_data("", &["base:allocation"]);
    assert_eq!(block_status_after(&s, std::slice::from_ref(&good)), None);
    let mut truncated = meta_data("", &["base:allocation"]);
    truncated.truncate(truncated.len() - 3);
    for second in [truncated, meta_data("", &[]), meta_data("nope", &["base:allocation"]), meta_data("", &["base:"])] {
        assert_eq!(block_status_after(&s, &[good.clone(), second.clone()]), Some(EINVAL), "after {second:?}");
    }
    let mut c = started(&s);
    assert_eq!(c.ask(OPT_STRUCTURED_REPLY, &[])[0].kind, REP_ACK);
    for (queries, selected) in [
        (vec![], false),
        (vec!["base:"], false),
        (vec!["base:nothing", "x-vendor:thing"], false),
        (vec!["base:nothing", "base:allocation"], true),
    ] {
        let r = c.ask(OPT_SET_META_CONTEXT, &meta_data("", &queries));
        assert_eq!(r.last().unwrap().kind, REP_ACK, "{queries:?} is no error: {r:?}");
        assert_eq!(r.len() == 2, selected, "{queries:?}: {r:?}");
    }
}

// Rules 46 and 47: LIST with no queries or "base:" lists base:allocation (id 0); unknown
// namespaces are ignored; a malformed request is ERR_INVALID (rule 13).
#[test]
fn list_meta_context_follows_the_base_namespace_rules_rule_46() {
    let s = server();
    let mut c = started(&s);
    assert_eq!(c.ask(OPT_STRUCTURED_REPLY, &[])[0].kind, REP_ACK);
    c.structured = true;
    for (queries, listed) in
        [(vec![], true), (vec!["base:"], true), (vec!["x-vendor:thing"], false), (vec!["base:allocation"], true)]
    {
        let r = c.ask(OPT_LIST_META_CONTEXT, &meta_data("disk", &queries));
        assert_eq!(r.last().unwrap().kind, REP_ACK, "{queries:?}: {r:?}");
        if listed {
            assert_eq!(r.len(), 2, "{queries:?}: {r:?}");
            assert_eq!(r[0].kind, REP_META_CONTEXT);
            assert_eq!(be32(&r[0].data[0..4]), 0, "LIST context ids are 0");
            assert_eq!(&r[0].data[4..], b"base:allocation");
        } else {
            assert_eq!(r.len(), 1, "{queries:?}: {r:?}");
        }
    }
    let mut bad = meta_data("disk", &["base:allocation"]);
    bad[8 + 4..12 + 4].copy_from_slice(&1000u32.to_be_bytes()); // query length runs past the option
    let r = c.ask(OPT_LIST_META_CONTEXT, &bad);
    assert_eq!(r.len(), 1);
    assert_error_reply(&r[0], OPT_LIST_META_CONTEXT, REP_ERR_INVALID);
    assert_go_works(&mut c, "disk");
}

/// The identity of an export (`x-sluice:identity:HEX`, listed when named, never selected):
/// what a
/// reconnecting client (`sluice attach`) compares. The same file keeps it across a restart;
/// another file, or a RAM disk started afresh, does not. Listed without structured replies
/// too, since the kernel's client negotiates none.
#[test]
fn the_export_identity_is_listed_and_follows_the_data_not_the_name() {
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = (dir.path().join("a.img"), dir.path().join("b.img"));
    for f in [&a, &b] {
        std::fs::File::create(f).unwrap().set_len(1 << 20).unwrap();
    }
    let identity = |s: &Sluice, export: &str| {
        let mut c = started(s);
        let r = c.ask(OPT_LIST_META_CONTEXT, &meta_data(export, &["x-sluice:identity"]));
        assert_eq!(r.len(), 2, "{r:?}");
        assert_eq!(r[1].kind, REP_ACK);
        assert_eq!(be32(&r[0].data[0..4]), 0, "LIST context ids are 0");
        let name = String::from_utf8(r[0].data[4..].to_vec()).unwrap();
        let id = name.strip_prefix("x-sluice:identity:").unwrap_or_else(|| panic!("{name}")).to_owned();
        assert!(id.len() == 32 && id.bytes().all(|c| c.is_ascii_hexdigit()), "{id}");
        let r = c.ask(OPT_LIST_META_CONTEXT, &meta_data(export, &["x-sluice:"]));
        assert_eq!(r.len(), 2, "the namespace lists it too: {r:?}");
        // Listed without structured replies, and GO follows as ever.
        assert_go_works(&mut c, export);
        id
    };
    let (fa, fb) = (format!("disk={}", a.display()), format!("other={}", b.display()));
    let mut s = Sluice::start(&["--export", &fa, "--export", &fb, "--export", "ram=memory:1M"]);
    let (first_a, first_b, first_ram) = (identity(&s, "disk"), identity(&s, "other"), identity(&s, "ram"));
    assert_ne!(first_a, first_b, "two files, one identity");
    s.kill_and_restart();
    assert_eq!(identity(&s, "disk"), first_a, "the same file after a restart");
    assert_ne!(identity(&s, "ram"), first_ram, "a RAM disk started afresh keeps its identity");
    drop(s);
    let swapped = format!("disk={}", b.display());
    let s = Sluice::start(&["--export", &swapped]);
    assert_eq!(identity(&s, "disk"), first_b, "the identity follows the file, not the export's name");
}

// Rules 41 and 89: the 124 zeros belong to EXPORT_NAME only; GO never pads, even for a
// client that did not set C_NO_ZEROES.
#[test]
fn go_never_pads_even_without_no_zeroes_rule_89() {
    let s = server();
    let mut c = Client::unix(&s.socket);
    c.greeting();
    c.client_flags(FLAG_C_FIXED_NEWSTYLE);
    let e = c.go("disk", false, false);
    assert_eq!(e.size, DISK_SIZE);
    let data = pattern(4096, 3);
    c.write(0, &data);
    assert_eq!(c.read(0, 4096), data);
    c.disconnect();
}
