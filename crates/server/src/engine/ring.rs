//! One io_uring per worker thread, behind a safe interface: every operation takes ownership
//! of the memory and descriptors the kernel will touch (in its `Token`) and hands them back
//! with the completion, so no Rust reference can alias memory the kernel is using.
//! Operations carried out by other threads park here too (`defer`) and come back from the
//! same `wait`, through the ring's mailbox.

use std::any::Any;
use std::collections::HashMap;
use std::io;
use std::os::fd::{OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::{Arc, Weak};

use io_uring::{cqueue, opcode, squeue, types, IoUring};

use super::buffer::{Buf, Region};
use super::mailbox::{Completer, Mailbox};
use super::op::{Completion, ConnId, Held, LinkEnd, LinkIo, StorageId, Token};
use super::pipe::Pipe;
use super::send::SendBatch;
use crate::limits::BUSY_POLL_CHECKS_PER_CLOCK_READ;

/// Kernel user data of the cancel request sent at drop; slab ids are 32-bit.
const CANCEL_USER_DATA: u64 = u64::MAX;

/// A fixed-buffer slot: empty, or naming the slab (by id) registered in it or refused.
#[derive(Clone, Copy)]
enum Fixed {
    Empty,
    Registered(u64),
    Refused(u64),
}

pub struct Ring {
    uring: IoUring,
    ops: Vec<Option<Token>>,
    free_ops: Vec<u32>,
    /// Storage operations the kernel holds (a subset of `ops`).
    storage: usize,
    /// What each fixed-buffer slot holds; empty when the kernel has no sparse table.
    fixed: Vec<Fixed>,
    cqes: Vec<cqueue::Entry>,
    /// Operations other threads carry out; the kernel never sees them.
    mailbox: Mailbox,
    /// Storage operations a link carries (sent to a remote on this ring, not yet answered).
    pub(super) linked: usize,
    /// Links with requests gathered, to send before the next submit.
    pub(super) flushes: Vec<Rc<dyn LinkEnd>>,
    /// `flushes`' other half while it is worked through, and what a flushing link asks
    /// for: kept so that a pass allocates nothing.
    pub(super) flushes_spare: Vec<Rc<dyn LinkEnd>>,
    pub(super) link_next: Vec<LinkIo>,
    /// What backends keep per worker (a remote export's link), each under its backend's key,
    /// with a handle that dies with the backend (and the entry with it).
    pub(super) locals: HashMap<u64, (Rc<dyn Any>, Weak<()>)>,
    /// The worker this ring belongs to (0 for a ring of no worker's).
    owner: usize,
}

impl Ring {
    pub fn new(entries: u32) -> io::Result<Ring> {
        // One thread owns the ring, so completion work can wait until that thread asks for
        // completions instead of interrupting it (Linux 6.1+); the ring's flags then say when
        // such work is waiting, which a spinning worker looks at (`spin`). Older kernels get
        // a plain ring, whose completions appear without being asked for.
        let uring = match IoUring::builder()
            .setup_clamp()
            .setup_single_issuer()
            .setup_defer_taskrun()
            .setup_taskrun_flag()
            .setup_submit_all()
            .build(entries)
        {
            Ok(u) => u,
            Err(_) => IoUring::builder().setup_clamp().build(entries)?,
        };
        Ok(Ring {
            uring,
            ops: Vec::new(),
            free_ops: Vec::new(),
            storage: 0,
            fixed: Vec::new(),
            cqes: Vec::new(),
            mailbox: Mailbox::new(),
            linked: 0,
            flushes: Vec::new(),
            flushes_spare: Vec::new(),
            link_next: Vec::new(),
            locals: HashMap::new(),
            owner: 0,
        })
    }

    /// Sets aside `slots` empty fixed-buffer slots for a pool's slabs, which are registered
    /// when first used (`fixed_slot`). Failure (a kernel before 5.13) is not fatal:
    /// operations then use ordinary buffers.
    pub fn reserve_fixed(&mut self, slots: u32) -> io::Result<()> {
        self.uring.submitter().register_buffers_sparse(slots)?;
        self.fixed = (0..slots).map(|_| Fixed::Empty).collect();
        Ok(())
    }

    /// The fixed-buffer slot `buf` may be used through, registering its slab on first use;
    /// None for heap buffers and slabs the kernel refused (a small RLIMIT_MEMLOCK).
    fn fixed_slot(&mut self, buf: &Buf) -> Option<u16> {
        let region = buf.region()?;
        let (slot, id) = (region.slot(), region.id());
        let entry = self.fixed.get_mut(slot as usize)?;
        match *entry {
            Fixed::Registered(held) if held == id => return Some(slot),
            Fixed::Refused(held) if held == id => return None,
            _ => {}
        }
        // SAFETY: the region stays mapped while any Buf from it exists (this one among
        // them), and the pool has `unfix` drop the registration before it unmaps a slab; a
        // later slab in this slot has another id and is registered again before use.
        match unsafe { self.uring.submitter().register_buffers_update(u32::from(slot), &[region.iovec()], None) } {
            Ok(()) => {
                *entry = Fixed::Registered(id);
                Some(slot)
            }
            Err(e) => {
                if !self.fixed.iter().any(|f| matches!(f, Fixed::Refused(_))) {
                    log::warn!("could not register I/O buffers ({e}); using unregistered buffers (raise RLIMIT_MEMLOCK to fix)");
                }
                self.fixed[slot as usize] = Fixed::Refused(id);
                None
            }
        }
    }

    /// Drops the registration of a slab the pool is about to unmap, so the kernel unpins
    /// its pages.
    pub fn unfix(&mut self, region: &Region) {
        let Some(entry) = self.fixed.get_mut(region.slot() as usize) else { return };
        match *entry {
            Fixed::Registered(id) if id == region.id() => {
                let empty = libc::iovec { iov_base: std::ptr::null_mut(), iov_len: 0 };
                // SAFETY: an empty entry names no memory.
                if let Err(e) = unsafe { self.uring.submitter().register_buffers_update(u32::from(region.slot()), &[empty], None) } {
                    log::debug!("could not unregister a buffer slab: {e}");
                }
            }
            Fixed::Refused(id) if id == region.id() => {}
            _ => return,
        }
        *entry = Fixed::Empty;
    }

    /// Operations the kernel holds.
    pub fn in_flight(&self) -> usize {
        self.ops.len() - self.free_ops.len()
    }

    /// Storage operations in flight, on the ring or parked: what a worker waits for when
    /// there are any, rather than its clients.
    pub fn storage_in_flight(&self) -> usize {
        self.storage + self.mailbox.parked() + self.linked
    }

    /// Names the worker this ring belongs to, for backends that keep something per worker.
    pub fn set_owner(&mut self, worker: usize) {
        self.owner = worker;
    }

    pub fn owner(&self) -> usize {
        self.owner
    }


    /// Operations parked by `defer` and not yet completed.
    pub fn deferred(&self) -> usize {
        self.mailbox.parked()
    }

    /// The eventfd that posts to the mailbox write to. The caller keeps a read of it in
    /// flight on this ring (the worker's wake-up read), so that a post ends `wait`.
    pub fn set_waker(&mut self, fd: Arc<OwnedFd>) {
        self.mailbox.set_waker(fd);
    }

    /// Parks a storage operation that another thread will carry out: the ring keeps `held`
    /// (a buffer stays on this thread), and the completer, which may go anywhere, completes
    /// it. Bytes it brings back are copied into a held buffer from byte `at` on. The
    /// operation then comes out of `wait` like any other.
    pub fn defer(&mut self, id: StorageId, held: Held, at: usize) -> Completer {
        self.mailbox.park(id, held, at, false)
    }

    /// Parks an operation as `defer` does, for a foreign library that reads or writes the
    /// held buffer through a raw pointer until it posts the completion. Should the ring go
    /// first (a worker stopping while the library still waits on its storage), the buffer
    /// is leaked, never freed under the library's feet.
    #[cfg_attr(not(feature = "rbd"), allow(dead_code))]
    pub(super) fn defer_lent(&mut self, id: StorageId, held: Held, at: usize) -> Completer {
        self.mailbox.park(id, held, at, true)
    }

    /// Receives into `buf[at..]`. With `wait_all`, MSG_WAITALL has the kernel go on
    /// receiving until the buffer is full before it completes (a kernel whose io_uring does
    /// not retry completes short, which the caller takes too): a 1 MiB write's payload then
    /// costs one completion, not one per burst of segments that arrived.
    pub fn recv(&mut self, fd: RawFd, buf: Buf, at: usize, conn: ConnId, wait_all: bool) {
        assert!(at < buf.len());
        // SAFETY: at < len, so the pointer stays inside the buffer.
        let ptr = unsafe { buf.ptr().add(at) };
        let len = (buf.len() - at) as u32;
        let flags = if wait_all { libc::MSG_WAITALL } else { 0 };
        let sqe = opcode::Recv::new(types::Fd(fd), ptr, len).flags(flags).build();
        self.push(sqe, Token::Recv { conn, buf });
    }

    /// Receives into `bytes[at..]`: for bytes that may cross threads (a TLS session's
    /// ciphertext), which a `Buf` cannot.
    pub fn recv_bytes(&mut self, fd: RawFd, mut bytes: Vec<u8>, at: usize, conn: ConnId) {
        assert!(at < bytes.len());
        let ptr = bytes[at..].as_mut_ptr();
        let len = (bytes.len() - at) as u32;
        let sqe = opcode::Recv::new(types::Fd(fd), ptr, len).build();
        self.push(sqe, Token::RecvBytes { conn, bytes });
    }

    /// Reads the worker's wake-up eventfd into the whole buffer.
    pub fn recv_wake(&mut self, fd: RawFd, buf: Buf) {
        let sqe = opcode::Read::new(types::Fd(fd), buf.ptr(), buf.len() as u32).offset(u64::MAX).build();
        self.push(sqe, Token::Wake { buf });
    }

    /// Sends the batch. With `wait_all`, MSG_WAITALL makes the kernel finish a partial send
    /// itself instead of completing early; a kTLS socket refuses that flag (EOPNOTSUPP), so
    /// its short sends complete and the caller sends the rest. MSG_MORE holds back a header
    /// whose data is spliced next.
    pub fn send(&mut self, fd: RawFd, mut batch: Box<SendBatch>, conn: ConnId, wait_all: bool) {
        let msg = batch.prepare();
        let mut flags = libc::MSG_NOSIGNAL;
        if wait_all {
            flags |= libc::MSG_WAITALL;
        }
        if batch.ends_with_splice() {
            flags |= libc::MSG_MORE;
        }
        let sqe = opcode::SendMsg::new(types::Fd(fd), msg).flags(flags as u32).build();
        self.push(sqe, Token::Send { conn, batch });
    }

    /// Moves up to `len` bytes waiting in `pipe` to the socket `fd`.
    pub fn splice_out(&mut self, pipe: Pipe, fd: RawFd, len: usize, conn: ConnId) {
        let sqe = splice(pipe.read_fd(), -1, fd, len);
        self.push(sqe, Token::SpliceOut { conn, pipe });
    }

    /// Moves up to `len` bytes at `offset` of file `fd` into `pipe`.
    pub fn splice_in(&mut self, fd: RawFd, offset: u64, pipe: Pipe, len: usize, id: StorageId) {
        let sqe = splice(fd, offset as i64, pipe.write_fd(), len);
        self.push(sqe, Token::Storage { id, held: Held::Pipe(pipe) });
    }

    /// Reads `len` bytes at file offset `offset` into `buf[at..at + len]`.
    pub fn read_at(&mut self, fd: RawFd, buf: Buf, at: usize, len: usize, offset: u64, id: StorageId) {
        assert!(at + len <= buf.len() && len <= u32::MAX as usize);
        // SAFETY: at + len <= buf.len(), checked above.
        let ptr = unsafe { buf.ptr().add(at) };
        let sqe = if let Some(slot) = self.fixed_slot(&buf) {
            opcode::ReadFixed::new(types::Fd(fd), ptr, len as u32, slot).offset(offset).build()
        } else {
            opcode::Read::new(types::Fd(fd), ptr, len as u32).offset(offset).build()
        };
        self.push(sqe, Token::Storage { id, held: Held::Buf(buf) });
    }

    /// Writes `buf[at..at + len]` at `offset`; `dsync` makes it durable before completing.
    #[allow(clippy::too_many_arguments)]
    pub fn write_at(&mut self, fd: RawFd, buf: Buf, at: usize, len: usize, offset: u64, dsync: bool, id: StorageId) {
        assert!(at + len <= buf.len() && len <= u32::MAX as usize);
        // SAFETY: at + len <= buf.len(), checked above.
        let ptr = unsafe { buf.ptr().add(at) } as *const u8;
        let flags = if dsync { libc::RWF_DSYNC } else { 0 };
        let sqe = if let Some(slot) = self.fixed_slot(&buf) {
            opcode::WriteFixed::new(types::Fd(fd), ptr, len as u32, slot).offset(offset).rw_flags(flags).build()
        } else {
            opcode::Write::new(types::Fd(fd), ptr, len as u32).offset(offset).rw_flags(flags).build()
        };
        self.push(sqe, Token::Storage { id, held: Held::Buf(buf) });
    }

    pub fn fdatasync(&mut self, fd: RawFd, id: StorageId) {
        let sqe = opcode::Fsync::new(types::Fd(fd)).flags(types::FsyncFlags::DATASYNC).build();
        self.push(sqe, Token::Storage { id, held: Held::Nothing });
    }

    pub fn fallocate(&mut self, fd: RawFd, mode: i32, offset: u64, len: u64, id: StorageId) {
        let sqe = opcode::Fallocate::new(types::Fd(fd), len).offset(offset).mode(mode).build();
        self.push(sqe, Token::Storage { id, held: Held::Nothing });
    }

    pub fn fadvise_willneed(&mut self, fd: RawFd, offset: u64, len: u64, id: StorageId) {
        let sqe = opcode::Fadvise::new(types::Fd(fd), len as libc::off_t, libc::POSIX_FADV_WILLNEED)
            .offset(offset)
            .build();
        self.push(sqe, Token::Storage { id, held: Held::Nothing });
    }

    /// Hands what is queued to the kernel, then spins for up to `budget` without sleeping
    /// until a completion is ready (for `wait` to collect at once). True when one is.
    pub fn spin(&mut self, budget: std::time::Duration) -> io::Result<bool> {
        self.flush_links();
        match self.uring.submit() {
            Ok(_) => {}
            Err(e) if matches!(e.raw_os_error(), Some(libc::EINTR) | Some(libc::EBUSY)) => {}
            Err(e) => return Err(e),
        }
        if self.mailbox.has_posts() {
            return Ok(true);
        }
        let start = std::time::Instant::now();
        loop {
            for _ in 0..BUSY_POLL_CHECKS_PER_CLOCK_READ {
                if self.uring.submission().taskrun() || !self.uring.completion().is_empty() {
                    return Ok(true);
                }
                std::hint::spin_loop();
            }
            if start.elapsed() >= budget {
                return Ok(false);
            }
            // A client on this CPU (a local benchmark, a co-located VM) must not wait for
            // the spin to end: let whatever else is runnable here go first.
            std::thread::yield_now();
        }
    }

    /// Submits everything queued, waits for at least one completion (or `timeout`), and
    /// appends all available completions to `out`.
    pub fn wait(&mut self, out: &mut Vec<Completion>, timeout: Option<std::time::Duration>) -> io::Result<()> {
        self.flush_links();
        // This thread's own posts are waiting: no sleep, but the kernel's completions
        // still collected.
        let timeout = if self.mailbox.has_posts() { Some(std::time::Duration::ZERO) } else { timeout };
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
        // After the kernel's completions: a post's wake-up read that completed above is
        // followed by taking that post here.
        self.mailbox.collect(out);
        Ok(())
    }

    fn finish(&mut self, cqe: &cqueue::Entry) -> Completion {
        let id = cqe.user_data() as u32;
        let token = self.ops[id as usize].take().expect("the kernel completes each submitted operation once");
        self.free_ops.push(id);
        if matches!(token, Token::Storage { .. }) {
            self.storage -= 1;
        }
        Completion { token, result: cqe.result() }
    }

    pub(super) fn push(&mut self, sqe: squeue::Entry, op: Token) {
        if matches!(op, Token::Storage { .. }) {
            self.storage += 1;
        }
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
            // SAFETY: every pointer in the entry refers to memory owned by the token in
            // `self.ops[id]` (a Buf, a Vec's heap block or a boxed SendBatch), which is kept until the completion
            // for `id` arrives; descriptors the entry names are kept open by the token (a
            // Pipe) or by the caller (sockets and files outlive the ring's operations).
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
        let cancel = opcode::AsyncCancel2::new(types::CancelBuilder::any()).build().user_data(CANCEL_USER_DATA);
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
                if cqe.user_data() != CANCEL_USER_DATA {
                    drop(self.finish(&cqe));
                }
            }
        }
        if self.in_flight() > 0 {
            // Leak rather than free memory the kernel may still write.
            for token in self.ops.drain(..).flatten() {
                std::mem::forget(token);
            }
        }
    }
}

fn splice(fd_in: RawFd, off_in: i64, fd_out: RawFd, len: usize) -> squeue::Entry {
    let len = len.min(u32::MAX as usize) as u32;
    opcode::Splice::new(types::Fd(fd_in), off_in, types::Fd(fd_out), -1, len).build()
}

#[cfg(test)]
mod tests {
    use std::os::fd::AsRawFd;
    use std::time::Duration;

    use sluice_proto::reply::Extent;

    use super::super::buffer::Pool;
    use super::super::mailbox::Payload;
    use super::super::op::Tag;
    use super::*;

    fn id(slot: u16) -> StorageId {
        StorageId { conn: ConnId(7), tag: Tag { slot, chunk: 0 } }
    }

    /// A ring whose mailbox wakes it through an eventfd read kept in flight, as a worker's does.
    fn ring_with_waker() -> (Ring, Arc<OwnedFd>) {
        let mut ring = Ring::new(8).unwrap();
        let fd = Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC).unwrap());
        ring.set_waker(Arc::clone(&fd));
        ring.recv_wake(fd.as_raw_fd(), Buf::heap(8));
        (ring, fd)
    }

    /// Waits for `n` storage completions, re-arming the wake-up read as the worker does.
    /// Every wait must end in something: a post that failed to wake the ring would leave
    /// it waiting out the (generous) timeout with nothing to show.
    fn storage_completions(ring: &mut Ring, fd: &OwnedFd, n: usize) -> Vec<(StorageId, Held, i32)> {
        let mut found = Vec::new();
        let mut batch = Vec::new();
        while found.len() < n {
            ring.wait(&mut batch, Some(Duration::from_secs(10))).unwrap();
            assert!(!batch.is_empty(), "a post did not wake the ring");
            for Completion { token, result } in batch.drain(..) {
                match token {
                    Token::Wake { buf } => ring.recv_wake(fd.as_raw_fd(), buf),
                    Token::Storage { id, held } => found.push((id, held, result)),
                    _ => unreachable!("only wake-ups and storage operations here"),
                }
            }
        }
        found
    }

    #[test]
    fn bytes_posted_from_another_thread_land_in_the_parked_buffer() {
        let (mut ring, fd) = ring_with_waker();
        let done = ring.defer(id(3), Held::Buf(Buf::heap(8192)), 4096);
        assert_eq!(ring.deferred(), 1);
        std::thread::spawn(move || done.complete(4, Payload::Pieces { pieces: vec![vec![1, 2, 3, 4]], spent: drop })).join().unwrap();
        let mut got = storage_completions(&mut ring, &fd, 1);
        let (sid, held, result) = got.pop().unwrap();
        assert_eq!((sid, result, ring.deferred()), (id(3), 4, 0));
        let Held::Buf(buf) = held else { panic!("the parked buffer comes back") };
        assert_eq!(&buf.as_slice()[4096..4100], &[1, 2, 3, 4]);
        assert!(buf.as_slice()[..4096].iter().chain(&buf.as_slice()[4100..]).all(|&b| b == 0));
    }

    #[test]
    fn pieces_land_one_after_another_and_too_many_bytes_fail() {
        let (mut ring, fd) = ring_with_waker();
        let done = ring.defer(id(3), Held::Buf(Buf::heap(8)), 1);
        done.complete(5, Payload::Pieces { pieces: vec![vec![1, 2], vec![], vec![3, 4, 5]], spent: drop });
        let (_, held, result) = storage_completions(&mut ring, &fd, 1).pop().unwrap();
        let Held::Buf(buf) = held else { panic!("the parked buffer comes back") };
        assert_eq!((result, buf.as_slice()), (5, &[0, 1, 2, 3, 4, 5, 0, 0][..]));
        if cfg!(debug_assertions) {
            // A poster's bug, which debug builds assert on; release builds answer EIO.
            return;
        }
        let done = ring.defer(id(4), Held::Buf(Buf::heap(4)), 1);
        done.complete(4, Payload::Pieces { pieces: vec![vec![1, 2], vec![3, 4]], spent: drop });
        let (_, _, result) = storage_completions(&mut ring, &fd, 1).pop().unwrap();
        assert_eq!(result, -libc::EIO);
    }

    #[test]
    fn posts_from_many_threads_each_arrive_once() {
        let (mut ring, fd) = ring_with_waker();
        let completers: Vec<_> = (0..64).map(|i| ring.defer(id(i), Held::Nothing, 0)).collect();
        let threads: Vec<_> = completers
            .into_iter()
            .enumerate()
            .map(|(i, done)| std::thread::spawn(move || done.complete(i as i32, Payload::Nothing)))
            .collect();
        let mut got = storage_completions(&mut ring, &fd, 64);
        threads.into_iter().for_each(|t| t.join().unwrap());
        got.sort_by_key(|(sid, _, _)| sid.tag.slot);
        for (i, (sid, _, result)) in got.iter().enumerate() {
            assert_eq!((sid.tag.slot as usize, *result as usize), (i, i));
        }
        assert_eq!(ring.deferred(), 0);
    }

    #[test]
    fn a_completer_dropped_unanswered_cancels_and_returns_what_was_parked() {
        let (mut ring, fd) = ring_with_waker();
        let done = ring.defer(id(1), Held::Extents(Vec::new()), 0);
        std::thread::spawn(move || drop(done)).join().unwrap();
        let (_, held, result) = storage_completions(&mut ring, &fd, 1).pop().unwrap();
        assert_eq!(result, -libc::ECANCELED);
        assert!(matches!(held, Held::Extents(_)));
    }

    #[test]
    fn extents_posted_replace_the_parked_list() {
        let (mut ring, fd) = ring_with_waker();
        let done = ring.defer(id(1), Held::Extents(Vec::new()), 0);
        let extents = vec![Extent { length: 512, flags: 3 }, Extent { length: 4096, flags: 0 }];
        let sent = extents.clone();
        std::thread::spawn(move || done.complete(0, Payload::Extents(sent))).join().unwrap();
        let (_, held, result) = storage_completions(&mut ring, &fd, 1).pop().unwrap();
        assert_eq!(result, 0);
        assert!(matches!(held, Held::Extents(e) if e == extents));
    }

    #[test]
    fn parked_buffers_go_with_the_ring_and_later_posts_are_dropped() {
        let mut pool = Pool::new(1 << 20, Duration::from_secs(1), Arc::default());
        let (mut ring, _fd) = ring_with_waker();
        let done = ring.defer(id(1), Held::Buf(pool.get(4096)), 0);
        assert_eq!(pool.bytes_out(), 4096);
        drop(ring);
        assert_eq!(pool.bytes_out(), 0, "the parked buffer went back to the pool with the ring");
        done.complete(4096, Payload::Pieces { pieces: vec![vec![9; 4096]], spent: drop });
    }

    /// Reads `len` bytes at `offset` of `file` into a fresh pool buffer through the ring.
    fn read_into_pool(ring: &mut Ring, fd: &OwnedFd, pool: &mut Pool, file: &std::fs::File, offset: u64) -> Buf {
        let buf = pool.get(4096);
        assert!(ring.fixed_slot(&buf).is_some(), "the slab is registered");
        ring.read_at(file.as_raw_fd(), buf, 0, 4096, offset, id(1));
        let (_, held, result) = storage_completions(ring, fd, 1).pop().unwrap();
        assert_eq!(result, 4096);
        let Held::Buf(buf) = held else { panic!("the buffer comes back") };
        buf
    }

    #[test]
    fn a_slab_given_back_and_mapped_again_is_registered_again() {
        use std::io::Write;
        use std::os::unix::fs::OpenOptionsExt;
        let dir = std::env::temp_dir();
        let mut file = std::fs::OpenOptions::new().read(true).write(true).custom_flags(libc::O_TMPFILE).open(dir).unwrap();
        let data: Vec<u8> = (0..8192u32).map(|i| (i * 7 % 251) as u8).collect();
        file.write_all(&data).unwrap();
        let quiet = Duration::from_secs(1);
        let mut pool = Pool::new(4 << 20, quiet, Arc::default());
        let (mut ring, fd) = ring_with_waker();
        ring.reserve_fixed(pool.slots()).unwrap();
        let first = read_into_pool(&mut ring, &fd, &mut pool, &file, 0);
        assert_eq!(first.as_slice(), &data[..4096]);
        let old_id = first.region().unwrap().id();
        drop(first);
        let t0 = std::time::Instant::now();
        pool.tick(t0, |r| ring.unfix(r));
        pool.tick(t0 + quiet, |r| ring.unfix(r));
        assert_eq!(pool.mapped_bytes(), 0);
        // The new slab takes the same slot (and often the same addresses): the read must
        // land in its pages, not in the old slab's.
        let second = read_into_pool(&mut ring, &fd, &mut pool, &file, 4096);
        assert_ne!(second.region().unwrap().id(), old_id);
        assert_eq!(second.as_slice(), &data[4096..]);
    }
}
