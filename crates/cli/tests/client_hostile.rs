//! The client against a fake server that lies: chunks outside the request, overlapping
//! chunks, huge lengths, unknown chunk types, stray handles, bad handshakes. Every case must
//! end in a clean error, within a time bound, with no panic.

use sluice_client::{Client, Error};
use sluice_proto::reply::{self, ReplyTo};
use sluice_proto::wire::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

const SIZE: u64 = 1 << 20;
const CONTEXT: u32 = 9;

/// What the fake server does: answer the handshake honestly (or not), then reply to the
/// first request with whatever the script writes.
type Script = fn(&mut TcpStream, Request);

#[derive(Clone, Copy, Debug)]
struct Request {
    kind: u16,
    handle: u64,
    offset: u64,
    len: u32,
}

fn read_exact(s: &mut TcpStream, n: usize) -> Option<Vec<u8>> {
    let mut b = vec![0u8; n];
    s.read_exact(&mut b).ok()?;
    Some(b)
}

fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b[..4].try_into().unwrap())
}

fn option_reply(s: &mut TcpStream, opt: u32, kind: u32, payload: &[u8]) {
    let mut out = Vec::new();
    out.extend_from_slice(&OPTION_REPLY_MAGIC.to_be_bytes());
    out.extend_from_slice(&opt.to_be_bytes());
    out.extend_from_slice(&kind.to_be_bytes());
    out.extend_from_slice(&(payload.len() as u32).to_be_bytes());
    out.extend_from_slice(payload);
    s.write_all(&out).unwrap();
}

/// An honest fixed-newstyle handshake with structured replies and base:allocation.
fn handshake(s: &mut TcpStream) -> Option<()> {
    handshake_with(s, 1, false, false)
}

/// The handshake, advertising a minimum block size of `block_min`; with `meta_fails`,
/// SET_META_CONTEXT names the context and then fails (so no context is selected); with
/// `extended`, extended headers are agreed (else refused as unknown).
fn handshake_with(s: &mut TcpStream, block_min: u32, meta_fails: bool, extended: bool) -> Option<()> {
    let mut g = NBDMAGIC.to_be_bytes().to_vec();
    g.extend_from_slice(&IHAVEOPT.to_be_bytes());
    g.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&g).ok()?;
    read_exact(s, 4)?;
    loop {
        let h = read_exact(s, 16)?;
        let opt = be32(&h[8..]);
        read_exact(s, be32(&h[12..]) as usize)?;
        match opt {
            OPT_STRUCTURED_REPLY => option_reply(s, opt, REP_ACK, &[]),
            OPT_EXTENDED_HEADERS if extended => option_reply(s, opt, REP_ACK, &[]),
            OPT_SET_META_CONTEXT => {
                let mut p = CONTEXT.to_be_bytes().to_vec();
                p.extend_from_slice(META_BASE_ALLOCATION.as_bytes());
                option_reply(s, opt, REP_META_CONTEXT, &p);
                option_reply(s, opt, if meta_fails { REP_ERR_INVALID } else { REP_ACK }, &[]);
            }
            OPT_GO => {
                let mut p = INFO_EXPORT.to_be_bytes().to_vec();
                p.extend_from_slice(&SIZE.to_be_bytes());
                p.extend_from_slice(&(FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_WRITE_ZEROES).to_be_bytes());
                option_reply(s, opt, REP_INFO, &p);
                if block_min > 1 {
                    let mut b = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                    for v in [block_min, block_min, 1 << 20] {
                        b.extend_from_slice(&v.to_be_bytes());
                    }
                    option_reply(s, opt, REP_INFO, &b);
                }
                option_reply(s, opt, REP_ACK, &[]);
                return Some(());
            }
            _ => option_reply(s, opt, REP_ERR_UNSUP, &[]),
        }
    }
}

fn next_request(s: &mut TcpStream) -> Option<Request> {
    next_request_as(s, false)
}

fn next_request_as(s: &mut TcpStream, extended: bool) -> Option<Request> {
    let b = read_exact(s, sluice_proto::request::header_bytes(extended))?;
    let raw = sluice_proto::RawRequest::decode_as(&b, extended).ok()?;
    read_exact(s, raw.payload_len(extended) as usize)?;
    Some(Request { kind: raw.kind, handle: raw.handle, offset: raw.offset, len: raw.length as u32 })
}

/// Starts a fake server that handshakes, then runs `script` on the first request and keeps
/// the connection open (reading and ignoring) until the client goes away.
fn fake(script: Script) -> u16 {
    fake_with(1, false, false, script)
}

fn fake_with(block_min: u32, meta_fails: bool, extended: bool, script: Script) -> u16 {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        if handshake_with(&mut s, block_min, meta_fails, extended).is_none() {
            return;
        }
        let Some(r) = next_request_as(&mut s, extended) else { return };
        script(&mut s, r);
        let mut sink = [0u8; 4096];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    port
}

/// Connects, reads 4096 bytes at 4096 and returns the result, all within 10 seconds.
fn read_from(port: u16) -> Result<Vec<u8>, Error> {
    read_into_from(port, 0)
}

/// As `read_from`, into a buffer that holds `old` in every byte before the read.
fn read_into_from(port: u16, old: u8) -> Result<Vec<u8>, Error> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), async {
            let c = Client::connect(&format!("nbd://127.0.0.1:{port}/")).await?;
            let first = c.read_owned(4096, vec![old; 4096]).await;
            if matches!(first, Err(Error::Protocol(_))) {
                // The connection must now refuse further work rather than hang.
                let again = c.read_owned(0, vec![0; 512]).await;
                assert!(again.is_err(), "connection still used after a protocol error");
            }
            first
        })
        .await
        .expect("client hung on a hostile server")
    })
}

fn assert_protocol_error(script: Script, what: &str) {
    assert_protocol_error_from(fake(script), what);
}

fn assert_protocol_error_from(port: u16, what: &str) {
    match read_from(port) {
        Err(Error::Protocol(m)) => eprintln!("{what}: {m}"),
        other => panic!("{what}: expected a protocol error, got {:?}", other.map(|v| v.len())),
    }
}

fn data_chunk(s: &mut TcpStream, handle: u64, offset: u64, data: &[u8], done: bool) {
    let _ = s.write_all(&reply::offset_data_header(ReplyTo::compact(handle), offset, data.len() as u32, done));
    let _ = s.write_all(data);
}

#[test]
fn chunk_before_the_request() {
    assert_protocol_error(|s, r| data_chunk(s, r.handle, r.offset - 1, &[1; 4096], true), "before");
}

#[test]
fn chunk_past_the_request() {
    assert_protocol_error(|s, r| data_chunk(s, r.handle, r.offset + 1, &[1; 4096], true), "past");
}

#[test]
fn chunk_offset_overflow() {
    assert_protocol_error(|s, r| data_chunk(s, r.handle, u64::MAX - 10, &[1; 100], true), "overflow");
}

#[test]
fn overlapping_chunks() {
    assert_protocol_error(
        |s, r| {
            data_chunk(s, r.handle, r.offset, &[1; 2048], false);
            data_chunk(s, r.handle, r.offset + 1024, &[2; 2048], true);
        },
        "overlap",
    );
}

#[test]
fn overlapping_hole_and_data() {
    assert_protocol_error(
        |s, r| {
            let _ = s.write_all(&reply::offset_hole(ReplyTo::compact(r.handle), r.offset + 2048, 2048, false));
            data_chunk(s, r.handle, r.offset + 1024, &[2; 2048], true);
        },
        "hole overlap",
    );
}

#[test]
fn huge_data_length() {
    // Claims 4 GiB of data for a 4 KiB read: refused from the header, nothing allocated.
    assert_protocol_error(
        |s, r| {
            let _ = s.write_all(&reply::chunk_header(ReplyTo::compact(r.handle), REPLY_TYPE_OFFSET_DATA, true, u32::MAX as u64));
            let _ = s.write_all(&r.offset.to_be_bytes());
        },
        "huge data",
    );
}

#[test]
fn huge_error_chunk() {
    assert_protocol_error(|s, r| drop(s.write_all(&reply::chunk_header(ReplyTo::compact(r.handle), REPLY_TYPE_ERROR, true, 0x7fff_ffff))), "huge error");
}

#[test]
fn unknown_chunk_type() {
    assert_protocol_error(|s, r| drop(s.write_all(&reply::chunk_header(ReplyTo::compact(r.handle), 77, true, 0))), "unknown type");
}

#[test]
fn reply_to_a_handle_never_sent() {
    assert_protocol_error(|s, r| data_chunk(s, r.handle ^ 0xdead_beef, r.offset, &[1; 4096], true), "stray handle");
}

#[test]
fn done_without_covering_the_read() {
    assert_protocol_error(|s, r| data_chunk(s, r.handle, r.offset, &[1; 1024], true), "short");
}

#[test]
fn zero_length_data_chunk() {
    assert_protocol_error(|s, r| data_chunk(s, r.handle, r.offset, &[], true), "empty data");
}

#[test]
fn bad_reply_magic() {
    assert_protocol_error(|s, _| drop(s.write_all(&[0x12; 64])), "bad magic");
}

#[test]
fn none_chunk_with_payload() {
    assert_protocol_error(|s, r| drop(s.write_all(&reply::chunk_header(ReplyTo::compact(r.handle), REPLY_TYPE_NONE, true, 4))), "NONE with payload");
}

#[test]
fn error_offset_outside_the_request() {
    assert_protocol_error(
        |s, r| {
            let mut out = Vec::new();
            reply::error_chunk(&mut out, ReplyTo::compact(r.handle), sluice_proto::Errno::Io, "x", Some(r.offset + r.len as u64));
            let _ = s.write_all(&out);
        },
        "error offset",
    );
}

#[test]
fn hole_chunk_with_wrong_size() {
    assert_protocol_error(
        |s, r| {
            let _ = s.write_all(&reply::chunk_header(ReplyTo::compact(r.handle), REPLY_TYPE_OFFSET_HOLE, true, 11));
            let _ = s.write_all(&[0; 11]);
        },
        "hole size",
    );
}

#[test]
fn close_in_the_middle_of_data() {
    let port = fake(|s, r| {
        let _ = s.write_all(&reply::offset_data_header(ReplyTo::compact(r.handle), r.offset, 4096, true));
        let _ = s.write_all(&[1; 100]);
        let _ = s.shutdown(std::net::Shutdown::Both);
    });
    match read_from(port) {
        Err(Error::Closed | Error::Io(_)) => {}
        other => panic!("expected a closed connection, got {:?}", other.map(|v| v.len())),
    }
}

#[test]
fn unknown_error_type_fails_only_the_request() {
    // Error types (bit 15) the client does not know still carry an errno and message.
    let port = fake(|s, r| {
        let mut p = 28u32.to_be_bytes().to_vec();
        p.extend_from_slice(&2u16.to_be_bytes());
        p.extend_from_slice(b"no");
        let _ = s.write_all(&reply::chunk_header(ReplyTo::compact(r.handle), 0x8007, true, p.len() as u64));
        let _ = s.write_all(&p);
    });
    match read_from(port) {
        Err(Error::Server { errno: 28, message: Some(m) }) => assert_eq!(m, "no"),
        other => panic!("expected ENOSPC, got {:?}", other.map(|v| v.len())),
    }
}

#[test]
fn honest_out_of_order_chunks_with_a_hole_are_accepted() {
    // The control case: the same fake server, telling the truth in a strange order.
    let port = fake(|s, r| {
        data_chunk(s, r.handle, r.offset + 3072, &[3; 1024], false);
        let _ = s.write_all(&reply::offset_hole(ReplyTo::compact(r.handle), r.offset + 1024, 2048, false));
        data_chunk(s, r.handle, r.offset, &[1; 1024], true);
    });
    let got = read_from(port).expect("honest reply refused");
    assert!(got[..1024].iter().all(|&b| b == 1));
    assert!(got[1024..3072].iter().all(|&b| b == 0));
    assert!(got[3072..].iter().all(|&b| b == 3));
}

#[test]
fn a_hole_reads_as_zeros_whatever_the_buffer_held() {
    // The client does not zero a read's buffer first: a hole chunk must write its zeros.
    let port = fake(|s, r| {
        let _ = s.write_all(&reply::offset_hole(ReplyTo::compact(r.handle), r.offset, 1024, false));
        data_chunk(s, r.handle, r.offset + 1024, &[5; 3072], true);
    });
    let got = read_into_from(port, 0xaa).expect("honest reply refused");
    assert!(got[..1024].iter().all(|&b| b == 0), "the hole kept what the buffer held");
    assert!(got[1024..].iter().all(|&b| b == 5));
}

/// A fake whose handshake itself misbehaves.
fn fake_handshake(script: fn(&mut TcpStream)) -> Error {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
        script(&mut s);
        let mut sink = [0u8; 4096];
        while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
    });
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(15), Client::connect(&format!("nbd://127.0.0.1:{port}/")))
            .await
            .expect("client hung in a hostile handshake")
            .err()
            .expect("hostile handshake accepted")
    })
}

fn greet(s: &mut TcpStream) {
    let mut g = NBDMAGIC.to_be_bytes().to_vec();
    g.extend_from_slice(&IHAVEOPT.to_be_bytes());
    g.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&g).unwrap();
    read_exact(s, 4);
}

fn skip_option(s: &mut TcpStream) -> u32 {
    let h = read_exact(s, 16).unwrap();
    read_exact(s, be32(&h[12..]) as usize);
    be32(&h[8..])
}

#[test]
fn handshake_garbage_greeting() {
    let e = fake_handshake(|s| drop(s.write_all(b"HTTP/1.1 200 OK\r\n\r\nhello there")));
    assert!(matches!(e, Error::Protocol(_)), "{e}");
}

#[test]
fn handshake_huge_option_reply() {
    let e = fake_handshake(|s| {
        greet(s);
        let opt = skip_option(s);
        let mut out = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
        out.extend_from_slice(&opt.to_be_bytes());
        out.extend_from_slice(&REP_ACK.to_be_bytes());
        out.extend_from_slice(&u32::MAX.to_be_bytes());
        let _ = s.write_all(&out);
    });
    assert!(matches!(e, Error::Protocol(_)), "{e}");
}

#[test]
fn handshake_reply_to_another_option() {
    let e = fake_handshake(|s| {
        greet(s);
        skip_option(s);
        option_reply(s, OPT_LIST, REP_ACK, &[]);
    });
    assert!(matches!(e, Error::Protocol(_)), "{e}");
}

#[test]
fn handshake_go_without_export_info() {
    let e = fake_handshake(|s| {
        greet(s);
        loop {
            let opt = skip_option(s);
            let kind = if opt == OPT_SET_META_CONTEXT { REP_ERR_UNSUP } else { REP_ACK };
            option_reply(s, opt, kind, &[]);
            if opt == OPT_GO {
                return;
            }
        }
    });
    assert!(matches!(e, Error::Protocol(_)), "{e}");
}

#[test]
fn handshake_impossible_block_sizes() {
    let e = fake_handshake(|s| {
        greet(s);
        loop {
            let opt = skip_option(s);
            if opt == OPT_GO {
                let mut p = INFO_BLOCK_SIZE.to_be_bytes().to_vec();
                for v in [3u32, 4096, 1 << 20] {
                    p.extend_from_slice(&v.to_be_bytes());
                }
                option_reply(s, opt, REP_INFO, &p);
                return;
            }
            option_reply(s, opt, REP_ERR_UNSUP, &[]);
        }
    });
    assert!(matches!(e, Error::Protocol(_)), "{e}");
}

#[test]
fn handshake_closed_early() {
    let e = fake_handshake(|s| drop(s.shutdown(std::net::Shutdown::Both)));
    assert!(matches!(e, Error::Protocol(_) | Error::Io(_)), "{e}");
}

/// Runs `body` on a client connected to the fake server at `port`, within 10 seconds.
fn with_client<T>(port: u16, body: impl AsyncFnOnce(Client) -> T) -> T {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        tokio::time::timeout(Duration::from_secs(10), async {
            let c = Client::connect(&format!("nbd://127.0.0.1:{port}/")).await.expect("connect");
            body(c).await
        })
        .await
        .expect("client hung on the fake server")
    })
}

#[test]
fn scattered_tiny_chunks_hit_the_fragment_cap() {
    // 1-byte holes at every other byte of a 16 KiB read: more separate pieces than the cap.
    let port = fake(|s, r| {
        let mut out = Vec::new();
        for i in 0..(r.len as u64 / 2) {
            out.extend_from_slice(&reply::offset_hole(ReplyTo::compact(r.handle), r.offset + 2 * i, 1, false));
        }
        let _ = s.write_all(&out);
    });
    let got = with_client(port, async |c| c.read_owned(0, vec![0; 16384]).await);
    assert!(matches!(got, Err(Error::Protocol(ref m)) if m.contains("pieces")), "{:?}", got.map(|v| v.len()));
}

#[test]
fn a_large_block_status_reply_is_accepted() {
    // qemu-nbd sends up to 2^17 extents in one chunk: more than a MiB of payload.
    let port = fake(|s, r| {
        let n = 1u32 << 17;
        let mut out = reply::chunk_header(ReplyTo::compact(r.handle), REPLY_TYPE_BLOCK_STATUS, true, 4 + 8 * n as u64).to_vec();
        out.extend_from_slice(&CONTEXT.to_be_bytes());
        for i in 0..n {
            out.extend_from_slice(&1u32.to_be_bytes());
            out.extend_from_slice(&(i % 2 * STATE_HOLE).to_be_bytes());
        }
        let _ = s.write_all(&out);
    });
    let extents = with_client(port, async |c| c.block_status(0, 1 << 17).await).expect("legal reply refused");
    assert_eq!(extents.len(), 1 << 17);
    assert_eq!(extents.iter().map(|e| e.length).sum::<u64>(), 1 << 17);
}

#[test]
fn minimum_block_size_is_kept() {
    // The server asks for 4096-byte blocks: an unaligned read goes out widened to whole
    // blocks, and an unaligned write is refused before it is sent.
    let port = fake_with(4096, false, false, |s, r| {
        assert_eq!((r.kind, r.offset, r.len), (CMD_READ, 0, 8192), "the read was not widened to whole blocks");
        let data: Vec<u8> = (0..8192u32).map(|i| i as u8).collect();
        data_chunk(s, r.handle, 0, &data, true);
    });
    let (read, write) = with_client(port, async |c| {
        let read = c.read_owned(100, vec![0; 5000]).await;
        let write = c.write(100, &[1; 10], false).await;
        let zero = c.write_zeroes(512, 4096, false, true, false).await;
        assert!(matches!(zero, Err(Error::Unaligned { block: 4096, .. })), "{zero:?}");
        (read, write)
    });
    let want: Vec<u8> = (100..5100u32).map(|i| i as u8).collect();
    assert_eq!(read.expect("widened read"), want);
    assert!(matches!(write, Err(Error::Unaligned { offset: 100, len: 10, block: 4096 })), "{write:?}");
}

#[test]
fn a_failed_set_meta_context_selects_no_context() {
    let port = fake_with(1, true, false, |_, _| {});
    let (base_allocation, extents) = with_client(port, async |c| (c.export().base_allocation, c.block_status(0, 4096).await));
    assert!(!base_allocation, "context kept after SET_META_CONTEXT failed");
    // Without the context no BLOCK_STATUS is sent: the whole range is reported as data.
    let e = extents.unwrap();
    assert_eq!((e.len(), e[0].hole, e[0].length), (1, false, 4096));
}

#[test]
fn a_dropped_client_still_sends_disc() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        handshake(&mut s).unwrap();
        let _ = tx.send(next_request(&mut s).map(|r| r.kind));
    });
    with_client(port, async |c| {
        drop(c);
        tokio::time::sleep(Duration::from_millis(200)).await;
    });
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Some(CMD_DISC));
}

#[test]
fn eshutdown_means_no_new_requests_then_disc() {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        handshake(&mut s).unwrap();
        let r = next_request(&mut s).unwrap();
        let mut out = Vec::new();
        reply::error_chunk(&mut out, ReplyTo::compact(r.handle), sluice_proto::Errno::Shutdown, "going away", None);
        s.write_all(&out).unwrap();
        // What the client sends next must be DISC: no new request after ESHUTDOWN.
        let _ = tx.send(next_request(&mut s).map(|r| r.kind));
    });
    let (first, second) = with_client(port, async |c| {
        let first = c.read_owned(0, vec![0; 512]).await;
        tokio::time::sleep(Duration::from_millis(100)).await;
        (first, c.read_owned(0, vec![0; 512]).await)
    });
    assert!(matches!(first, Err(Error::Server { errno: 108, .. })), "{:?}", first.map(|v| v.len()));
    assert!(second.is_err(), "a request was accepted after ESHUTDOWN");
    assert_eq!(rx.recv_timeout(Duration::from_secs(10)).unwrap(), Some(CMD_DISC));
}

// ---------------------------------------------------------------------------------------
// Extended headers
// ---------------------------------------------------------------------------------------

fn extended_to(r: &Request) -> ReplyTo {
    ReplyTo { handle: r.handle, offset: r.offset, extended: true }
}

#[test]
fn extended_headers_carry_an_honest_read() {
    let port = fake_with(1, false, true, |s, r| {
        let _ = s.write_all(&reply::offset_data_header(extended_to(&r), r.offset, 4096, true));
        let _ = s.write_all(&[0x5e; 4096]);
    });
    assert_eq!(read_from(port).expect("an honest extended reply refused"), vec![0x5e; 4096]);
}

#[test]
fn a_compact_reply_under_extended_headers() {
    let port = fake_with(1, false, true, |s, r| drop(s.write_all(&reply::simple(r.handle, None))));
    assert_protocol_error_from(port, "simple reply under extended headers");
    let port = fake_with(1, false, true, |s, r| data_chunk(s, r.handle, r.offset, &[1; 4096], true));
    assert_protocol_error_from(port, "structured chunk under extended headers");
}

#[test]
fn an_extended_reply_without_extended_headers() {
    assert_protocol_error(
        |s, r| {
            let _ = s.write_all(&reply::offset_data_header(extended_to(&r), r.offset, 4096, true));
            let _ = s.write_all(&[1; 4096]);
        },
        "extended chunk, compact session",
    );
}

#[test]
fn a_huge_extended_error_chunk() {
    // A 64-bit payload length: refused from the header, nothing allocated.
    let port = fake_with(1, false, true, |s, r| {
        let _ = s.write_all(&reply::chunk_header(extended_to(&r), REPLY_TYPE_ERROR, true, 1 << 40));
    });
    assert_protocol_error_from(port, "huge extended error chunk");
}
