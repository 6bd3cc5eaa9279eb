//! 64 clients at once, over Unix and TCP, each write and verify their own region; one reader checks all.
mod common;
use common::*;

use std::collections::HashMap;
use std::io::{Read, Write};

use sluice_proto::wire::*;
use sluice_proto::RawRequest;

const CLIENTS: usize = 64;
const REGION: usize = 1 << 20;
/// Writes per region, all sent before the first reply is read.
const WRITE_CHUNKS: usize = 16;
/// Reads per region, pipelined the same way.
const READ_CHUNKS: usize = 4;

trait Stream: Read + Write + Send {}
impl<T: Read + Write + Send> Stream for T {}

/// The smallest useful NBD client: fixed newstyle, EXPORT_NAME, simple replies.
struct Client {
    s: Box<dyn Stream>,
    next_handle: u64,
    size: u64,
    flags: u16,
}

fn be_u16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b.try_into().unwrap())
}
fn be_u32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().unwrap())
}
fn be_u64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().unwrap())
}

impl Client {
    fn connect(mut s: Box<dyn Stream>, export: &str) -> Client {
        let mut greeting = [0u8; GREETING_BYTES];
        s.read_exact(&mut greeting).expect("greeting");
        assert_eq!(be_u64(&greeting[0..8]), NBDMAGIC);
        assert_eq!(be_u64(&greeting[8..16]), IHAVEOPT);
        let server_flags = be_u16(&greeting[16..18]);
        assert_ne!(server_flags & FLAG_FIXED_NEWSTYLE, 0, "server is not fixed newstyle");
        let no_zeroes = server_flags & FLAG_NO_ZEROES != 0;
        let client_flags = FLAG_C_FIXED_NEWSTYLE | if no_zeroes { FLAG_C_NO_ZEROES } else { 0 };
        let mut out = client_flags.to_be_bytes().to_vec();
        out.extend_from_slice(&IHAVEOPT.to_be_bytes());
        out.extend_from_slice(&OPT_EXPORT_NAME.to_be_bytes());
        out.extend_from_slice(&(export.len() as u32).to_be_bytes());
        out.extend_from_slice(export.as_bytes());
        s.write_all(&out).unwrap();
        let mut reply = vec![0u8; 10 + if no_zeroes { 0 } else { EXPORT_NAME_PADDING_BYTES }];
        s.read_exact(&mut reply).expect("EXPORT_NAME reply");
        Client { s, next_handle: 1, size: be_u64(&reply[0..8]), flags: be_u16(&reply[8..10]) }
    }

    fn send(&mut self, kind: u16, offset: u64, data: &[u8], length: u32) -> u64 {
        let handle = self.next_handle;
        self.next_handle += 1;
        let header = RawRequest { flags: 0, kind, handle, offset, length: length.into() }.encode();
        self.s.write_all(&header).unwrap();
        self.s.write_all(data).unwrap();
        handle
    }

    fn send_write(&mut self, offset: u64, data: &[u8]) -> u64 {
        self.send(CMD_WRITE, offset, data, data.len() as u32)
    }

    fn send_read(&mut self, offset: u64, len: usize) -> u64 {
        self.send(CMD_READ, offset, &[], len as u32)
    }

    /// Reads one simple reply: (handle, error). `read_len` says how many data bytes follow a
    /// successful reply to each pending read handle.
    fn reply(&mut self, read_len: &HashMap<u64, usize>) -> (u64, u32, Vec<u8>) {
        let mut h = [0u8; SIMPLE_REPLY_BYTES];
        self.s.read_exact(&mut h).expect("reply header");
        assert_eq!(be_u32(&h[0..4]), SIMPLE_REPLY_MAGIC, "bad reply magic");
        let (error, handle) = (be_u32(&h[4..8]), be_u64(&h[8..16]));
        let mut data = Vec::new();
        if error == 0 {
            if let Some(&n) = read_len.get(&handle) {
                data.resize(n, 0);
                self.s.read_exact(&mut data).expect("read payload");
            }
        }
        (handle, error, data)
    }

    /// Writes `data` at `offset` in pipelined chunks, then waits for every reply.
    fn write_pipelined(&mut self, offset: u64, data: &[u8], chunks: usize) {
        let step = data.len() / chunks;
        let mut pending: Vec<u64> =
            (0..chunks).map(|i| self.send_write(offset + (i * step) as u64, &data[i * step..(i + 1) * step])).collect();
        let none = HashMap::new();
        while !pending.is_empty() {
            let (handle, error, _) = self.reply(&none);
            assert_eq!(error, 0, "write {handle} failed");
            let i = pending.iter().position(|&p| p == handle).unwrap_or_else(|| panic!("reply to unknown handle {handle}"));
            pending.swap_remove(i);
        }
    }

    /// Reads `len` bytes at `offset` in pipelined chunks; replies may arrive in any order.
    fn read_pipelined(&mut self, offset: u64, len: usize, chunks: usize) -> Vec<u8> {
        let step = len / chunks;
        let mut at = HashMap::new();
        let mut lens = HashMap::new();
        for i in 0..chunks {
            let h = self.send_read(offset + (i * step) as u64, step);
            at.insert(h, i * step);
            lens.insert(h, step);
        }
        let mut out = vec![0u8; len];
        for _ in 0..chunks {
            let (handle, error, data) = self.reply(&lens);
            assert_eq!(error, 0, "read {handle} failed");
            let start = at.remove(&handle).unwrap_or_else(|| panic!("reply to unknown or repeated handle {handle}"));
            out[start..start + step].copy_from_slice(&data);
        }
        out
    }

    fn flush(&mut self) {
        let h = self.send(CMD_FLUSH, 0, &[], 0);
        let (handle, error, _) = self.reply(&HashMap::new());
        assert_eq!((handle, error), (h, 0), "flush failed");
    }

    fn disconnect(mut self) {
        self.send(CMD_DISC, 0, &[], 0);
    }
}

/// A stuck server fails the test instead of hanging it.
const IO_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(60);

fn open(s: &Sluice, tcp: bool, export: &str) -> Client {
    let stream: Box<dyn Stream> = if tcp {
        let t = std::net::TcpStream::connect(("127.0.0.1", s.port)).unwrap();
        t.set_nodelay(true).unwrap();
        t.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        t.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        Box::new(t)
    } else {
        let u = std::os::unix::net::UnixStream::connect(&s.socket).unwrap();
        u.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        u.set_write_timeout(Some(IO_TIMEOUT)).unwrap();
        Box::new(u)
    };
    Client::connect(stream, export)
}

fn region_seed(i: usize) -> u64 {
    1000 + i as u64
}

/// Every client writes its region, flushes, and reads it back; then one reader checks them all.
fn many_clients_write_and_verify(s: &Sluice) {
    // All 64 connections are open before anyone writes, so the load arrives at once.
    let clients: Vec<Client> = (0..CLIENTS).map(|i| open(s, i % 2 == 1, "m")).collect();
    let failed: Vec<usize> = std::thread::scope(|scope| {
        let threads: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| {
                scope.spawn(move || {
                    assert_eq!(c.size, (CLIENTS * REGION) as u64);
                    assert_ne!(c.flags & FLAG_CAN_MULTI_CONN, 0, "export does not advertise multi-conn");
                    let data = pattern(REGION, region_seed(i));
                    let offset = (i * REGION) as u64;
                    c.write_pipelined(offset, &data, WRITE_CHUNKS);
                    c.flush();
                    let back = c.read_pipelined(offset, REGION, READ_CHUNKS);
                    assert!(back == data, "client {i} read back something else");
                    c.disconnect();
                })
            })
            .collect();
        threads.into_iter().enumerate().filter_map(|(i, t)| t.join().is_err().then_some(i)).collect()
    });
    assert!(failed.is_empty(), "clients {failed:?} failed; server log:\n{}", s.log_text());

    let mut reader = open(s, false, "m");
    let all = reader.read_pipelined(0, CLIENTS * REGION, CLIENTS);
    for i in 0..CLIENTS {
        assert!(all[i * REGION..(i + 1) * REGION] == pattern(REGION, region_seed(i)), "region {i} is wrong for the final reader");
    }
    reader.disconnect();
}

#[test]
fn sixty_four_clients_write_and_verify_their_own_regions() {
    let s = Sluice::start(&["--export", "m=memory:64M"]);
    many_clients_write_and_verify(&s);
    assert_eq!(s.stop().code(), Some(0));
}

/// The same load with a per-connection budget of two requests: pipelined requests wait in
/// the socket until replies drain, and nothing is lost or reordered wrongly.
#[test]
fn sixty_four_clients_under_a_two_request_budget_still_verify() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    std::fs::write(&config, "[limits]\ninflight-requests-per-connection = 2\n").unwrap();
    let s = Sluice::start(&["--config", config.to_str().unwrap(), "--export", "m=memory:64M"]);
    many_clients_write_and_verify(&s);
    assert_eq!(s.stop().code(), Some(0));
}
