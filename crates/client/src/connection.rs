//! One NBD connection in transmission: callers send requests under a write lock and wait on
//! a oneshot; one reader task per connection parses replies, matches them to requests by
//! handle in whatever order they come, reads data straight into the request's own buffers,
//! and checks every chunk against the request before believing it.

use crate::error::Error;
use crate::limits::*;
use crate::socket::{Reader, Writer};
use crate::spans::Spans;
use sluice_proto::client as wire_c;
use sluice_proto::wire::*;
use sluice_proto::RawRequest;
use std::collections::HashMap;
use std::io::IoSlice;
use std::sync::{Arc, Mutex};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{oneshot, watch};

/// What a finished request hands back.
pub(crate) enum Outcome {
    Done,
    Read(Vec<Vec<u8>>),
    /// (length, flags) descriptors from base:allocation.
    Extents(Vec<(u64, u32)>),
}

/// A request that failed, with a read's buffers handed back (partly filled, perhaps) so
/// that a retry can use them again.
pub(crate) struct Failed {
    pub error: Error,
    pub bufs: Vec<Vec<u8>>,
}

/// What the reader task sends a waiting caller. `None` as the error: the request was
/// dropped unanswered, and the connection's own error says why.
type Answer = Result<Outcome, (Option<Error>, Vec<Vec<u8>>)>;

struct Pending {
    cmd: u16,
    flags: u16,
    offset: u64,
    /// 64 bits with extended headers; a read's always fits in 32.
    len: u64,
    /// Read destination: buffers whose lengths add up to `len`, holding anything until the
    /// reply's data and hole chunks (which must cover the whole range before the read
    /// succeeds) have written every byte.
    bufs: Vec<Vec<u8>>,
    /// Byte ranges (relative to `offset`) already filled by data or hole chunks, for the
    /// overlap and coverage checks.
    covered: Vec<(u32, u32)>,
    covered_bytes: u64,
    extents: Option<Vec<(u64, u32)>>,
    error: Option<Error>,
    /// Taken when the answer is sent; a request dropped before that still answers.
    done: Option<oneshot::Sender<Answer>>,
}

impl Pending {
    /// Sends the caller its result, with the read buffers if it failed.
    fn finish(mut self, result: Result<Outcome, Error>) {
        if let Some(done) = self.done.take() {
            let bufs = std::mem::take(&mut self.bufs);
            let _ = done.send(result.map_err(|e| (Some(e), bufs)));
        }
    }

    /// A write the server has not been asked to make durable at once: a later flush, and
    /// nothing else, makes it so.
    fn unforced_write(&self) -> bool {
        matches!(self.cmd, CMD_WRITE | CMD_TRIM | CMD_WRITE_ZEROES) && self.flags & CMD_FLAG_FUA == 0
    }
}

impl Drop for Pending {
    fn drop(&mut self) {
        // Dropped unanswered (the reader task was stopped in the middle of this reply):
        // the caller still gets its buffers back.
        if let Some(done) = self.done.take() {
            let _ = done.send(Err((None, std::mem::take(&mut self.bufs))));
        }
    }
}

/// Becomes true once the connection has failed and every request in flight was answered
/// (fail_all ran); a reconnecting client waits on it.
struct Ended(watch::Sender<bool>);

impl Default for Ended {
    fn default() -> Ended {
        Ended(watch::Sender::new(false))
    }
}

#[derive(Default)]
struct State {
    next_handle: u64,
    pending: HashMap<u64, Pending>,
    /// Set once the connection failed; every later request gets this error.
    dead: Option<Error>,
    /// The server answered ESHUTDOWN: it is going away, and the spec asks the client to
    /// send nothing new and disconnect once the requests in flight are answered.
    server_shutting_down: bool,
    /// fail_all has run: requests in flight were failed and the table must stay empty.
    failed: bool,
    /// Unforced writes the server acknowledged on this connection; final once `failed`.
    writes_acked: u64,
    ended: Ended,
}

/// The write half; `None` once the connection is closed (by DISC or after a failure).
/// Dropping a write half shuts the socket's sending side, which ends the connection.
type SharedWriter = Arc<tokio::sync::Mutex<Option<Writer>>>;

pub(crate) struct Connection {
    writer: SharedWriter,
    state: Arc<Mutex<State>>,
    reader: tokio::task::JoinHandle<()>,
    /// Extended headers: every request goes out in the 32-byte framing.
    extended: bool,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        // A client dropped without `disconnect()` still leaves the polite way when it can:
        // NBD_CMD_DISC from a task, if a runtime is there to run it (best effort).
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let (writer, extended) = (self.writer.clone(), self.extended);
            runtime.spawn(async move { send_disc(&writer, extended).await });
        }
    }
}

/// Sends NBD_CMD_DISC and closes the write side, unless it is closed already. Nothing is
/// ever sent after it: the writer is taken out for good.
async fn send_disc(writer: &SharedWriter, extended: bool) {
    if let Some(mut w) = writer.lock().await.take() {
        let disc = RawRequest { flags: 0, kind: CMD_DISC, handle: u64::MAX, offset: 0, length: 0 };
        let (b, n) = header(disc, extended);
        let _ = w.write_all(&b[..n]).await;
        let _ = w.shutdown().await;
    }
}

/// What the reader task needs to know about the session.
#[derive(Clone, Copy)]
struct Session {
    structured: bool,
    extended: bool,
    base_allocation_id: Option<u32>,
}

/// A request header in the framing the session uses; extended WRITEs say their payload.
fn header(raw: RawRequest, extended: bool) -> ([u8; EXTENDED_REQUEST_BYTES], usize) {
    let mut b = [0u8; EXTENDED_REQUEST_BYTES];
    if extended {
        let payload = if raw.kind == CMD_WRITE { CMD_FLAG_PAYLOAD_LEN } else { 0 };
        b = RawRequest { flags: raw.flags | payload, ..raw }.encode_extended();
        return (b, EXTENDED_REQUEST_BYTES);
    }
    b[..REQUEST_BYTES].copy_from_slice(&raw.encode());
    (b, REQUEST_BYTES)
}

impl Connection {
    /// Starts transmission on a negotiated connection: `structured`, `extended` and
    /// `base_allocation_id` are what the handshake agreed.
    pub(crate) fn start(reader: Reader, writer: Writer, structured: bool, extended: bool, base_allocation_id: Option<u32>) -> Connection {
        let state = Arc::new(Mutex::new(State::default()));
        let session = Session { structured, extended, base_allocation_id };
        let writer = Arc::new(tokio::sync::Mutex::new(Some(writer)));
        let task = tokio::spawn(read_replies(reader, state.clone(), writer.clone(), session));
        Connection { writer, state, reader: task, extended }
    }

    /// Requests sent and not yet answered, or None once the connection takes no more
    /// (failed, disconnected, or the server is shutting down). One lock per look.
    pub(crate) fn load(&self) -> Option<usize> {
        let st = self.state.lock().unwrap();
        st.dead.is_none().then_some(st.pending.len())
    }

    /// Why the connection takes no more requests, once it does not.
    pub(crate) fn failure(&self) -> Option<Error> {
        self.state.lock().unwrap().dead.clone()
    }

    /// Unforced writes acknowledged here so far (see `Pending::unforced_write`); final once
    /// `ended` has returned.
    pub(crate) fn writes_acked(&self) -> u64 {
        self.state.lock().unwrap().writes_acked
    }

    /// Returns once the connection has failed or closed and every request in flight on it
    /// has been answered or failed.
    pub(crate) async fn ended(&self) {
        let mut ended = self.state.lock().unwrap().ended.0.subscribe();
        let _ = ended.wait_for(|&e| e).await;
    }

    /// Sends one request and waits for its reply. `payload` follows the header (writes);
    /// `bufs` receive a read's data, and come back on failure too.
    /// A length past 32 bits needs extended headers (the caller checks the export).
    pub(crate) async fn call(&self, cmd: u16, flags: u16, offset: u64, len: u64, payload: &[IoSlice<'_>], bufs: Vec<Vec<u8>>) -> Result<Outcome, Failed> {
        debug_assert!(cmd != CMD_READ || bufs.iter().map(|b| b.len() as u64).sum::<u64>() == len);
        debug_assert!(self.extended || len <= u32::MAX as u64, "a {len}-byte request without extended headers");
        let (tx, rx) = oneshot::channel();
        let handle = {
            let mut st = self.state.lock().unwrap();
            if let Some(e) = &st.dead {
                return Err(Failed { error: e.clone(), bufs });
            }
            let handle = st.next_handle;
            st.next_handle = st.next_handle.wrapping_add(1);
            let done = Some(tx);
            let p = Pending { cmd, flags, offset, len, bufs, covered: Vec::new(), covered_bytes: 0, extents: None, error: None, done };
            st.pending.insert(handle, p);
            handle
        };
        // If this future is dropped before the request is fully written, the entry must go,
        // and a half-written request leaves the stream unusable.
        let mut guard = SendGuard { conn: self, handle, written: 0, finished: false };
        let (header, header_len) = header(RawRequest { flags, kind: cmd, handle, offset, length: len }, self.extended);
        let header = &header[..header_len];
        {
            let mut lock = self.writer.lock().await;
            let Some(w) = lock.as_mut() else {
                // Closed (DISC sent, or failed) after the check above: the entry, dropped
                // unanswered, fails with the connection's error below.
                let unsent = self.state.lock().unwrap().pending.remove(&handle);
                drop(unsent);
                guard.finished = true;
                drop(lock);
                return self.answer(rx).await;
            };
            // Header and payload in one writev; no allocation for the usual one-slice payload.
            let mut few = [IoSlice::new(header), IoSlice::new(&[])];
            let mut many = Vec::new();
            let mut slices: &mut [IoSlice<'_>] = if payload.len() <= 1 {
                if let Some(p) = payload.first() {
                    few[1] = IoSlice::new(p);
                }
                &mut few[..1 + payload.len()]
            } else {
                many.push(IoSlice::new(header));
                many.extend(payload.iter().map(|s| IoSlice::new(s)));
                &mut many[..]
            };
            let mut failed = None;
            while !slices.is_empty() {
                match w.write_vectored(slices).await {
                    Ok(0) => failed = Some(std::io::Error::from(std::io::ErrorKind::WriteZero)),
                    Ok(n) => {
                        guard.written += n;
                        IoSlice::advance_slices(&mut slices, n);
                        continue;
                    }
                    Err(e) => failed = Some(e),
                }
                break;
            }
            guard.finished = true;
            if let Some(e) = failed {
                lock.take();
                fail_all(&self.state, Error::io(e));
                self.reader.abort();
            }
        }
        self.answer(rx).await
    }

    async fn answer(&self, rx: oneshot::Receiver<Answer>) -> Result<Outcome, Failed> {
        let dead = || self.failure().unwrap_or(Error::Closed);
        match rx.await {
            Ok(Ok(outcome)) => Ok(outcome),
            Ok(Err((error, bufs))) => Err(Failed { error: error.unwrap_or_else(dead), bufs }),
            // Every entry answers, even when dropped; this is only for completeness.
            Err(_) => Err(Failed { error: dead(), bufs: Vec::new() }),
        }
    }

    /// Marks the connection failed, fails everything in flight with `e`, and closes it: a
    /// client that saw the protocol broken must hard-disconnect.
    fn fail(&self, e: Error) {
        fail_all(&self.state, e);
        self.reader.abort();
        // The writer is free unless a send is in progress; that send then fails or finds
        // the connection dead, and the Connection's drop closes it at the latest.
        if let Ok(mut w) = self.writer.try_lock() {
            w.take();
        }
    }

    /// Sends NBD_CMD_DISC and closes the write side; requests in flight still get answers
    /// (the spec lets the server finish them). Nothing is sent after DISC.
    pub(crate) async fn disconnect(&self) {
        {
            let mut st = self.state.lock().unwrap();
            if st.dead.is_none() {
                st.dead = Some(Error::Closed);
            }
        }
        send_disc(&self.writer, self.extended).await;
    }
}

struct SendGuard<'a> {
    conn: &'a Connection,
    handle: u64,
    /// Bytes of this request already on the wire.
    written: usize,
    finished: bool,
}

impl Drop for SendGuard<'_> {
    fn drop(&mut self) {
        if self.finished {
            return;
        }
        if self.written > 0 {
            // The caller gave up with part of the request sent: the stream cannot carry
            // another request, so the connection ends (not the server's fault).
            let why = std::io::Error::other("a request was cancelled while being sent; the connection was closed");
            self.conn.fail(Error::io(why));
        } else {
            self.conn.state.lock().unwrap().pending.remove(&self.handle);
        }
    }
}

fn fail_all(state: &Mutex<State>, e: Error) {
    let pending = {
        let mut st = state.lock().unwrap();
        if st.dead.is_none() {
            st.dead = Some(e.clone());
        }
        st.failed = true;
        std::mem::take(&mut st.pending)
    };
    for (_, p) in pending {
        p.finish(Err(e.clone()));
    }
    state.lock().unwrap().ended.0.send_replace(true);
}

async fn read_replies(mut r: Reader, state: Arc<Mutex<State>>, writer: SharedWriter, session: Session) {
    let e = loop {
        if let Err(e) = read_reply(&mut r, &state, session).await {
            break e;
        }
        let leave = {
            let st = state.lock().unwrap();
            st.server_shutting_down && st.pending.is_empty()
        };
        if leave {
            // The soft disconnect ESHUTDOWN asks for.
            send_disc(&writer, session.extended).await;
            break Error::Closed;
        }
    };
    log::debug!("connection reader stops: {e}");
    fail_all(&state, e);
    // Close our side too: after a protocol error the spec wants a hard disconnect, and
    // after the server closed there is nothing left to say.
    writer.lock().await.take();
}

fn protocol<T>(m: impl Into<String>) -> Result<T, Error> {
    Err(Error::Protocol(m.into()))
}

async fn read_exact(r: &mut Reader, buf: &mut [u8]) -> Result<(), Error> {
    match r.read_exact(buf).await {
        Ok(_) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Error::Closed),
        Err(e) => Err(Error::io(e)),
    }
}

/// Takes the request a reply names out of the table while its payload is read, so the
/// lock is never held across I/O. A handle we did not send is a protocol error.
fn take(state: &Mutex<State>, handle: u64) -> Result<Pending, Error> {
    match state.lock().unwrap().pending.remove(&handle) {
        Some(p) => Ok(p),
        None => protocol(format!("reply for handle {handle:#x}, which has no request in flight")),
    }
}

/// Hands a request the server's answer. An unforced write counts in `writes_acked`,
/// unless the connection failed meanwhile: then it fails instead (resending a write is
/// safe), so that the count a failed connection ends with is exact.
fn finish(state: &Mutex<State>, p: Pending, result: Result<Outcome, Error>) {
    let result = match result {
        Ok(outcome) if p.unforced_write() => {
            let mut st = state.lock().unwrap();
            match st.failed {
                true => Err(st.dead.clone().unwrap_or(Error::Closed)),
                false => {
                    st.writes_acked += 1;
                    Ok(outcome)
                }
            }
        }
        other => other,
    };
    p.finish(result);
}

/// Notes an ESHUTDOWN answer: no new requests from now on (they get this error).
fn note_shutdown(state: &Mutex<State>, result: &Result<Outcome, Error>) {
    if let Err(e @ Error::Server { errno, .. }) = result {
        if *errno == sluice_proto::Errno::Shutdown.code() {
            let mut st = state.lock().unwrap();
            st.server_shutting_down = true;
            st.dead.get_or_insert_with(|| e.clone());
        }
    }
}

async fn read_reply(r: &mut Reader, state: &Mutex<State>, session: Session) -> Result<(), Error> {
    let mut magic = [0u8; 4];
    read_exact(r, &mut magic).await?;
    match wire_c::reply_magic(&magic) {
        SIMPLE_REPLY_MAGIC | STRUCTURED_REPLY_MAGIC if session.extended => protocol("a compact reply under extended headers"),
        SIMPLE_REPLY_MAGIC => {
            let mut rest = [0u8; SIMPLE_REPLY_BYTES - 4];
            read_exact(r, &mut rest).await?;
            let (code, handle) = wire_c::decode_simple(&rest);
            let mut p = take(state, handle)?;
            if code != 0 {
                let result = Err(Error::Server { errno: code, message: None });
                note_shutdown(state, &result);
                finish(state, p, result);
                return Ok(());
            }
            match p.cmd {
                CMD_READ => {
                    // Simple replies carry the whole range; the buffers are exactly its size.
                    for i in 0..p.bufs.len() {
                        if let Err(e) = read_exact(r, &mut p.bufs[i]).await {
                            finish(state, p, Err(e.clone()));
                            return Err(e);
                        }
                    }
                    let bufs = std::mem::take(&mut p.bufs);
                    finish(state, p, Ok(Outcome::Read(bufs)));
                }
                CMD_BLOCK_STATUS => {
                    let e = Error::Protocol("simple reply to BLOCK_STATUS".into());
                    finish(state, p, Err(e.clone()));
                    return Err(e);
                }
                _ => finish(state, p, Ok(Outcome::Done)),
            }
            Ok(())
        }
        EXTENDED_REPLY_MAGIC if session.extended => {
            let mut rest = [0u8; EXTENDED_REPLY_BYTES - 4];
            read_exact(r, &mut rest).await?;
            chunk_reply(r, state, session, wire_c::ChunkHeader::decode_extended(&rest)).await
        }
        STRUCTURED_REPLY_MAGIC if session.structured => {
            let mut rest = [0u8; CHUNK_HEADER_BYTES - 4];
            read_exact(r, &mut rest).await?;
            chunk_reply(r, state, session, wire_c::ChunkHeader::decode(&rest)).await
        }
        STRUCTURED_REPLY_MAGIC => protocol("structured reply chunk without structured replies negotiated"),
        EXTENDED_REPLY_MAGIC => protocol("extended reply chunk without extended headers negotiated"),
        other => protocol(format!("bad reply magic {other:#010x}")),
    }
}

/// One structured or extended chunk, its header read: its payload goes to its request.
async fn chunk_reply(r: &mut Reader, state: &Mutex<State>, session: Session, h: wire_c::ChunkHeader) -> Result<(), Error> {
    let mut p = take(state, h.handle)?;
    if let Err(e) = chunk(r, &mut p, &h, session).await {
        finish(state, p, Err(e.clone()));
        return Err(e);
    }
    if h.done() {
        let result = complete(&mut p);
        match result {
            Err(e @ Error::Protocol(_)) => {
                finish(state, p, Err(e.clone()));
                return Err(e);
            }
            other => {
                note_shutdown(state, &other);
                finish(state, p, other);
            }
        }
    } else {
        let mut st = state.lock().unwrap();
        if st.failed {
            // The connection failed while this chunk was read: fail_all has run and
            // will not see the entry, so finish it here.
            let e = st.dead.clone().unwrap_or(Error::Closed);
            drop(st);
            finish(state, p, Err(e));
        } else {
            st.pending.insert(h.handle, p);
        }
    }
    Ok(())
}

/// Reads and checks one structured chunk's payload into its request.
async fn chunk(r: &mut Reader, p: &mut Pending, h: &wire_c::ChunkHeader, session: Session) -> Result<(), Error> {
    let end = p.offset + p.len;
    match h.kind {
        REPLY_TYPE_OFFSET_DATA => {
            if p.cmd != CMD_READ {
                return protocol("OFFSET_DATA chunk for a request that is not a read");
            }
            if h.len <= 8 || h.len - 8 > p.len {
                return protocol(format!("OFFSET_DATA chunk of {} bytes for a {}-byte read", h.len, p.len));
            }
            let mut o = [0u8; 8];
            read_exact(r, &mut o).await?;
            let at = u64::from_be_bytes(o);
            // At most the read's length, which fits in 32 bits.
            let n = (h.len - 8) as u32;
            let rel = place(p, at, n, end, "OFFSET_DATA")?;
            // Straight from the socket into the caller's buffers.
            let mut spans = Spans::new(rel, n);
            while let Some((i, range)) = spans.next(&p.bufs) {
                read_exact(r, &mut p.bufs[i][range]).await?;
            }
            debug_assert_eq!(spans.left, 0, "a chunk reaches past its request's buffers");
        }
        REPLY_TYPE_OFFSET_HOLE => {
            if p.cmd != CMD_READ {
                return protocol("OFFSET_HOLE chunk for a request that is not a read");
            }
            let payload = small_payload(r, h).await?;
            let (at, n) = wire_c::decode_offset_hole(&payload)?;
            if n == 0 {
                return protocol("OFFSET_HOLE chunk of length 0");
            }
            // The buffers may hold anything (they are not zeroed up front), so the hole is
            // written as zeros here, like data.
            let rel = place(p, at, n, end, "OFFSET_HOLE")?;
            let mut spans = Spans::new(rel, n);
            while let Some((i, range)) = spans.next(&p.bufs) {
                p.bufs[i][range].fill(0);
            }
        }
        REPLY_TYPE_BLOCK_STATUS_EXT if !session.extended => return protocol("BLOCK_STATUS_EXT chunk without extended headers"),
        REPLY_TYPE_BLOCK_STATUS | REPLY_TYPE_BLOCK_STATUS_EXT => {
            if p.cmd != CMD_BLOCK_STATUS {
                return protocol("BLOCK_STATUS chunk for a request that is not block status");
            }
            if h.len > BLOCK_STATUS_PAYLOAD_MAX_BYTES as u64 {
                return protocol(format!("BLOCK_STATUS chunk of {} bytes (limit {BLOCK_STATUS_PAYLOAD_MAX_BYTES})", h.len));
            }
            let mut payload = vec![0u8; h.len as usize];
            read_exact(r, &mut payload).await?;
            let (id, extents) = if h.kind == REPLY_TYPE_BLOCK_STATUS_EXT {
                wire_c::decode_block_status_ext(&payload)?
            } else {
                wire_c::decode_block_status(&payload)?
            };
            if Some(id) != session.base_allocation_id {
                return protocol(format!("BLOCK_STATUS for metadata context {id}, which was not negotiated"));
            }
            if p.extents.is_some() {
                return protocol("two BLOCK_STATUS chunks for one context");
            }
            if extents.iter().any(|&(len, _)| len == 0) {
                return protocol("BLOCK_STATUS extent of length 0");
            }
            p.extents = Some(extents);
        }
        REPLY_TYPE_NONE => {
            if h.len != 0 {
                return protocol(format!("NONE chunk with {} bytes of payload", h.len));
            }
            if !h.done() {
                return protocol("NONE chunk without the DONE flag");
            }
        }
        kind if h.is_error() => {
            let payload = small_payload(r, h).await?;
            let e = wire_c::decode_error_chunk(kind, &payload)?;
            if let Some(at) = e.offset {
                if at < p.offset || at >= end {
                    return protocol(format!("ERROR_OFFSET {at} outside the request {}..{end}", p.offset));
                }
            }
            if p.error.is_none() {
                let message = (!e.message.is_empty()).then_some(e.message);
                p.error = Some(Error::Server { errno: e.code, message });
            }
        }
        kind => return protocol(format!("unknown reply chunk type {kind}")),
    }
    Ok(())
}

/// Reads a non-data chunk's payload, refusing sizes no honest server sends.
async fn small_payload(r: &mut Reader, h: &wire_c::ChunkHeader) -> Result<Vec<u8>, Error> {
    if h.len > CHUNK_PAYLOAD_MAX_BYTES as u64 {
        return protocol(format!("reply chunk of {} bytes (limit {CHUNK_PAYLOAD_MAX_BYTES})", h.len));
    }
    let mut payload = vec![0u8; h.len as usize];
    read_exact(r, &mut payload).await?;
    Ok(payload)
}

/// Checks that `n` bytes at `at` lie inside the request and overlap nothing already
/// received, records them, and returns their offset within the request.
fn place(p: &mut Pending, at: u64, n: u32, end: u64, what: &str) -> Result<u32, Error> {
    let Some(chunk_end) = at.checked_add(n as u64) else {
        return protocol(format!("{what} chunk offset overflows"));
    };
    if at < p.offset || chunk_end > end {
        return protocol(format!("{what} chunk {at}..{chunk_end} outside the request {}..{end}", p.offset));
    }
    let rel = (at - p.offset) as u32;
    let rel_end = rel + n;
    let i = p.covered.partition_point(|&(s, _)| s < rel);
    let overlaps_prev = i > 0 && p.covered[i - 1].1 > rel;
    let overlaps_next = i < p.covered.len() && p.covered[i].0 < rel_end;
    if overlaps_prev || overlaps_next {
        return protocol(format!("{what} chunk {at}..{chunk_end} overlaps data already received"));
    }
    // Merged with touching neighbours, so an honest server's chunks (in any order) keep the
    // list short; a server scattering tiny chunks runs into the cap instead of making each
    // insert cost more.
    let joins_prev = i > 0 && p.covered[i - 1].1 == rel;
    let joins_next = i < p.covered.len() && p.covered[i].0 == rel_end;
    match (joins_prev, joins_next) {
        (true, true) => {
            p.covered[i - 1].1 = p.covered[i].1;
            p.covered.remove(i);
        }
        (true, false) => p.covered[i - 1].1 = rel_end,
        (false, true) => p.covered[i].0 = rel,
        (false, false) => {
            if p.covered.len() >= COVERED_RANGES_MAX {
                return protocol(format!("read reply scattered into more than {COVERED_RANGES_MAX} separate pieces"));
            }
            p.covered.insert(i, (rel, rel_end));
        }
    }
    p.covered_bytes += n as u64;
    Ok(rel)
}

/// The request's final result once its DONE chunk arrived.
fn complete(p: &mut Pending) -> Result<Outcome, Error> {
    if let Some(e) = p.error.take() {
        return Err(e);
    }
    match p.cmd {
        CMD_READ if p.covered_bytes != p.len => protocol(format!(
            "read of {} bytes at {} answered with only {} bytes and no error",
            p.len, p.offset, p.covered_bytes
        )),
        CMD_READ => Ok(Outcome::Read(std::mem::take(&mut p.bufs))),
        CMD_BLOCK_STATUS => match p.extents.take() {
            Some(e) => Ok(Outcome::Extents(e)),
            None => protocol("block status finished without a BLOCK_STATUS chunk"),
        },
        _ => Ok(Outcome::Done),
    }
}

