//! Pipes for the splice data path: file -> pipe -> socket without the CPU touching the
//! bytes. A worker keeps a bounded pool; a pipe that may still hold data is never reused.

use std::cell::Cell;
use std::io;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::rc::Rc;

/// One pipe sized to hold a whole chunk, so a file -> pipe splice never waits for a reader.
pub struct Pipe {
    /// Read and write ends; taken out only when the pipe goes back to the pool.
    fds: Option<(OwnedFd, OwnedFd)>,
    out: Rc<Cell<usize>>,
    /// What the pipe holds when every page in it is full.
    bytes: usize,
}

impl Pipe {
    /// The capacity the pool gave it: what it holds of whole pages.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn read_fd(&self) -> RawFd {
        self.fds.as_ref().expect("a live pipe has descriptors").0.as_raw_fd()
    }

    pub fn write_fd(&self) -> RawFd {
        self.fds.as_ref().expect("a live pipe has descriptors").1.as_raw_fd()
    }

    /// The read end, for system calls made directly.
    pub fn read_end(&self) -> BorrowedFd<'_> {
        self.fds.as_ref().expect("a live pipe has descriptors").0.as_fd()
    }

    /// The write end, for system calls made directly.
    pub fn write_end(&self) -> BorrowedFd<'_> {
        self.fds.as_ref().expect("a live pipe has descriptors").1.as_fd()
    }
}

impl Drop for Pipe {
    fn drop(&mut self) {
        self.out.set(self.out.get() - 1);
    }
}

/// A worker's pipes: at most `max` handed out at once, each with at least `bytes` capacity.
pub struct Pipes {
    free: Vec<(OwnedFd, OwnedFd)>,
    out: Rc<Cell<usize>>,
    max: usize,
    bytes: usize,
}

impl Pipes {
    /// Probes the largest pipe the system grants up to `bytes_wanted` (pipe-max-size bounds
    /// unprivileged users); every pipe of the pool then has that capacity.
    pub fn new(max: usize, bytes_wanted: usize) -> Pipes {
        let out = Rc::new(Cell::new(0));
        match make(bytes_wanted) {
            Ok((r, w, bytes)) => Pipes { free: vec![(r, w)], out, max, bytes },
            Err(e) => {
                log::warn!("cannot create pipes ({e}); spliced reads are copied instead");
                Pipes { free: Vec::new(), out, max: 0, bytes: 0 }
            }
        }
    }

    /// Capacity of every pipe in the pool; 0 when pipes are unavailable.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Pipes handed out and not yet returned or dropped.
    #[cfg(any(test, feature = "sim"))]
    pub fn in_use(&self) -> usize {
        self.out.get()
    }

    /// A pipe, or None when the pool is exhausted or the system refuses another.
    pub fn get(&mut self) -> Option<Pipe> {
        if self.out.get() >= self.max {
            return None;
        }
        let fds = match self.free.pop() {
            Some(p) => p,
            None => match make(self.bytes) {
                Ok((r, w, cap)) if cap >= self.bytes => (r, w),
                // Smaller than promised (the per-user pipe page limit): a chunk could block.
                _ => return None,
            },
        };
        self.out.set(self.out.get() + 1);
        Some(Pipe { fds: Some(fds), out: Rc::clone(&self.out), bytes: self.bytes })
    }

    /// Returns a pipe that was drained completely; anything else must simply be dropped.
    pub fn put(&mut self, mut pipe: Pipe) {
        if let Some(fds) = pipe.fds.take() {
            self.free.push(fds);
        }
    }
}

fn make(bytes: usize) -> io::Result<(OwnedFd, OwnedFd, usize)> {
    let (r, w) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let cap = match rustix::pipe::fcntl_setpipe_size(&w, bytes) {
        Ok(cap) => cap,
        Err(_) => rustix::pipe::fcntl_getpipe_size(&w)?,
    };
    Ok((r, w, cap))
}

/// Whether every page of `[offset, offset + len)` of `fd` is in the page cache, by the
/// cachestat system call (Linux 6.5+); None when the kernel cannot tell.
pub fn fully_cached(fd: BorrowedFd<'_>, offset: u64, len: usize) -> Option<bool> {
    #[repr(C)]
    struct Range {
        off: u64,
        len: u64,
    }
    #[repr(C)]
    #[derive(Default)]
    struct Stat {
        nr_cache: u64,
        nr_dirty: u64,
        nr_writeback: u64,
        nr_evicted: u64,
        nr_recently_evicted: u64,
    }
    /// The same number on every architecture: it was allocated after the tables merged.
    const SYS_CACHESTAT: libc::c_long = 451;
    const PAGE: u64 = crate::limits::PAGE_BYTES as u64;
    let range = Range { off: offset, len: len as u64 };
    let mut stat = Stat::default();
    // SAFETY: both pointers refer to live, properly laid out structs of this frame that the
    // kernel only reads (range) or writes (stat) during the call.
    let rc = unsafe { libc::syscall(SYS_CACHESTAT, fd.as_raw_fd(), &range as *const Range, &mut stat as *mut Stat, 0u32) };
    if rc != 0 {
        return None;
    }
    let pages = (offset + len as u64).div_ceil(PAGE) - offset / PAGE;
    Some(stat.nr_cache >= pages)
}

/// Moves up to `len` bytes at `offset` of `file` into `pipe` now, without waiting for the
/// pipe; meant for data already in the page cache.
pub fn splice_now(file: BorrowedFd<'_>, offset: u64, pipe: &Pipe, len: usize) -> io::Result<usize> {
    let mut off = offset;
    let n = rustix::pipe::splice(file, Some(&mut off), pipe.write_end(), None, len, rustix::pipe::SpliceFlags::NONBLOCK)?;
    Ok(n)
}

/// Moves what the socket takes at once of the `len` bytes waiting in `pipe`, without
/// waiting for room; `WouldBlock` when it takes nothing.
///
/// A splice through io_uring always runs on one of its worker threads, and that round trip
/// cost more than a copy for replies of a few hundred KiB. Done here it is one system call.
/// The socket is non-blocking only for this call: a splice handed to io_uring because the
/// socket was full must wait for room rather than fail, and a splice cannot be told alone
/// not to wait (SPLICE_F_NONBLOCK concerns the pipe). Nothing else that could wait acts on
/// the socket meanwhile: a connection has one send or splice at a time, and io_uring's own
/// receives and sends never read the flag (they ask not to wait themselves).
/// A splice to a reset socket raises SIGPIPE (splice has no MSG_NOSIGNAL); the `sluice`
/// binary ignores it, as every Rust program does, so the call fails with EPIPE.
pub fn splice_out_now(pipe: &Pipe, socket: BorrowedFd<'_>, len: usize) -> io::Result<usize> {
    rustix::io::ioctl_fionbio(socket, true)?;
    let moved = rustix::pipe::splice(pipe.read_end(), None, socket, None, len, rustix::pipe::SpliceFlags::NONBLOCK);
    if let Err(e) = rustix::io::ioctl_fionbio(socket, false) {
        // The bytes moved must still be counted. A later splice through the ring may then
        // fail with EAGAIN, which closes the connection rather than hanging it.
        log::warn!("could not make a socket blocking again after a splice: {e}");
    }
    Ok(moved?)
}

/// What `splice_in_now` did.
#[derive(Debug, PartialEq, Eq)]
pub enum SpliceIn {
    /// Moved this many bytes (at least one).
    Moved(usize),
    /// Nothing waits on the socket yet.
    Empty,
    /// Bytes wait on the socket and the pipe took none: it is full.
    Full,
    /// The peer closed the connection, with nothing left to read.
    Closed,
}

/// Moves up to `len` of the bytes waiting on `socket` into `pipe` now, waiting neither for
/// data nor for room, on a socket left blocking (the ring's receives wait whole on it).
///
/// A socket's data goes into a pipe by reference, page by page, so the CPU does not touch
/// it. A splice from a blocking socket waits only while it has moved nothing; asking for
/// no more than what waits (FIONREAD) means it never does. A pipe holds a number of pages,
/// and a socket's segments may split pages between them, so a pipe may fill before it
/// holds its capacity in bytes: `Full` says so, and the caller takes the rest another way.
pub fn splice_in_now(socket: BorrowedFd<'_>, pipe: &Pipe, len: usize) -> io::Result<SpliceIn> {
    let waiting = rustix::io::ioctl_fionread(socket)? as usize;
    if waiting == 0 {
        // Nothing to read: the peer closed it, or the data is still to come.
        let mut probe = [0u8; 1];
        return match rustix::net::recv(socket, &mut probe, rustix::net::RecvFlags::PEEK | rustix::net::RecvFlags::DONTWAIT) {
            Ok((0, _)) => Ok(SpliceIn::Closed),
            Ok(_) => Ok(SpliceIn::Empty),
            Err(e) if e == rustix::io::Errno::AGAIN => Ok(SpliceIn::Empty),
            Err(e) => Err(e.into()),
        };
    }
    match rustix::pipe::splice(socket, None, pipe.write_end(), None, len.min(waiting), rustix::pipe::SpliceFlags::NONBLOCK) {
        Ok(0) => Ok(SpliceIn::Full),
        Ok(n) => Ok(SpliceIn::Moved(n)),
        Err(e) if e == rustix::io::Errno::AGAIN => Ok(SpliceIn::Full),
        Err(e) => Err(e.into()),
    }
}

/// Copies `bytes` into `pipe`, which holds `held` bytes already; false, writing nothing,
/// unless it is empty and they fit (then the write cannot wait for a reader: it fills
/// whole pages of the pipe, and the pipe has enough).
pub fn write_into(pipe: &Pipe, held: usize, bytes: &[u8]) -> io::Result<bool> {
    if held > 0 || bytes.len() > pipe.bytes {
        return Ok(false);
    }
    let mut rest = bytes;
    while !rest.is_empty() {
        let n = rustix::io::write(pipe.write_end(), rest)?;
        rest = &rest[n..];
    }
    Ok(true)
}

/// Reads the `held` bytes in `pipe` into `into[..held]`, emptying it; fails, rather than
/// waits, if it holds fewer.
pub fn drain_into(pipe: &Pipe, held: usize, into: &mut [u8]) -> io::Result<()> {
    let inside = rustix::io::ioctl_fionread(pipe.read_end())? as usize;
    if inside < held {
        return Err(io::Error::other(format!("a pipe holds {inside} bytes, not {held}")));
    }
    let mut at = 0;
    while at < held {
        match rustix::io::read(pipe.read_end(), &mut into[at..held])? {
            0 => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "a pipe held less than was put in")),
            n => at += n,
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::os::unix::net::UnixStream;

    use super::*;

    fn blocking(socket: &UnixStream) -> bool {
        !rustix::fs::fcntl_getfl(socket).unwrap().contains(rustix::fs::OFlags::NONBLOCK)
    }

    #[test]
    fn splice_out_now_moves_what_fits_never_waits_and_leaves_the_socket_blocking() {
        let mut pipes = Pipes::new(1, 1 << 20);
        let Some(pipe) = pipes.get().filter(|_| pipes.bytes() >= 256 << 10) else {
            eprintln!("SKIP: this system grants no 256 KiB pipes");
            return;
        };
        let (ours, mut peer) = UnixStream::pair().unwrap();
        rustix::net::sockopt::set_socket_send_buffer_size(&ours, 16 << 10).unwrap();
        let data: Vec<u8> = (0..256u32 << 10).map(|i| (i * 7 + i / 4096) as u8).collect();
        let mut w = std::fs::File::from(pipe.write_end().try_clone_to_owned().unwrap());
        w.write_all(&data).unwrap();
        // The socket's buffer is much smaller than 256 KiB: the first call moves part, and
        // once the buffer is full the next one moves nothing and says so at once.
        let mut moved = splice_out_now(&pipe, ours.as_fd(), data.len()).unwrap();
        assert!(moved > 0 && moved < data.len(), "moved {moved}");
        assert!(blocking(&ours), "the socket is blocking again");
        let full = loop {
            match splice_out_now(&pipe, ours.as_fd(), data.len() - moved) {
                Ok(n) => moved += n,
                Err(e) => break e,
            }
        };
        assert_eq!(full.kind(), io::ErrorKind::WouldBlock);
        assert!(blocking(&ours), "the socket is blocking again after a refusal");
        // The peer reads; the rest goes, and every byte arrives once and in order.
        let reader = std::thread::spawn(move || {
            let mut got = vec![0u8; 256 << 10];
            peer.read_exact(&mut got).unwrap();
            got
        });
        while moved < data.len() {
            match splice_out_now(&pipe, ours.as_fd(), data.len() - moved) {
                Ok(n) => moved += n,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => panic!("{e}"),
            }
        }
        assert!(reader.join().unwrap() == data, "the bytes arrived as they were written");
    }

    /// A TCP connection over loopback: (ours, the peer's).
    fn tcp_pair() -> (std::net::TcpStream, std::net::TcpStream) {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let peer = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        (listener.accept().unwrap().0, peer)
    }

    /// Splices from `socket` into `pipe` until it moves nothing more: what it moved, and
    /// why it stopped. Waits for data to come (at most 10 s), never for the socket to close.
    fn splice_until_stopped(socket: &std::net::TcpStream, pipe: &Pipe, len: usize) -> (usize, SpliceIn) {
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut moved = 0;
        loop {
            match splice_in_now(socket.as_fd(), pipe, len - moved).unwrap() {
                SpliceIn::Moved(n) => moved += n,
                SpliceIn::Empty if moved < len => {
                    assert!(std::time::Instant::now() < until, "the data never came ({moved} of {len} bytes)");
                    std::thread::yield_now();
                }
                stop => return (moved, stop),
            }
            if moved == len {
                return (moved, SpliceIn::Moved(0));
            }
        }
    }

    /// Sends `data` from `peer` on a thread of its own, which then closes it.
    fn send_all(mut peer: std::net::TcpStream, data: Vec<u8>) -> std::thread::JoinHandle<()> {
        std::thread::spawn(move || peer.write_all(&data).unwrap())
    }

    #[test]
    fn splice_in_now_moves_what_waits_and_never_waits_itself() {
        let mut pipes = Pipes::new(1, 1 << 20);
        let Some(pipe) = pipes.get().filter(|_| pipes.bytes() >= 256 << 10) else {
            eprintln!("SKIP: this system grants no 256 KiB pipes");
            return;
        };
        let (ours, peer) = tcp_pair();
        assert_eq!(splice_in_now(ours.as_fd(), &pipe, 4096).unwrap(), SpliceIn::Empty, "nothing sent yet");
        assert!(!rustix::fs::fcntl_getfl(&ours).unwrap().contains(rustix::fs::OFlags::NONBLOCK), "the socket is blocking");
        let data: Vec<u8> = (0..100_000u32).map(|i| (i * 13 + i / 4096) as u8).collect();
        let sender = send_all(peer, data.clone());
        // Each call moves what waits, however much more it was asked for, and returns.
        let (moved, _) = splice_until_stopped(&ours, &pipe, data.len());
        assert_eq!(moved, data.len());
        sender.join().unwrap();
        let mut got = vec![0u8; data.len()];
        assert!(drain_into(&pipe, data.len() + 1, &mut got).is_err(), "more than it holds is refused, not waited for");
        drain_into(&pipe, data.len(), &mut got).unwrap();
        assert!(got == data, "the pipe holds the bytes in order");
        // The peer closed it; its FIN comes after the data, so the wait is bounded too.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let closed = loop {
            match splice_in_now(ours.as_fd(), &pipe, 4096).unwrap() {
                SpliceIn::Empty if std::time::Instant::now() < until => std::thread::yield_now(),
                other => break other,
            }
        };
        assert_eq!(closed, SpliceIn::Closed, "the peer closed it");
    }

    #[test]
    fn a_full_pipe_is_told_from_an_empty_socket_and_nothing_is_lost() {
        // One page: a socket's segment of any size takes all of it.
        let mut pipes = Pipes::new(1, 4096);
        let pipe = pipes.get().unwrap();
        let (mut ours, peer) = tcp_pair();
        let data: Vec<u8> = (0..256 << 10).map(|i: u32| (i * 7 + i / 999) as u8).collect();
        let sender = send_all(peer, data.clone());
        let (held, stop) = splice_until_stopped(&ours, &pipe, data.len());
        assert_eq!(stop, SpliceIn::Full, "data waits, and the pipe took {held} bytes");
        assert!(held > 0 && held < data.len(), "held {held}");
        // What the pipe has and what is still on the socket make up the data.
        let mut got = vec![0u8; data.len()];
        drain_into(&pipe, held, &mut got[..held]).unwrap();
        ours.read_exact(&mut got[held..]).unwrap();
        sender.join().unwrap();
        assert!(got == data, "every byte once, in order");
    }

    #[test]
    fn write_into_takes_bytes_only_into_an_empty_pipe_with_room() {
        let mut pipes = Pipes::new(1, 16 << 10);
        let pipe = pipes.get().unwrap();
        let big = vec![1u8; pipe.bytes() + 1];
        assert!(!write_into(&pipe, 0, &big).unwrap(), "more than the pipe holds");
        assert!(write_into(&pipe, 0, &[2u8; 5000]).unwrap());
        assert!(!write_into(&pipe, 5000, &[3u8; 10]).unwrap(), "a pipe that holds data already");
        let mut got = vec![0u8; 5000];
        drain_into(&pipe, 5000, &mut got).unwrap();
        assert!(got.iter().all(|&b| b == 2));
    }
}
