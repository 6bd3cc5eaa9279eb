//! The transmission core of one client connection, without I/O: it takes events (bytes
//! received, a send finished, a storage operation finished) through `handle_*` and yields
//! the operations to carry out next through `poll_io` (receive into this buffer, send
//! these replies, run this storage operation, splice this pipe to the socket). It owns no
//! socket, no ring and no clock; the worker drives it against io_uring, and the
//! simulation in `sim` drives it against a model.
//!
//! Requests run concurrently and are answered as they complete. Concerns, one file each:
//! `intake` (framing, validation, slots), `execute` (commands other than READ, through the
//! backend's emulation layer), `read` (reads split into chunks, each sent as soon as it is
//! read), `pace` (storage and network rates, and the chunk size and window they call for),
//! `hold` (requests held before the storage by the QoS scheduler),
//! `reply` (the ordering rules for simple and structured replies), `send` (batches
//! and splicing out), `slot` (taking, accounting and releasing a request's slot), `state`
//! (the per-request data they share), `watch` (requests held at the backend too long).

use std::collections::VecDeque;
use std::sync::Arc;
use std::time::Instant;

use sluice_proto::reply::Extent;
use sluice_proto::Session;

use crate::admission::Budget;
use crate::backend::{Caps, StorageOp};
use crate::engine::{Buf, Held, Part, Pipe, Pipes, Pool, SendBatch, Tag};
use crate::export::{Chunking, Export};
use crate::limits::{Limits, RECV_BUFFER_BYTES, SEND_PARTS_MAX};
use crate::metrics::Metrics;

mod execute;
mod hold;
mod intake;
mod pace;
mod read;
mod reply;
mod send;
mod slot;
mod state;
mod watch;

use state::{Chunk, Receiving, Slot};

/// An operation the core asks its driver to carry out. Each but `Shutdown` and
/// `AwaitBudget` is answered by exactly one `handle_*` call.
pub enum Io {
    /// Receive from the socket into `buf[at..]`; answer with `handle_recv`. `whole`: the
    /// bytes are a write's payload, every one of them wanted, so the driver may have the
    /// kernel fill the buffer before it answers (a short answer is still taken).
    Recv { buf: Buf, at: usize, whole: bool },
    /// Send the batch; answer with `handle_send`.
    Send { batch: Box<SendBatch> },
    /// Splice up to `len` bytes from the pipe to the socket; answer with `handle_splice_out`.
    SpliceOut { pipe: Pipe, len: usize },
    /// Run a storage operation on the export's backend; answer with `handle_storage`.
    Storage { tag: Tag, op: StorageOp },
    /// Shut the socket down: the read side wakes a parked receive, both sides end it all.
    Shutdown(Shutdown),
    /// The worker's byte budget is spent: call `resume` once bytes come back.
    AwaitBudget,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Shutdown {
    Read,
    Both,
}

/// What the core borrows from its worker for one call: the time, and the worker's buffers,
/// pipes and byte budget.
pub struct Env<'a> {
    pub now: Instant,
    pub pool: &'a mut Pool,
    pub pipes: &'a mut Pipes,
    pub budget: &'a mut Budget,
}

/// Where a connection is in its life.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    /// Taking requests.
    Open,
    /// No new requests (after DISC, end of stream, a protocol error, shutdown); those in
    /// flight are still answered.
    Draining,
    /// A reply was cut short: what is queued goes out, nothing more, then the socket is
    /// shut (the protocol's way to report an error after part of a read's data).
    Closing,
    /// The socket failed or was shut: nothing more is sent; operations in flight return.
    Broken,
}

pub struct Conn {
    peer: String,
    export: Arc<Export>,
    /// The backend's capabilities and the export's O_DIRECT alignment, asked once.
    caps: Caps,
    direct_align: Option<usize>,
    session: Session,
    limits: Limits,
    life: Life,
    /// Operations handed out and not yet answered.
    ops: usize,
    out: VecDeque<Io>,

    // Intake (intake.rs).
    rbuf: Option<Buf>,
    rstart: usize,
    rend: usize,
    receiving: Receiving,
    /// Payload bytes of a rejected write still to be read and dropped.
    discard: u64,
    /// The rejected write's slot, answered once its payload is gone.
    after_discard: Option<u16>,
    recv_in_flight: bool,

    // Requests (slot.rs, state.rs).
    slots: Vec<Option<Slot>>,
    /// Chunks of each slot's read, kept apart from the slot so their Vec is reused.
    chunks: Vec<Vec<Chunk>>,
    free_slots: Vec<u16>,
    inflight_bytes: usize,
    /// Reads being worked on; an O_DIRECT splice is taken only by a read that is alone.
    reads_in_flight: usize,
    /// Extent lists of finished BLOCK_STATUS requests, reused by the next ones.
    spare_extents: Vec<Vec<Extent>>,

    // Replies (reply.rs, send.rs).
    batch: Option<Box<SendBatch>>,
    queue: VecDeque<Part>,
    /// A part whose data is being spliced from its pipe to the socket; nothing else may be
    /// sent until it is done.
    splicing: Option<Part>,
    /// A read whose reply must stay contiguous on the wire (simple replies, or one
    /// OFFSET_DATA chunk for DF) and has started going out; other replies wait in `deferred`
    /// until its last part is queued, and other such reads wait in `stream_waiters`.
    streaming: Option<u16>,
    deferred: VecDeque<Part>,
    stream_waiters: VecDeque<u16>,
    spare_vecs: Vec<Vec<u8>>,
    /// Scratch space reused across sends so the hot path does not allocate.
    finished_parts: Vec<Part>,
    /// When the send or splice to the socket in flight was handed out, to time it.
    sending_since: Option<Instant>,
    /// Storage and network rates, which size automatic read chunks (pace.rs).
    pace: pace::Pace,

    /// The QoS scheduler, when load restriction applies to this connection (hold.rs).
    qos: Option<crate::qos::Port>,

    metrics: Arc<Metrics>,
    metrics_export: usize,
    /// For the closing log line: payload bytes read and written for the client, and why
    /// the connection ended (the first reason given).
    bytes_read: u64,
    bytes_written: u64,
    ended: Option<String>,
}

impl Conn {
    pub fn new(peer: String, export: Arc<Export>, session: Session, limits: Limits, metrics: Arc<Metrics>) -> Conn {
        let slots_max = limits.inflight_requests_per_connection;
        let metrics_export = metrics.export_index(&export.name).expect("metrics know every export");
        metrics.connection_opened(metrics_export);
        let style = match (session.extended, session.structured) {
            (true, _) => "extended headers",
            (false, true) => "structured replies",
            (false, false) => "simple replies",
        };
        log::debug!("{peer}: transmission with {style}");
        Conn {
            peer,
            caps: export.caps(),
            direct_align: export.direct_align(),
            export,
            session,
            limits,
            life: Life::Open,
            ops: 0,
            out: VecDeque::with_capacity(2 * slots_max),
            rbuf: Some(Buf::heap(RECV_BUFFER_BYTES)),
            rstart: 0,
            rend: 0,
            receiving: Receiving::Headers,
            discard: 0,
            after_discard: None,
            recv_in_flight: false,
            slots: (0..slots_max).map(|_| None).collect(),
            chunks: (0..slots_max).map(|_| Vec::new()).collect(),
            free_slots: (0..slots_max as u16).rev().collect(),
            inflight_bytes: 0,
            reads_in_flight: 0,
            spare_extents: Vec::new(),
            batch: Some(SendBatch::new(SEND_PARTS_MAX)),
            queue: VecDeque::with_capacity(slots_max),
            splicing: None,
            streaming: None,
            deferred: VecDeque::new(),
            stream_waiters: VecDeque::new(),
            spare_vecs: Vec::new(),
            finished_parts: Vec::with_capacity(SEND_PARTS_MAX),
            sending_since: None,
            pace: pace::Pace::default(),
            qos: None,
            metrics,
            metrics_export,
            bytes_read: 0,
            bytes_written: 0,
            ended: None,
        }
    }

    pub fn peer(&self) -> &str {
        &self.peer
    }

    /// "read 4096 bytes, wrote 0 bytes: client disconnected", for the closing log line.
    pub fn audit(&self) -> String {
        let why = self.ended.as_deref().unwrap_or("closed");
        format!("read {} bytes, wrote {} bytes: {why}", self.bytes_read, self.bytes_written)
    }

    /// Sends every read's data from a buffer, never by splice: for a socket whose bytes
    /// are encrypted in user space.
    pub fn copy_only(&mut self) {
        self.caps.splice = false;
    }

    /// Starts reading requests, or resumes after waiting for the worker's byte budget.
    pub fn resume(&mut self, env: &mut Env) {
        if self.life == Life::Open {
            self.pump_input(env);
        }
        self.pump_output(env);
    }

    /// The next operation to carry out, if any.
    pub fn poll_io(&mut self) -> Option<Io> {
        let io = self.out.pop_front()?;
        if !matches!(io, Io::Shutdown(_) | Io::AwaitBudget) {
            self.ops += 1;
        }
        Some(io)
    }

    /// True once every request is answered (or the socket is gone) and every operation
    /// has returned: the connection can be dropped.
    pub fn is_done(&self) -> bool {
        self.ops == 0
            && self.out.is_empty()
            && self.life != Life::Open
            && (self.life == Life::Broken || self.free_slots.len() == self.slots.len())
    }

    /// Stops taking requests (server shutdown); those in flight complete and are answered.
    pub fn stop(&mut self, env: &mut Env, why: &str) {
        self.stop_reading(env, why);
        self.pump_output(env);
    }

    pub fn handle_recv(&mut self, env: &mut Env, result: i32, buf: Buf) {
        self.answered();
        self.received(env, result, buf);
        self.pump_output(env);
    }

    pub fn handle_send(&mut self, env: &mut Env, result: i32, batch: Box<SendBatch>) {
        self.answered();
        self.send_done(env, result, batch);
        self.pump_output(env);
    }

    /// Whether the driver should tell `socket_backlog` before handing over a send or
    /// splice completion that moved `sent` bytes: only automatic chunking uses the network
    /// rate, and only sends large enough to measure it.
    pub fn wants_socket_backlog(&self, sent: i32) -> bool {
        self.export.chunking == Chunking::Auto && self.pace.wants_backlog(sent)
    }

    /// What the socket held that its peer had not taken, when the send or splice about to
    /// be handled completed; the driver says it where the kernel can tell.
    pub fn socket_backlog(&mut self, unacked: Option<usize>) {
        self.pace.socket_backlog(unacked);
    }

    pub fn handle_splice_out(&mut self, env: &mut Env, result: i32, pipe: Pipe) {
        self.answered();
        self.splice_out_done(env, result, pipe);
        self.pump_output(env);
    }

    pub fn handle_storage(&mut self, env: &mut Env, tag: Tag, result: i32, held: Held) {
        self.handle_storage_now(env, tag, result, held);
        self.pump_output(env);
    }

    /// A storage outcome the driver had at once, while carrying out what `poll_io` gave:
    /// like `handle_storage`, but the replies it queues wait for `flush`, so that the
    /// replies of one burst of requests leave in one send.
    pub fn handle_storage_now(&mut self, env: &mut Env, tag: Tag, result: i32, held: Held) {
        self.answered();
        let s = self.slot_mut(tag.slot);
        s.ops -= 1;
        s.times.storage_end = Some(env.now);
        if s.is_read() {
            self.chunk_done(env, tag.slot, tag.chunk as usize, result, held);
        } else {
            self.storage_done(env, tag.slot, result, held);
        }
        self.storage_maybe_over(env.now, tag.slot);
    }

    /// Sends what `handle_storage_now` queued.
    pub fn flush(&mut self, env: &mut Env) {
        self.pump_output(env);
    }

    fn answered(&mut self) {
        debug_assert!(self.ops > 0, "an answer for an operation that was not handed out");
        self.ops -= 1;
    }

    fn emit(&mut self, io: Io) {
        self.out.push_back(io);
    }

    fn is_open(&self) -> bool {
        self.life == Life::Open
    }

    fn is_broken(&self) -> bool {
        self.life == Life::Broken
    }

    /// Stops taking requests; those in flight complete and are answered.
    fn stop_reading(&mut self, env: &mut Env, why: &str) {
        if self.life == Life::Open {
            log::debug!("{}: {why}", self.peer);
            self.ended = Some(why.to_owned());
            self.life = Life::Draining;
            if self.recv_in_flight {
                // A receive may be parked waiting for bytes that will never come; wake it.
                self.emit(Io::Shutdown(Shutdown::Read));
            }
        }
        if let Some(slot) = self.after_discard.take() {
            // The payload will never finish arriving, so the reply would never be read.
            self.release(env, slot);
        }
    }

    /// The socket is unusable: nothing more is sent, and every queued part is dropped.
    fn fail(&mut self, env: &mut Env, why: &str) {
        if !self.is_open() && self.life != Life::Broken {
            log::debug!("{}: {why}", self.peer);
        }
        self.stop_reading(env, why);
        if self.life != Life::Broken {
            self.life = Life::Broken;
            self.emit(Io::Shutdown(Shutdown::Both));
        }
        while let Some(part) = self.queue.pop_front().or_else(|| self.deferred.pop_front()) {
            self.sent(env, part);
        }
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        self.metrics.connection_closed(self.metrics_export);
    }
}

#[cfg(test)]
mod tests;
#[cfg(test)]
mod tests_extended;
