//! Typed operation ids: what each in-flight ring operation is for, together with what it
//! owns on the kernel's behalf. The ring keys its own slab by a plain index; everything the
//! worker needs to route a completion comes back in a `Token`, by type, so no completion is
//! decoded from packed bits or unwrapped on the assumption of a shape.

use std::rc::Rc;

use sluice_proto::reply::Extent;

use super::buffer::Buf;
use super::pipe::Pipe;
use super::send::SendBatch;

/// A connection's place in its worker's table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct ConnId(pub u32);

/// A storage operation of one request: the request's slot on its connection, and which
/// piece of it (a read's chunk; 0 for everything else).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Tag {
    pub slot: u16,
    pub chunk: u16,
}

/// A storage operation anywhere in the worker: its connection and its tag there.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StorageId {
    pub conn: ConnId,
    pub tag: Tag,
}

/// What a storage operation carries to the backend and back: the buffer it reads into or
/// writes from, the pipe it splices into, or the extents it reports.
#[derive(Default)]
pub enum Held {
    #[default]
    Nothing,
    Buf(Buf),
    Pipe(Pipe),
    Extents(Vec<Extent>),
}

/// An operation in flight, with the memory and descriptors the kernel may use until it
/// completes.
pub enum Token {
    /// The worker's wake-up eventfd read.
    Wake { buf: Buf },
    Recv { conn: ConnId, buf: Buf },
    /// A TLS connection's ciphertext arriving.
    RecvBytes { conn: ConnId, bytes: Vec<u8> },
    Send { conn: ConnId, batch: Box<SendBatch> },
    /// Reply data moving from a pipe to the socket.
    SpliceOut { conn: ConnId, pipe: Pipe },
    Storage { id: StorageId, held: Held },
    /// A backend's own connection driven on this ring (a remote export's link).
    Link { link: Rc<dyn LinkEnd>, op: LinkOp },
    /// A link's operation done for someone other than a connection's request (a pool's
    /// member operation): never in the kernel, only handed from the link to the worker.
    Carried { end: Box<dyn CarriedEnd>, held: Held },
}

/// Whoever waits for a link's operation that is not a connection's request.
pub trait CarriedEnd {
    /// The operation finished with `result` (bytes, or -errno) and gave back `held`.
    /// `ring` is the worker's `Ring`, which may start more: passed as `Any` because the
    /// operations a ring holds cannot name the ring.
    fn done(self: Box<Self>, result: i32, held: Held, ring: &mut dyn std::any::Any);
    /// Itself, for an owner taking it back from a link that did not take it.
    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any>;
}

/// What a link's operation holds while the kernel has it.
pub enum LinkOp {
    /// Replies arriving, into the link's own buffer or straight into a read's.
    Recv { buf: Buf },
    /// Requests, and write payloads, leaving.
    Send { batch: Box<SendBatch> },
    /// Waiting for the socket to have something to read (data spliced out of it).
    Readable,
}

/// What a link asks its ring to do next.
pub enum LinkIo {
    /// Receive into `buf[at..at + len]`; with `wait_all`, until all of it is there.
    Recv { buf: Buf, at: usize, len: usize, wait_all: bool },
    /// Send the batch whole.
    Send { batch: Box<SendBatch> },
    /// Tell when the socket has something to read, or is closed.
    Readable,
}

/// A connection a backend keeps on a worker's ring (and nowhere else: it lives and dies on
/// that worker's thread), driven like a connection's core: it hears of its operations'
/// completions and says what to do next, and sends what it gathered when the ring is
/// about to submit, so that every request started in one pass of the worker leaves in
/// one send.
pub trait LinkEnd {
    /// The socket the link's operations use.
    fn fd(&self) -> std::os::fd::RawFd;
    /// One of the link's operations finished: what to do next goes to `next`, and the
    /// storage operations it thereby finished to `done`, each to be counted off with
    /// `Ring::link_finished`.
    fn completed(&self, op: LinkOp, result: i32, next: &mut Vec<LinkIo>, done: &mut Vec<Completion>);
    /// What was gathered since the link asked for a flush (`Ring::flush_later`).
    fn flush(&self, next: &mut Vec<LinkIo>);
}

/// A finished operation: its token back, and the kernel's result (bytes, or -errno).
pub struct Completion {
    pub token: Token,
    pub result: i32,
}
