//! Shared by the handshake tests: a tiny catalog, a driver that feeds bytes the way a
//! socket loop would, and builders and parsers for option messages.
//!
//! Magic numbers are spelled here as literal bytes copied from the spec rather than taken
//! from `wire`, so a wrong constant in the crate cannot agree with itself in the tests.
#![allow(dead_code)] // each test binary uses a different part of this module

use sluice_proto::handshake::{Catalog, ExportSummary, Handshake, Negotiated, Next};
use sluice_proto::wire::*;

/// "IHAVEOPT": the prefix of every client option.
pub const IHAVEOPT_BYTES: [u8; 8] = *b"IHAVEOPT";
/// 0x0003e889045565a9: the prefix of every option reply.
pub const REPLY_MAGIC_BYTES: [u8; 8] = [0x00, 0x03, 0xe8, 0x89, 0x04, 0x55, 0x65, 0xa9];

pub const DISK_SIZE: u64 = 1 << 20;
/// Catalog flags of "disk": SEND_FLUSH | SEND_FUA. The handshake adds HAS_FLAGS (and SEND_DF
/// once structured replies are on).
pub const DISK_FLAGS: u16 = FLAG_SEND_FLUSH | FLAG_SEND_FUA;
pub const DISK_DESCRIPTION: &str = "scratch disk";
pub const DEFAULT_SIZE: u64 = 4096;

/// A catalog that is just a list, in the order LIST reports it.
pub struct TestCatalog {
    pub exports: Vec<(String, ExportSummary)>,
}

impl Catalog for TestCatalog {
    fn lookup(&self, name: &str) -> Option<ExportSummary> {
        self.exports.iter().find(|(n, _)| n == name).map(|(_, s)| s.clone())
    }
    fn list(&self) -> Vec<(String, Option<String>)> {
        self.exports.iter().map(|(n, s)| (n.clone(), s.description.clone())).collect()
    }
}

pub fn summary(size: u64, flags: u16, description: Option<&str>) -> ExportSummary {
    ExportSummary {
        size,
        flags,
        description: description.map(str::to_owned),
        block_min: 1,
        block_preferred: 4096,
        block_max: 32 << 20,
        identity: None,
    }
}

impl TestCatalog {
    /// "disk" (1 MiB, with a description) and the default export "" (4 KiB, read-only,
    /// no description).
    pub fn standard() -> TestCatalog {
        TestCatalog {
            exports: vec![
                ("disk".to_owned(), summary(DISK_SIZE, DISK_FLAGS, Some(DISK_DESCRIPTION))),
                (String::new(), summary(DEFAULT_SIZE, FLAG_READ_ONLY, None)),
            ],
        }
    }

    pub fn with(exports: Vec<(&str, ExportSummary)>) -> TestCatalog {
        TestCatalog { exports: exports.into_iter().map(|(n, s)| (n.to_owned(), s)).collect() }
    }
}

/// One parsed option reply.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct OptReply {
    pub option: u32,
    pub kind: u32,
    pub data: Vec<u8>,
}

/// Splits server output into option replies, insisting on the magic and on lengths that
/// add up exactly.
pub fn parse_replies(mut out: &[u8]) -> Vec<OptReply> {
    let mut replies = Vec::new();
    while !out.is_empty() {
        assert!(out.len() >= 20, "truncated option reply header: {out:02x?}");
        assert_eq!(out[0..8], REPLY_MAGIC_BYTES, "option reply magic");
        let option = u32::from_be_bytes(out[8..12].try_into().unwrap());
        let kind = u32::from_be_bytes(out[12..16].try_into().unwrap());
        let len = u32::from_be_bytes(out[16..20].try_into().unwrap()) as usize;
        assert!(out.len() >= 20 + len, "option reply claims {len} bytes, {} present", out.len() - 20);
        replies.push(OptReply { option, kind, data: out[20..20 + len].to_vec() });
        out = &out[20 + len..];
    }
    replies
}

/// Hand-built option reply bytes, for byte-exact comparisons.
pub fn reply_bytes(option: u32, kind: u32, data: &[u8]) -> Vec<u8> {
    let mut b = REPLY_MAGIC_BYTES.to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&kind.to_be_bytes());
    b.extend_from_slice(&(data.len() as u32).to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// A client option: header and data, with a length that matches the data.
pub fn option(option: u32, data: &[u8]) -> Vec<u8> {
    option_with_len(option, data.len() as u32, data)
}

/// A client option header claiming `len` bytes, followed by `data` (which may differ).
pub fn option_with_len(option: u32, len: u32, data: &[u8]) -> Vec<u8> {
    let mut b = IHAVEOPT_BYTES.to_vec();
    b.extend_from_slice(&option.to_be_bytes());
    b.extend_from_slice(&len.to_be_bytes());
    b.extend_from_slice(data);
    b
}

/// INFO/GO data: name_len(4) name n_req(2) info_type(2) × n_req.
pub fn info_data(name: &[u8], requests: &[u16]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name);
    b.extend_from_slice(&(requests.len() as u16).to_be_bytes());
    for r in requests {
        b.extend_from_slice(&r.to_be_bytes());
    }
    b
}

/// LIST/SET_META_CONTEXT data: name_len(4) name n_queries(4) {query_len(4) query} × n.
pub fn meta_data(name: &[u8], queries: &[&[u8]]) -> Vec<u8> {
    let mut b = (name.len() as u32).to_be_bytes().to_vec();
    b.extend_from_slice(name);
    b.extend_from_slice(&(queries.len() as u32).to_be_bytes());
    for q in queries {
        b.extend_from_slice(&(q.len() as u32).to_be_bytes());
        b.extend_from_slice(q);
    }
    b
}

/// The server's half of a connection, driven the way a socket loop drives it.
pub struct Driver {
    pub hs: Handshake,
    pub next: Next,
    pub catalog: TestCatalog,
}

impl Driver {
    /// Greeting sent; nothing read yet.
    pub fn new(catalog: TestCatalog) -> Driver {
        Driver { hs: Handshake::new(), next: Handshake::start(), catalog }
    }

    /// A fixed-newstyle client that did not ask for NO_ZEROES, ready for options.
    pub fn fixed() -> Driver {
        Driver::fixed_with(TestCatalog::standard(), FLAG_C_FIXED_NEWSTYLE)
    }

    pub fn fixed_with(catalog: TestCatalog, client_flags: u32) -> Driver {
        let mut d = Driver::new(catalog);
        let out = d.send(&client_flags.to_be_bytes());
        assert!(out.is_empty(), "client flags need no answer");
        assert_eq!(d.next, Next::Read(16));
        d
    }

    /// Feeds `bytes` in the slices `Next::Read` asks for and returns everything written.
    /// Panics if the input ends inside a message, or if bytes are left once the machine
    /// stops reading: either means the test, not the machine, is wrong.
    pub fn send(&mut self, mut bytes: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        loop {
            match self.next {
                // Read(0) is the machine asking for an option's empty data: answering it with
                // an empty slice is what produces the reply.
                Next::Read(n) if n <= bytes.len() => {
                    let (now, rest) = bytes.split_at(n);
                    bytes = rest;
                    self.next = self.hs.input(now, &self.catalog, &mut out);
                }
                Next::Read(_) if bytes.is_empty() => return out,
                Next::Read(n) => panic!("input ends inside a message: {} of {n} bytes", bytes.len()),
                _ => {
                    assert!(bytes.is_empty(), "{} bytes left after {:?}", bytes.len(), self.next);
                    return out;
                }
            }
        }
    }

    /// Sends one option and parses its replies.
    pub fn option(&mut self, opt: u32, data: &[u8]) -> Vec<OptReply> {
        let out = self.send(&option(opt, data));
        parse_replies(&out)
    }

    /// Negotiates structured replies, checking the ACK.
    pub fn structured(&mut self) {
        let replies = self.option(OPT_STRUCTURED_REPLY, &[]);
        assert_eq!(replies, vec![ack(OPT_STRUCTURED_REPLY)]);
    }

    /// The handshake is waiting for the next option header.
    pub fn assert_continues(&self) {
        assert_eq!(self.next, Next::Read(16), "the handshake should wait for the next option");
    }

    pub fn assert_closed(&self) {
        assert!(matches!(self.next, Next::Close { .. }), "expected Close, got {:?}", self.next);
    }

    pub fn negotiated(&self) -> &Negotiated {
        match &self.next {
            Next::Transmission(n) => n,
            other => panic!("expected Transmission, got {other:?}"),
        }
    }
}

pub fn ack(option: u32) -> OptReply {
    OptReply { option, kind: REP_ACK, data: Vec::new() }
}

/// Checks that `replies` is exactly one error reply of `kind` for `option`, carrying a
/// human-readable UTF-8 message (the spec allows one with every error).
pub fn assert_single_error(replies: &[OptReply], option: u32, kind: u32) {
    assert_eq!(replies.len(), 1, "expected one error reply, got {replies:?}");
    assert_eq!((replies[0].option, replies[0].kind), (option, kind), "{replies:?}");
    assert!(std::str::from_utf8(&replies[0].data).is_ok(), "error message is not UTF-8");
}
