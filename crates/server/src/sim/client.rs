//! The simulated client: a seeded stream of requests (valid, invalid, and what follows a
//! DISC), and a strict checker of every reply byte the core sends back.

use std::collections::HashMap;

use sluice_proto::client::{decode_block_status_ext, decode_error_chunk, decode_simple, reply_magic, ChunkHeader};
use sluice_proto::request::header_bytes;
use sluice_proto::wire::*;
use sluice_proto::RawRequest;

use sluice_proto::rng::Rng;

/// The byte every export offset holds in the simulated storage; never zero, so zero-fill
/// writes are told apart from payload.
pub fn pattern(offset: u64) -> u8 {
    (offset % 251) as u8 + 1
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Read,
    Write,
    BlockStatus,
    Other,
}

/// A request the client sent, as the checker needs it.
#[derive(Clone, Copy, Debug)]
pub struct Sent {
    pub kind: Kind,
    pub offset: u64,
    pub length: u64,
    /// Where the request's last byte sits in the client's byte stream.
    pub end: usize,
    /// Whether the server must answer it in a clean run (false after DISC or a bad magic).
    pub answerable: bool,
    /// A DF read: one data chunk for the whole range.
    pub whole: bool,
}

/// How the simulated session frames requests and replies.
#[derive(Clone, Copy, Debug)]
pub struct Framing {
    pub structured: bool,
    /// Extended headers (then `structured` too).
    pub extended: bool,
}

/// Builds the byte stream a client sends: requests, a DISC, and sometimes more after it.
pub fn requests(rng: &mut Rng, size: u64, framing: Framing, count: usize) -> (Vec<u8>, HashMap<u64, Sent>) {
    let extended = framing.extended;
    let mut out = Vec::new();
    let mut sent = HashMap::new();
    let mut answerable = true;
    for handle in 0..count as u64 {
        if answerable && rng.below(40) == 0 {
            // The client hangs up, and what it sends after must never be answered.
            push(&mut out, RawRequest { flags: 0, kind: CMD_DISC, handle: u64::MAX, offset: 0, length: 0 }, &[], extended);
            answerable = false;
        }
        if answerable && rng.below(300) == 0 {
            // Garbage instead of a header: the server stops reading here.
            out.extend(std::iter::repeat_n(0xde, header_bytes(extended)));
            answerable = false;
        }
        let (mut raw, kind) = random_request(rng, size, framing, handle);
        if extended && raw.kind == CMD_WRITE && rng.below(2) == 0 {
            // libnbd sets the flag on writes, qemu does not.
            raw.flags |= CMD_FLAG_PAYLOAD_LEN;
        }
        let payload: Vec<u8> = (0..raw.payload_len(extended)).map(|i| pattern(raw.offset.wrapping_add(i))).collect();
        push(&mut out, raw, &payload, extended);
        let whole = raw.kind == CMD_READ && raw.flags & CMD_FLAG_DF != 0;
        sent.insert(handle, Sent { kind, offset: raw.offset, length: raw.length, end: out.len(), answerable, whole });
    }
    if answerable && rng.below(2) == 0 {
        push(&mut out, RawRequest { flags: 0, kind: CMD_DISC, handle: u64::MAX, offset: 0, length: 0 }, &[], extended);
    }
    (out, sent)
}

fn push(out: &mut Vec<u8>, raw: RawRequest, payload: &[u8], extended: bool) {
    if extended {
        out.extend_from_slice(&raw.encode_extended());
    } else {
        out.extend_from_slice(&raw.encode());
    }
    out.extend_from_slice(payload);
}

fn random_request(rng: &mut Rng, size: u64, framing: Framing, handle: u64) -> (RawRequest, Kind) {
    let structured = framing.structured;
    let offset = rng.below(size);
    let max_len = (size - offset).min(300 * 1024);
    let length = rng.below(max_len + 1);
    let mut raw = RawRequest { flags: 0, kind: CMD_READ, handle, offset, length };
    let kind = match rng.below(20) {
        0..=7 => {
            if structured && rng.below(4) == 0 {
                raw.flags = CMD_FLAG_DF;
            }
            Kind::Read
        }
        8..=11 => {
            raw.kind = CMD_WRITE;
            raw.flags = if rng.below(3) == 0 { CMD_FLAG_FUA } else { 0 };
            Kind::Write
        }
        12 => {
            raw.kind = CMD_FLUSH;
            (raw.offset, raw.length) = (0, 0);
            Kind::Other
        }
        13 => {
            raw.kind = CMD_TRIM;
            raw.flags = CMD_FLAG_FUA * rng.below(2) as u16;
            Kind::Other
        }
        14 => {
            raw.kind = CMD_WRITE_ZEROES;
            raw.flags = [0, CMD_FLAG_FUA, CMD_FLAG_NO_HOLE, CMD_FLAG_FAST_ZERO][rng.below(4) as usize];
            Kind::Other
        }
        15 => {
            raw.kind = CMD_CACHE;
            Kind::Other
        }
        16 if structured => {
            raw.kind = CMD_BLOCK_STATUS;
            raw.length = raw.length.max(1).min(size - offset);
            Kind::BlockStatus
        }
        17 => {
            // Past the end: refused, and a write's payload must still be read and dropped.
            raw.kind = if rng.below(2) == 0 { CMD_WRITE } else { CMD_READ };
            raw.offset = size - rng.below(4096).min(size);
            raw.length = 4096 + rng.below(8192);
            return (raw, if raw.kind == CMD_WRITE { Kind::Write } else { Kind::Other });
        }
        19 if framing.extended => {
            // A 64-bit effect length past the export, or a payload on a command that takes
            // none: refused, the payload read and dropped first.
            raw.kind = [CMD_TRIM, CMD_WRITE_ZEROES, CMD_BLOCK_STATUS, CMD_CACHE][rng.below(4) as usize];
            if rng.below(2) == 0 {
                raw.length = (1 << 32) + rng.below(1 << 34);
            } else {
                raw.flags = CMD_FLAG_PAYLOAD_LEN;
                raw.length = rng.below(9000);
            }
            Kind::Other
        }
        18 => {
            raw.flags = 1 << 9; // no such flag
            Kind::Read
        }
        _ => {
            raw.kind = 77; // no such command
            Kind::Other
        }
    };
    (raw, kind)
}

/// What the checker learnt of one request's answer so far.
#[derive(Default)]
struct Answer {
    done: bool,
    error: bool,
    /// Data ranges received, for overlap and coverage checks.
    ranges: Vec<(u64, u64)>,
}

/// Parses the server's byte stream and checks every reply against what was asked.
pub struct Checker {
    pub framing: Framing,
    wire: Vec<u8>,
    answers: HashMap<u64, Answer>,
}

impl Checker {
    pub fn new(framing: Framing) -> Checker {
        Checker { framing, wire: Vec::new(), answers: HashMap::new() }
    }

    /// Handles of requests answered completely.
    pub fn finished(&self) -> impl Iterator<Item = u64> + '_ {
        self.answers.iter().filter(|(_, a)| a.done).map(|(&h, _)| h)
    }

    /// Bytes received and not yet parsed (a reply cut short by a close).
    pub fn partial(&self) -> usize {
        self.wire.len()
    }

    /// Takes bytes the server sent; `read_to` is how far into the client's stream the
    /// server had received when they were sent.
    pub fn take(&mut self, bytes: &[u8], sent: &HashMap<u64, Sent>, read_to: usize) -> Result<(), String> {
        self.wire.extend_from_slice(bytes);
        while let Some(used) = self.parse_one(sent, read_to)? {
            self.wire.drain(..used);
        }
        Ok(())
    }

    /// Checks one reply at the front of the wire; None when it is not all there yet.
    fn parse_one(&mut self, sent: &HashMap<u64, Sent>, read_to: usize) -> Result<Option<usize>, String> {
        if self.wire.len() < 4 {
            return Ok(None);
        }
        let magic = reply_magic(self.wire[..4].try_into().expect("four bytes"));
        let Framing { structured, extended } = self.framing;
        match magic {
            // With structured replies, commands other than READ and BLOCK_STATUS may still
            // be answered simply (doc/proto.md); with extended headers nothing may.
            SIMPLE_REPLY_MAGIC if !extended => self.parse_simple(sent, read_to),
            STRUCTURED_REPLY_MAGIC if structured && !extended => self.parse_chunk(sent, read_to),
            EXTENDED_REPLY_MAGIC if extended => self.parse_chunk(sent, read_to),
            m => Err(format!("reply magic {m:#x} ({:?})", self.framing)),
        }
    }

    fn request(&self, handle: u64, sent: &HashMap<u64, Sent>, read_to: usize) -> Result<Sent, String> {
        let Some(&s) = sent.get(&handle) else { return Err(format!("a reply for handle {handle}, never sent")) };
        if s.end > read_to {
            return Err(format!("a reply for handle {handle} before the server read all of it"));
        }
        if !s.answerable {
            return Err(format!("a reply for handle {handle}, sent after DISC or garbage"));
        }
        if self.answers.get(&handle).is_some_and(|a| a.done) {
            return Err(format!("a second reply for handle {handle}"));
        }
        Ok(s)
    }

    fn parse_simple(&mut self, sent: &HashMap<u64, Sent>, read_to: usize) -> Result<Option<usize>, String> {
        if self.wire.len() < SIMPLE_REPLY_BYTES {
            return Ok(None);
        }
        let (error, handle) = decode_simple(self.wire[4..SIMPLE_REPLY_BYTES].try_into().expect("length checked"));
        let s = self.request(handle, sent, read_to)?;
        if self.framing.structured && matches!(s.kind, Kind::Read | Kind::BlockStatus) {
            return Err(format!("handle {handle}: a simple reply to a {:?} under structured replies", s.kind));
        }
        let data = if error == 0 && s.kind == Kind::Read { s.length as usize } else { 0 };
        if self.wire.len() < SIMPLE_REPLY_BYTES + data {
            return Ok(None);
        }
        check_data(handle, s.offset, &self.wire[SIMPLE_REPLY_BYTES..SIMPLE_REPLY_BYTES + data])?;
        self.answers.insert(handle, Answer { done: true, error: error != 0, ranges: Vec::new() });
        Ok(Some(SIMPLE_REPLY_BYTES + data))
    }

    fn parse_chunk(&mut self, sent: &HashMap<u64, Sent>, read_to: usize) -> Result<Option<usize>, String> {
        let extended = self.framing.extended;
        let head = if extended { EXTENDED_REPLY_BYTES } else { CHUNK_HEADER_BYTES };
        if self.wire.len() < head {
            return Ok(None);
        }
        let h = match extended {
            true => ChunkHeader::decode_extended(self.wire[4..head].try_into().expect("length checked")),
            false => ChunkHeader::decode(self.wire[4..head].try_into().expect("length checked")),
        };
        if h.len > 64 << 20 {
            return Err(format!("handle {}: a chunk of {} bytes", h.handle, h.len));
        }
        let total = head + h.len as usize;
        if self.wire.len() < total {
            return Ok(None);
        }
        let s = self.request(h.handle, sent, read_to)?;
        if extended && h.offset != s.offset {
            return Err(format!("handle {}: extended header offset {} for a request at {}", h.handle, h.offset, s.offset));
        }
        let payload = &self.wire[head..total];
        let answer = self.answers.entry(h.handle).or_default();
        match h.kind {
            REPLY_TYPE_OFFSET_DATA if s.kind == Kind::Read && payload.len() >= 8 => {
                let offset = u64::from_be_bytes(payload[..8].try_into().expect("eight bytes"));
                let end = offset + (payload.len() - 8) as u64;
                if offset < s.offset || end > s.offset + s.length || end == offset {
                    return Err(format!("handle {}: data chunk {offset}..{end} outside its read", h.handle));
                }
                if answer.ranges.iter().any(|&(a, b)| offset < b && a < end) {
                    return Err(format!("handle {}: data chunk {offset}..{end} overlaps another", h.handle));
                }
                answer.ranges.push((offset, end));
                check_data(h.handle, offset, &payload[8..])?;
            }
            REPLY_TYPE_NONE if payload.is_empty() => {}
            REPLY_TYPE_BLOCK_STATUS if s.kind == Kind::BlockStatus && payload.len() >= 4 && !extended => {
                let lengths = payload[4..].chunks(8).map(|e| u32::from_be_bytes(e[..4].try_into().expect("4")) as u64);
                let sum: u64 = lengths.sum();
                if sum == 0 || sum > s.length || payload.len() % 8 != 4 {
                    return Err(format!("handle {}: block status covers {sum} of {} bytes", h.handle, s.length));
                }
            }
            REPLY_TYPE_BLOCK_STATUS_EXT if s.kind == Kind::BlockStatus && extended => {
                let (_, extents) = decode_block_status_ext(payload).map_err(|e| format!("handle {}: {e}", h.handle))?;
                let sum: u64 = extents.iter().map(|&(length, _)| length).sum();
                if sum == 0 || sum > s.length {
                    return Err(format!("handle {}: block status covers {sum} of {} bytes", h.handle, s.length));
                }
            }
            REPLY_TYPE_ERROR | REPLY_TYPE_ERROR_OFFSET => {
                decode_error_chunk(h.kind, payload).map_err(|e| format!("handle {}: {e}", h.handle))?;
                answer.error = true;
            }
            k => return Err(format!("handle {}: chunk type {k} for a {:?} request", h.handle, s.kind)),
        }
        if h.done() {
            answer.done = true;
            let covered: u64 = answer.ranges.iter().map(|&(a, b)| b - a).sum();
            let one_chunk_or_none = answer.ranges.len() <= 1 || !s.whole;
            if s.kind == Kind::Read && !answer.error && (covered != s.length || !one_chunk_or_none) {
                return Err(format!("handle {}: read of {} answered with {covered} bytes", h.handle, s.length));
            }
        }
        Ok(Some(total))
    }
}

fn check_data(handle: u64, offset: u64, data: &[u8]) -> Result<(), String> {
    match data.iter().enumerate().find(|&(i, &b)| b != pattern(offset + i as u64)) {
        Some((i, b)) => Err(format!("handle {handle}: byte {} is {b}, not {}", offset + i as u64, pattern(offset + i as u64))),
        None => Ok(()),
    }
}
