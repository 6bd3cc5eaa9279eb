//! Hostile clients (half messages, garbage, stalled readers, connection storms) must not hurt the server or its neighbours.
mod common;
mod raw;

use std::io::Write;
use std::time::{Duration, Instant};

use common::{pattern, Sluice};
use raw::*;

const SIZE: u64 = 256 << 20;

/// One worker thread, so every connection shares the ring a hostile client could jam, and
/// a panic in that worker would show as a dead server for the next client.
fn server() -> Sluice {
    Sluice::start(&["memory:256M", "--threads", "1"])
}

/// The server process is up and a fresh client can write and read back on it.
fn assert_healthy(s: &mut Sluice, seed: u64) {
    assert!(s.alive(), "server died: {}", s.log_text());
    let (mut c, _) = Client::connect(&s.socket, "", true, true);
    let data = pattern(65536, seed);
    let offset = (seed % 1024) * 65536;
    c.write(offset, &data);
    assert_eq!(c.read(offset, 65536), data, "fresh client got wrong data");
    c.disconnect();
    assert!(!s.log_text().contains("panicked"), "a server thread panicked: {}", s.log_text());
}

/// Writes as much as the server will take; it may already have hung up.
fn send_lossy(c: &mut Client, bytes: &[u8]) {
    let _ = c.stream.write_all(bytes);
}

/// Tiny deterministic generator for the request fuzz.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

// Resource bounds: a client may vanish anywhere in a message (handshake, request header,
// WRITE payload, READ reply); the server cleans up and keeps serving.
#[test]
fn clients_disconnecting_mid_message_leave_the_server_serving() {
    let mut s = server();

    // Mid-option: the header promises 100 bytes, 50 arrive.
    let mut c = Client::unix(&s.socket);
    c.start();
    let mut b = IHAVEOPT.to_vec();
    b.extend_from_slice(&OPT_GO.to_be_bytes());
    b.extend_from_slice(&100u32.to_be_bytes());
    b.extend_from_slice(&[0u8; 50]);
    c.send(&b);
    drop(c);
    assert_healthy(&mut s, 1);

    // Mid-header.
    let (mut c, _) = Client::connect(&s.socket, "", true, true);
    c.send(&request(0, CMD_READ, 1, 0, 4096)[..10]);
    drop(c);
    assert_healthy(&mut s, 2);

    // Mid-payload, with reads still being answered to a socket about to close.
    let (mut c, _) = Client::connect(&s.socket, "", true, true);
    for i in 0..4 {
        c.req(0, CMD_READ, i << 22, 4 << 20);
    }
    let mut b = request(0, CMD_WRITE, 99, 0, 1 << 20).to_vec();
    b.extend_from_slice(&pattern(100 * 1024, 3));
    c.send(&b);
    drop(c);
    assert_healthy(&mut s, 3);
    let (mut c, _) = Client::connect(&s.socket, "", false, false);
    assert_eq!(c.read(0, 4096), vec![0u8; 4096], "a WRITE without its payload wrote");

    // Mid-reply: a 32 MiB read, of which 1000 bytes are read.
    let (mut c, _) = Client::connect(&s.socket, "", true, true);
    c.req(0, CMD_READ, 0, PAYLOAD_MAX);
    c.recv(1000);
    drop(c);
    assert_healthy(&mut s, 4);
}

// Rules 4, 19 and 53: garbage in place of the client flags, an option, or a request is met
// with a disconnect, never a crash.
#[test]
fn garbage_is_dropped_and_the_server_survives() {
    let mut s = server();
    let garbage = pattern(64 * 1024, 5);
    // The start of a TLS ClientHello, long enough to fill any NBD header it lands in (a
    // shorter message would rightly leave the server waiting for the rest).
    let mut tls_client_hello = vec![0x16, 0x03, 0x01, 0x02, 0x00, 0x01, 0x00, 0x01, 0xfc, 0x03, 0x03];
    tls_client_hello.resize(64, 0);
    let http = b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n";

    for junk in [&garbage[..], &tls_client_hello[..], &http[..]] {
        // Instead of client flags, before even reading the greeting.
        let mut c = Client::tcp(s.port);
        send_lossy(&mut c, junk);
        let rest = c.expect_close();
        assert!(rest.len() <= 18, "server answered garbage with {} bytes", rest.len());
        // Instead of an option.
        let mut c = Client::unix(&s.socket);
        c.start();
        send_lossy(&mut c, junk);
        assert!(c.expect_close().is_empty());
        // Instead of a request.
        let (mut c, _) = Client::connect(&s.socket, "", true, true);
        send_lossy(&mut c, junk);
        assert!(c.expect_close().is_empty(), "garbage request was answered");
    }
    assert_healthy(&mut s, 6);

    // Well-framed but random requests: every one gets exactly one complete reply.
    let (mut c, _) = Client::connect(&s.socket, "", true, true);
    let mut rng = Rng(0x5eed_1234_5678_9abc);
    let kinds =
        [CMD_READ, CMD_WRITE, CMD_FLUSH, CMD_TRIM, CMD_CACHE, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS, 8, 42, 0xffff];
    let mut bytes = Vec::new();
    const N: usize = 400;
    for _ in 0..N {
        let kind = kinds[rng.below(kinds.len() as u64) as usize];
        let flags = match rng.below(4) {
            0 => rng.next() as u16,
            1 => 1 << rng.below(16),
            _ => 0,
        };
        let offset = match rng.below(4) {
            0 => rng.next(),
            1 => SIZE - rng.below(1 << 20),
            _ => rng.below(SIZE),
        };
        let length = match (kind, rng.below(4)) {
            (CMD_WRITE, _) => rng.below(64 * 1024) as u32,
            (_, 0) => rng.next() as u32,
            (_, 1) => rng.below(16) as u32,
            _ => rng.below(1 << 20) as u32,
        };
        let h = c.handle();
        c.expect(h, Sent { kind, offset, length });
        bytes.extend_from_slice(&request(flags, kind, h, offset, length));
        if kind == CMD_WRITE {
            bytes.extend_from_slice(&pattern(length as usize, h));
        }
    }
    let mut w = c.writer();
    let writer = std::thread::spawn(move || w.write_all(&bytes).expect("sending random requests"));
    let replies = c.replies(N);
    writer.join().unwrap();
    for r in replies.values() {
        if r.sent.kind == CMD_READ && r.error().is_none() {
            assert_eq!(r.read_data().len(), r.sent.length as usize);
        }
    }
    c.disconnect();
    assert_healthy(&mut s, 7);
}

// A client that pipelines large reads and never reads the replies blocks only itself:
// another client on the same worker keeps getting correct data.
#[test]
fn stalled_reader_does_not_starve_other_clients() {
    let mut s = server();
    let (mut stalled, _) = Client::connect(&s.socket, "", true, false);
    for i in 0..64u64 {
        stalled.req(0, CMD_READ, (i % 8) * (32 << 20), PAYLOAD_MAX);
    }
    // Let the server fill the stalled socket and block on it.
    std::thread::sleep(Duration::from_millis(500));
    let (mut c, _) = Client::connect(&s.socket, "", true, true);
    let started = Instant::now();
    for i in 0..100u64 {
        let data = pattern(128 * 1024, i);
        c.write(i * 128 * 1024, &data);
        assert_eq!(c.read(i * 128 * 1024, 128 * 1024), data, "round {i}");
        c.call(0, CMD_BLOCK_STATUS, i * 128 * 1024, 4096).block_status();
    }
    assert!(started.elapsed() < Duration::from_secs(20), "other client slowed to {:?}", started.elapsed());
    // The stalled client still gets its data, in order of whatever the server chose.
    let first = stalled.replies(1);
    assert_eq!(first.values().next().unwrap().read_data().len(), PAYLOAD_MAX as usize);
    drop(stalled);
    assert_healthy(&mut s, 8);
}

fn vm_rss_bytes(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).expect("reading /proc/PID/status");
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS line");
    let kb: u64 = line.split_whitespace().nth(1).unwrap().parse().unwrap();
    kb * 1024
}

/// Above this the server's memory is not bounded by anything an operator would call a limit.
const RSS_MAX_BYTES: u64 = 1 << 30;

/// Opens `connections` connections that each pipeline 200 × 32 MiB reads and never read a
/// reply; returns them (still open) and the server's peak RSS once it stops growing (the
/// server may be slow to take it all in on a busy machine) or passes the bound.
fn stalled_readers(s: &Sluice, connections: usize) -> (Vec<Client>, u64) {
    let mut hogs = Vec::new();
    for _ in 0..connections {
        let (mut c, _) = Client::connect(&s.socket, "", true, false);
        for i in 0..200u64 {
            c.req(0, CMD_READ, (i % 8) * (32 << 20), PAYLOAD_MAX);
        }
        hogs.push(c);
    }
    let started = Instant::now();
    let mut samples: Vec<u64> = Vec::new();
    loop {
        std::thread::sleep(Duration::from_millis(100));
        samples.push(vm_rss_bytes(s.pid()));
        let peak = *samples.iter().max().unwrap();
        let recent = &samples[samples.len().saturating_sub(8)..];
        let settled = samples.len() >= 8 && recent.iter().max().unwrap() - recent.iter().min().unwrap() < 4 << 20;
        if peak >= RSS_MAX_BYTES || settled || started.elapsed() > Duration::from_secs(10) {
            return (hogs, peak);
        }
    }
}

// Limits: payload bytes in flight per connection are bounded, so clients pipelining
// 200 × 32 MiB reads without reading cannot make the server's memory grow without bound.
#[test]
fn pipelined_huge_reads_without_reading_keep_rss_bounded() {
    let mut s = server();
    let before = vm_rss_bytes(s.pid());
    let (hogs, peak) = stalled_readers(&s, 3);
    assert!(peak < RSS_MAX_BYTES, "RSS grew from {} MiB to {} MiB", before >> 20, peak >> 20);
    // Closing them with replies unread frees everything and the server carries on.
    drop(hogs);
    assert_healthy(&mut s, 9);
}

// Limits ("put a bound on everything a peer controls"): the in-flight budget is per
// connection (64 MiB) with no server-wide cap, so one peer with a couple of dozen stalled
// connections makes the server hold 64 MiB of read buffers for each; 1024 connections
// would be 64 GiB.
#[test]
fn many_stalled_connections_keep_rss_bounded() {
    let mut s = server();
    let before = vm_rss_bytes(s.pid());
    let (hogs, peak) = stalled_readers(&s, 24);
    drop(hogs);
    assert!(peak < RSS_MAX_BYTES, "24 stalled connections grew RSS from {} MiB to {} MiB", before >> 20, peak >> 20);
    assert_healthy(&mut s, 14);
}

// Connection bookkeeping: hundreds of connections opened and dropped at every stage, then
// more sequential connections than the connection limit (1024), which only succeed if each
// closed connection gave its slot back.
#[test]
fn connection_storm_leaves_no_leaks() {
    let mut s = server();
    let workers: Vec<_> = (0..4u64)
        .map(|t| {
            let socket = s.socket.clone();
            let port = s.port;
            std::thread::spawn(move || {
                for i in 0..50u64 {
                    let mut c = if i % 2 == 0 { Client::unix(&socket) } else { Client::tcp(port) };
                    match (i + t) % 4 {
                        0 => {}
                        1 => {
                            c.greeting();
                        }
                        2 => {
                            c.start();
                            c.go("", true, true);
                        }
                        _ => {
                            c.start();
                            c.go("", true, false);
                            c.req(0, CMD_READ, 0, 1 << 20);
                        }
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    assert_healthy(&mut s, 10);

    let started = Instant::now();
    for i in 0..1100 {
        let mut tries = 0;
        loop {
            let mut c = Client::unix(&s.socket);
            let mut g = [0u8; 18];
            if std::io::Read::read_exact(&mut c.stream, &mut g).is_ok() {
                c.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
                c.go("", false, false);
                break;
            }
            // Refused: tolerate a close still in progress, not a slot that never comes back.
            tries += 1;
            assert!(tries < 50, "connection {i} refused for a second: connection slots leak");
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    assert!(started.elapsed() < Duration::from_secs(30));
    assert_healthy(&mut s, 11);
}

// Rule 87: a client that trickles its bytes one at a time is slow, not wrong.
#[test]
fn byte_at_a_time_client_is_served() {
    let mut s = server();
    let mut c = Client::tcp(s.port);
    let mut bytes = Vec::new();
    bytes.extend_from_slice(&(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes());
    for (option, data) in [(OPT_STRUCTURED_REPLY, Vec::new()), (OPT_GO, info_data("", &[]))] {
        bytes.extend_from_slice(&IHAVEOPT);
        bytes.extend_from_slice(&option.to_be_bytes());
        bytes.extend_from_slice(&(data.len() as u32).to_be_bytes());
        bytes.extend_from_slice(&data);
    }
    let data = pattern(4096, 12);
    let mut req = request(0, CMD_WRITE, 7, 8192, 4096).to_vec();
    req.extend_from_slice(&data);
    req.extend_from_slice(&request(0, CMD_READ, 8, 8192, 4096));
    bytes.extend_from_slice(&req);
    for b in &bytes {
        c.send(std::slice::from_ref(b));
    }
    c.greeting();
    c.structured = true;
    assert_eq!(c.option_replies(OPT_STRUCTURED_REPLY).last().unwrap().kind, REP_ACK);
    assert_eq!(c.option_replies(OPT_GO).last().unwrap().kind, REP_ACK);
    c.expect(7, Sent { kind: CMD_WRITE, offset: 8192, length: 4096 });
    c.expect(8, Sent { kind: CMD_READ, offset: 8192, length: 4096 });
    let r = c.replies(2);
    r[&7].assert_ok();
    assert_eq!(r[&8].read_data(), data);
    assert_healthy(&mut s, 13);
}

// A write's payload that trickles in over hundreds of separate arrivals is received whole
// (past io_uring's 128 poll retries of one receive, the kernel finishes it on a worker
// thread of its own), and the connection goes on. The pauses only spread the arrivals; the
// checks hold however the pieces are grouped.
#[test]
fn a_write_payload_trickled_in_many_pieces_lands_whole() {
    let mut s = server();
    let (mut c, _) = Client::connect(&s.socket, "", true, true);
    let len = 1 << 20;
    let data = pattern(len, 21);
    c.send(&request(0, CMD_WRITE, 7, 1 << 20, len as u32));
    for piece in data.chunks(len / 400) {
        c.send(piece);
        std::thread::sleep(Duration::from_micros(500));
    }
    c.expect(7, Sent { kind: CMD_WRITE, offset: 1 << 20, length: len as u32 });
    c.replies(1)[&7].assert_ok();
    assert_eq!(c.read(1 << 20, len as u32), data, "the trickled write reads back");
    c.disconnect();
    assert_healthy(&mut s, 22);
}
