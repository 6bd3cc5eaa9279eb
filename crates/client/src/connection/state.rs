//! What a connection's callers and its reader task share: the requests in flight and their
//! answers, the connection's state, the sending side and its queue, and the request framing.

use crate::error::Error;
use crate::limits::QUEUE_KEPT_BYTES_MAX;
use crate::socket::Writer;
use sluice_proto::wire::*;
use sluice_proto::RawRequest;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use tokio::io::AsyncWriteExt;
use tokio::task::AbortHandle;
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
pub(super) type Answer = Result<Outcome, (Option<Error>, Vec<Vec<u8>>)>;

pub(super) struct Pending {
    pub(super) cmd: u16,
    pub(super) flags: u16,
    pub(super) offset: u64,
    /// 64 bits with extended headers; a read's always fits in 32.
    pub(super) len: u64,
    /// Read destination: buffers whose lengths add up to `len`, holding anything until the
    /// reply's data and hole chunks (which must cover the whole range before the read
    /// succeeds) have written every byte.
    pub(super) bufs: Vec<Vec<u8>>,
    /// Byte ranges (relative to `offset`) already filled by data or hole chunks, for the
    /// overlap and coverage checks.
    pub(super) covered: Vec<(u32, u32)>,
    pub(super) covered_bytes: u64,
    pub(super) extents: Option<Vec<(u64, u32)>>,
    pub(super) error: Option<Error>,
    /// Taken when the answer is sent; a request dropped before that still answers.
    pub(super) done: Option<oneshot::Sender<Answer>>,
}

impl Pending {
    /// Sends the caller its result, with the read buffers if it failed.
    pub(super) fn finish(mut self, result: Result<Outcome, Error>) {
        if let Some(done) = self.done.take() {
            let bufs = std::mem::take(&mut self.bufs);
            let _ = done.send(result.map_err(|e| (Some(e), bufs)));
        }
    }

    /// A write the server has not been asked to make durable at once: a later flush, and
    /// nothing else, makes it so.
    pub(super) fn unforced_write(&self) -> bool {
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
pub(super) struct Ended(pub(super) watch::Sender<bool>);

impl Default for Ended {
    fn default() -> Ended {
        Ended(watch::Sender::new(false))
    }
}

#[derive(Default)]
pub(super) struct State {
    pub(super) next_handle: u64,
    pub(super) pending: HashMap<u64, Pending>,
    /// Set once the connection failed; every later request gets this error.
    pub(super) dead: Option<Error>,
    /// The server answered ESHUTDOWN: it is going away, and the spec asks the client to
    /// send nothing new and disconnect once the requests in flight are answered.
    pub(super) server_shutting_down: bool,
    /// fail_all has run: requests in flight were failed and the table must stay empty.
    pub(super) failed: bool,
    /// Unforced writes the server acknowledged on this connection; final once `failed`.
    pub(super) writes_acked: u64,
    pub(super) ended: Ended,
}

/// The sending side, shared by every caller and the reader task.
pub(super) struct Outgoing {
    /// The write half; `None` once the connection is closed (by DISC or after a failure).
    /// Dropping a write half shuts the socket's sending side, which ends the connection.
    pub(super) half: tokio::sync::Mutex<Option<Writer>>,
    /// Whole headers of requests without payload, waiting to go out together (`call`).
    pub(super) queued: Mutex<Vec<u8>>,
    /// A writer that was cancelled left a frame half-written, so the stream cannot carry
    /// another: set under `half`'s lock by a write in progress and cleared when it is
    /// done; whoever next takes the lock and finds it set ends the connection (`usable`).
    pub(super) torn: AtomicBool,
    /// Bytes of one request header (28, or 32 with extended headers).
    pub(super) frame: usize,
    /// The requests in flight, which an end of the connection fails.
    pub(super) state: Arc<Mutex<State>>,
    /// The reader task, stopped when the connection ends; set once it is started.
    pub(super) reader: OnceLock<AbortHandle>,
}

const TORN: &str = "a request was cancelled while being sent; the connection was closed";

/// A batch of queued headers being written. Dropped before all of it went (its writer
/// cancelled): if none went, it goes back to the front of the queue, for whoever sends
/// next; if some went, the stream is torn.
struct Batch<'a> {
    out: &'a Outgoing,
    bytes: Vec<u8>,
    at: usize,
}

impl Drop for Batch<'_> {
    fn drop(&mut self) {
        if self.at == 0 && !self.bytes.is_empty() {
            let mut queued = self.out.queued.lock().unwrap();
            let later = std::mem::replace(&mut *queued, std::mem::take(&mut self.bytes));
            queued.extend_from_slice(&later);
        } else if self.at < self.bytes.len() {
            self.out.torn.store(true, Ordering::Relaxed);
        }
    }
}

pub(super) type SharedWriter = Arc<Outgoing>;

impl Outgoing {
    pub(super) fn new(writer: Writer, extended: bool, state: Arc<Mutex<State>>) -> Outgoing {
        let frame = if extended { EXTENDED_REQUEST_BYTES } else { REQUEST_BYTES };
        let (half, queued) = (tokio::sync::Mutex::new(Some(writer)), Mutex::new(Vec::new()));
        Outgoing { half, queued, torn: AtomicBool::new(false), frame, state, reader: OnceLock::new() }
    }

    /// Ends the connection: the write half (held under its lock) closed, every request in
    /// flight failed with `e`, the reader stopped. Once a send failed or a frame was torn,
    /// the stream carries nothing more.
    pub(super) fn end(&self, half: &mut Option<Writer>, e: Error) {
        half.take();
        self.fail(e);
    }

    /// Fails every request in flight with `e` and stops the reader, leaving the write half
    /// to whoever holds its lock: the callers that reach this with the lock held by someone
    /// else have marked the frame torn, so the next holder ends the connection (`usable`).
    pub(super) fn fail(&self, e: Error) {
        fail_all(&self.state, e);
        if let Some(reader) = self.reader.get() {
            reader.abort();
        }
    }

    /// The write half (under its lock), if the stream can take another frame. When a
    /// cancelled writer left one half-written, the connection ends here: its requests fail
    /// (and a reconnecting client sends them again), as when the writer's own guard can
    /// close it.
    pub(super) fn usable<'a>(&self, half: &'a mut Option<Writer>) -> Option<&'a mut Writer> {
        if self.torn.load(Ordering::Relaxed) && half.is_some() {
            self.end(half, Error::io(std::io::Error::other(TORN)));
        }
        half.as_mut()
    }

    /// Sends what is queued, in one write. A write that fails ends the connection, as any
    /// failed send does.
    pub(super) async fn send_queued(&self) {
        let mut half = self.half.lock().await;
        let mut batch = Batch { out: self, bytes: std::mem::take(&mut *self.queued.lock().unwrap()), at: 0 };
        let Some(w) = self.usable(&mut half) else {
            // Closed (DISC sent, or failed) after these requests were queued: they will not
            // go, so they fail now rather than when the server closes.
            self.fail_unsent(&std::mem::take(&mut batch.bytes));
            return;
        };
        let mut failed = None;
        while batch.at < batch.bytes.len() && failed.is_none() {
            match w.write(&batch.bytes[batch.at..]).await {
                Ok(n) if n > 0 => batch.at += n,
                done => failed = Some(done.err().unwrap_or_else(|| std::io::ErrorKind::WriteZero.into())),
            }
        }
        if let Some(e) = failed {
            // Every request in the batch is still pending: fail_all answers them.
            batch.at = batch.bytes.len();
            return self.end(&mut half, Error::io(e));
        }
        // The batch's buffer becomes the queue's again, unless the next burst has begun one:
        // a steady stream of bursts then allocates nothing.
        let mut spare = std::mem::take(&mut batch.bytes);
        let mut queued = self.queued.lock().unwrap();
        if queued.capacity() == 0 && spare.capacity() <= QUEUE_KEPT_BYTES_MAX {
            spare.clear();
            *queued = spare;
        }
    }

    /// Answers the requests whose headers are in `bytes` and were never sent: each caller
    /// gets the connection's error (a `Pending` dropped unanswered).
    fn fail_unsent(&self, bytes: &[u8]) {
        let unsent: Vec<Pending> = {
            let mut st = self.state.lock().unwrap();
            let handles = bytes.chunks(self.frame).map(|h| u64::from_be_bytes(h[8..16].try_into().expect("8 bytes")));
            handles.filter_map(|handle| st.pending.remove(&handle)).collect()
        };
        drop(unsent);
    }
}

/// Sends NBD_CMD_DISC and closes the write side, unless it is closed already. Nothing is
/// ever sent after it: the writer is taken out for good. On a torn stream (`usable`) the
/// goodbye cannot be said: the connection just ends, and its requests fail now (a TLS
/// stream's write half closes nothing when dropped, so the server would wait for the rest
/// of the frame, and they with it).
pub(super) async fn send_disc(writer: &SharedWriter, extended: bool) {
    let Some(mut w) = writer.half.lock().await.take() else { return };
    if writer.torn.load(Ordering::Relaxed) {
        writer.fail(Error::io(std::io::Error::other(TORN)));
        return;
    }
    {
        // Requests queued before the goodbye still go, ahead of it.
        let mut bytes = std::mem::take(&mut *writer.queued.lock().unwrap());
        let disc = RawRequest { flags: 0, kind: CMD_DISC, handle: u64::MAX, offset: 0, length: 0 };
        let (b, n) = header(disc, extended);
        bytes.extend_from_slice(&b[..n]);
        let _ = w.write_all(&bytes).await;
        let _ = w.shutdown().await;
    }
}

/// What the reader task needs to know about the session.
#[derive(Clone, Copy)]
pub(super) struct Session {
    pub(super) structured: bool,
    pub(super) extended: bool,
    pub(super) base_allocation_id: Option<u32>,
}

/// A request header in the framing the session uses; extended WRITEs say their payload.
pub(super) fn header(raw: RawRequest, extended: bool) -> ([u8; EXTENDED_REQUEST_BYTES], usize) {
    let mut b = [0u8; EXTENDED_REQUEST_BYTES];
    if extended {
        let payload = if raw.kind == CMD_WRITE { CMD_FLAG_PAYLOAD_LEN } else { 0 };
        b = RawRequest { flags: raw.flags | payload, ..raw }.encode_extended();
        return (b, EXTENDED_REQUEST_BYTES);
    }
    b[..REQUEST_BYTES].copy_from_slice(&raw.encode());
    (b, REQUEST_BYTES)
}

pub(super) fn fail_all(state: &Mutex<State>, e: Error) {
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
