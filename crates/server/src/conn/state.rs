//! The state a connection keeps per request and per read chunk, and where its receive
//! stream stands: plain data that the concerns of the core share.

use std::time::Instant;

use sluice_proto::{Command, Errno, Request};

use crate::backend::emulate::Exec;
use crate::engine::{Buf, Pipe};
use crate::metrics::Phases;

/// Where the next received bytes go.
pub(super) enum Receiving {
    Headers,
    /// Straight into a write's buffer: `filled` of its bytes have arrived.
    Payload { slot: u16, filled: usize },
}

pub(super) struct Slot {
    pub(super) request: Request,
    /// The offset the client sent, valid or not: an extended reply header echoes it.
    pub(super) offset: u64,
    /// A write's payload, until the command starts.
    pub(super) buf: Option<Buf>,
    /// A command other than READ while it runs through the backend.
    pub(super) exec: Option<Exec>,
    /// Storage operations in flight and reply parts not yet sent; the slot is free again
    /// when both are zero and the final reply part has been queued.
    pub(super) ops: u16,
    pub(super) parts: u16,
    pub(super) final_queued: bool,
    /// Reads: chunks not yet read, chunks handed to the storage so far, how many may be
    /// at the storage at once, the next chunk to send in order (contiguous replies), and
    /// the first storage error (OS errno, file offset).
    pub(super) chunks_left: u16,
    pub(super) submitted: u16,
    pub(super) window: u16,
    pub(super) next_in_order: u16,
    pub(super) error: Option<(i32, u64)>,
    /// A read that went to storage and counts in `reads_in_flight`.
    pub(super) storage_read: bool,
    /// Payload bytes counted against the budgets (a read's or a write's length).
    pub(super) bytes: usize,
    /// Answered with an error.
    pub(super) failed: bool,
    /// Logged as slow (watch.rs): its end is logged too.
    pub(super) slow: bool,
    /// Refused by validation, with the error to answer (metrics leave these out).
    pub(super) rejection: Option<(Errno, &'static str)>,
    /// Where the request stands with the QoS scheduler (hold.rs).
    pub(super) hold: Hold,
    pub(super) times: Times,
}

/// A request's place in load restriction.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Hold {
    /// Not restricted, or done with the storage.
    Off,
    /// Waiting in the scheduler since then; counted in the slot and byte budgets.
    Held(Instant),
    /// Started by the scheduler (at once, or let go after a hold): counted at the storage
    /// until it is done there.
    Started,
}

impl Slot {
    pub(super) fn new(request: Request, now: Instant) -> Slot {
        Slot {
            request,
            offset: 0,
            buf: None,
            exec: None,
            ops: 0,
            parts: 0,
            final_queued: false,
            chunks_left: 0,
            submitted: 0,
            window: 0,
            next_in_order: 0,
            error: None,
            storage_read: false,
            bytes: 0,
            failed: false,
            slow: false,
            rejection: None,
            hold: Hold::Off,
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
    pub(super) fn new(now: Instant) -> Times {
        Times { decoded: now, received: None, storage_start: None, storage_end: None, queued: None, sending: None }
    }

    pub(super) fn phases(&self, done: Instant) -> Phases {
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
    /// Not yet handed to the storage: the read's window is full.
    Waiting,
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
    /// Read into a pipe, if one is free when the chunk is handed to the storage.
    pub(super) splice: bool,
    /// When its storage read (or the rest of it, after a short read) was handed out.
    pub(super) started: Instant,
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
