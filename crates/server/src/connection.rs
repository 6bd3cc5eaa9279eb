//! One client connection in transmission: reading requests, running them through the
//! engine, and queueing replies. Requests run concurrently and are answered in completion
//! order; how many run at once, and how many payload bytes they hold, is bounded.
//!
//! Reads are split into chunks that are all submitted at once. With structured replies each
//! chunk goes out as its own OFFSET_DATA chunk as soon as it is read, in whatever order the
//! storage finishes; with simple replies chunks go out in order, each as soon as it and all
//! before it are read. Chunk data reaches the socket from a buffer (copy, direct) or from a
//! pipe (splice), per the export's data path.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;
use std::time::Instant;

use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::reply::{self, Extent};
use sluice_proto::wire::{REQUEST_BYTES, SIMPLE_REPLY_BYTES};
use sluice_proto::{validate, Command, Errno, Range, RawRequest, Request, Session};

use crate::engine::{fully_cached, splice_now, Buf, Part, Pipe, Pipes, Pool, Ring, SendBatch, BUFFER_ALIGN_BYTES};
use crate::errors::errno_from_os;
use crate::export::Export;
use crate::limits::Limits;
use crate::metrics::{self, Metrics, Phases};

/// Receive buffer for request headers; payloads that do not fit go straight to their buffer.
pub const RECV_BUFFER_BYTES: usize = 64 * 1024;
/// Replies gathered into one sendmsg.
pub const SEND_PARTS_MAX: usize = 32;
/// Largest write issued when emulating WRITE_ZEROES by writing zeros.
pub const ZERO_FILL_CHUNK_BYTES: usize = 1024 * 1024;

/// Most pieces one read is split into; a huge read uses chunks larger than configured.
pub const CHUNKS_PER_READ_MAX: usize = 256;
/// Buffered writes up to this size are written by the worker thread itself (see submit_io).
pub const INLINE_WRITE_MAX_BYTES: usize = 64 * 1024;
/// Spliced reads smaller than this are copied: two trips through io_uring's worker threads
/// cost more than copying a few pages.
pub const SPLICE_MIN_BYTES: usize = 64 * 1024;

const _: () = assert!(RECV_BUFFER_BYTES >= REQUEST_BYTES * 2);
const _: () = assert!(ZERO_FILL_CHUNK_BYTES <= REQUEST_PAYLOAD_MAX_BYTES as usize);
// Operation numbers must fit the low 32 bits of the user data for any slot and chunk.
const _: () = assert!(OP_SLOT_BASE as u64 + (u16::MAX as u64 + 1) * CHUNKS_PER_READ_MAX as u64 <= u32::MAX as u64);

/// Low 32 bits of a completion's user data: which operation of the connection it was.
pub const OP_RECV: u32 = 0;
pub const OP_SEND: u32 = 1;
/// Spliced reply data moving from its pipe to the socket.
pub const OP_SPLICE_OUT: u32 = 2;
/// Slot operations: OP_SLOT_BASE + slot * CHUNKS_PER_READ_MAX + chunk.
const OP_SLOT_BASE: u32 = 3;

/// What a slot's operation in flight is doing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The main operation (read, write, fsync, fallocate, fadvise).
    Main,
    /// WRITE_ZEROES emulated by writing zeros; `done` bytes are written.
    ZeroFill,
    /// The fdatasync that follows a FUA trim or zero.
    Sync,
}

struct Slot {
    request: Request,
    buf: Option<Buf>,
    /// Bytes of the main operation done so far (short reads and writes continue).
    done: usize,
    stage: Stage,
    /// Storage operations in flight and reply parts not yet sent; the slot is free again
    /// when both are zero and the final reply part has been queued.
    ops: u16,
    parts: u16,
    final_queued: bool,
    /// Reads: chunks still being read, the next chunk to send in order (simple replies),
    /// and the first storage error (OS errno, file offset).
    chunks_left: u16,
    next_in_order: u16,
    error: Option<(i32, u64)>,
    /// Answered with an error, and refused before it ran (which metrics leave out).
    failed: bool,
    rejected: bool,
    times: Times,
}

/// When a request passed each phase boundary (the research's INIT, READ, SEND_INIT, SEND,
/// FIN); recorded into the metrics when its slot is released.
#[derive(Clone, Copy)]
struct Times {
    decoded: Instant,
    received: Option<Instant>,
    storage_start: Option<Instant>,
    storage_end: Option<Instant>,
    queued: Option<Instant>,
    sending: Option<Instant>,
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

impl Slot {
    fn new(request: Request) -> Slot {
        Slot {
            request,
            buf: None,
            done: 0,
            stage: Stage::Main,
            ops: 0,
            parts: 0,
            final_queued: false,
            chunks_left: 0,
            next_in_order: 0,
            error: None,
            failed: false,
            rejected: false,
            times: Times::new(Instant::now()),
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum ChunkState {
    Reading,
    Ready,
    /// Queued for sending, or dropped after an error.
    Gone,
}

/// One piece of a read: a storage read into a buffer or a pipe, then a reply chunk.
struct Chunk {
    /// Where the storage read starts and how long it is; for an O_DIRECT bounce both are
    /// aligned, and the requested bytes start `skip` bytes in.
    file_offset: u64,
    read_len: usize,
    skip: usize,
    /// Requested bytes this chunk carries to the client.
    want: usize,
    done: usize,
    direct: bool,
    buf: Option<Buf>,
    pipe: Option<Pipe>,
    state: ChunkState,
}

impl Chunk {
    /// Read bytes needed before the chunk can be sent (an O_DIRECT read may stop short at
    /// the end of the file, past the requested bytes).
    fn need(&self) -> usize {
        self.skip + self.want
    }
}

/// Where the next received bytes go.
enum Receiving {
    Headers,
    /// Straight into a write's buffer: `filled` of its bytes have arrived.
    Payload { slot: u16, filled: usize },
}

pub struct Connection {
    fd: OwnedFd,
    pub peer: String,
    export: Arc<Export>,
    session: Session,
    limits: Limits,

    rbuf: Option<Buf>,
    rstart: usize,
    rend: usize,
    receiving: Receiving,
    /// Payload bytes of a rejected write still to be read and dropped.
    discard: u64,
    /// The rejected write's error reply, sent once its payload is gone.
    after_discard: Option<(u16, Errno, &'static str)>,
    recv_in_flight: bool,

    slots: Vec<Option<Slot>>,
    /// Reads being worked on; the splice path is taken only by a read that is alone.
    reads_in_flight: usize,
    /// Chunks of each slot's read, kept apart from the slot so their Vec is reused.
    chunks: Vec<Vec<Chunk>>,
    free_slots: Vec<u16>,
    inflight_bytes: usize,
    budget: Rc<Budget>,

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
    metrics: Arc<Metrics>,
    metrics_export: usize,
    /// Scratch space reused across requests so the hot path does not allocate.
    finished_parts: Vec<Part>,
    extents: Vec<Extent>,

    /// Still accepting requests (false after DISC, end of stream, a protocol error, shutdown).
    reading: bool,
    /// The socket failed: nothing more can be sent.
    broken: bool,
    /// A reply was cut short: what is queued goes out, nothing more, then the connection
    /// closes (the protocol's way to report an error after part of a read's data).
    closing: bool,
    shut_down: bool,
    /// Operations submitted and not yet completed.
    ops: usize,
}

/// Payload bytes held by all of a worker's connections, against a cap, and the connections
/// waiting for some to come back. A connection's own budget keeps one client from taking
/// it all; this one bounds the worker's memory whatever the number of clients.
pub struct Budget {
    pub used: Cell<usize>,
    pub max: usize,
    waiters: RefCell<VecDeque<u32>>,
}

impl Budget {
    pub fn new(max: usize) -> Budget {
        Budget { used: Cell::new(0), max, waiters: RefCell::new(VecDeque::new()) }
    }

    fn wait(&self, conn: u32) {
        let mut w = self.waiters.borrow_mut();
        if !w.contains(&conn) {
            w.push_back(conn);
        }
    }

    /// The next connection to resume, oldest first, while there is room.
    pub fn next_waiter(&self) -> Option<u32> {
        if self.used.get() >= self.max {
            return None;
        }
        self.waiters.borrow_mut().pop_front()
    }
}

/// Says once per process that pipes ran out, the one case where splice falls back to copy.
/// The header in front of a contiguous read's first chunk.
enum Head {
    Simple([u8; SIMPLE_REPLY_BYTES]),
    Data([u8; reply::OFFSET_DATA_HEADER_BYTES]),
    None,
}

impl Head {
    fn bytes(&self) -> &[u8] {
        match self {
            Head::Simple(h) => h,
            Head::Data(h) => h,
            Head::None => &[],
        }
    }
}

fn log_once_pipes_exhausted() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        log::info!("all splice pipes are in use; further reads are copied until some are free (said once)")
    });
}

/// What a connection needs from its worker to make progress.
pub struct Ctx<'a> {
    pub ring: &'a mut Ring,
    pub pool: &'a mut Pool,
    pub pipes: &'a mut Pipes,
    pub index: u32,
}

impl Ctx<'_> {
    fn user(&self, op: u32) -> u64 {
        ((self.index as u64) << 32) | op as u64
    }
}

impl Connection {
    pub fn new(
        fd: OwnedFd,
        peer: String,
        export: Arc<Export>,
        session: Session,
        limits: Limits,
        budget: Rc<Budget>,
        metrics: Arc<Metrics>,
    ) -> Connection {
        let slots_max = limits.inflight_requests_per_connection;
        let metrics_export = metrics.export_index(&export.name).expect("metrics know every export");
        metrics.connection_opened(metrics_export);
        Connection {
            fd,
            peer,
            export,
            session,
            rbuf: Some(Buf::heap(RECV_BUFFER_BYTES)),
            rstart: 0,
            rend: 0,
            receiving: Receiving::Headers,
            discard: 0,
            after_discard: None,
            recv_in_flight: false,
            slots: (0..slots_max).map(|_| None).collect(),
            reads_in_flight: 0,
            chunks: (0..slots_max).map(|_| Vec::new()).collect(),
            free_slots: (0..slots_max as u16).rev().collect(),
            inflight_bytes: 0,
            budget,
            batch: Some(SendBatch::new(SEND_PARTS_MAX)),
            queue: VecDeque::with_capacity(slots_max),
            splicing: None,
            streaming: None,
            deferred: VecDeque::new(),
            stream_waiters: VecDeque::new(),
            spare_vecs: Vec::new(),
            metrics,
            metrics_export,
            finished_parts: Vec::with_capacity(SEND_PARTS_MAX),
            extents: Vec::new(),
            reading: true,
            broken: false,
            closing: false,
            shut_down: false,
            ops: 0,
            limits,
        }
    }

    fn raw_fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    /// Starts reading requests; also resumes a connection that waited for the budget.
    pub fn start(&mut self, ctx: &mut Ctx) {
        if self.reading {
            self.pump_input(ctx);
        }
    }

    /// True once everything is finished and the connection can be dropped.
    pub fn finished(&self) -> bool {
        self.ops == 0 && !self.reading && (self.broken || self.free_slots.len() == self.slots.len())
    }

    /// Stops taking requests; those in flight complete and are answered.
    pub fn stop_reading(&mut self, why: &str) {
        if self.reading {
            log::debug!("{}: {why}", self.peer);
            self.reading = false;
        }
        if let Some((slot, ..)) = self.after_discard.take() {
            // The payload will never finish arriving, so the reply would never be read.
            self.release(slot);
        }
        // A receive may be parked waiting for bytes that will never come; wake it.
        if self.recv_in_flight && !self.shut_down {
            self.shut_down = true;
            let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Read);
        }
    }

    fn fail(&mut self, why: &str) {
        self.broken = true;
        self.stop_reading(why);
        let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both);
        self.shut_down = true;
        while let Some(part) = self.queue.pop_front().or_else(|| self.deferred.pop_front()) {
            self.sent(part);
        }
    }

    /// Handles a completion addressed to this connection.
    pub fn complete(&mut self, ctx: &mut Ctx, op: u32, result: i32, buf: Option<Buf>, batch: Option<Box<SendBatch>>) {
        self.ops -= 1;
        match op {
            OP_RECV => self.received(ctx, result, buf.expect("recv returns its buffer")),
            OP_SEND => self.send_done(ctx, result, batch.expect("send returns its batch")),
            OP_SPLICE_OUT => self.splice_out_done(ctx, result),
            _ => {
                let slot = ((op - OP_SLOT_BASE) as usize / CHUNKS_PER_READ_MAX) as u16;
                let chunk = (op - OP_SLOT_BASE) as usize % CHUNKS_PER_READ_MAX;
                let s = self.slots[slot as usize].as_mut().expect("completion for a live slot");
                s.ops -= 1;
                s.times.storage_end = Some(Instant::now());
                if matches!(self.slots[slot as usize].as_ref().map(|s| s.request.command), Some(Command::Read { .. })) {
                    self.chunk_done(ctx, slot, chunk, result, buf)
                } else {
                    self.slot_done(ctx, slot, result, buf)
                }
            }
        }
    }

    // ---- receiving -------------------------------------------------------------------

    fn received(&mut self, ctx: &mut Ctx, result: i32, buf: Buf) {
        self.recv_in_flight = false;
        let n = match result {
            n if n > 0 => n as usize,
            0 => {
                self.put_back_recv_buf(buf);
                self.stop_reading("client closed the connection");
                return;
            }
            e => {
                self.put_back_recv_buf(buf);
                self.stop_reading(&format!("receive failed: {}", std::io::Error::from_raw_os_error(-e)));
                return;
            }
        };
        match self.receiving {
            Receiving::Headers => {
                self.rbuf = Some(buf);
                self.rend += n;
            }
            Receiving::Payload { slot, filled } => {
                let filled = filled + n;
                if filled < buf.len() {
                    self.receiving = Receiving::Payload { slot, filled };
                    self.recv_in_flight = true;
                    self.ops += 1;
                    ctx.ring.recv(self.raw_fd(), buf, filled, ctx.user(OP_RECV));
                    return;
                } else {
                    self.slots[slot as usize].as_mut().expect("payload slot is live").buf = Some(buf);
                    self.receiving = Receiving::Headers;
                    self.dispatch(ctx, slot);
                }
            }
        }
        if self.reading {
            self.pump_input(ctx);
        }
    }

    fn put_back_recv_buf(&mut self, buf: Buf) {
        match self.receiving {
            Receiving::Headers => self.rbuf = Some(buf),
            Receiving::Payload { slot, .. } => {
                // The write never got its payload: answer nothing, just release it.
                self.slots[slot as usize].as_mut().expect("payload slot is live").buf = Some(buf);
                self.release(slot);
                self.receiving = Receiving::Headers;
            }
        }
    }

    /// Parses whatever is buffered and posts the next receive when there is room.
    fn pump_input(&mut self, ctx: &mut Ctx) {
        if !matches!(self.receiving, Receiving::Headers) || self.recv_in_flight {
            return;
        }
        while self.reading {
            let avail = self.rend - self.rstart;
            if self.discard > 0 {
                let take = (self.discard as usize).min(avail);
                self.rstart += take;
                self.discard -= take as u64;
                if self.discard > 0 {
                    break;
                }
                if let Some((slot, errno, reason)) = self.after_discard.take() {
                    self.reply_error(slot, errno, reason, None);
                }
                continue;
            }
            if self.free_slots.is_empty() || self.inflight_bytes >= self.limits.inflight_bytes_per_connection {
                // Over budget: leave the rest in the socket until replies drain.
                return;
            }
            if self.budget.used.get() >= self.budget.max {
                // The worker's buffers are all spoken for; resume when some come back.
                self.budget.wait(ctx.index);
                return;
            }
            if avail < REQUEST_BYTES {
                break;
            }
            let header: &[u8; REQUEST_BYTES] = self.rbuf.as_ref().expect("receive buffer is home").as_slice()
                [self.rstart..self.rstart + REQUEST_BYTES]
                .try_into()
                .expect("slice has header length");
            self.rstart += REQUEST_BYTES;
            let raw = match RawRequest::decode(header) {
                Ok(raw) => raw,
                Err(e) => {
                    log::warn!("{}: {e}; disconnecting", self.peer);
                    self.stop_reading("protocol error");
                    return;
                }
            };
            if !self.request(ctx, raw) {
                // The request's payload goes straight into its buffer.
                return;
            }
        }
        if !self.reading {
            return;
        }
        let mut rbuf = self.rbuf.take().expect("receive buffer is home");
        if self.rstart > 0 {
            rbuf.as_mut_slice().copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
        self.recv_in_flight = true;
        self.ops += 1;
        ctx.ring.recv(self.raw_fd(), rbuf, self.rend, ctx.user(OP_RECV));
    }

    /// Takes one decoded header. Returns false when its payload must be received first.
    fn request(&mut self, ctx: &mut Ctx, raw: RawRequest) -> bool {
        let slot = self.free_slots.pop().expect("caller checked for a free slot");
        let request = match validate(&raw, &self.session) {
            Ok(r) => r,
            Err(rej) => {
                log::debug!("{}: {:?} rejected: {} ({})", self.peer, raw, rej.errno, rej.reason);
                let request = Request { handle: raw.handle, command: Command::Flush };
                let mut s = Slot::new(request);
                s.rejected = true;
                self.slots[slot as usize] = Some(s);
                if rej.discard > 0 {
                    // Clients match replies only to requests they finished sending: answer
                    // once the payload has been read and dropped.
                    self.discard = rej.discard as u64;
                    self.after_discard = Some((slot, rej.errno, rej.reason));
                } else {
                    self.reply_error(slot, rej.errno, rej.reason, None);
                }
                return true;
            }
        };
        let mut s = Slot::new(request);
        match request.command {
            Command::Disconnect => {
                self.free_slots.push(slot);
                self.stop_reading("client disconnected");
                return true;
            }
            Command::Read { range, .. } | Command::Write { range, .. } => {
                let len = range.length as usize;
                if let Command::Write { .. } = request.command {
                    s.buf = Some(ctx.pool.get(len));
                }
                // A read's buffers (or pipes) are taken per chunk, but count from now.
                self.inflight_bytes += len;
                self.budget.used.set(self.budget.used.get() + len);
            }
            _ => {}
        }
        self.metrics.request_started(self.metrics_export);
        self.slots[slot as usize] = Some(s);
        if let Command::Write { range, .. } = request.command {
            let len = range.length as usize;
            let avail = (self.rend - self.rstart).min(len);
            let rbuf = self.rbuf.as_ref().expect("receive buffer is home").as_slice();
            let chunk = &rbuf[self.rstart..self.rstart + avail];
            let s = self.slots[slot as usize].as_mut().expect("just stored");
            s.buf.as_mut().expect("write has a buffer").as_mut_slice()[..avail].copy_from_slice(chunk);
            self.rstart += avail;
            if avail < len {
                let buf = s.buf.take().expect("write has a buffer");
                self.receiving = Receiving::Payload { slot, filled: avail };
                self.recv_in_flight = true;
                self.ops += 1;
                ctx.ring.recv(self.raw_fd(), buf, avail, ctx.user(OP_RECV));
                return false;
            }
        }
        self.dispatch(ctx, slot);
        true
    }

    // ---- executing -------------------------------------------------------------------

    fn slot_user(ctx: &Ctx, slot: u16, chunk: usize) -> u64 {
        ctx.user(OP_SLOT_BASE + (slot as usize * CHUNKS_PER_READ_MAX + chunk) as u32)
    }

    fn submit_io(&mut self, ctx: &mut Ctx, slot: u16) {
        let fd = self.export.backend.fd().expect("only descriptor backends do I/O");
        let user = Self::slot_user(ctx, slot, 0);
        let caps = self.export.backend.caps();
        let direct = self.direct_fd();
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        s.times.storage_start.get_or_insert_with(Instant::now);
        if let (Stage::Main, Command::Write { range, fua: false }) = (s.stage, s.request.command) {
            let len = range.length as usize - s.done;
            let offset = range.offset + s.done as u64;
            // Whole pages, or pages already cached, need no read from the disk first.
            let no_read = (offset as usize | len).is_multiple_of(BUFFER_ALIGN_BYTES)
                || fully_cached(fd, offset, len) == Some(true);
            if direct.is_none() && len <= INLINE_WRITE_MAX_BYTES && no_read {
                // A small buffered write is a copy into the page cache: doing it here costs
                // less than handing it to io_uring's worker thread and back, which is where
                // io_uring runs buffered writes on most filesystems.
                let buf = s.buf.as_ref().expect("write has a buffer");
                let data = &buf.as_slice()[s.done..s.done + len];
                let file = self.export.backend.file().expect("only descriptor backends do I/O");
                let result = match rustix::io::pwrite(file, data, offset) {
                    Ok(n) => n as i32,
                    Err(e) => -e.raw_os_error(),
                };
                s.times.storage_end = Some(Instant::now());
                return self.slot_done(ctx, slot, result, None);
            }
        }
        self.ops += 1;
        s.ops += 1;
        match (s.stage, s.request.command) {
            (Stage::Sync, _) | (Stage::Main, Command::Flush) => ctx.ring.fdatasync(fd, user),
            (Stage::Main, Command::Write { range, fua }) => {
                let buf = s.buf.take().expect("write has a buffer");
                let len = range.length as usize - s.done;
                let offset = range.offset + s.done as u64;
                // Unaligned writes go through the page cache, which the kernel keeps coherent
                // with O_DIRECT; a read-modify-write here would race with other writers.
                let fd = match direct {
                    Some((dfd, align)) if (offset as usize | len | s.done).is_multiple_of(align) => dfd,
                    _ => fd,
                };
                ctx.ring.write_at(fd, buf, s.done, len, offset, fua, user);
            }
            (Stage::Main, Command::Trim { range, .. }) => {
                let mode = libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE;
                ctx.ring.fallocate(fd, mode, range.offset, range.length as u64, user);
            }
            (Stage::Main, Command::WriteZeroes { range, may_trim, .. }) => {
                let mode = if may_trim && caps.trim {
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE
                } else {
                    libc::FALLOC_FL_ZERO_RANGE | libc::FALLOC_FL_KEEP_SIZE
                };
                ctx.ring.fallocate(fd, mode, range.offset, range.length as u64, user);
            }
            (Stage::ZeroFill, Command::WriteZeroes { range, fua, .. }) => {
                let len = (range.length as usize - s.done).min(ZERO_FILL_CHUNK_BYTES);
                let mut buf = s.buf.take().unwrap_or_else(|| ctx.pool.get(ZERO_FILL_CHUNK_BYTES));
                buf.set_len(len);
                buf.as_mut_slice().fill(0);
                ctx.ring.write_at(fd, buf, 0, len, range.offset + s.done as u64, fua, user);
            }
            (Stage::Main, Command::Cache { range }) => {
                ctx.ring.fadvise_willneed(fd, range.offset, range.length as u64, user)
            }
            (stage, command) => unreachable!("no I/O for {command:?} in {stage:?}"),
        }
    }

    /// Starts a validated request.
    fn dispatch(&mut self, ctx: &mut Ctx, slot: u16) {
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        let command = s.request.command;
        if let Command::Write { .. } = command {
            s.times.received = Some(Instant::now());
        }
        if let Command::BlockStatus { range, context_id, one } = command {
            let mut extents = std::mem::take(&mut self.extents);
            extents.clear();
            let found = self.export.backend.extents(range.offset, range.length, one, &mut extents);
            match found {
                Ok(()) => self.reply_block_status(slot, context_id, &extents),
                Err(e) => {
                    let errno = errno_from_os(e.raw_os_error().unwrap_or(libc::EIO));
                    self.reply_error(slot, errno, "block status failed", None);
                }
            }
            self.extents = extents;
            return;
        }
        match command {
            Command::Read { range, .. }
            | Command::Write { range, .. }
            | Command::Trim { range, .. }
            | Command::WriteZeroes { range, .. }
            | Command::Cache { range }
                if range.length == 0 =>
            {
                // Nothing to do; the kernel would call a zero-length fallocate invalid.
                return self.reply_ok(slot);
            }
            _ => {}
        }
        if self.export.backend.fd().is_none() {
            // Null backend: nothing to wait for.
            if let Command::Read { range, .. } = command {
                let mut buf = ctx.pool.get(range.length as usize);
                buf.as_mut_slice().fill(0);
                s.buf = Some(buf);
            }
            return self.reply_ok(slot);
        }
        if let Command::Read { range, .. } = command {
            return self.start_read(ctx, slot, range.offset, range.length as usize);
        }
        if let Command::WriteZeroes { fast, may_trim, .. } = command {
            let caps = self.export.backend.caps();
            if !(caps.zero || (may_trim && caps.trim)) {
                if fast {
                    return self.reply_error(slot, Errno::NotSup, "zeroing here means writing zeros", None);
                }
                s.stage = Stage::ZeroFill;
            }
        }
        self.submit_io(ctx, slot);
    }

    /// The O_DIRECT descriptor and its alignment, when the export's path uses one.
    fn direct_fd(&self) -> Option<(RawFd, usize)> {
        let b = &self.export.backend;
        b.direct_fd().filter(|_| self.export.data_path.uses_direct()).map(|fd| (fd, b.direct_align()))
    }

    /// Splits a read into chunks and submits them all.
    fn start_read(&mut self, ctx: &mut Ctx, slot: u16, offset: u64, len: usize) {
        let end = offset + len as u64;
        let path = self.export.data_path;
        let direct = self.direct_fd();
        let aligned = direct.is_some_and(|(_, a)| (offset as usize | len).is_multiple_of(a));
        // Splice only whole requested ranges (an O_DIRECT splice must be aligned) and only
        // when big enough to pay for its two worker-thread hops.
        // A pipe holds one chunk, so small pipes (when the system refused 1 MiB) may not
        // cover a long read in CHUNKS_PER_READ_MAX chunks; such reads are copied.
        // Cutting chunks at pipe-sized page runs (below) adds at most one chunk.
        let pipe_bytes = ctx.pipes.bytes();
        let splice = path.uses_splice()
            && len >= SPLICE_MIN_BYTES
            && pipe_bytes > 0
            && len.div_ceil(pipe_bytes) < CHUNKS_PER_READ_MAX
            // Spliced replies leave one after another, each through an io-wq round trip;
            // with other reads in flight, copying keeps the socket busier for less CPU.
            && self.reads_in_flight == 0;
        self.reads_in_flight += 1;
        let splice_direct = splice && aligned;
        // O_DIRECT into buffers reads whole aligned blocks and sends the requested part.
        let bounce = !splice && direct.is_some();
        let (lo, hi) = match direct {
            Some((_, a)) if bounce => (offset / a as u64 * a as u64, end.next_multiple_of(a as u64)),
            _ => (offset, end),
        };
        let span = (hi - lo) as usize;
        let mut chunk = match self.export.chunk_bytes as usize {
            0 => span,
            c => c.max(span.div_ceil(CHUNKS_PER_READ_MAX)).next_multiple_of(BUFFER_ALIGN_BYTES),
        };
        if splice {
            chunk = chunk.min(ctx.pipes.bytes());
        }
        let mut chunks = std::mem::take(&mut self.chunks[slot as usize]);
        chunks.clear();
        let mut at = lo;
        while at < hi {
            let mut c1 = (at + chunk as u64).min(hi);
            if splice {
                // A pipe holds pipe_bytes / PAGE page references, and a splice from the file
                // takes one per page it touches: an unaligned chunk of pipe_bytes touches one
                // page too many, fills the pipe short of its length and would never finish.
                let page = BUFFER_ALIGN_BYTES as u64;
                c1 = c1.min(at / page * page + pipe_bytes as u64);
            }
            let first = offset.max(at);
            chunks.push(Chunk {
                file_offset: at,
                read_len: (c1 - at) as usize,
                skip: (first - at) as usize,
                want: (c1.min(end) - first) as usize,
                done: 0,
                direct: bounce || splice_direct,
                buf: None,
                pipe: None,
                state: ChunkState::Reading,
            });
            at = c1;
        }
        assert!(chunks.len() <= CHUNKS_PER_READ_MAX, "chunk numbers are part of the operation id");
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        s.chunks_left = chunks.len() as u16;
        for c in chunks.iter_mut() {
            if splice {
                c.pipe = ctx.pipes.get();
                if c.pipe.is_none() {
                    log_once_pipes_exhausted();
                }
            }
            if c.pipe.is_none() {
                c.buf = Some(ctx.pool.get(c.read_len));
            }
        }
        self.chunks[slot as usize] = chunks;
        for i in 0..self.chunks[slot as usize].len() {
            self.submit_chunk(ctx, slot, i);
        }
    }

    /// Submits (the rest of) one chunk's storage read.
    fn submit_chunk(&mut self, ctx: &mut Ctx, slot: u16, i: usize) {
        let user = Self::slot_user(ctx, slot, i);
        let buffered = self.export.backend.fd().expect("only descriptor backends do I/O");
        let fd = match self.direct_fd() {
            Some((dfd, _)) if self.chunks[slot as usize][i].direct => dfd,
            _ => buffered,
        };
        let c = &mut self.chunks[slot as usize][i];
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        s.times.storage_start.get_or_insert_with(Instant::now);
        let offset = c.file_offset + c.done as u64;
        let len = c.read_len - c.done;
        if let Some(pipe) = c.pipe.as_ref().filter(|_| !c.direct) {
            // Cached data moves into the pipe at once, saving two trips through io_uring's
            // worker threads (io_uring always runs splice there).
            if fully_cached(fd, offset, len) == Some(true) {
                if let Ok(n @ 1..) = splice_now(fd, offset, pipe, len) {
                    s.times.storage_end = Some(Instant::now());
                    return self.chunk_done(ctx, slot, i, n as i32, None);
                }
            }
        }
        self.ops += 1;
        s.ops += 1;
        match &c.pipe {
            Some(pipe) => ctx.ring.splice(fd, Some(offset), pipe.write_fd(), len, user),
            None => {
                let buf = c.buf.take().expect("an unspliced chunk has a buffer");
                ctx.ring.read_at(fd, buf, c.done, len, offset, user);
            }
        }
    }

    fn chunk_done(&mut self, ctx: &mut Ctx, slot: u16, i: usize, result: i32, buf: Option<Buf>) {
        let c = &mut self.chunks[slot as usize][i];
        if buf.is_some() {
            c.buf = buf;
        }
        let mut failure = match result {
            r if r < 0 => Some(-r),
            0 if c.done < c.need() => {
                // The file shrank under us, or the device returned nothing.
                Some(libc::EIO)
            }
            n => {
                c.done += n as usize;
                None
            }
        };
        let error_offset = c.file_offset + c.done as u64;
        let mut short = failure.is_none() && c.done < c.need();
        let align = self.export.backend.direct_align();
        if short && c.direct && !c.done.is_multiple_of(align) {
            // O_DIRECT stopped mid-block: that is the end of the file, and the rest of the
            // chunk cannot be asked for at an unaligned offset anyway.
            failure = Some(libc::EIO);
            short = false;
        }
        if short && !self.broken && self.slots[slot as usize].as_ref().is_some_and(|s| s.error.is_none()) {
            return self.submit_chunk(ctx, slot, i);
        }
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        s.chunks_left -= 1;
        let c = &mut self.chunks[slot as usize][i];
        if let Some(code) = failure {
            c.state = ChunkState::Gone;
            drop((c.buf.take(), c.pipe.take()));
            if s.error.is_none() {
                let offset = match s.request.command {
                    Command::Read { range, .. } => error_offset.max(range.offset),
                    _ => unreachable!("chunks belong to reads"),
                };
                log::debug!("{}: read at {offset} failed: {}", self.peer, std::io::Error::from_raw_os_error(code));
                s.error = Some((code, offset));
            }
        } else if c.state == ChunkState::Reading {
            c.state = ChunkState::Ready;
        }
        if self.broken {
            return self.release_if_idle(slot);
        }
        self.flush_read(slot);
    }

    /// Queues whatever chunks of a read may go out now, and the final reply part once the
    /// last chunk is in.
    fn flush_read(&mut self, slot: u16) {
        let s = self.slots[slot as usize].as_ref().expect("slot is live");
        let last = s.chunks_left == 0;
        let error = s.error;
        let handle = s.request.handle;
        let Command::Read { range: Range { offset, length }, whole } = s.request.command else {
            unreachable!("chunks belong to reads")
        };
        // Simple replies, and DF reads, carry the data as one run after one header.
        let contiguous = !self.session.structured || whole;
        let hold = self.export.chunk_bytes == 0 && !last;
        let n = self.chunks[slot as usize].len();
        if let Some((code, offset)) = error {
            // Nothing more goes out for this read but the error, once every chunk is back.
            for c in self.chunks[slot as usize].iter_mut().filter(|c| c.state == ChunkState::Ready) {
                c.state = ChunkState::Gone;
                drop((c.buf.take(), c.pipe.take()));
            }
            let sent_some = self.slots[slot as usize].as_ref().expect("live").next_in_order > 0;
            if contiguous && sent_some {
                // Part of the data is queued after a header promising all of it; the only
                // way to tell the client is to close the connection once that part is out.
                self.slots[slot as usize].as_mut().expect("live").final_queued = true;
                self.close_after_queue("a read failed after part of its data was queued");
                return self.release_if_idle(slot);
            }
            if last {
                let msg = std::io::Error::from_raw_os_error(code).to_string();
                self.reply_error(slot, errno_from_os(code), &msg, Some(offset));
            }
            return;
        }
        if hold {
            return;
        }
        if !contiguous {
            let ready = self.chunks[slot as usize].iter().filter(|c| c.state == ChunkState::Ready).count();
            let mut queued = 0;
            for i in 0..n {
                if self.chunks[slot as usize][i].state != ChunkState::Ready {
                    continue;
                }
                queued += 1;
                let done = last && queued == ready;
                let c = &mut self.chunks[slot as usize][i];
                let head = reply::offset_data_header(handle, c.file_offset + c.skip as u64, c.want as u32, done);
                let part = Self::chunk_part(slot, c, &head);
                self.queue_part(slot, part, done);
            }
            return;
        }
        let s = self.slots[slot as usize].as_ref().expect("slot is live");
        if s.next_in_order == 0 && !last && self.streaming.is_some_and(|x| x != slot) {
            // Another contiguous reply is on the wire; start once it is complete.
            if !self.stream_waiters.contains(&slot) {
                self.stream_waiters.push_back(slot);
            }
            return;
        }
        loop {
            let s = self.slots[slot as usize].as_mut().expect("slot is live");
            let i = s.next_in_order as usize;
            if i == n || self.chunks[slot as usize][i].state != ChunkState::Ready {
                break;
            }
            s.next_in_order += 1;
            let head = match (i, self.session.structured) {
                (0, false) => Head::Simple(reply::simple(handle, None)),
                (0, true) => Head::Data(reply::offset_data_header(handle, offset, length, true)),
                _ => Head::None,
            };
            let part = Self::chunk_part(slot, &mut self.chunks[slot as usize][i], head.bytes());
            if i == 0 && !last {
                self.streaming = Some(slot);
            }
            self.queue_part(slot, part, i + 1 == n);
        }
    }

    fn chunk_part(slot: u16, c: &mut Chunk, head: &[u8]) -> Part {
        c.state = ChunkState::Gone;
        match c.pipe.take() {
            Some(pipe) => Part::spliced(slot as u32, head, pipe, c.want),
            None => Part::window(slot as u32, head, c.buf.take(), c.skip, c.want, Vec::new()),
        }
    }

    fn slot_done(&mut self, ctx: &mut Ctx, slot: u16, result: i32, buf: Option<Buf>) {
        let s = self.slots[slot as usize].as_mut().expect("completion for a live slot");
        if buf.is_some() {
            s.buf = buf;
        }
        if self.broken {
            return self.release_if_idle(slot);
        }
        let command = s.request.command;
        if result < 0 {
            let code = -result;
            let unsupported = code == libc::EOPNOTSUPP || code == libc::EINVAL && s.stage == Stage::Main;
            match command {
                Command::Trim { fua, .. } if unsupported && s.stage == Stage::Main => {
                    // Trimming is advisory; a backend that cannot punch simply keeps the data.
                    return self.after_modify(ctx, slot, fua);
                }
                Command::WriteZeroes { fast, .. } if unsupported && s.stage == Stage::Main => {
                    if fast {
                        return self.reply_error(slot, Errno::NotSup, "no fast zeroing here", None);
                    }
                    s.stage = Stage::ZeroFill;
                    return self.submit_io(ctx, slot);
                }
                _ => {}
            }
            let errno = errno_from_os(code);
            let offset = match command {
                Command::Write { range, .. } => Some(range.offset + s.done as u64),
                _ => None,
            };
            let msg = std::io::Error::from_raw_os_error(code).to_string();
            log::debug!("{}: {:?} failed: {msg}", self.peer, command);
            return self.reply_error(slot, errno, &msg, offset);
        }
        let n = result as usize;
        match (s.stage, command) {
            (Stage::Main, Command::Write { range, .. }) => {
                if n == 0 {
                    // The file shrank under us, or the device returned nothing.
                    let offset = range.offset + s.done as u64;
                    return self.reply_error(slot, Errno::Io, "unexpected end of file", Some(offset));
                }
                s.done += n;
                if s.done < range.length as usize {
                    return self.submit_io(ctx, slot);
                }
                self.reply_ok(slot)
            }
            (Stage::ZeroFill, Command::WriteZeroes { range, .. }) => {
                if n == 0 {
                    return self.reply_error(slot, Errno::Io, "zero-fill wrote nothing", None);
                }
                s.done += n;
                if s.done < range.length as usize {
                    return self.submit_io(ctx, slot);
                }
                // Each zero-fill write was already durable when FUA asked for it.
                self.reply_ok(slot)
            }
            (Stage::Main, Command::Trim { fua, .. }) | (Stage::Main, Command::WriteZeroes { fua, .. }) => {
                self.after_modify(ctx, slot, fua)
            }
            _ => self.reply_ok(slot),
        }
    }

    fn after_modify(&mut self, ctx: &mut Ctx, slot: u16, fua: bool) {
        if fua {
            self.slots[slot as usize].as_mut().expect("slot is live").stage = Stage::Sync;
            return self.submit_io(ctx, slot);
        }
        self.reply_ok(slot)
    }

    // ---- replying --------------------------------------------------------------------

    fn reply_ok(&mut self, slot: u16) {
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        let handle = s.request.handle;
        let part = match s.request.command {
            Command::Read { range, .. } => {
                let data = s.buf.take();
                if !self.session.structured {
                    Part::new(slot as u32, &reply::simple(handle, None), data, Vec::new())
                } else if range.length == 0 {
                    Part::new(slot as u32, &reply::done_none(handle), data, Vec::new())
                } else {
                    let head = reply::offset_data_header(handle, range.offset, range.length, true);
                    Part::new(slot as u32, &head, data, Vec::new())
                }
            }
            _ => {
                // A write's buffer goes back to the pool now; the reply carries no data.
                drop(s.buf.take());
                Part::new(slot as u32, &reply::simple(handle, None), None, Vec::new())
            }
        };
        self.queue_part(slot, part, true);
    }

    fn reply_block_status(&mut self, slot: u16, context_id: u32, extents: &[Extent]) {
        let handle = self.slots[slot as usize].as_ref().expect("slot is live").request.handle;
        let mut extra = self.spare_vecs.pop().unwrap_or_default();
        reply::block_status(&mut extra, handle, context_id, extents);
        self.queue_part(slot, Part::new(slot as u32, &[], None, extra), true);
    }

    fn reply_error(&mut self, slot: u16, errno: Errno, message: &str, offset: Option<u64>) {
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        let handle = s.request.handle;
        s.failed = true;
        // An error reply never carries data, whatever buffer the request held.
        drop(s.buf.take());
        let part = if self.session.structured {
            let mut extra = self.spare_vecs.pop().unwrap_or_default();
            reply::error_chunk(&mut extra, handle, errno, message, offset);
            Part::new(slot as u32, &[], None, extra)
        } else {
            Part::new(slot as u32, &reply::simple(handle, Some(errno)), None, Vec::new())
        };
        self.queue_part(slot, part, true);
    }

    /// Stops taking requests and queueing replies; the connection closes once what is
    /// already queued has been sent.
    fn close_after_queue(&mut self, why: &str) {
        self.closing = true;
        self.stop_reading(why);
        while let Some(part) = self.deferred.pop_front() {
            self.sent(part);
        }
    }

    /// Queues one part of a slot's reply; `last` marks the part that completes it.
    fn queue_part(&mut self, slot: u16, part: Part, last: bool) {
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        debug_assert!(!s.final_queued, "nothing follows a reply's final part");
        s.parts += 1;
        s.final_queued |= last;
        s.times.queued.get_or_insert_with(Instant::now);
        if self.broken || self.closing {
            return self.sent(part);
        }
        if self.streaming.is_some_and(|x| x != slot) {
            return self.deferred.push_back(part);
        }
        self.queue.push_back(part);
        if last && self.streaming == Some(slot) {
            self.streaming = None;
            self.queue.extend(self.deferred.drain(..));
            for _ in 0..self.stream_waiters.len() {
                let Some(waiter) = self.stream_waiters.pop_front() else { break };
                if self.streaming.is_some() {
                    self.stream_waiters.push_back(waiter);
                } else if self.slots[waiter as usize].as_ref().is_some_and(|s| !s.final_queued) {
                    self.flush_read(waiter);
                }
            }
        }
    }

    /// Sends queued replies when no send or splice is in flight.
    pub fn pump_output(&mut self, ctx: &mut Ctx) {
        if self.splicing.is_some() {
            return;
        }
        if self.closing && !self.broken && self.queue.is_empty() && self.batch.is_some() {
            return self.fail("closing after a read that failed part way");
        }
        let Some(mut batch) = self.batch.take() else { return };
        let now = Instant::now();
        if self.queue.front().is_some_and(Part::is_bare_splice) {
            // Data with no header in front (a later piece of a contiguous read): no sendmsg,
            // straight to the splice.
            self.batch = Some(batch);
            let part = self.queue.pop_front().expect("checked");
            if let Some(s) = self.slots[part.tag as usize].as_mut() {
                s.times.sending.get_or_insert(now);
            }
            return self.start_splice_out(ctx, part);
        }
        while !batch.is_full() && !batch.ends_with_splice() {
            let Some(part) = self.queue.pop_front() else { break };
            if let Some(s) = self.slots[part.tag as usize].as_mut() {
                s.times.sending.get_or_insert(now);
            }
            batch.push(part);
        }
        if batch.is_empty() {
            self.batch = Some(batch);
            return;
        }
        self.ops += 1;
        ctx.ring.send(self.raw_fd(), batch, ctx.user(OP_SEND));
    }

    fn send_done(&mut self, ctx: &mut Ctx, result: i32, mut batch: Box<SendBatch>) {
        if result < 0 {
            let e = std::io::Error::from_raw_os_error(-result);
            batch.drain(|part| self.sent(part));
            self.batch = Some(batch);
            self.fail(&format!("send failed: {e}"));
            return;
        }
        let mut finished = std::mem::take(&mut self.finished_parts);
        batch.consume(result as usize, |part| finished.push(part));
        for part in finished.drain(..) {
            if part.pipe.is_some() && !self.broken {
                // The header is out; its data follows straight from the pipe.
                debug_assert!(batch.is_empty(), "a spliced part ends its batch");
                self.start_splice_out(ctx, part);
                continue;
            }
            self.sent(part);
        }
        self.finished_parts = finished;
        if !batch.is_empty() {
            // A short send: the rest goes first, before anything newer.
            self.ops += 1;
            ctx.ring.send(self.raw_fd(), batch, ctx.user(OP_SEND));
            return;
        }
        self.batch = Some(batch);
        if self.splicing.is_some() {
            return;
        }
        self.pump_output(ctx);
        // Slots freed up: requests may be waiting in the receive buffer.
        if self.reading {
            self.pump_input(ctx);
        }
    }

    fn start_splice_out(&mut self, ctx: &mut Ctx, part: Part) {
        let pipe = part.pipe.as_ref().expect("a spliced part has its pipe");
        self.ops += 1;
        ctx.ring.splice(pipe.read_fd(), None, self.raw_fd(), part.pipe_left, ctx.user(OP_SPLICE_OUT));
        self.splicing = Some(part);
    }

    fn splice_out_done(&mut self, ctx: &mut Ctx, result: i32) {
        let mut part = self.splicing.take().expect("a splice completion has its part");
        if self.broken {
            return self.sent(part);
        }
        if result <= 0 {
            let why = if result == 0 { "the socket took no data".to_string() } else { std::io::Error::from_raw_os_error(-result).to_string() };
            self.sent(part);
            return self.fail(&format!("splice to the socket failed: {why}"));
        }
        part.pipe_left -= result as usize;
        if part.pipe_left > 0 {
            return self.start_splice_out(ctx, part);
        }
        // Drained: the pipe can carry another chunk.
        ctx.pipes.put(part.pipe.take().expect("a spliced part has its pipe"));
        self.sent(part);
        self.pump_output(ctx);
        if self.reading {
            self.pump_input(ctx);
        }
    }

    /// A reply part left (or will never leave): its buffers are free, and its slot too
    /// once nothing else of it is pending.
    fn sent(&mut self, mut part: Part) {
        drop(part.data.take());
        drop(part.pipe.take());
        if part.extra.capacity() > 0 {
            let mut v = std::mem::take(&mut part.extra);
            v.clear();
            self.spare_vecs.push(v);
        }
        let slot = part.tag as u16;
        self.slots[slot as usize].as_mut().expect("a sent part's slot is live").parts -= 1;
        self.release_if_idle(slot);
    }

    fn release_if_idle(&mut self, slot: u16) {
        let s = self.slots[slot as usize].as_ref().expect("slot is live");
        if s.ops == 0 && s.parts == 0 && (s.final_queued || self.broken) {
            self.release(slot);
        }
    }

    fn release(&mut self, slot: u16) {
        // Chunks never sent (after an error or a failed connection) give back their buffers.
        self.chunks[slot as usize].clear();
        self.stream_waiters.retain(|&w| w != slot);
        if self.streaming == Some(slot) {
            self.streaming = None;
        }
        let s = self.slots[slot as usize].take().expect("released slot was live");
        let mut bytes = 0;
        if let (Command::Read { range, .. }, false) = (s.request.command, s.rejected) {
            if range.length > 0 && self.export.backend.fd().is_some() {
                self.reads_in_flight -= 1;
            }
        }
        if let Command::Read { range, .. } | Command::Write { range, .. } = s.request.command {
            bytes = range.length as u64;
            self.inflight_bytes -= range.length as usize;
            self.budget.used.set(self.budget.used.get() - range.length as usize);
        }
        self.free_slots.push(slot);
        if !s.rejected {
            let op = match s.request.command {
                Command::Read { .. } => metrics::Op::Read,
                Command::Write { .. } => metrics::Op::Write,
                Command::Flush | Command::Disconnect => metrics::Op::Flush,
                Command::Trim { .. } => metrics::Op::Trim,
                Command::WriteZeroes { .. } => metrics::Op::WriteZeroes,
                Command::Cache { .. } => metrics::Op::Cache,
                Command::BlockStatus { .. } => metrics::Op::BlockStatus,
            };
            let ok = !s.failed && !self.broken;
            let bytes = if ok { bytes } else { 0 };
            self.metrics.record(self.metrics_export, op, &s.times.phases(Instant::now()), bytes, ok);
            self.metrics.request_finished(self.metrics_export);
        }
    }
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.metrics.connection_closed(self.metrics_export);
    }
}
