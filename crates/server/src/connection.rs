//! One client connection in transmission: reading requests, running them through the
//! engine, and queueing replies. Requests run concurrently and are answered in completion
//! order; how many run at once, and how many payload bytes they hold, is bounded.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::rc::Rc;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::sync::Arc;

use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::reply::{self, Extent};
use sluice_proto::wire::REQUEST_BYTES;
use sluice_proto::{validate, Command, Errno, RawRequest, Request, Session};

use crate::engine::{Buf, Part, Pool, Ring, SendBatch};
use crate::errors::errno_from_os;
use crate::export::Export;
use crate::limits::Limits;

/// Receive buffer for request headers; payloads that do not fit go straight to their buffer.
pub const RECV_BUFFER_BYTES: usize = 64 * 1024;
/// Replies gathered into one sendmsg.
pub const SEND_PARTS_MAX: usize = 32;
/// Largest write issued when emulating WRITE_ZEROES by writing zeros.
pub const ZERO_FILL_CHUNK_BYTES: usize = 1024 * 1024;

const _: () = assert!(RECV_BUFFER_BYTES >= REQUEST_BYTES * 2);
const _: () = assert!(ZERO_FILL_CHUNK_BYTES <= REQUEST_PAYLOAD_MAX_BYTES as usize);

/// Low 32 bits of a completion's user data: which operation of the connection it was.
pub const OP_RECV: u32 = 0;
pub const OP_SEND: u32 = 1;
const OP_SLOT_BASE: u32 = 2;

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
    free_slots: Vec<u16>,
    inflight_bytes: usize,
    budget: Rc<Budget>,

    batch: Option<Box<SendBatch>>,
    queue: VecDeque<Part>,
    spare_vecs: Vec<Vec<u8>>,
    /// Scratch space reused across requests so the hot path does not allocate.
    finished_parts: Vec<Part>,
    extents: Vec<Extent>,

    /// Still accepting requests (false after DISC, end of stream, a protocol error, shutdown).
    reading: bool,
    /// The socket failed: nothing more can be sent.
    broken: bool,
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

/// What a connection needs from its worker to make progress.
pub struct Ctx<'a> {
    pub ring: &'a mut Ring,
    pub pool: &'a mut Pool,
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
    ) -> Connection {
        let slots_max = limits.inflight_requests_per_connection;
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
            free_slots: (0..slots_max as u16).rev().collect(),
            inflight_bytes: 0,
            budget,
            batch: Some(SendBatch::new(SEND_PARTS_MAX)),
            queue: VecDeque::with_capacity(slots_max),
            spare_vecs: Vec::new(),
            finished_parts: Vec::with_capacity(SEND_PARTS_MAX),
            extents: Vec::new(),
            reading: true,
            broken: false,
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
        while let Some(part) = self.queue.pop_front() {
            self.sent(part);
        }
    }

    /// Handles a completion addressed to this connection.
    pub fn complete(&mut self, ctx: &mut Ctx, op: u32, result: i32, buf: Option<Buf>, batch: Option<Box<SendBatch>>) {
        self.ops -= 1;
        match op {
            OP_RECV => self.received(ctx, result, buf.expect("recv returns its buffer")),
            OP_SEND => self.send_done(ctx, result, batch.expect("send returns its batch")),
            _ => self.slot_done(ctx, (op - OP_SLOT_BASE) as u16, result, buf),
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
                self.slots[slot as usize] = Some(Slot { request, buf: None, done: 0, stage: Stage::Main });
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
        let mut s = Slot { request, buf: None, done: 0, stage: Stage::Main };
        match request.command {
            Command::Disconnect => {
                self.free_slots.push(slot);
                self.stop_reading("client disconnected");
                return true;
            }
            Command::Read { range, .. } | Command::Write { range, .. } => {
                let len = range.length as usize;
                s.buf = Some(ctx.pool.get(len));
                self.inflight_bytes += len;
                self.budget.used.set(self.budget.used.get() + len);
            }
            _ => {}
        }
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

    fn submit_io(&mut self, ctx: &mut Ctx, slot: u16) {
        let fd = self.export.backend.fd().expect("only descriptor backends do I/O");
        let user = ctx.user(OP_SLOT_BASE + slot as u32);
        let caps = self.export.backend.caps();
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        self.ops += 1;
        match (s.stage, s.request.command) {
            (Stage::Sync, _) | (Stage::Main, Command::Flush) => ctx.ring.fdatasync(fd, user),
            (Stage::Main, Command::Read { range, .. }) => {
                let buf = s.buf.take().expect("read has a buffer");
                let len = range.length as usize - s.done;
                ctx.ring.read_at(fd, buf, s.done, len, range.offset + s.done as u64, user);
            }
            (Stage::Main, Command::Write { range, fua }) => {
                let buf = s.buf.take().expect("write has a buffer");
                let len = range.length as usize - s.done;
                ctx.ring.write_at(fd, buf, s.done, len, range.offset + s.done as u64, fua, user);
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
            if let Command::Read { .. } = command {
                s.buf.as_mut().expect("read has a buffer").as_mut_slice().fill(0);
            }
            return self.reply_ok(slot);
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

    fn slot_done(&mut self, ctx: &mut Ctx, slot: u16, result: i32, buf: Option<Buf>) {
        let s = self.slots[slot as usize].as_mut().expect("completion for a live slot");
        if buf.is_some() {
            s.buf = buf;
        }
        if self.broken {
            return self.release(slot);
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
                Command::Read { range, .. } | Command::Write { range, .. } => Some(range.offset + s.done as u64),
                _ => None,
            };
            let msg = std::io::Error::from_raw_os_error(code).to_string();
            log::debug!("{}: {:?} failed: {msg}", self.peer, command);
            return self.reply_error(slot, errno, &msg, offset);
        }
        let n = result as usize;
        match (s.stage, command) {
            (Stage::Main, Command::Read { range, .. }) | (Stage::Main, Command::Write { range, .. }) => {
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
        self.queue_reply(part);
    }

    fn reply_block_status(&mut self, slot: u16, context_id: u32, extents: &[Extent]) {
        let handle = self.slots[slot as usize].as_ref().expect("slot is live").request.handle;
        let mut extra = self.spare_vecs.pop().unwrap_or_default();
        reply::block_status(&mut extra, handle, context_id, extents);
        self.queue_reply(Part::new(slot as u32, &[], None, extra));
    }

    fn reply_error(&mut self, slot: u16, errno: Errno, message: &str, offset: Option<u64>) {
        let s = self.slots[slot as usize].as_mut().expect("slot is live");
        let handle = s.request.handle;
        // An error reply never carries data, whatever buffer the request held.
        drop(s.buf.take());
        let part = if self.session.structured {
            let mut extra = self.spare_vecs.pop().unwrap_or_default();
            reply::error_chunk(&mut extra, handle, errno, message, offset);
            Part::new(slot as u32, &[], None, extra)
        } else {
            Part::new(slot as u32, &reply::simple(handle, Some(errno)), None, Vec::new())
        };
        self.queue_reply(part);
    }

    fn queue_reply(&mut self, part: Part) {
        if self.broken {
            return self.sent(part);
        }
        self.queue.push_back(part);
    }

    /// Sends queued replies when no send is in flight.
    pub fn pump_output(&mut self, ctx: &mut Ctx) {
        let Some(mut batch) = self.batch.take() else { return };
        while !batch.is_full() {
            let Some(part) = self.queue.pop_front() else { break };
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
        self.pump_output(ctx);
        // Slots freed up: requests may be waiting in the receive buffer.
        if self.reading {
            self.pump_input(ctx);
        }
    }

    /// A reply left (or will never leave): its slot and buffers are free again.
    fn sent(&mut self, mut part: Part) {
        drop(part.data.take());
        if part.extra.capacity() > 0 {
            let mut v = std::mem::take(&mut part.extra);
            v.clear();
            self.spare_vecs.push(v);
        }
        self.release(part.tag as u16);
    }

    fn release(&mut self, slot: u16) {
        let s = self.slots[slot as usize].take().expect("released slot was live");
        if let Command::Read { range, .. } | Command::Write { range, .. } = s.request.command {
            self.inflight_bytes -= range.length as usize;
            self.budget.used.set(self.budget.used.get() - range.length as usize);
        }
        self.free_slots.push(slot);
    }
}
