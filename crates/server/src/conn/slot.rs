//! Per-request state: a slot from admission to the last byte of its reply, the chunks of a
//! read, the phase timestamps the metrics break a request into, and the accounting that
//! returns a slot's bytes to the budgets exactly once.

use std::time::Instant;

use sluice_proto::{Command, Errno, Request};

use super::{Conn, Env};
use crate::backend::emulate::Exec;
use crate::engine::{Buf, Pipe};
use crate::metrics::{self, Phases};

pub(super) struct Slot {
    pub(super) request: Request,
    /// A write's payload, until the command starts.
    pub(super) buf: Option<Buf>,
    /// A command other than READ while it runs through the backend.
    pub(super) exec: Option<Exec>,
    /// Storage operations in flight and reply parts not yet sent; the slot is free again
    /// when both are zero and the final reply part has been queued.
    pub(super) ops: u16,
    pub(super) parts: u16,
    pub(super) final_queued: bool,
    /// Reads: chunks still being read, the next chunk to send in order (contiguous
    /// replies), and the first storage error (OS errno, file offset).
    pub(super) chunks_left: u16,
    pub(super) next_in_order: u16,
    pub(super) error: Option<(i32, u64)>,
    /// Payload bytes counted against the budgets (a read's or a write's length).
    pub(super) bytes: usize,
    /// Answered with an error.
    pub(super) failed: bool,
    /// Refused by validation, with the error to answer (metrics leave these out).
    pub(super) rejection: Option<(Errno, &'static str)>,
    pub(super) times: Times,
}

impl Slot {
    pub(super) fn new(request: Request, now: Instant) -> Slot {
        Slot {
            request,
            buf: None,
            exec: None,
            ops: 0,
            parts: 0,
            final_queued: false,
            chunks_left: 0,
            next_in_order: 0,
            error: None,
            bytes: 0,
            failed: false,
            rejection: None,
            times: Times::new(now),
        }
    }

    pub(super) fn is_read(&self) -> bool {
        matches!(self.request.command, Command::Read { .. }) && self.rejection.is_none()
    }
}

/// When a request passed each phase boundary (the research's INIT, READ, SEND_INIT, SEND,
/// FIN); recorded into the metrics when its slot is released.
#[derive(Clone, Copy)]
pub(super) struct Times {
    decoded: Instant,
    pub(super) received: Option<Instant>,
    pub(super) storage_start: Option<Instant>,
    pub(super) storage_end: Option<Instant>,
    pub(super) queued: Option<Instant>,
    pub(super) sending: Option<Instant>,
}

impl Times {
    fn new(now: Instant) -> Times {
        Times { decoded: now, received: None, storage_start: None, storage_end: None, queued: None, sending: None }
    }

    fn phases(&self, done: Instant) -> Phases {
        let ns = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) => b.saturating_duration_since(a).as_nanos() as u64,
            _ => 0,
        };
        let received = self.received.unwrap_or(self.decoded);
        Phases {
            receive_ns: ns(Some(self.decoded), Some(received)),
            storage_ns: ns(self.storage_start, self.storage_end),
            queue_ns: ns(self.queued, self.sending),
            send_ns: ns(self.sending, Some(done)),
            total_ns: ns(Some(self.decoded), Some(done)),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum ChunkState {
    Reading,
    Ready,
    /// Queued for sending, or dropped after an error.
    Gone,
}

/// One piece of a read: a storage read into a buffer or a pipe, then a reply chunk.
pub(super) struct Chunk {
    /// Where the storage read starts and how long it is; for an O_DIRECT bounce both are
    /// aligned, and the requested bytes start `skip` bytes in.
    pub(super) file_offset: u64,
    pub(super) read_len: usize,
    pub(super) skip: usize,
    /// Requested bytes this chunk carries to the client.
    pub(super) want: usize,
    pub(super) done: usize,
    pub(super) direct: bool,
    pub(super) buf: Option<Buf>,
    pub(super) pipe: Option<Pipe>,
    pub(super) state: ChunkState,
}

impl Chunk {
    /// Read bytes needed before the chunk can be sent (an O_DIRECT read may stop short at
    /// the end of the file, past the requested bytes).
    pub(super) fn need(&self) -> usize {
        self.skip + self.want
    }
}

fn metrics_op(command: Command) -> metrics::Op {
    match command {
        Command::Read { .. } => metrics::Op::Read,
        Command::Write { .. } => metrics::Op::Write,
        Command::Flush | Command::Disconnect => metrics::Op::Flush,
        Command::Trim { .. } => metrics::Op::Trim,
        Command::WriteZeroes { .. } => metrics::Op::WriteZeroes,
        Command::Cache { .. } => metrics::Op::Cache,
        Command::BlockStatus { .. } => metrics::Op::BlockStatus,
    }
}

impl Conn {
    pub(super) fn slot_mut(&mut self, slot: u16) -> &mut Slot {
        self.slots[slot as usize].as_mut().expect("an operation's slot stays live until it returns")
    }

    pub(super) fn slot(&self, slot: u16) -> &Slot {
        self.slots[slot as usize].as_ref().expect("an operation's slot stays live until it returns")
    }

    /// Takes a free slot for a request; the caller checked that one is free.
    pub(super) fn occupy(&mut self, slot: Slot) -> u16 {
        let index = self.free_slots.pop().expect("admission checks for a free slot");
        self.slots[index as usize] = Some(slot);
        index
    }

    /// Counts a read's or write's payload against the connection's and the worker's budgets.
    pub(super) fn hold_bytes(&mut self, env: &mut Env, slot: u16, bytes: usize) {
        self.slot_mut(slot).bytes = bytes;
        self.inflight_bytes += bytes;
        env.budget.take(bytes);
    }

    pub(super) fn release_if_idle(&mut self, env: &mut Env, slot: u16) {
        let broken = self.is_broken();
        let s = self.slot(slot);
        if s.ops == 0 && s.parts == 0 && (s.final_queued || broken) {
            self.release(env, slot);
        }
    }

    /// Frees a slot: its chunks, its bytes, its place in the reply order; records it.
    pub(super) fn release(&mut self, env: &mut Env, slot: u16) {
        // Chunks never sent (after an error or a failed connection) give back their buffers.
        self.chunks[slot as usize].clear();
        self.stream_waiters.retain(|&w| w != slot);
        if self.streaming == Some(slot) {
            self.streaming = None;
        }
        let s = self.slots[slot as usize].take().expect("a released slot was live");
        if s.is_read() {
            self.reads_in_flight -= 1;
        }
        self.inflight_bytes -= s.bytes;
        env.budget.give(s.bytes);
        self.free_slots.push(slot);
        if s.rejection.is_none() {
            let ok = !s.failed && !self.is_broken();
            let bytes = if ok { s.bytes as u64 } else { 0 };
            let op = metrics_op(s.request.command);
            self.metrics.record(self.metrics_export, op, &s.times.phases(env.now), bytes, ok);
            self.metrics.request_finished(self.metrics_export);
        }
    }
}
