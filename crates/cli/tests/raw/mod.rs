//! A byte-level NBD client for the protocol tests: every field written and parsed by hand
//! from the layouts in doc/proto.md, every read bounded by a timeout.
//!
//! The numbers below are copied from the spec, not taken from `sluice_proto::wire`, so a
//! wrong constant in the server cannot agree with itself here.
#![allow(dead_code)] // each test binary uses a different part of this module

use std::collections::HashMap;
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::{Duration, Instant};

/// Longest any single read may wait. Generous for a loaded CI machine, short enough that a
/// server that stops answering fails the test instead of hanging it.
pub const IO_TIMEOUT: Duration = Duration::from_secs(5);

// Magics (§1.1), as the bytes on the wire.
pub const NBDMAGIC: [u8; 8] = *b"NBDMAGIC";
pub const IHAVEOPT: [u8; 8] = *b"IHAVEOPT";
pub const REP_MAGIC: [u8; 8] = [0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9];
pub const REQUEST_MAGIC: [u8; 4] = [0x25, 0x60, 0x95, 0x13];
pub const SIMPLE_REPLY_MAGIC: [u8; 4] = [0x67, 0x44, 0x66, 0x98];
pub const STRUCTURED_REPLY_MAGIC: [u8; 4] = [0x66, 0x8e, 0x33, 0xef];

// Handshake and client flags (§1.2, §1.3).
pub const FLAG_FIXED_NEWSTYLE: u16 = 0x1;
pub const FLAG_NO_ZEROES: u16 = 0x2;
pub const FLAG_C_FIXED_NEWSTYLE: u32 = 0x1;
pub const FLAG_C_NO_ZEROES: u32 = 0x2;

// Transmission flags (§1.4).
pub const HAS_FLAGS: u16 = 0x0001;
pub const READ_ONLY: u16 = 0x0002;
pub const SEND_FLUSH: u16 = 0x0004;
pub const SEND_FUA: u16 = 0x0008;
pub const SEND_TRIM: u16 = 0x0020;
pub const SEND_WRITE_ZEROES: u16 = 0x0040;
pub const SEND_DF: u16 = 0x0080;
pub const SEND_CACHE: u16 = 0x0400;
pub const SEND_FAST_ZERO: u16 = 0x0800;

// Options (§1.5, R-new numbering).
pub const OPT_EXPORT_NAME: u32 = 1;
pub const OPT_ABORT: u32 = 2;
pub const OPT_LIST: u32 = 3;
pub const OPT_PEEK_EXPORT: u32 = 4;
pub const OPT_STARTTLS: u32 = 5;
pub const OPT_INFO: u32 = 6;
pub const OPT_GO: u32 = 7;
pub const OPT_STRUCTURED_REPLY: u32 = 8;
pub const OPT_LIST_META_CONTEXT: u32 = 9;
pub const OPT_SET_META_CONTEXT: u32 = 10;

// Option reply types (§1.6).
pub const REP_ACK: u32 = 1;
pub const REP_SERVER: u32 = 2;
pub const REP_INFO: u32 = 3;
pub const REP_META_CONTEXT: u32 = 4;
pub const REP_ERR_UNSUP: u32 = 0x8000_0001;
pub const REP_ERR_POLICY: u32 = 0x8000_0002;
pub const REP_ERR_INVALID: u32 = 0x8000_0003;
pub const REP_ERR_UNKNOWN: u32 = 0x8000_0006;
pub const REP_ERR_TOO_BIG: u32 = 0x8000_0009;

// Info types (§1.7).
pub const INFO_EXPORT: u16 = 0;
pub const INFO_NAME: u16 = 1;
pub const INFO_DESCRIPTION: u16 = 2;
pub const INFO_BLOCK_SIZE: u16 = 3;

// Commands (§1.8) and command flags (§1.9).
pub const CMD_READ: u16 = 0;
pub const CMD_WRITE: u16 = 1;
pub const CMD_DISC: u16 = 2;
pub const CMD_FLUSH: u16 = 3;
pub const CMD_TRIM: u16 = 4;
pub const CMD_CACHE: u16 = 5;
pub const CMD_WRITE_ZEROES: u16 = 6;
pub const CMD_BLOCK_STATUS: u16 = 7;
pub const F_FUA: u16 = 0x01;
pub const F_NO_HOLE: u16 = 0x02;
pub const F_DF: u16 = 0x04;
pub const F_REQ_ONE: u16 = 0x08;
pub const F_FAST_ZERO: u16 = 0x10;

// Structured replies (§1.10).
pub const REPLY_FLAG_DONE: u16 = 0x1;
pub const CHUNK_NONE: u16 = 0;
pub const CHUNK_OFFSET_DATA: u16 = 1;
pub const CHUNK_OFFSET_HOLE: u16 = 2;
pub const CHUNK_BLOCK_STATUS: u16 = 5;
pub const CHUNK_ERROR: u16 = 0x8001;
pub const CHUNK_ERROR_OFFSET: u16 = 0x8002;

// Errors (§1.11).
pub const EPERM: u32 = 1;
pub const EIO: u32 = 5;
pub const EINVAL: u32 = 22;
pub const ENOSPC: u32 = 28;
pub const EOVERFLOW: u32 = 75;
pub const ENOTSUP: u32 = 95;

// base:allocation (§1.12).
pub const STATE_HOLE: u32 = 0x1;
pub const STATE_ZERO: u32 = 0x2;

/// The largest payload the spec says is never a denial of service (2^25), and sluice's cap.
pub const PAYLOAD_MAX: u32 = 32 << 20;

pub enum Stream {
    Unix(UnixStream),
    Tcp(TcpStream),
    /// After STARTTLS (`Client::start_tls`).
    Tls(Box<openssl::ssl::SslStream<TcpStream>>),
    /// Between STARTTLS and the TLS handshake.
    Upgrading,
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.read(buf),
            Stream::Tcp(s) => s.read(buf),
            Stream::Tls(s) => s.read(buf),
            Stream::Upgrading => unreachable!(),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Unix(s) => s.write(buf),
            Stream::Tcp(s) => s.write(buf),
            Stream::Tls(s) => s.write(buf),
            Stream::Upgrading => unreachable!(),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

impl Stream {
    fn set_timeouts(&self, t: Duration) {
        match self {
            Stream::Unix(s) => {
                s.set_read_timeout(Some(t)).unwrap();
                s.set_write_timeout(Some(t)).unwrap();
            }
            Stream::Tcp(s) => {
                s.set_read_timeout(Some(t)).unwrap();
                s.set_write_timeout(Some(t)).unwrap();
            }
            Stream::Tls(s) => Stream::Tcp(s.get_ref().try_clone().unwrap()).set_timeouts(t),
            Stream::Upgrading => unreachable!(),
        }
    }

    fn try_clone(&self) -> Stream {
        match self {
            Stream::Unix(s) => Stream::Unix(s.try_clone().unwrap()),
            Stream::Tcp(s) => Stream::Tcp(s.try_clone().unwrap()),
            Stream::Tls(_) | Stream::Upgrading => panic!("a TLS stream has one owner"),
        }
    }
}

/// One option reply (§2.4).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptReply {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// What GO (or EXPORT_NAME) settled.
#[derive(Clone, Copy, Debug)]
pub struct Export {
    pub size: u64,
    pub flags: u16,
    /// The id SET_META_CONTEXT gave base:allocation.
    pub context: Option<u32>,
}

/// One structured reply chunk (§2.8).
#[derive(Clone, Debug)]
pub struct Chunk {
    pub flags: u16,
    pub kind: u16,
    pub handle: u64,
    pub payload: Vec<u8>,
}

/// One message of a transmission reply.
#[derive(Clone, Debug)]
pub enum Msg {
    /// A simple reply (§2.7); `data` is the READ payload that followed a zero error.
    Simple {
        error: u32,
        handle: u64,
        data: Vec<u8>,
    },
    Chunk(Chunk),
}

impl Msg {
    pub fn handle(&self) -> u64 {
        match self {
            Msg::Simple { handle, .. } => *handle,
            Msg::Chunk(c) => c.handle,
        }
    }

    /// Whether this message ends its reply.
    pub fn done(&self) -> bool {
        match self {
            Msg::Simple { .. } => true,
            Msg::Chunk(c) => c.flags & REPLY_FLAG_DONE != 0,
        }
    }
}

/// A request as sent, kept to parse and judge its reply.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    pub kind: u16,
    pub offset: u64,
    pub length: u32,
}

/// Every message of one request's reply, in arrival order.
#[derive(Clone, Debug)]
pub struct Reply {
    pub handle: u64,
    pub sent: Sent,
    pub msgs: Vec<Msg>,
}

impl Reply {
    pub fn is_simple(&self) -> bool {
        matches!(self.msgs.as_slice(), [Msg::Simple { .. }])
    }

    /// The error this reply carries, if any, after checking its error chunks are well formed
    /// (§2.8: error nonzero, message length inside the chunk, ERROR_OFFSET inside the request).
    pub fn error(&self) -> Option<u32> {
        let mut found = None;
        for m in &self.msgs {
            match m {
                Msg::Simple { error, .. } if *error != 0 => found = found.or(Some(*error)),
                Msg::Simple { .. } => {}
                Msg::Chunk(c) if c.kind & 0x8000 != 0 => {
                    let p = &c.payload;
                    let trailer = if c.kind == CHUNK_ERROR_OFFSET { 8 } else { 0 };
                    assert!(p.len() >= 6 + trailer, "error chunk too short: {c:?}");
                    let error = be32(&p[0..4]);
                    let msg_len = be16(&p[4..6]) as usize;
                    assert_ne!(error, 0, "error chunk with error 0: {c:?}");
                    assert!(msg_len <= p.len() - 6 - trailer, "error message overruns its chunk: {c:?}");
                    assert!(msg_len <= 4096, "error message longer than 4096 bytes");
                    assert!(std::str::from_utf8(&p[6..6 + msg_len]).is_ok(), "error message is not UTF-8");
                    if c.kind == CHUNK_ERROR_OFFSET {
                        let at = be64(&p[p.len() - 8..]);
                        let end = self.sent.offset.saturating_add(self.sent.length as u64);
                        assert!(
                            at >= self.sent.offset && (at < end || self.sent.length == 0),
                            "ERROR_OFFSET {at} outside the request"
                        );
                    } else {
                        assert_eq!(c.kind, CHUNK_ERROR, "unknown error chunk type");
                    }
                    found = found.or(Some(error));
                }
                Msg::Chunk(_) => {}
            }
        }
        found
    }

    /// Asserts the reply is structured (rule 52 for READ) and failed with `errno`.
    pub fn assert_structured_error(&self, errno: u32) {
        assert!(
            !self.msgs.iter().any(|m| matches!(m, Msg::Simple { .. })),
            "simple reply where structured was required: {self:?}"
        );
        assert_eq!(self.error(), Some(errno), "reply {self:?}");
    }

    /// Asserts the reply succeeded; no data is expected.
    pub fn assert_ok(&self) {
        assert_eq!(self.error(), None, "reply {self:?}");
    }

    /// The data of a successful READ, after checking the chunks against rules 64 and 65:
    /// only the last chunk has DONE, content chunks stay inside the request and do not
    /// overlap, and together they cover it.
    pub fn read_data(&self) -> Vec<u8> {
        assert_eq!(self.error(), None, "read failed: {self:?}");
        let Sent { offset, length, .. } = self.sent;
        if let [Msg::Simple { data, .. }] = self.msgs.as_slice() {
            assert_eq!(data.len(), length as usize);
            return data.clone();
        }
        let mut data = vec![0u8; length as usize];
        let mut covered = Vec::new();
        for (i, m) in self.msgs.iter().enumerate() {
            let Msg::Chunk(c) = m else { panic!("simple reply inside a structured read: {self:?}") };
            let last = i == self.msgs.len() - 1;
            assert_eq!(c.flags & REPLY_FLAG_DONE != 0, last, "DONE must be on the last chunk only");
            assert_eq!(c.flags & !REPLY_FLAG_DONE, 0, "reply flags other than DONE");
            let (at, piece): (u64, Option<&[u8]>) = match c.kind {
                CHUNK_NONE => {
                    assert!(last && c.payload.is_empty(), "NONE must be last and empty");
                    continue;
                }
                CHUNK_OFFSET_DATA => {
                    assert!(c.payload.len() >= 9, "OFFSET_DATA carries at least one byte");
                    (be64(&c.payload[0..8]), Some(&c.payload[8..]))
                }
                CHUNK_OFFSET_HOLE => {
                    assert_eq!(c.payload.len(), 12, "OFFSET_HOLE payload is 12 bytes");
                    let n = be32(&c.payload[8..12]);
                    assert_ne!(n, 0, "empty hole");
                    (be64(&c.payload[0..8]), None)
                }
                k => panic!("chunk type {k:#x} in a READ reply"),
            };
            let n = piece.map_or_else(|| be32(&c.payload[8..12]) as usize, <[u8]>::len);
            assert!(at >= offset && at + n as u64 <= offset + length as u64, "chunk [{at}, +{n}) outside the request");
            let start = (at - offset) as usize;
            covered.push((start, start + n));
            if let Some(bytes) = piece {
                data[start..start + n].copy_from_slice(bytes);
            }
        }
        covered.sort_unstable();
        let mut end = 0;
        for &(a, b) in &covered {
            assert!(a >= end, "chunks overlap at {}", offset + a as u64);
            assert_eq!(a, end, "a successful read must cover the whole range: gap at {}", offset + end as u64);
            end = b;
        }
        assert_eq!(end, length as usize, "a successful read must cover the whole range");
        data
    }

    /// The extents of a successful BLOCK_STATUS reply: (context id, [(length, flags)]).
    pub fn block_status(&self) -> (u32, Vec<(u32, u32)>) {
        assert_eq!(self.error(), None, "block status failed: {self:?}");
        let [Msg::Chunk(c)] = self.msgs.as_slice() else { panic!("expected one BLOCK_STATUS chunk: {self:?}") };
        assert_eq!(c.kind, CHUNK_BLOCK_STATUS);
        assert_eq!(c.flags, REPLY_FLAG_DONE);
        let p = &c.payload;
        assert!(p.len() >= 12 && (p.len() - 4) % 8 == 0, "BLOCK_STATUS payload is 4 + 8k bytes, k >= 1");
        let id = be32(&p[0..4]);
        let extents = p[4..].chunks(8).map(|e| (be32(&e[0..4]), be32(&e[4..8]))).collect();
        (id, extents)
    }
}

pub fn be16(b: &[u8]) -> u16 {
    u16::from_be_bytes(b.try_into().unwrap())
}
pub fn be32(b: &[u8]) -> u32 {
    u32::from_be_bytes(b.try_into().unwrap())
}
pub fn be64(b: &[u8]) -> u64 {
    u64::from_be_bytes(b.try_into().unwrap())
}

/// INFO/GO data (§2.5): name_len(4) name n(2) info(2)×n.
pub fn info_data(name: &str, infos: &[u16]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(infos.len() as u16).to_be_bytes());
    for i in infos {
        d.extend_from_slice(&i.to_be_bytes());
    }
    d
}

/// LIST/SET_META_CONTEXT data (§2.5): name_len(4) name n(4) {len(4) query}×n.
pub fn meta_data(name: &str, queries: &[&str]) -> Vec<u8> {
    let mut d = (name.len() as u32).to_be_bytes().to_vec();
    d.extend_from_slice(name.as_bytes());
    d.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        d.extend_from_slice(&(q.len() as u32).to_be_bytes());
        d.extend_from_slice(q.as_bytes());
    }
    d
}

/// A 28-byte request header (§2.6).
pub fn request(flags: u16, kind: u16, handle: u64, offset: u64, length: u32) -> [u8; 28] {
    let mut b = [0u8; 28];
    b[0..4].copy_from_slice(&REQUEST_MAGIC);
    b[4..6].copy_from_slice(&flags.to_be_bytes());
    b[6..8].copy_from_slice(&kind.to_be_bytes());
    b[8..16].copy_from_slice(&handle.to_be_bytes());
    b[16..24].copy_from_slice(&offset.to_be_bytes());
    b[24..28].copy_from_slice(&length.to_be_bytes());
    b
}

pub struct Client {
    pub stream: Stream,
    /// Structured replies were negotiated: every READ reply must be structured.
    pub structured: bool,
    next_handle: u64,
    pending: HashMap<u64, Sent>,
}

impl Client {
    pub fn unix(path: &Path) -> Client {
        Client::new(Stream::Unix(UnixStream::connect(path).expect("connect to the Unix socket")))
    }

    pub fn tcp(port: u16) -> Client {
        let s = TcpStream::connect(("127.0.0.1", port)).expect("connect to the TCP port");
        s.set_nodelay(true).unwrap();
        Client::new(Stream::Tcp(s))
    }

    /// Connects to `dest` from the source address `source` (bound first), as a client on
    /// another host of the loopback network would.
    pub fn tcp_from(source: std::net::IpAddr, dest: std::net::SocketAddr) -> io::Result<Client> {
        use rustix::net::{AddressFamily, SocketType};
        let fd = rustix::net::socket(AddressFamily::INET, SocketType::STREAM, None)?;
        rustix::net::bind(&fd, &std::net::SocketAddr::new(source, 0))?;
        rustix::net::connect(&fd, &dest)?;
        let s = TcpStream::from(fd);
        s.set_nodelay(true)?;
        Ok(Client::new(Stream::Tcp(s)))
    }

    fn new(stream: Stream) -> Client {
        stream.set_timeouts(IO_TIMEOUT);
        // Handles with bytes in both halves, so a byte-order slip shows.
        Client { stream, structured: false, next_handle: 0x1122_3344_0000_0001, pending: HashMap::new() }
    }

    /// A second handle on the same socket, for a thread that only writes.
    pub fn writer(&self) -> Stream {
        self.stream.try_clone()
    }

    pub fn set_read_timeout(&self, t: Duration) {
        match &self.stream {
            Stream::Unix(s) => s.set_read_timeout(Some(t)).unwrap(),
            Stream::Tcp(s) => s.set_read_timeout(Some(t)).unwrap(),
            Stream::Tls(s) => s.get_ref().set_read_timeout(Some(t)).unwrap(),
            Stream::Upgrading => unreachable!(),
        }
    }

    /// Runs the client's side of the TLS handshake (after STARTTLS was acknowledged),
    /// trusting the CA in `ca_dir`/ca-cert.pem and checking the name `localhost`.
    pub fn start_tls(&mut self, ca_dir: &Path) -> Result<(), String> {
        use openssl::ssl::{SslConnector, SslMethod};
        let Stream::Tcp(tcp) = std::mem::replace(&mut self.stream, Stream::Upgrading) else {
            panic!("TLS over TCP only");
        };
        let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
        b.set_ca_file(ca_dir.join("ca-cert.pem")).unwrap();
        let connector = b.build();
        let tls = connector.connect("localhost", tcp).map_err(|e| e.to_string())?;
        self.stream = Stream::Tls(Box::new(tls));
        Ok(())
    }

    /// The TCP socket under the TLS session, for writing bytes outside any record.
    pub fn tcp_under_tls(&self) -> TcpStream {
        match &self.stream {
            Stream::Tls(s) => s.get_ref().try_clone().unwrap(),
            _ => panic!("not a TLS stream"),
        }
    }

    pub fn send(&mut self, bytes: &[u8]) {
        self.stream.write_all(bytes).expect("send to server");
    }

    pub fn recv(&mut self, n: usize) -> Vec<u8> {
        let mut b = vec![0u8; n];
        if let Err(e) = self.stream.read_exact(&mut b) {
            panic!("reading {n} bytes from the server: {e}");
        }
        b
    }

    /// Waits (at most IO_TIMEOUT) for the server to close the connection; returns whatever it
    /// sent first.
    pub fn expect_close(&mut self) -> Vec<u8> {
        self.close_within(IO_TIMEOUT)
            .unwrap_or_else(|got| panic!("server kept the connection open (sent {} bytes)", got.len()))
    }

    /// Ok(bytes sent before the close), or Err(bytes) if the connection was still open after `t`.
    pub fn close_within(&mut self, t: Duration) -> Result<Vec<u8>, Vec<u8>> {
        let deadline = Instant::now() + t;
        let mut got = Vec::new();
        let mut buf = [0u8; 4096];
        let result = loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break Err(got);
            }
            self.set_read_timeout(left);
            match self.stream.read(&mut buf) {
                Ok(0) => break Ok(got),
                Ok(n) => {
                    got.extend_from_slice(&buf[..n]);
                    assert!(got.len() < 1 << 20, "server keeps sending while it should close");
                }
                Err(e) if e.kind() == io::ErrorKind::ConnectionReset => break Ok(got),
                // A socket read with a timeout fails with EINTR when the process is stopped and
                // continued (signal(7)), even without a handler: read again for what is left.
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut) => break Err(got),
                Err(e) => panic!("waiting for close: {e}"),
            }
        };
        self.set_read_timeout(IO_TIMEOUT);
        result
    }

    // ---- handshake ---------------------------------------------------------------------

    /// Reads the 18-byte greeting (§2.2) and returns the handshake flags.
    pub fn greeting(&mut self) -> u16 {
        let g = self.recv(18);
        assert_eq!(&g[0..8], &NBDMAGIC, "greeting starts with NBDMAGIC");
        assert_eq!(&g[8..16], &IHAVEOPT, "newstyle greeting continues with IHAVEOPT");
        be16(&g[16..18])
    }

    pub fn client_flags(&mut self, flags: u32) {
        self.send(&flags.to_be_bytes());
    }

    /// Greeting plus client flags FIXED_NEWSTYLE | NO_ZEROES.
    pub fn start(&mut self) {
        let flags = self.greeting();
        assert_eq!(flags & FLAG_FIXED_NEWSTYLE, FLAG_FIXED_NEWSTYLE);
        self.client_flags(FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES);
    }

    /// Sends one option (§2.3).
    pub fn option(&mut self, option: u32, data: &[u8]) {
        let mut b = IHAVEOPT.to_vec();
        b.extend_from_slice(&option.to_be_bytes());
        b.extend_from_slice(&(data.len() as u32).to_be_bytes());
        b.extend_from_slice(data);
        self.send(&b);
    }

    /// Reads one option reply (§2.4).
    pub fn option_reply(&mut self) -> OptReply {
        let h = self.recv(20);
        assert_eq!(&h[0..8], &REP_MAGIC, "option reply magic");
        let len = be32(&h[16..20]) as usize;
        assert!(len <= 1 << 20, "option reply of {len} bytes");
        let data = self.recv(len);
        OptReply { option: be32(&h[8..12]), kind: be32(&h[12..16]), data }
    }

    /// Reads replies to `option` up to and including the final one (ACK or an error).
    pub fn option_replies(&mut self, option: u32) -> Vec<OptReply> {
        let mut all = Vec::new();
        loop {
            let r = self.option_reply();
            assert_eq!(r.option, option, "reply echoes the option number (rule 9)");
            let last = !matches!(r.kind, REP_SERVER | REP_INFO | REP_META_CONTEXT);
            all.push(r);
            if last {
                return all;
            }
        }
    }

    /// Sends `option` and returns its replies.
    pub fn ask(&mut self, option: u32, data: &[u8]) -> Vec<OptReply> {
        self.option(option, data);
        self.option_replies(option)
    }

    /// Negotiates structured replies and (optionally) base:allocation, then GO. Panics
    /// unless every step succeeds.
    pub fn go(&mut self, export: &str, structured: bool, meta: bool) -> Export {
        let mut context = None;
        if structured {
            let r = self.ask(OPT_STRUCTURED_REPLY, &[]);
            assert_eq!(r.last().unwrap().kind, REP_ACK, "STRUCTURED_REPLY: {r:?}");
            self.structured = true;
        }
        if meta {
            let r = self.ask(OPT_SET_META_CONTEXT, &meta_data(export, &["base:allocation"]));
            assert_eq!(r.len(), 2, "one context and ACK: {r:?}");
            assert_eq!(r[0].kind, REP_META_CONTEXT);
            assert_eq!(&r[0].data[4..], b"base:allocation");
            assert_eq!(r[1].kind, REP_ACK);
            context = Some(be32(&r[0].data[0..4]));
        }
        let r = self.ask(OPT_GO, &info_data(export, &[]));
        assert_eq!(r.last().unwrap().kind, REP_ACK, "GO {export:?}: {r:?}");
        let info =
            r.iter().find(|i| i.kind == REP_INFO && be16(&i.data[0..2]) == INFO_EXPORT).expect("GO sends INFO_EXPORT");
        assert_eq!(info.data.len(), 12, "INFO_EXPORT is 12 bytes");
        Export { size: be64(&info.data[2..10]), flags: be16(&info.data[10..12]), context }
    }

    /// Connects over the Unix socket and negotiates as `go` does.
    pub fn connect(path: &Path, export: &str, structured: bool, meta: bool) -> (Client, Export) {
        let mut c = Client::unix(path);
        c.start();
        let e = c.go(export, structured, meta);
        (c, e)
    }

    // ---- transmission ------------------------------------------------------------------

    pub fn handle(&mut self) -> u64 {
        let h = self.next_handle;
        self.next_handle += 1;
        h
    }

    /// Sends a request header and remembers it; returns its handle.
    pub fn req(&mut self, flags: u16, kind: u16, offset: u64, length: u32) -> u64 {
        let h = self.handle();
        self.pending.insert(h, Sent { kind, offset, length });
        self.send(&request(flags, kind, h, offset, length));
        h
    }

    /// Sends a WRITE header and its payload.
    pub fn req_write(&mut self, flags: u16, offset: u64, data: &[u8]) -> u64 {
        let h = self.handle();
        self.pending.insert(h, Sent { kind: CMD_WRITE, offset, length: data.len() as u32 });
        let mut b = request(flags, CMD_WRITE, h, offset, data.len() as u32).to_vec();
        b.extend_from_slice(data);
        self.send(&b);
        h
    }

    /// Remembers a request sent some other way (e.g. from a writer thread).
    pub fn expect(&mut self, handle: u64, sent: Sent) {
        self.pending.insert(handle, sent);
    }

    /// Reads one message of any pending reply.
    pub fn msg(&mut self) -> Msg {
        let magic = self.recv(4);
        if magic == SIMPLE_REPLY_MAGIC {
            let rest = self.recv(12);
            let error = be32(&rest[0..4]);
            let handle = be64(&rest[4..12]);
            let sent =
                *self.pending.get(&handle).unwrap_or_else(|| panic!("simple reply for unknown handle {handle:#x}"));
            let data = if error == 0 && sent.kind == CMD_READ {
                assert!(!self.structured, "simple reply carrying READ data after STRUCTURED_REPLY (rule 52)");
                self.recv(sent.length as usize)
            } else {
                Vec::new()
            };
            return Msg::Simple { error, handle, data };
        }
        assert_eq!(magic, STRUCTURED_REPLY_MAGIC, "reply magic");
        assert!(self.structured, "structured chunk without STRUCTURED_REPLY (rule 51)");
        let h = self.recv(16);
        let len = be32(&h[12..16]) as usize;
        assert!(len <= PAYLOAD_MAX as usize + 4096, "chunk of {len} bytes");
        let payload = self.recv(len);
        let chunk = Chunk { flags: be16(&h[0..2]), kind: be16(&h[2..4]), handle: be64(&h[4..12]), payload };
        assert!(self.pending.contains_key(&chunk.handle), "chunk for unknown handle {:#x}", chunk.handle);
        assert_eq!(chunk.flags & !REPLY_FLAG_DONE, 0, "reply flags other than DONE (rule 64)");
        if chunk.kind == CHUNK_NONE {
            assert!(
                chunk.flags & REPLY_FLAG_DONE != 0 && chunk.payload.is_empty(),
                "NONE chunk must be empty and DONE"
            );
        }
        Msg::Chunk(chunk)
    }

    /// Reads replies until `n` are complete; replies may come in any order and chunks of
    /// different replies may interleave (rule 50).
    pub fn replies(&mut self, n: usize) -> HashMap<u64, Reply> {
        let mut partial: HashMap<u64, Vec<Msg>> = HashMap::new();
        let mut done = HashMap::new();
        while done.len() < n {
            let m = self.msg();
            let h = m.handle();
            assert!(!done.contains_key(&h), "message after the end of reply {h:#x}");
            let finished = m.done();
            partial.entry(h).or_default().push(m);
            if finished {
                let sent = self.pending.remove(&h).expect("pending");
                done.insert(h, Reply { handle: h, sent, msgs: partial.remove(&h).unwrap() });
            }
        }
        done
    }

    /// Reads the reply to the one outstanding request `handle`.
    pub fn reply(&mut self, handle: u64) -> Reply {
        let mut r = self.replies(1);
        r.remove(&handle).unwrap_or_else(|| panic!("expected the reply to {handle:#x}, got {r:?}"))
    }

    /// Sends a request without payload and waits for its reply.
    pub fn call(&mut self, flags: u16, kind: u16, offset: u64, length: u32) -> Reply {
        let h = self.req(flags, kind, offset, length);
        self.reply(h)
    }

    pub fn read(&mut self, offset: u64, length: u32) -> Vec<u8> {
        self.call(0, CMD_READ, offset, length).read_data()
    }

    pub fn write(&mut self, offset: u64, data: &[u8]) {
        let h = self.req_write(0, offset, data);
        self.reply(h).assert_ok();
    }

    /// Sends DISC and waits for the server to close.
    pub fn disconnect(mut self) {
        let h = self.handle();
        self.send(&request(0, CMD_DISC, h, 0, 0));
        let rest = self.expect_close();
        assert!(rest.is_empty(), "DISC has no reply, got {} bytes", rest.len());
    }
}
