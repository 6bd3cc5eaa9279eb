//! The read pipeline: a read is split into chunks, handed to the storage all at once (a
//! fixed `--chunk`) or a window at a time (`--chunk auto`, sized by `pace`). With
//! structured replies each chunk goes out as its own OFFSET_DATA chunk as soon as it is
//! read, in whatever order the storage finishes; with simple replies (and DF reads) chunks
//! go out in order, each as soon as it and all before it are read. Chunk data reaches the
//! socket from a buffer (copy, direct) or from a pipe (splice), per the export's data path.

use sluice_proto::reply;
use sluice_proto::{Command, Range};

use super::reply::Head;
use super::state::{Chunk, ChunkState};
use super::{Conn, Env};
use crate::backend::StorageOp;
use crate::engine::{Held, Part, BUFFER_ALIGN_BYTES};
use crate::errors::errno_from_os;
use crate::export::{Chunking, DataPath};
use crate::limits::{CHUNKS_PER_READ_MAX, CHUNK_COST_NS, PAGE_BYTES, SPLICE_MIN_BYTES};

/// Says once per process that pipes ran out, the one case where splice falls back to copy.
fn log_once_pipes_exhausted() {
    static SAID: std::sync::Once = std::sync::Once::new();
    SAID.call_once(|| {
        log::info!(
            "no splice pipe free (all in use, or the system refuses more pipe memory); further reads are copied until one is (said once)"
        )
    });
}

/// How one read is cut: the storage range (widened to O_DIRECT alignment for a bounce),
/// the chunk length, and how the data travels.
struct Plan {
    lo: u64,
    hi: u64,
    chunk: usize,
    /// Chunk reads at the storage at once.
    window: usize,
    splice: bool,
    /// Chunks read through the O_DIRECT descriptor.
    direct: bool,
}

impl Conn {
    pub(super) fn start_read(&mut self, env: &mut Env, slot: u16, offset: u64, len: usize) {
        if len == 0 {
            return self.reply_ok(env, slot);
        }
        if !self.caps.instant {
            self.reads_in_flight += 1;
            self.slot_mut(slot).storage_read = true;
        }
        let plan = self.plan_read(env, offset, len);
        let end = offset + len as u64;
        let pipe_bytes = env.pipes.bytes() as u64;
        let mut chunks = std::mem::take(&mut self.chunks[slot as usize]);
        chunks.clear();
        let mut at = plan.lo;
        while at < plan.hi {
            let mut c1 = (at + plan.chunk as u64).min(plan.hi);
            if plan.splice {
                // A pipe holds pipe_bytes / PAGE page references, and a splice from the file
                // takes one per page it touches: an unaligned chunk of pipe_bytes touches one
                // page too many, fills the pipe short of its length and would never finish.
                let page = PAGE_BYTES as u64;
                c1 = c1.min(at / page * page + pipe_bytes);
            }
            let first = offset.max(at);
            chunks.push(Chunk {
                file_offset: at,
                read_len: (c1 - at) as usize,
                skip: (first - at) as usize,
                want: (c1.min(end) - first) as usize,
                done: 0,
                direct: plan.direct,
                splice: plan.splice,
                started: env.now,
                buf: None,
                pipe: None,
                state: ChunkState::Waiting,
            });
            at = c1;
        }
        assert!(chunks.len() <= CHUNKS_PER_READ_MAX, "chunk numbers are part of the operation id");
        let s = self.slot_mut(slot);
        s.chunks_left = chunks.len() as u16;
        s.submitted = 0;
        s.window = plan.window.clamp(1, chunks.len()) as u16;
        self.chunks[slot as usize] = chunks;
        self.refill(env, slot);
    }

    /// Hands the storage a read's next chunks while fewer than its window are there. After
    /// an error, or once the socket is gone, the chunks not yet handed out are given up.
    fn refill(&mut self, env: &mut Env, slot: u16) {
        let n = self.chunks[slot as usize].len() as u16;
        if self.slot(slot).error.is_some() || self.is_broken() {
            let s = self.slot_mut(slot);
            let from = s.submitted as usize;
            s.chunks_left -= n - s.submitted;
            s.submitted = n;
            for c in &mut self.chunks[slot as usize][from..] {
                c.state = ChunkState::Gone;
            }
            return;
        }
        loop {
            let s = self.slot_mut(slot);
            let reading = s.submitted - (n - s.chunks_left);
            if s.submitted == n || reading >= s.window {
                return;
            }
            let i = s.submitted as usize;
            s.submitted += 1;
            let c = &mut self.chunks[slot as usize][i];
            c.state = ChunkState::Reading;
            if c.splice {
                c.pipe = env.pipes.get();
                if c.pipe.is_none() {
                    log_once_pipes_exhausted();
                }
            }
            if c.pipe.is_none() {
                c.buf = Some(env.pool.get(c.read_len));
            }
            self.submit_chunk(env, slot, i);
        }
    }

    fn plan_read(&self, env: &Env, offset: u64, len: usize) -> Plan {
        let end = offset + len as u64;
        let caps = self.caps;
        let direct = self.direct_align;
        let aligned = direct.is_some_and(|a| (offset as usize | len).is_multiple_of(a));
        // What a chunk may put in a pipe: a socket's segments may split pages, and each
        // piece takes a page's room.
        let pipe_bytes = if caps.splice { env.pipes.bytes() / self.export.backend.pipe_share().max(1) } else { 0 };
        // Splice reads big enough to pay for a trip through io_uring's worker threads (the
        // one taken when the data is not cached, or the socket full), that small pipes (when
        // the system refused 1 MiB) can still carry in CHUNKS_PER_READ_MAX chunks (cutting
        // chunks at page runs adds at most one). From the page cache, other reads in flight
        // do not matter: cached pages go into the pipe at once, and the driver splices the
        // pipe to the socket at once while it has room. An O_DIRECT splice always reads on
        // one of io_uring's worker threads, so with other reads in flight an O_DIRECT read
        // into a buffer (asynchronous, no thread) keeps the disk busier: such a read is
        // spliced only when it is alone.
        let direct_splice = aligned && self.export.data_path == DataPath::SpliceDirect;
        let splice = self.export.data_path.uses_splice()
            && caps.splice
            && len >= SPLICE_MIN_BYTES
            && pipe_bytes > 0
            && len.div_ceil(pipe_bytes) < CHUNKS_PER_READ_MAX
            && (!direct_splice || self.reads_in_flight == 1);
        // O_DIRECT into buffers reads whole aligned blocks and sends the requested part; an
        // O_DIRECT splice must cover the requested range exactly.
        let bounce = !splice && direct.is_some();
        let (lo, hi) = match direct {
            Some(a) if bounce => (offset / a as u64 * a as u64, end.next_multiple_of(a as u64)),
            _ => (offset, end),
        };
        let span = (hi - lo) as usize;
        // Fixed chunks are all read at once; automatic ones through the pace's window.
        let (chunk, window) = match self.export.chunking {
            _ if caps.instant => (span, 1),
            Chunking::Off => (span, 1),
            Chunking::Fixed(c) => (c as usize, CHUNKS_PER_READ_MAX),
            Chunking::Auto => {
                let cut = self.pace.cut(span, caps.chunk_cost_ns.unwrap_or(CHUNK_COST_NS));
                (cut.chunk, cut.window)
            }
        };
        let mut chunk = chunk.max(span.div_ceil(CHUNKS_PER_READ_MAX)).next_multiple_of(BUFFER_ALIGN_BYTES);
        if splice {
            chunk = chunk.min(pipe_bytes);
        }
        log::trace!(
            "{}: read of {span} bytes in chunks of {chunk}, {window} at once (storage {:?} B/s, network {:?} B/s)",
            self.peer,
            self.pace.storage_rate().map(|r| r as u64),
            self.pace.network_rate().map(|r| r as u64)
        );
        Plan { lo, hi, chunk, window, splice, direct: bounce || (splice && aligned) }
    }

    /// Submits (the rest of) one chunk's storage read.
    fn submit_chunk(&mut self, env: &mut Env, slot: u16, i: usize) {
        let c = &mut self.chunks[slot as usize][i];
        let offset = c.file_offset + c.done as u64;
        let len = c.read_len - c.done;
        let into = match (c.pipe.take(), c.buf.take()) {
            (Some(pipe), _) => Held::Pipe(pipe),
            (None, Some(buf)) => Held::Buf(buf),
            (None, None) => unreachable!("a chunk being read has a pipe or a buffer"),
        };
        c.started = env.now;
        let op = StorageOp::Read { offset, len, into, at: c.done, direct: c.direct };
        self.submit(env, slot, i, op);
    }

    pub(super) fn chunk_done(&mut self, env: &mut Env, slot: u16, i: usize, result: i32, held: Held) {
        let c = &mut self.chunks[slot as usize][i];
        match held {
            Held::Buf(buf) => c.buf = Some(buf),
            Held::Pipe(pipe) => c.pipe = Some(pipe),
            Held::Nothing | Held::Extents(_) => debug_assert!(false, "a read returns its buffer or pipe"),
        }
        let mut failure = match result {
            r if r < 0 => Some(-r),
            // The file shrank under us, or the device returned nothing.
            0 if c.done < c.need() => Some(libc::EIO),
            n => {
                c.done += n as usize;
                self.pace.storage_done(c.started, env.now, n as usize);
                None
            }
        };
        let error_offset = c.file_offset + c.done as u64;
        let mut short = failure.is_none() && c.done < c.need();
        let align = self.direct_align.unwrap_or(PAGE_BYTES);
        if short && c.direct && !c.done.is_multiple_of(align) {
            // O_DIRECT stopped mid-block: that is the end of the file, and the rest of the
            // chunk cannot be asked for at an unaligned offset anyway.
            failure = Some(libc::EIO);
            short = false;
        }
        if short && !self.is_broken() && self.slot(slot).error.is_none() {
            return self.submit_chunk(env, slot, i);
        }
        let s = self.slots[slot as usize].as_mut().expect("a read's slot is live while chunks return");
        s.chunks_left -= 1;
        let c = &mut self.chunks[slot as usize][i];
        if let Some(code) = failure {
            c.state = ChunkState::Gone;
            drop((c.buf.take(), c.pipe.take()));
            if s.error.is_none() {
                let Command::Read { range, .. } = s.request.command else { unreachable!("chunks belong to reads") };
                let offset = error_offset.max(range.offset);
                log::debug!("{}: read at {offset} failed: {}", self.peer, std::io::Error::from_raw_os_error(code));
                s.error = Some((code, offset));
            }
        } else if c.state == ChunkState::Reading {
            c.state = ChunkState::Ready;
        }
        self.refill(env, slot);
        if self.is_broken() {
            return self.release_if_idle(env, slot);
        }
        self.flush_read(env, slot);
    }

    /// Queues whatever chunks of a read may go out now, and the final reply part once the
    /// last chunk is in.
    pub(super) fn flush_read(&mut self, env: &mut Env, slot: u16) {
        let s = self.slot(slot);
        let last = s.chunks_left == 0;
        let Command::Read { whole, .. } = s.request.command else { unreachable!("chunks belong to reads") };
        if let Some((code, offset)) = s.error {
            return self.read_failed(env, slot, code, offset, last);
        }
        if self.export.chunking == Chunking::Off && !last {
            // Unpipelined: the reply waits for the whole read.
            return;
        }
        // Simple replies, and DF reads, carry the data as one run after one header.
        if !self.session.structured || whole {
            self.flush_contiguous(env, slot, last);
        } else {
            self.flush_chunks(env, slot, last);
        }
    }

    fn read_failed(&mut self, env: &mut Env, slot: u16, code: i32, offset: u64, last: bool) {
        // Nothing more goes out for this read but the error, once every chunk is back.
        for c in self.chunks[slot as usize].iter_mut().filter(|c| c.state == ChunkState::Ready) {
            c.state = ChunkState::Gone;
            drop((c.buf.take(), c.pipe.take()));
        }
        let Command::Read { whole, .. } = self.slot(slot).request.command else { unreachable!("chunks belong to reads") };
        let contiguous = !self.session.structured || whole;
        if contiguous && self.slot(slot).next_in_order > 0 {
            // Part of the data is queued after a header promising all of it; the only way to
            // tell the client is to close the connection once that part is out.
            self.slot_mut(slot).final_queued = true;
            self.close_after_queue(env, "a read failed after part of its data was queued");
            return self.release_if_idle(env, slot);
        }
        if last {
            let msg = std::io::Error::from_raw_os_error(code).to_string();
            self.reply_error(env, slot, errno_from_os(code), &msg, Some(offset));
        }
    }

    /// Structured replies: every ready chunk goes out now as its own OFFSET_DATA chunk.
    fn flush_chunks(&mut self, env: &mut Env, slot: u16, last: bool) {
        let to = self.reply_to(slot);
        let ready = self.chunks[slot as usize].iter().filter(|c| c.state == ChunkState::Ready).count();
        let mut queued = 0;
        for i in 0..self.chunks[slot as usize].len() {
            if self.chunks[slot as usize][i].state != ChunkState::Ready {
                continue;
            }
            queued += 1;
            let done = last && queued == ready;
            let c = &mut self.chunks[slot as usize][i];
            let head = reply::offset_data_header(to, c.file_offset + c.skip as u64, c.want as u32, done);
            let part = Self::chunk_part(slot, c, &head);
            self.queue_part(env, slot, part, done);
            if done {
                // The final part may have released the slot (on a closing connection).
                return;
            }
        }
    }

    /// Simple and DF replies: chunks go out in order, after one header, and no other reply
    /// may come between them.
    fn flush_contiguous(&mut self, env: &mut Env, slot: u16, last: bool) {
        let to = self.reply_to(slot);
        let s = self.slot(slot);
        let Command::Read { range: Range { offset, length }, .. } = s.request.command else {
            unreachable!("chunks belong to reads")
        };
        if s.next_in_order == 0 && !last && self.streaming.is_some_and(|x| x != slot) {
            // Another contiguous reply is on the wire; start once it is complete.
            if !self.stream_waiters.contains(&slot) {
                self.stream_waiters.push_back(slot);
            }
            return;
        }
        let n = self.chunks[slot as usize].len();
        loop {
            let i = self.slot(slot).next_in_order as usize;
            if i == n || self.chunks[slot as usize][i].state != ChunkState::Ready {
                break;
            }
            self.slot_mut(slot).next_in_order += 1;
            let head = match (i, self.session.structured) {
                (0, false) => Head::Simple(reply::simple(to.handle, None)),
                // A read's length is within the payload maximum, so 32 bits.
                (0, true) => Head::Data(reply::offset_data_header(to, offset, length as u32, true)),
                _ => Head::None,
            };
            let part = Self::chunk_part(slot, &mut self.chunks[slot as usize][i], head.bytes());
            if i == 0 && !last {
                self.streaming = Some(slot);
            }
            self.queue_part(env, slot, part, i + 1 == n);
            if i + 1 == n {
                // The final part may have released the slot (on a closing connection).
                return;
            }
        }
    }

    fn chunk_part(slot: u16, c: &mut Chunk, head: &[u8]) -> Part {
        c.state = ChunkState::Gone;
        match c.pipe.take() {
            Some(pipe) => Part::spliced(slot as u32, head, pipe, c.want),
            None => Part::window(slot as u32, head, c.buf.take(), c.skip, c.want, Vec::new()),
        }
    }
}
