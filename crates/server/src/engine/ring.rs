//! One io_uring per worker thread, behind a safe interface: every operation takes ownership
//! of the memory the kernel will touch (a `Buf` or a `SendBatch`) and hands it back with the
//! completion, so no Rust reference can alias memory the kernel is using.

use std::collections::VecDeque;
use std::io;
use std::os::fd::RawFd;

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::buffer::{Buf, Pool};
use super::pipe::Pipe;

/// Bytes of a reply header stored inline in a send part; the largest, OFFSET_HOLE, is 32.
pub const INLINE_HEAD_BYTES: usize = 32;

/// What one finished operation gives back.
pub struct Completion {
    pub user: u64,
    pub result: i32,
    pub buf: Option<Buf>,
    pub batch: Option<Box<SendBatch>>,
}

/// One reply on its way out: an inline header, then data (a window of a buffer, or bytes
/// waiting in a pipe to be spliced after the header), then optional extra bytes (block
/// status descriptors, error messages).
pub struct Part {
    pub tag: u32,
    head: [u8; INLINE_HEAD_BYTES],
    head_len: u8,
    pub data: Option<Buf>,
    data_start: usize,
    data_len: usize,
    pub extra: Vec<u8>,
    /// Data that follows the header straight from a pipe, and how much of it is still there.
    pub pipe: Option<Pipe>,
    pub pipe_left: usize,
    sent: usize,
}

impl Part {
    pub fn new(tag: u32, head: &[u8], data: Option<Buf>, extra: Vec<u8>) -> Part {
        let len = data.as_ref().map_or(0, Buf::len);
        Part::window(tag, head, data, 0, len, extra)
    }

    /// A part whose data is `data[start..start + len]`.
    pub fn window(tag: u32, head: &[u8], data: Option<Buf>, start: usize, len: usize, extra: Vec<u8>) -> Part {
        assert!(data.as_ref().map_or(start + len == 0, |d| start + len <= d.len()));
        let mut h = [0u8; INLINE_HEAD_BYTES];
        h[..head.len()].copy_from_slice(head);
        Part {
            tag,
            head: h,
            head_len: head.len() as u8,
            data,
            data_start: start,
            data_len: len,
            extra,
            pipe: None,
            pipe_left: 0,
            sent: 0,
        }
    }

    /// A header sent by sendmsg, then `len` bytes spliced from `pipe` to the socket.
    pub fn spliced(tag: u32, head: &[u8], pipe: Pipe, len: usize) -> Part {
        let mut p = Part::window(tag, head, None, 0, 0, Vec::new());
        p.pipe = Some(pipe);
        p.pipe_left = len;
        p
    }

    fn total(&self) -> usize {
        self.head_len as usize + self.data_len + self.extra.len()
    }

    /// Only spliced data: nothing for sendmsg to do.
    pub fn is_bare_splice(&self) -> bool {
        self.pipe.is_some() && self.total() == 0
    }
}

/// A gather list for one sendmsg. It lives in a Box so the iovecs and msghdr keep their
/// addresses while the kernel reads them.
pub struct SendBatch {
    parts: VecDeque<Part>,
    iov: Vec<libc::iovec>,
    msg: libc::msghdr,
    parts_max: usize,
}

impl SendBatch {
    pub fn new(parts_max: usize) -> Box<SendBatch> {
        Box::new(SendBatch {
            parts: VecDeque::with_capacity(parts_max),
            iov: Vec::with_capacity(3 * parts_max),
            // SAFETY: msghdr is plain old data for which all-zero is a valid value.
            msg: unsafe { std::mem::zeroed() },
            parts_max,
        })
    }

    pub fn is_full(&self) -> bool {
        self.parts.len() >= self.parts_max
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    pub fn push(&mut self, part: Part) {
        assert!(!self.is_full());
        assert!(self.parts.back().is_none_or(|p| p.pipe.is_none()), "a spliced part ends its batch");
        self.parts.push_back(part);
    }

    /// Whether the last part's data follows by splice, so the header should not be pushed
    /// out on its own.
    pub fn ends_with_splice(&self) -> bool {
        self.parts.back().is_some_and(|p| p.pipe.is_some())
    }

    /// Accounts `n` sent bytes; parts sent in full are passed to `done` in order.
    pub fn consume(&mut self, mut n: usize, mut done: impl FnMut(Part)) {
        while let Some(front) = self.parts.front_mut() {
            let left = front.total() - front.sent;
            if n < left {
                front.sent += n;
                return;
            }
            n -= left;
            done(self.parts.pop_front().expect("front exists"));
        }
        debug_assert_eq!(n, 0, "the kernel reported more bytes sent than were queued");
    }

    /// Takes every part back, sent or not (the connection is going away).
    pub fn drain(&mut self, done: impl FnMut(Part)) {
        self.parts.drain(..).for_each(done);
    }

    fn prepare(&mut self) {
        self.iov.clear();
        for p in &self.parts {
            let mut skip = p.sent;
            // SAFETY: Part::window checked data_start + data_len <= the buffer's length.
            let data = p.data.as_ref().map(|b| (unsafe { b.ptr().add(p.data_start) } as *const u8, p.data_len));
            let pieces = [
                (p.head.as_ptr(), p.head_len as usize),
                data.unwrap_or((std::ptr::null(), 0)),
                (p.extra.as_ptr(), p.extra.len()),
            ];
            for (ptr, len) in pieces {
                if skip >= len {
                    skip -= len;
                    continue;
                }
                // SAFETY: skip < len, so the pointer stays inside the piece.
                let base = unsafe { ptr.add(skip) };
                self.iov.push(libc::iovec { iov_base: base as *mut libc::c_void, iov_len: len - skip });
                skip = 0;
            }
        }
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len() as _;
    }
}

/// Resources an in-flight operation holds on the kernel's behalf.
struct Op {
    user: u64,
    buf: Option<Buf>,
    batch: Option<Box<SendBatch>>,
}

pub struct Ring {
    uring: IoUring,
    ops: Vec<Option<Op>>,
    free_ops: Vec<u32>,
    /// The pool region registered as fixed buffer 0, when registration succeeded.
    registered: bool,
    cqes: Vec<cqueue::Entry>,
}

impl Ring {
    pub fn new(entries: u32) -> io::Result<Ring> {
        // One thread owns the ring, so completion work can wait until that thread asks for
        // completions instead of interrupting it (Linux 6.1+); older kernels get a plain ring.
        let uring = match IoUring::builder()
            .setup_clamp()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_submit_all()
            .build(entries)
        {
            Ok(u) => u,
            Err(_) => IoUring::builder().setup_clamp().build(entries)?,
        };
        Ok(Ring { uring, ops: Vec::new(), free_ops: Vec::new(), registered: false, cqes: Vec::new() })
    }

    /// Registers the pool's region as fixed buffer 0. Failure (for example a small
    /// RLIMIT_MEMLOCK) is not fatal: operations then use ordinary buffers.
    pub fn register(&mut self, pool: &Pool) -> io::Result<()> {
        let (base, len) = pool.region();
        let iov = libc::iovec { iov_base: base.cast(), iov_len: len };
        // SAFETY: the region stays mapped while any Buf from it exists, and the Pool (with the
        // region) is owned by the same worker as this ring and dropped after it.
        unsafe { self.uring.submitter().register_buffers(&[iov])? };
        self.registered = true;
        Ok(())
    }

    pub fn in_flight(&self) -> usize {
        self.ops.len() - self.free_ops.len()
    }

    /// Receives into `buf[at..]`.
    pub fn recv(&mut self, fd: RawFd, buf: Buf, at: usize, user: u64) {
        assert!(at < buf.len());
        // SAFETY: at < len, so the pointer stays inside the buffer.
        let ptr = unsafe { buf.ptr().add(at) };
        let len = (buf.len() - at) as u32;
        let sqe = opcode::Recv::new(types::Fd(fd), ptr, len).build();
        self.push(sqe, Op { user, buf: Some(buf), batch: None });
    }

    /// Reads from a stream (an eventfd) at its current position into the whole buffer.
    pub fn recv_eventfd(&mut self, fd: RawFd, buf: Buf, user: u64) {
        let sqe = opcode::Read::new(types::Fd(fd), buf.ptr(), buf.len() as u32).offset(u64::MAX).build();
        self.push(sqe, Op { user, buf: Some(buf), batch: None });
    }

    /// Sends the whole batch: MSG_WAITALL makes the kernel finish a partial send itself
    /// instead of completing early; MSG_MORE holds back a header whose data is spliced next.
    pub fn send(&mut self, fd: RawFd, mut batch: Box<SendBatch>, user: u64) {
        batch.prepare();
        let mut flags = libc::MSG_NOSIGNAL | libc::MSG_WAITALL;
        if batch.ends_with_splice() {
            flags |= libc::MSG_MORE;
        }
        let sqe = opcode::SendMsg::new(types::Fd(fd), &batch.msg).flags(flags as u32).build();
        self.push(sqe, Op { user, buf: None, batch: Some(batch) });
    }

    /// Moves `len` bytes from `fd_in` (at `off_in`, or its position when None) to `fd_out`;
    /// one side must be a pipe. The descriptors belong to the caller, which keeps them open
    /// until the completion arrives.
    pub fn splice(&mut self, fd_in: RawFd, off_in: Option<u64>, fd_out: RawFd, len: usize, user: u64) {
        let off = off_in.map_or(-1, |o| o as i64);
        let len = len.min(u32::MAX as usize) as u32;
        let sqe = opcode::Splice::new(types::Fd(fd_in), off, types::Fd(fd_out), -1, len).build();
        self.push(sqe, Op { user, buf: None, batch: None });
    }

    /// Reads `len` bytes at file offset `offset` into `buf[at..at + len]`.
    pub fn read_at(&mut self, fd: RawFd, buf: Buf, at: usize, len: usize, offset: u64, user: u64) {
        assert!(at + len <= buf.len() && len <= u32::MAX as usize);
        // SAFETY: at + len <= buf.len(), checked above.
        let ptr = unsafe { buf.ptr().add(at) };
        let sqe = if self.registered && buf.is_registered() {
            opcode::ReadFixed::new(types::Fd(fd), ptr, len as u32, 0).offset(offset).build()
        } else {
            opcode::Read::new(types::Fd(fd), ptr, len as u32).offset(offset).build()
        };
        self.push(sqe, Op { user, buf: Some(buf), batch: None });
    }

    /// Writes `buf[at..at + len]` at `offset`; `dsync` makes it durable before completing.
    #[allow(clippy::too_many_arguments)]
    pub fn write_at(&mut self, fd: RawFd, buf: Buf, at: usize, len: usize, offset: u64, dsync: bool, user: u64) {
        assert!(at + len <= buf.len() && len <= u32::MAX as usize);
        // SAFETY: at + len <= buf.len(), checked above.
        let ptr = unsafe { buf.ptr().add(at) } as *const u8;
        let flags = if dsync { libc::RWF_DSYNC } else { 0 };
        let sqe = if self.registered && buf.is_registered() {
            opcode::WriteFixed::new(types::Fd(fd), ptr, len as u32, 0).offset(offset).rw_flags(flags).build()
        } else {
            opcode::Write::new(types::Fd(fd), ptr, len as u32).offset(offset).rw_flags(flags).build()
        };
        self.push(sqe, Op { user, buf: Some(buf), batch: None });
    }

    pub fn fdatasync(&mut self, fd: RawFd, user: u64) {
        let sqe = opcode::Fsync::new(types::Fd(fd)).flags(types::FsyncFlags::DATASYNC).build();
        self.push(sqe, Op { user, buf: None, batch: None });
    }

    pub fn fallocate(&mut self, fd: RawFd, mode: i32, offset: u64, len: u64, user: u64) {
        let sqe = opcode::Fallocate::new(types::Fd(fd), len).offset(offset).mode(mode).build();
        self.push(sqe, Op { user, buf: None, batch: None });
    }

    pub fn fadvise_willneed(&mut self, fd: RawFd, offset: u64, len: u64, user: u64) {
        let sqe = opcode::Fadvise::new(types::Fd(fd), len as libc::off_t, libc::POSIX_FADV_WILLNEED)
            .offset(offset)
            .build();
        self.push(sqe, Op { user, buf: None, batch: None });
    }

    /// Submits everything queued, waits for at least one completion (or `timeout`), and
    /// appends all available completions to `out`.
    pub fn wait(&mut self, out: &mut Vec<Completion>, timeout: Option<std::time::Duration>) -> io::Result<()> {
        let submitted = match timeout {
            None => self.uring.submit_and_wait(1),
            Some(t) => {
                let ts = types::Timespec::new().sec(t.as_secs()).nsec(t.subsec_nanos());
                let args = types::SubmitArgs::new().timespec(&ts);
                self.uring.submitter().submit_with_args(1, &args)
            }
        };
        match submitted {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::ETIME) | Some(libc::EBUSY)) => {}
            Err(e) => return Err(e),
        }
        let mut cqes = std::mem::take(&mut self.cqes);
        cqes.extend(self.uring.completion());
        for cqe in cqes.drain(..) {
            out.push(self.finish(&cqe));
        }
        self.cqes = cqes;
        Ok(())
    }

    fn finish(&mut self, cqe: &cqueue::Entry) -> Completion {
        let id = cqe.user_data() as u32;
        let op = self.ops[id as usize].take().expect("a completion for a live operation");
        self.free_ops.push(id);
        Completion { user: op.user, result: cqe.result(), buf: op.buf, batch: op.batch }
    }

    fn push(&mut self, sqe: squeue::Entry, op: Op) {
        let id = match self.free_ops.pop() {
            Some(id) => {
                self.ops[id as usize] = Some(op);
                id
            }
            None => {
                self.ops.push(Some(op));
                (self.ops.len() - 1) as u32
            }
        };
        let sqe = sqe.user_data(id as u64);
        loop {
            // SAFETY: every pointer in the entry refers to memory owned by `self.ops[id]`
            // (a Buf or a boxed SendBatch), which is kept until the completion for `id`
            // arrives; file descriptors are plain numbers the kernel validates itself.
            if unsafe { self.uring.submission().push(&sqe) }.is_ok() {
                return;
            }
            // Submission queue full: hand what is queued to the kernel and retry.
            if let Err(e) = self.uring.submit() {
                if e.raw_os_error() != Some(libc::EBUSY) {
                    panic!("io_uring submit failed: {e}");
                }
            }
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        // The kernel may still write into buffers of operations in flight; cancel them and
        // wait, so the buffers are dropped only after the kernel let go of them.
        if self.in_flight() == 0 {
            return;
        }
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build().user_data(u64::MAX);
        // SAFETY: the cancel request carries no pointers.
        let _ = unsafe { self.uring.submission().push(&cancel) };
        let mut spins = 0;
        while self.in_flight() > 0 && spins < 1000 {
            spins += 1;
            if self.uring.submit_and_wait(1).is_err() {
                break;
            }
            let entries: Vec<cqueue::Entry> = self.uring.completion().collect();
            for cqe in entries {
                if cqe.user_data() != u64::MAX {
                    drop(self.finish(&cqe));
                }
            }
        }
        if self.in_flight() > 0 {
            // Leak rather than free memory the kernel may still write.
            for op in self.ops.drain(..).flatten() {
                std::mem::forget(op.buf);
                std::mem::forget(op.batch);
            }
        }
    }
}
