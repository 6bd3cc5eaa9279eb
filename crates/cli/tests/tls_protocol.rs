//! STARTTLS as doc/proto.md's "TLS support" section requires, byte by byte with a raw
//! client: what a FORCEDTLS server answers before TLS, STARTTLS's own errors, state from
//! before TLS forgotten after it, close_notify on disconnect; hostile clients (garbage
//! instead of a ClientHello, a stalled handshake, a connection dropped mid-record) while
//! others are served; and the pipelined-read and many-client workloads over TLS.
mod common;
mod raw;
use std::io::{Read, Write};
use std::time::Duration;

use common::tls::Keys;
use common::*;
use raw::*;

const REP_ERR_TLS_REQD: u32 = 0x8000_0005;

fn server(keys: &Keys, mode: &str, extra: &[&str]) -> Sluice {
    let dir = keys.server_dir();
    let mut args = vec!["--tls", mode, "--tls-certificates", dir.to_str().unwrap(), "--export", "disk=memory:8M"];
    args.extend_from_slice(extra);
    Sluice::start(&args)
}

/// A raw client over TCP that is through STARTTLS and the TLS handshake.
fn tls_client(s: &Sluice, keys: &Keys) -> Client {
    let mut c = Client::tcp(s.port);
    c.start();
    assert_eq!(c.ask(OPT_STARTTLS, &[]), vec![OptReply { option: OPT_STARTTLS, kind: REP_ACK, data: vec![] }]);
    c.start_tls(&keys.ca_only_client_dir()).expect("TLS handshake");
    c
}

fn single(replies: Vec<OptReply>, option: u32, kind: u32) {
    assert_eq!(replies.len(), 1, "{replies:?}");
    assert_eq!((replies[0].option, replies[0].kind), (option, kind), "{replies:?}");
}

#[test]
fn forced_tls_answers_every_option_but_starttls_with_tls_reqd_and_hangs_up_on_export_name() {
    require!("certtool");
    let keys = Keys::generate();
    let s = server(&keys, "require", &[]);
    let mut c = Client::tcp(s.port);
    c.start();
    single(c.ask(OPT_LIST, &[]), OPT_LIST, REP_ERR_TLS_REQD);
    single(c.ask(OPT_INFO, &info_data("disk", &[])), OPT_INFO, REP_ERR_TLS_REQD);
    single(c.ask(OPT_GO, &info_data("disk", &[])), OPT_GO, REP_ERR_TLS_REQD);
    single(c.ask(OPT_STRUCTURED_REPLY, &[]), OPT_STRUCTURED_REPLY, REP_ERR_TLS_REQD);
    single(c.ask(OPT_SET_META_CONTEXT, &meta_data("disk", &["base:allocation"])), OPT_SET_META_CONTEXT, REP_ERR_TLS_REQD);
    // EXPORT_NAME has no error reply: the server must hang up without a byte.
    c.option(OPT_EXPORT_NAME, b"disk");
    assert!(c.expect_close().is_empty(), "the export's size was sent in plaintext");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn starttls_with_a_payload_or_a_second_starttls_is_invalid() {
    require!("certtool");
    let keys = Keys::generate();
    let s = server(&keys, "require", &[]);
    let mut c = Client::tcp(s.port);
    c.start();
    single(c.ask(OPT_STARTTLS, b"junk"), OPT_STARTTLS, REP_ERR_INVALID);
    assert_eq!(c.ask(OPT_STARTTLS, &[])[0].kind, REP_ACK);
    c.start_tls(&keys.ca_only_client_dir()).expect("TLS handshake");
    single(c.ask(OPT_STARTTLS, &[]), OPT_STARTTLS, REP_ERR_INVALID);
    // Still in step, and over TLS nothing is refused for want of TLS.
    let e = c.go("disk", true, false);
    assert_eq!(e.size, 8 << 20);
    let data = pattern(100_000, 3);
    c.write(4096, &data);
    assert!(c.read(4096, 100_000) == data);
    c.disconnect();
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn structured_replies_injected_before_starttls_do_not_stay_in_effect() {
    require!("certtool");
    let keys = Keys::generate();
    let s = server(&keys, "on", &[]);
    let mut c = Client::tcp(s.port);
    c.start();
    // What a man in the middle would inject ahead of the client's STARTTLS.
    assert_eq!(c.ask(OPT_STRUCTURED_REPLY, &[])[0].kind, REP_ACK);
    assert_eq!(c.ask(OPT_SET_META_CONTEXT, &meta_data("disk", &["base:allocation"])).last().unwrap().kind, REP_ACK);
    assert_eq!(c.ask(OPT_STARTTLS, &[])[0].kind, REP_ACK);
    c.start_tls(&keys.ca_only_client_dir()).expect("TLS handshake");
    let e = c.go("disk", false, false);
    assert_eq!(e.flags & SEND_DF, 0, "DF advertised: structured replies survived STARTTLS");
    let h = c.req(0, CMD_READ, 0, 4096);
    let r = c.reply(h);
    assert!(r.is_simple(), "a structured reply to a client that negotiated none over TLS: {r:?}");
    c.disconnect();
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn disconnect_ends_the_tls_session_with_close_notify() {
    require!("certtool");
    let keys = Keys::generate();
    let s = server(&keys, "require", &[]);
    let mut c = tls_client(&s, &keys);
    c.go("disk", true, false);
    c.send(&request(0, CMD_DISC, 0, 0, 0));
    let Stream::Tls(tls) = &mut c.stream else { unreachable!() };
    let mut b = [0u8; 16];
    // OpenSSL reports a close without close_notify as an error, a close_notify as 0 bytes.
    assert_eq!(tls.read(&mut b).expect("a clean TLS close"), 0);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn garbage_instead_of_a_client_hello_is_dropped_and_others_are_served() {
    require!("certtool");
    let keys = Keys::generate();
    let s = server(&keys, "require", &[]);
    let mut c = Client::tcp(s.port);
    c.start();
    assert_eq!(c.ask(OPT_STARTTLS, &[])[0].kind, REP_ACK);
    // Plaintext options sent right after STARTTLS (the buffering attack) are not options.
    let mut junk = IHAVEOPT.to_vec();
    junk.extend_from_slice(&OPT_GO.to_be_bytes());
    junk.extend_from_slice(&[0u8; 4]);
    junk.extend_from_slice(&pattern(300, 9));
    c.send(&junk);
    let sent = c.expect_close();
    assert!(!sent.windows(8).any(|w| w == REP_MAGIC), "an option reply followed garbage after STARTTLS");
    let mut other = tls_client(&s, &keys);
    other.go("disk", true, false);
    assert_eq!(other.read(0, 512).len(), 512);
    other.disconnect();
    assert!(s.log_text().contains("TLS handshake failed"), "{}", s.log_text());
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn a_stalled_tls_handshake_is_freed_by_the_handshake_deadline() {
    require!("certtool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "[limits]\nhandshake-timeout-ms = 1000\n").unwrap();
    let s = server(&keys, "require", &["--config", config.to_str().unwrap()]);
    let mut c = Client::tcp(s.port);
    c.start();
    assert_eq!(c.ask(OPT_STARTTLS, &[])[0].kind, REP_ACK);
    // The first bytes of a ClientHello record header, then silence.
    c.send(&[0x16, 0x03, 0x01]);
    c.close_within(Duration::from_secs(10)).expect("the stalled handshake was never dropped");
    let mut other = tls_client(&s, &keys);
    other.go("disk", true, false);
    other.disconnect();
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn a_client_trickling_its_handshake_gets_no_more_than_the_deadline() {
    // One byte now and then must not earn a fresh timeout each time: the deadline covers
    // the whole handshake, plaintext options and the TLS handshake alike.
    require!("certtool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "[limits]\nhandshake-timeout-ms = 1000\n").unwrap();
    let s = server(&keys, "on", &["--config", config.to_str().unwrap()]);
    let mut tls_trickle = Client::tcp(s.port);
    tls_trickle.start();
    assert_eq!(tls_trickle.ask(OPT_STARTTLS, &[])[0].kind, REP_ACK);
    tls_trickle.send(&[0x16, 0x03, 0x01, 0x02, 0x00]);
    let mut plain_trickle = Client::tcp(s.port);
    plain_trickle.start();
    let mut list = IHAVEOPT.to_vec();
    list.extend_from_slice(&OPT_LIST.to_be_bytes());
    list.extend_from_slice(&600u32.to_be_bytes());
    plain_trickle.send(&list);
    for c in [&mut tls_trickle, &mut plain_trickle] {
        let mut w = c.writer();
        // Keeps trickling until the server has closed (the write fails) or 20 s passed.
        std::thread::spawn(move || {
            for _ in 0..100 {
                std::thread::sleep(Duration::from_millis(200));
                if w.write_all(&[0x01]).is_err() {
                    return;
                }
            }
        });
    }
    for c in [&mut tls_trickle, &mut plain_trickle] {
        c.close_within(Duration::from_secs(10)).expect("a trickling client outlived the handshake deadline by 9 s");
    }
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn a_client_that_drops_mid_record_is_closed_and_others_keep_going() {
    require!("certtool");
    let keys = Keys::generate();
    let s = server(&keys, "require", &[]);
    let mut steady = tls_client(&s, &keys);
    steady.go("disk", true, false);
    let data = pattern(1 << 20, 4);
    steady.write(0, &data);
    for round in 0..3 {
        let mut c = tls_client(&s, &keys);
        c.go("disk", true, false);
        // A record header promising 16 KiB, part of the record, then the socket closes.
        let mut tcp = c.tcp_under_tls();
        tcp.write_all(&[0x17, 0x03, 0x03, 0x40, 0x11]).unwrap();
        tcp.write_all(&pattern(1000 * (round + 1), round as u64)).unwrap();
        drop(tcp);
        drop(c);
        assert!(steady.read(0, 1 << 20) == data, "round {round}: the other client's data changed");
    }
    // And a record that arrives in full but does not decrypt.
    let mut c = tls_client(&s, &keys);
    c.go("disk", true, false);
    let mut tcp = c.tcp_under_tls();
    let mut bad = vec![0x17, 0x03, 0x03, 0x00, 0x40];
    bad.extend_from_slice(&pattern(64, 7));
    tcp.write_all(&bad).unwrap();
    tcp.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut rest = Vec::new();
    let _ = tcp.read_to_end(&mut rest);
    assert!(steady.read(0, 4096) == data[..4096]);
    steady.disconnect();
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn pipelined_reads_reassemble_byte_exact_over_tls() {
    require!("certtool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("disk.img");
    let data = pattern(4 << 20, 5);
    write_file(&file, &data);
    let spec = format!("disk={}", file.display());
    for path in ["copy", "splice", "direct"] {
        let s = Sluice::start(&[
            "--tls=require",
            "--tls-certificates",
            keys.server_dir().to_str().unwrap(),
            "--export",
            &spec,
            "--data-path",
            path,
            "--chunk",
            "64K",
        ]);
        let mut c = tls_client(&s, &keys);
        c.go("disk", true, false);
        // Several large reads in flight at once, their chunks interleaved on the wire.
        let handles: Vec<(u64, u64, u32)> = [(0u64, 1u32 << 20), (12345, 700_001), (3 << 20, 1 << 20), (4097, 2 << 20)]
            .iter()
            .map(|&(off, len)| (c.req(0, CMD_READ, off, len), off, len))
            .collect();
        let replies = c.replies(handles.len());
        for (h, off, len) in handles {
            let got = replies[&h].read_data();
            assert!(got == data[off as usize..off as usize + len as usize], "{path}: read of {len} at {off} differs");
        }
        c.disconnect();
        assert_eq!(s.stop().code(), Some(0));
    }
}

#[test]
fn many_tls_clients_write_and_verify_their_own_regions() {
    require!("certtool");
    let keys = std::sync::Arc::new(Keys::generate());
    let s = std::sync::Arc::new(server(&keys, "require", &[]));
    let threads: Vec<_> = (0..16u64)
        .map(|i| {
            let (s, keys) = (std::sync::Arc::clone(&s), std::sync::Arc::clone(&keys));
            std::thread::spawn(move || {
                let mut c = tls_client(&s, &keys);
                let e = c.go("disk", true, false);
                assert_ne!(e.flags & 0x0100, 0, "multi-conn is advertised over TLS");
                let base = i * (512 << 10);
                let data = pattern(512 << 10, 100 + i);
                // Eight writes in flight, then eight reads.
                let writes: Vec<u64> = (0..8).map(|k| c.req_write(0, base + k * 65536, &data[k as usize * 65536..][..65536])).collect();
                let replies = c.replies(writes.len());
                writes.iter().for_each(|h| replies[h].assert_ok());
                let reads: Vec<u64> = (0..8).map(|k| c.req(0, CMD_READ, base + k * 65536, 65536)).collect();
                let replies = c.replies(reads.len());
                for (k, h) in reads.iter().enumerate() {
                    assert!(replies[h].read_data() == data[k * 65536..][..65536], "client {i}: block {k} differs");
                }
                c.disconnect();
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let s = std::sync::Arc::into_inner(s).unwrap();
    assert_eq!(s.stop().code(), Some(0));
}
