//! One NBD connection in transmission: callers send requests under a write lock (those
//! without payload through a queue that a burst of them leaves by in one write) and wait on
//! a oneshot; one reader task per connection (`replies`) parses replies, matches them to
//! requests by handle in whatever order they come, reads data straight into the request's
//! own buffers, and checks every chunk against the request before believing it.

mod replies;
mod state;

pub(crate) use state::{Failed, Outcome};

use crate::error::Error;
use crate::socket::{Reader, Writer};
use replies::read_replies;
use sluice_proto::wire::*;
use sluice_proto::RawRequest;
use state::{header, send_disc, Answer, Outgoing, Pending, Session, SharedWriter, State};
use std::io::IoSlice;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use tokio::io::AsyncWriteExt;
use tokio::sync::oneshot;

pub(crate) struct Connection {
    writer: SharedWriter,
    state: Arc<Mutex<State>>,
    reader: tokio::task::JoinHandle<()>,
    /// Extended headers: every request goes out in the 32-byte framing.
    extended: bool,
    /// The runtime the connection's reader runs on, where a queue left by a cancelled
    /// caller is sent (`QueueSender`).
    runtime: tokio::runtime::Handle,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.reader.abort();
        // A client dropped without `disconnect()` still leaves the polite way when it can:
        // NBD_CMD_DISC from a task on the connection's runtime (best effort: not if that
        // runtime is gone).
        let (writer, extended) = (self.writer.clone(), self.extended);
        self.runtime.spawn(async move { send_disc(&writer, extended).await });
    }
}

impl Connection {
    /// Starts transmission on a negotiated connection: `structured`, `extended` and
    /// `base_allocation_id` are what the handshake agreed.
    pub(crate) fn start(reader: Reader, writer: Writer, structured: bool, extended: bool, base_allocation_id: Option<u32>) -> Connection {
        let state = Arc::new(Mutex::new(State::default()));
        let session = Session { structured, extended, base_allocation_id };
        let writer = Arc::new(Outgoing::new(writer, extended, state.clone()));
        let task = tokio::spawn(read_replies(reader, state.clone(), writer.clone(), session));
        writer.reader.set(task.abort_handle()).expect("a new connection's reader is set once");
        Connection { writer, state, reader: task, extended, runtime: tokio::runtime::Handle::current() }
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
        let (handle, alone) = {
            let mut st = self.state.lock().unwrap();
            if let Some(e) = &st.dead {
                return Err(Failed { error: e.clone(), bufs });
            }
            let handle = st.next_handle;
            st.next_handle = st.next_handle.wrapping_add(1);
            let done = Some(tx);
            let p = Pending { cmd, flags, offset, len, bufs, covered: Vec::new(), covered_bytes: 0, extents: None, error: None, done };
            st.pending.insert(handle, p);
            (handle, st.pending.len() == 1)
        };
        // If this future is dropped before the request is fully written, the entry must go,
        // and a half-written request leaves the stream unusable.
        let mut guard = SendGuard { conn: self, handle, written: 0, finished: false };
        let (header, header_len) = header(RawRequest { flags, kind: cmd, handle, offset, length: len }, self.extended);
        let header = &header[..header_len];
        if payload.is_empty() {
            // Whole in the queue at the first poll, before anything can cancel this: from
            // there on it will be sent, so the entry stays for its reply.
            guard.finished = true;
            self.queue(header, alone).await;
            return self.answer(rx).await;
        }
        {
            let mut lock = self.writer.half.lock().await;
            let Some(w) = self.writer.usable(&mut lock) else {
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
                        // Cancelled from here on, the frame is torn (`usable`).
                        self.writer.torn.store(!slices.is_empty(), Ordering::Relaxed);
                        continue;
                    }
                    Err(e) => failed = Some(e),
                }
                break;
            }
            guard.finished = true;
            if let Some(e) = failed {
                self.writer.end(&mut lock, Error::io(e));
            }
        }
        self.answer(rx).await
    }

    /// Sends a request without payload together with the others issued in the same turn of
    /// the runtime: a gateway's worker hands over a burst of requests at once, and one
    /// write per request (a system call, and on loopback the server's receive processing
    /// too) was the gateway's largest cost after its context switches. The header joins
    /// the queue whole; the first caller to find the queue empty yields once, so the rest of
    /// the burst can join, and then sends all of it. It is sent even if that caller is
    /// dropped meanwhile (`QueueSender`), and before a DISC (`send_disc`). A request
    /// `alone` in flight on the connection goes at once: one at a time (QD1), the turn
    /// would only add to its latency.
    async fn queue(&self, header: &[u8], alone: bool) {
        let first = {
            let mut queued = self.writer.queued.lock().unwrap();
            queued.extend_from_slice(header);
            queued.len() == header.len()
        };
        if first {
            let sender = QueueSender { conn: self, sent: false };
            if !alone {
                tokio::task::yield_now().await;
            }
            sender.send().await;
        }
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
        // The writer is free unless a send is in progress; every caller marked the frame
        // torn first, so that send, or the next, ends the connection (`usable`).
        match self.writer.half.try_lock() {
            Ok(mut half) => self.writer.end(&mut half, e),
            Err(_) => self.writer.fail(e),
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

/// The caller that owes the queue a send; if it is dropped first, a task sends instead.
struct QueueSender<'a> {
    conn: &'a Connection,
    sent: bool,
}

impl QueueSender<'_> {
    async fn send(mut self) {
        self.conn.writer.send_queued().await;
        self.sent = true;
    }
}

impl Drop for QueueSender<'_> {
    fn drop(&mut self) {
        if self.sent {
            return;
        }
        // On the connection's own runtime, wherever this drop runs. If that runtime is gone,
        // so is the reader, whose task failed every request as it was dropped.
        let writer = self.conn.writer.clone();
        self.conn.runtime.spawn(async move { writer.send_queued().await });
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

#[cfg(test)]
mod tests;
