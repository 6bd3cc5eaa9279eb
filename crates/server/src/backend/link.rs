//! A remote export's connection on one worker's ring, a *link*: negotiated on the remote
//! backend's runtime as the kernel's nbd driver negotiates one (simple replies only), then
//! driven by the worker that owns it, with no other thread between a request and its
//! reply. It carries reads, writes and flushes; everything else, and every request of a
//! worker whose link is not up, goes through the backend's client.
//!
//! A write's payload is sent from the request's own buffer. A read's data is received
//! straight into the request's buffer when much of it is still to come; replies and small
//! reads land in the link's receive buffer and are copied out from there. A read into a
//! pipe (the splice data path) has its data spliced from the socket into the pipe, by
//! reference, so that the worker passes it on to its client without touching it; while
//! such reads are what the link carries, it receives replies a header at a time, so that
//! their data stays on the socket for the splice. Requests started in one pass of the
//! worker leave in one send (`Ring::flush_later`).
//!
//! A link that fails (the remote closes it, an error, a reply that does not parse) fails
//! the requests on it with EIO, as a connection of the client does, says so once, and
//! takes no more: the worker goes back to the client.

use std::cell::{Cell, RefCell, RefMut};
use std::collections::VecDeque;
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use sluice_proto::link::{Event, Link as Replies};
use sluice_proto::wire::{CMD_DISC, CMD_FLAG_FUA, CMD_FLUSH, CMD_READ, CMD_WRITE, SIMPLE_REPLY_BYTES};
use sluice_proto::{Errno, RawRequest};

use crate::engine::{drain_into, splice_in_now, write_into, Buf, CarriedEnd, Completion, Held, LinkEnd, LinkIo, LinkOp, Part, Pipe, Ring, SendBatch, SpliceIn, StorageId, Token};
use crate::limits::{LINK_DIRECT_RECV_MIN_BYTES, LINK_RECV_BYTES, LINK_SEND_PARTS_MAX, SOCKET_SPLICE_PIPE_SHARE_MAX};

pub struct Link {
    /// Shared with the `Links` that opened it, which can cut it from any thread.
    fd: Arc<OwnedFd>,
    /// The remote, for the log.
    spec: Arc<str>,
    worker: usize,
    /// Set once the link failed, for the backend choosing a path.
    dead: Cell<bool>,
    /// Set when its `Links` were cut (the volume dropped the member): its end is expected,
    /// and logged as a debug line.
    cut: Arc<AtomicBool>,
    /// The share of a pipe a spliced read's chunk may fill (1/N), shared by every link to
    /// the remote: doubled when a pipe fills early.
    pipe_share: Arc<AtomicUsize>,
    inner: RefCell<Inner>,
}

struct Inner {
    replies: Replies,
    /// One entry per slot of `replies`.
    waiting: Vec<Option<Waiting>>,
    /// Where replies are received; None while the kernel has it.
    staging: Option<Buf>,
    /// The slot whose read's buffer a receive has, when one does.
    direct: Option<u32>,
    receiving: bool,
    /// Requests gathered for the next send, and the batch, which a send in flight has.
    queued: VecDeque<Part>,
    batch: Option<Box<SendBatch>>,
    flush_asked: bool,
    dead: bool,
    /// The last read or write started was a read into a pipe: replies are received a
    /// header at a time.
    splicing: bool,
    /// Said in the log once: the link spliced a read.
    said_splicing: bool,
}

/// Who waits for an operation sent over a link.
pub enum To {
    /// A connection's request.
    Storage(StorageId),
    /// Someone else on the worker (a pool's member operation).
    Carried(Box<dyn CarriedEnd>),
}

/// An operation sent over the link and not yet handed back.
struct Waiting {
    to: To,
    /// A read's buffer, or a write's once its payload is sent; None while the kernel has it.
    buf: Option<Buf>,
    /// A read's pipe, which holds `at` bytes before its data. The link keeps it throughout.
    pipe: Option<Pipe>,
    /// The operation has a buffer (a read or write; a flush has none).
    holds: bool,
    /// Where the range starts in the buffer.
    at: usize,
    len: usize,
    /// What the operation completes with, once the remote answered (or the link failed).
    answer: Option<i32>,
}

impl Link {
    /// A link over `fd`, a socket the handshake left ready for transmission with simple
    /// replies; `begin` starts it on its worker's ring.
    pub fn new(fd: Arc<OwnedFd>, spec: Arc<str>, worker: usize, cut: Arc<AtomicBool>, pipe_share: Arc<AtomicUsize>) -> Rc<Link> {
        let inner = Inner {
            replies: Replies::new(),
            waiting: Vec::new(),
            staging: Some(Buf::heap(LINK_RECV_BYTES)),
            direct: None,
            receiving: false,
            queued: VecDeque::new(),
            batch: Some(SendBatch::new(LINK_SEND_PARTS_MAX)),
            flush_asked: false,
            dead: false,
            splicing: false,
            said_splicing: false,
        };
        Rc::new(Link { fd, spec, worker, dead: Cell::new(false), cut, pipe_share, inner: RefCell::new(inner) })
    }

    /// Starts receiving, on the ring of the worker the link belongs to.
    pub fn begin(self: &Rc<Self>, ring: &mut Ring) {
        let (mut next, mut done) = (Vec::new(), Vec::new());
        self.receive_next(&mut self.lock(), &mut next, &mut done);
        debug_assert!(done.is_empty(), "nothing waits on a link before it begins");
        let link = Rc::clone(self) as Rc<dyn LinkEnd>;
        for io in next {
            ring.link_io(&link, io);
        }
    }

    pub fn is_dead(&self) -> bool {
        self.dead.get()
    }

    /// Sends a read of `len` bytes at `offset` into `buf[at..]`; the buffer comes back
    /// when the link has failed, for the caller to take another way.
    pub fn read(self: &Rc<Self>, offset: u64, len: usize, buf: Buf, at: usize, id: StorageId, ring: &mut Ring) -> Result<(), Buf> {
        self.start(CMD_READ, 0, offset, Some(buf), at, len, To::Storage(id), ring).map_err(|(b, _)| b.expect("the read's buffer"))
    }

    /// Sends a read of `len` bytes at `offset` whose data is spliced into `pipe`, after the
    /// `at` bytes it holds; the pipe comes back when the link has failed.
    pub fn read_into_pipe(self: &Rc<Self>, offset: u64, len: usize, pipe: Pipe, at: usize, id: StorageId, ring: &mut Ring) -> Result<(), Pipe> {
        let op = (CMD_READ, 0, offset, len, at);
        self.start_with(op, None, Some(pipe), To::Storage(id), ring).map_err(|(_, p, _)| p.expect("the read's pipe"))
    }

    /// Sends a write of `buf[at..at + len]` at `offset`, as `read` does.
    #[allow(clippy::too_many_arguments)]
    pub fn write(self: &Rc<Self>, offset: u64, buf: Buf, at: usize, len: usize, fua: bool, id: StorageId, ring: &mut Ring) -> Result<(), Buf> {
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        self.start(CMD_WRITE, flags, offset, Some(buf), at, len, To::Storage(id), ring).map_err(|(b, _)| b.expect("the write's buffer"))
    }

    /// Sends a flush; false when the link has failed. Under multi-conn it covers the
    /// writes answered on every connection to the remote, not just this one.
    pub fn flush(self: &Rc<Self>, id: StorageId, ring: &mut Ring) -> bool {
        self.start(CMD_FLUSH, 0, 0, None, 0, 0, To::Storage(id), ring).is_ok()
    }

    /// Sends an operation of `kind` (read, write or flush) for `to`: a read's data goes to
    /// `buf[at..at + len]`, a write's comes from there. When the link has failed, all
    /// comes back.
    #[allow(clippy::too_many_arguments)]
    pub fn start(self: &Rc<Self>, kind: u16, flags: u16, offset: u64, buf: Option<Buf>, at: usize, len: usize, to: To, ring: &mut Ring) -> Result<(), (Option<Buf>, To)> {
        self.start_with((kind, flags, offset, len, at), buf, None, to, ring).map_err(|(b, _, to)| (b, to))
    }

    /// Sends `op` (kind, flags, offset, length, and where its data starts in its buffer or
    /// pipe) for `to`; when the link has failed, all comes back.
    fn start_with(self: &Rc<Self>, op: (u16, u16, u64, usize, usize), buf: Option<Buf>, pipe: Option<Pipe>, to: To, ring: &mut Ring) -> Result<(), (Option<Buf>, Option<Pipe>, To)> {
        let mut g = self.lock();
        if g.dead {
            return Err((buf, pipe, to));
        }
        let (kind, flags, offset, len, at) = op;
        let length = u32::try_from(len).expect("a request's length fits in 32 bits");
        let (slot, head) = g.replies.request(kind, flags, offset, length);
        if kind == CMD_READ || kind == CMD_WRITE {
            g.splicing = pipe.is_some();
        }
        if g.splicing && !std::mem::replace(&mut g.said_splicing, true) {
            log::debug!("{}: worker {} splices read data from its own connection", self.spec, self.worker);
        }
        let holds = buf.is_some();
        let (part, kept) = if kind == CMD_WRITE {
            (Part::window(slot, &head, buf, at, len, Vec::new()), None)
        } else {
            (Part::new(slot, &head, None, Vec::new()), buf)
        };
        let i = slot as usize;
        if g.waiting.len() <= i {
            g.waiting.resize_with(i + 1, || None);
        }
        g.waiting[i] = Some(Waiting { to, buf: kept, pipe, holds, at, len, answer: None });
        g.queued.push_back(part);
        ring.link_started();
        if !g.flush_asked {
            g.flush_asked = true;
            ring.flush_later(Rc::clone(self) as Rc<dyn LinkEnd>);
        }
        Ok(())
    }

    fn lock(&self) -> RefMut<'_, Inner> {
        self.inner.borrow_mut()
    }

    /// Hands what is queued to one send, unless a send is in flight (its completion sends
    /// the rest).
    fn send_queued(&self, g: &mut Inner, next: &mut Vec<LinkIo>) {
        if g.dead || g.queued.is_empty() {
            return;
        }
        let Some(mut batch) = g.batch.take() else { return };
        while !batch.is_full() {
            match g.queued.pop_front() {
                Some(p) => batch.push(p),
                None => break,
            }
        }
        next.push(LinkIo::Send { batch });
    }

    /// Keeps one receive in flight: straight into a read's buffer when much of its data is
    /// still to come and none is in hand, else into the receive buffer. A read into a pipe
    /// has its data spliced in first, as much as waits, until it is all there (or the
    /// socket has no more yet: then the link waits for it to be readable).
    fn receive_next(&self, g: &mut Inner, next: &mut Vec<LinkIo>, done: &mut Vec<Completion>) {
        while !g.dead && !g.receiving {
            match g.replies.data_wanted() {
                Some((slot, at, left)) if g.waiting[slot as usize].as_ref().is_some_and(|w| w.pipe.is_some()) => {
                    if let Err(why) = self.splice_in(g, slot, at as usize, left as usize, next, done) {
                        self.fail(g, &why, done);
                    }
                }
                wanted => self.post_receive(g, wanted, next),
            }
        }
    }

    fn post_receive(&self, g: &mut Inner, wanted: Option<(u32, u32, u32)>, next: &mut Vec<LinkIo>) {
        g.receiving = true;
        if let Some((slot, at, left)) = wanted.filter(|w| w.2 as usize >= LINK_DIRECT_RECV_MIN_BYTES) {
            let w = g.waiting[slot as usize].as_mut().expect("a read in flight waits");
            let buf = w.buf.take().expect("a read's buffer is with the link while its data comes");
            g.direct = Some(slot);
            return next.push(LinkIo::Recv { buf, at: w.at + at as usize, len: left as usize, wait_all: true });
        }
        let staging = g.staging.take().expect("one receive at a time");
        // A header alone leaves a spliced read's data on the socket.
        let (len, wait_all) = if g.splicing && wanted.is_none() { (SIMPLE_REPLY_BYTES, true) } else { (LINK_RECV_BYTES, false) };
        next.push(LinkIo::Recv { buf: staging, at: 0, len, wait_all });
    }

    /// Splices what waits of `slot`'s data (`at` of it in, `left` to come) into its pipe.
    fn splice_in(&self, g: &mut Inner, slot: u32, at: usize, left: usize, next: &mut Vec<LinkIo>, done: &mut Vec<Completion>) -> Result<(), String> {
        let w = g.waiting[slot as usize].as_mut().expect("a read in flight waits");
        let pipe = w.pipe.as_ref().expect("checked by the caller");
        match splice_in_now(self.fd.as_fd(), pipe, left).map_err(|e| format!("splice: {e}"))? {
            SpliceIn::Moved(n) => {
                if let Some(Event::Done { slot, error }) = g.replies.landed(n as u32) {
                    answer(g, slot, error, done);
                }
            }
            SpliceIn::Empty => {
                g.receiving = true;
                next.push(LinkIo::Readable);
            }
            SpliceIn::Full => {
                let held = w.at + at;
                unpipe(w, held)?;
                self.filled_early();
            }
            SpliceIn::Closed => return Err("the remote closed it".into()),
        }
        Ok(())
    }

    /// Takes the `n` bytes just received into `staging`: data copied to its reads, answers
    /// to their operations. A reply that does not parse fails the link.
    fn take_staged(&self, g: &mut Inner, staging: &Buf, n: usize, done: &mut Vec<Completion>) -> Result<(), String> {
        let input = &staging.as_slice()[..n];
        let mut pos = 0;
        loop {
            let (used, event) = g.replies.take(&input[pos..]).map_err(|e| e.to_string())?;
            match event {
                Some(Event::Data { slot, at, len }) => {
                    let w = g.waiting[slot as usize].as_mut().expect("a read in flight waits");
                    let to = w.at + at as usize;
                    let data = &input[pos..pos + used];
                    let filled = match &w.pipe {
                        Some(pipe) if write_into(pipe, to, data).map_err(|e| format!("a pipe: {e}"))? => {
                            pos += used;
                            continue;
                        }
                        Some(_) => {
                            unpipe(w, to)?;
                            true
                        }
                        None => false,
                    };
                    let buf = w.buf.as_mut().expect("a read's buffer is with the link while its data comes");
                    buf.as_mut_slice()[to..to + len as usize].copy_from_slice(data);
                    if filled {
                        self.filled_early();
                    }
                }
                Some(Event::Done { slot, error }) => answer(g, slot, error, done),
                None if used == 0 => return Ok(()),
                None => {}
            }
            pos += used;
        }
    }

    /// A read's pipe filled before all its data came: later reads' chunks get half the
    /// share of a pipe they had, down to the least.
    fn filled_early(&self) {
        let doubled = |n: usize| (n < SOCKET_SPLICE_PIPE_SHARE_MAX).then_some(n * 2);
        if let Ok(was) = self.pipe_share.fetch_update(Ordering::Relaxed, Ordering::Relaxed, doubled) {
            let (spec, worker, now) = (&self.spec, self.worker, was * 2);
            log::info!("{spec}: worker {worker}: a read's pipe filled before all its data came (the remote's segments cut pages finely), and took the rest in a buffer; spliced reads now fill 1/{now} of a pipe");
        }
    }

    /// Ends the link: every operation on it fails with EIO as soon as the kernel has given
    /// back its buffer. Said once.
    fn fail(&self, g: &mut Inner, why: &str, done: &mut Vec<Completion>) {
        let failed = g.replies.fail_all();
        if !g.dead {
            g.dead = true;
            self.dead.set(true);
            let (spec, worker, n) = (&self.spec, self.worker, failed.len());
            let level = if self.cut.load(Ordering::Relaxed) { log::Level::Debug } else { log::Level::Warn };
            log::log!(level, "{spec}: the connection of worker {worker} failed ({why}); requests on it failed with EIO: {n}; the worker's next ones go through the export's other connections");
            // Whatever the kernel still has on the socket ends now.
            let _ = rustix::net::shutdown(&self.fd, rustix::net::Shutdown::Both);
        }
        for part in std::mem::take(&mut g.queued) {
            sent(g, part, done);
        }
        for slot in failed {
            let w = g.waiting[slot as usize].as_mut().expect("a request in flight waits");
            w.answer = Some(-libc::EIO);
            finish_if_ready(g, slot, done);
        }
    }
}

/// A read's pipe cannot take the rest of its data: what it holds (`held` bytes) moves to a
/// buffer (a copy), where the rest is received as for a read into a buffer. A pipe fills
/// early when the socket's segments cut pages finer than the chunk's share of a pipe
/// allows for (`Link::pipe_share`, which the caller then halves).
fn unpipe(w: &mut Waiting, held: usize) -> Result<(), String> {
    let pipe = w.pipe.take().expect("a read into a pipe");
    let mut buf = Buf::heap(w.at + w.len);
    let drained = drain_into(&pipe, held, &mut buf.as_mut_slice()[..held]);
    w.buf = Some(buf);
    w.holds = true;
    drained.map_err(|e| format!("a pipe: {e}"))
}

/// The remote answered `slot`.
fn answer(g: &mut Inner, slot: u32, error: u32, done: &mut Vec<Completion>) {
    let w = g.waiting[slot as usize].as_mut().expect("an answered request waits");
    w.answer = Some(if error == 0 { w.len as i32 } else { -Errno::from_code(error).map_or(libc::EIO, |e| e.code() as i32) });
    finish_if_ready(g, slot, done);
}

/// A part left the link (sent, or never to be): a write's buffer is back.
fn sent(g: &mut Inner, part: Part, done: &mut Vec<Completion>) {
    if let Some(buf) = part.data {
        let w = g.waiting[part.tag as usize].as_mut().expect("a write being sent waits");
        w.buf = Some(buf);
        finish_if_ready(g, part.tag, done);
    }
}

/// Completes `slot`'s operation once it is answered and its buffer is back.
fn finish_if_ready(g: &mut Inner, slot: u32, done: &mut Vec<Completion>) {
    let i = slot as usize;
    if !g.waiting[i].as_ref().is_some_and(|w| w.answer.is_some() && (w.buf.is_some() || !w.holds)) {
        return;
    }
    let w = g.waiting[i].take().expect("checked above");
    g.replies.release(slot);
    let held = match (w.buf, w.pipe) {
        (Some(buf), _) => Held::Buf(buf),
        (None, Some(pipe)) => Held::Pipe(pipe),
        (None, None) => Held::Nothing,
    };
    let token = match w.to {
        To::Storage(id) => Token::Storage { id, held },
        To::Carried(end) => Token::Carried { end, held },
    };
    done.push(Completion { token, result: w.answer.expect("checked above") });
}

impl LinkEnd for Link {
    fn fd(&self) -> RawFd {
        self.fd.as_raw_fd()
    }

    fn completed(&self, op: LinkOp, result: i32, next: &mut Vec<LinkIo>, done: &mut Vec<Completion>) {
        let mut g = self.lock();
        match op {
            LinkOp::Send { mut batch } => {
                if result < 0 {
                    batch.drain(|p| sent(&mut g, p, done));
                    g.batch = Some(batch);
                    let why = format!("send: {}", std::io::Error::from_raw_os_error(-result));
                    return self.fail(&mut g, &why, done);
                }
                batch.consume(result as usize, |p| sent(&mut g, p, done));
                if !batch.is_empty() && !g.dead {
                    // A short send: the rest goes first.
                    return next.push(LinkIo::Send { batch });
                }
                batch.drain(|p| sent(&mut g, p, done));
                g.batch = Some(batch);
                self.send_queued(&mut g, next);
            }
            LinkOp::Recv { buf } => {
                g.receiving = false;
                let outcome = match g.direct.take() {
                    Some(slot) => {
                        let w = g.waiting[slot as usize].as_mut().expect("a read in flight waits");
                        w.buf = Some(buf);
                        if g.dead || result <= 0 {
                            // Failed already, waiting only for this buffer; or failing below.
                            finish_if_ready(&mut g, slot, done);
                        } else if let Some(Event::Done { slot, error }) = g.replies.landed(result as u32) {
                            answer(&mut g, slot, error, done);
                        }
                        Ok(())
                    }
                    None => {
                        let r = if result > 0 && !g.dead { self.take_staged(&mut g, &buf, result as usize, done) } else { Ok(()) };
                        g.staging = Some(buf);
                        r
                    }
                };
                let why = match (outcome, result) {
                    // Ended already: by its failure, or from outside (`Kept` dropped, the
                    // socket cut). Whatever still waits fails now, its buffers being back.
                    (_, _) if g.dead => "ended".to_string(),
                    (Err(e), _) => e,
                    (Ok(()), 0) => "the remote closed it".to_string(),
                    (Ok(()), r) if r < 0 => format!("receive: {}", std::io::Error::from_raw_os_error(-r)),
                    (Ok(()), _) => return self.receive_next(&mut g, next, done),
                };
                self.fail(&mut g, &why, done);
            }
            LinkOp::Readable => {
                g.receiving = false;
                match result {
                    _ if g.dead => self.fail(&mut g, "ended", done),
                    r if r < 0 => self.fail(&mut g, &format!("poll: {}", std::io::Error::from_raw_os_error(-r)), done),
                    _ => self.receive_next(&mut g, next, done),
                }
            }
        }
    }

    fn flush(&self, next: &mut Vec<LinkIo>) {
        let mut g = self.lock();
        g.flush_asked = false;
        self.send_queued(&mut g, next);
    }
}

/// What a worker keeps of its link (`Ring::set_local`), or that it has none and will have
/// none. Dropped when the link failed, when its backend is gone, or with the ring, it ends
/// the link (quietly, with NBD_CMD_DISC if the socket takes it at once) so that its
/// receive, always in flight, comes back and the link goes. No request is in flight on it
/// then but at the ring's drop, when nothing is waiting for them any more: a connection's
/// requests hold its export, and so the backend.
pub struct Kept(pub(super) Option<Rc<Link>>);

impl Drop for Kept {
    fn drop(&mut self) {
        let Some(link) = &self.0 else { return };
        if !link.dead.replace(true) {
            let mut g = link.lock();
            g.dead = true;
            // Not in the middle of a request's bytes: a send the ring cancelled may have
            // stopped inside a write's payload, where DISC would pass for data.
            if g.batch.is_some() {
                let disc = RawRequest { flags: 0, kind: CMD_DISC, handle: 0, offset: 0, length: 0 }.encode();
                let _ = rustix::net::send(&link.fd, &disc, rustix::net::SendFlags::DONTWAIT | rustix::net::SendFlags::NOSIGNAL);
            }
            let _ = rustix::net::shutdown(&link.fd, rustix::net::Shutdown::Both);
        }
    }
}
