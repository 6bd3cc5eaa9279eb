//! Exports whose bytes live elsewhere: another NBD server (`nbd://`, `nbd+unix://`), or a
//! sluice pool (`pool:FILE`), or a cached volume (`cache:FILE`), all reached through
//! sluice's async client. The backend owns the client and a small tokio runtime. Each
//! operation is parked in the worker's ring, runs on the runtime, and comes back through
//! the ring's mailbox, so registered buffers never leave the worker: a write's payload is
//! copied out once before it goes, a read's data copied in once when it arrives. A remote
//! that fails fails only the requests on it.
//!
//! A plain remote server that allows multi-conn gets more: each worker opens a connection
//! of its own to it and carries its reads and writes there itself, on its ring (`link`),
//! with no thread hop and no copy of large data.

use std::future::Future;
use std::io;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sluice_client::{Address, Client, Error, Options, Uri};
use sluice_proto::reply::Extent;
use sluice_proto::wire::{CMD_FLUSH, CMD_READ, CMD_WRITE, STATE_HOLE, STATE_ZERO};
use tokio::runtime::Runtime;

use super::interface::{Backend, Caps, Outcome, StorageOp};
use super::links::Links;
use super::member_links::MemberLinks;
use crate::engine::{Completer, Held, Payload, Ring, StorageId};
use crate::errors::os_from_remote;
use crate::limits::{EXTENTS_PER_REPLY_MAX, REMOTE_CHUNK_COST_NS, REMOTE_CONNECTIONS, REMOTE_DISCONNECT_TIMEOUT_MS, REMOTE_RUNTIME_THREADS, REMOTE_STATUS_TIMEOUT_MS};

pub struct RemoteBackend {
    kind: &'static str,
    remote: Arc<Remote>,
    caps: Caps,
    runtime: Runtime,
    /// Each worker's own connection for reads and writes, where the remote allows them.
    links: Option<Links>,
    /// A pool's coordinator or a cached volume's core, driven by the workers themselves,
    /// and their own connections to its members.
    volume: Option<Arc<MemberLinks>>,
}

/// What the runtime's tasks share with the backend.
struct Remote {
    client: Client,
    spec: String,
    /// The connection to the remote failed and the log said so; its requests now fail
    /// one by one, quietly.
    lost: AtomicBool,
    /// The goodbye was said (at stop, or on drop).
    closed: AtomicBool,
}

impl Remote {
    /// A storage result from a client call that moved `n` bytes.
    fn result(&self, r: Result<usize, Error>) -> i32 {
        match r {
            Ok(n) => n.min(i32::MAX as usize) as i32,
            Err(e) => {
                let unreachable = matches!(e, Error::Io(_) | Error::Closed | Error::Protocol(_) | Error::Timeout);
                if unreachable && !self.lost.swap(true, Ordering::Relaxed) {
                    log::warn!("{}: {e}; requests to this export fail with EIO", self.spec);
                } else {
                    log::debug!("{}: request failed: {e}", self.spec);
                }
                -os_from_remote(&e)
            }
        }
    }

    /// The completion of a call that moves no data.
    fn done(&self, r: Result<(), Error>) -> (i32, Payload) {
        (self.result(r.map(|()| 0)), Payload::Nothing)
    }
}

impl RemoteBackend {
    /// Connects to `spec` (an NBD URI, or anything else `Uri::parse` takes), with several
    /// connections when the server allows multi-conn; a pool with members missing when
    /// `degraded` allows it.
    pub fn open(spec: &str, degraded: bool) -> io::Result<RemoteBackend> {
        let uri = Uri::parse(spec).map_err(open_error)?;
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(REMOTE_RUNTIME_THREADS)
            .thread_name("sluice-remote")
            .enable_all()
            .build()?;
        let options = Options { connections: REMOTE_CONNECTIONS, degraded, ..Options::default() };
        let client = runtime.block_on(Client::connect_with(&uri, &options)).map_err(open_error)?;
        let ex = client.export();
        let links = Links::new(&uri, spec, ex);
        let volume = client.direct().map(|direct| MemberLinks::new(direct, spec, runtime.handle().clone()));
        // A worker's own connection over TCP splices read data into pipes. A Unix socket
        // fails a splice into a full pipe with EFAULT, which cannot be told from a real
        // fault; a volume's members are reached otherwise.
        let splice = links.is_some() && volume.is_none() && matches!(uri.address, Address::Tcp { .. });
        let caps = Caps {
            splice,
            trim: ex.can_trim(),
            zero: ex.can_zero(),
            fua: ex.can_fua(),
            // Without base:allocation the client reports everything as data, which is true.
            extents: true,
            rotational: ex.rotational(),
            block_min: Some(ex.block_min).filter(|&b| b > 1),
            chunk_cost_ns: Some(REMOTE_CHUNK_COST_NS),
            ..Caps::default()
        };
        let kind = match uri.address {
            Address::Pool(_) => "pool",
            Address::Cache(_) => "cache",
            _ => "nbd",
        };
        log::debug!("{spec}: {} bytes over {} connection(s), flags {:#06x}", ex.size, client.connections(), ex.flags);
        let remote = Arc::new(Remote { client, spec: spec.to_owned(), lost: AtomicBool::new(false), closed: AtomicBool::new(false) });
        Ok(RemoteBackend { kind, remote, caps, runtime, links, volume })
    }

    /// The remote export refuses writes.
    pub fn read_only(&self) -> bool {
        self.remote.client.export().read_only()
    }

    /// The worker's own connection to the remote, for a request of `len` bytes at `offset`,
    /// if it has one up that takes it (`Links::get`).
    fn link(&self, ring: &mut Ring, offset: u64, len: usize) -> Option<std::rc::Rc<super::link::Link>> {
        self.links.as_ref()?.get(ring, offset, len, self.runtime.handle())
    }

    /// The pool or cached volume, for a request of `len` bytes at `offset` that it takes as
    /// one (as `Client::read_pieces` sends one).
    fn volume(&self, offset: u64, len: usize) -> Option<&Arc<MemberLinks>> {
        let ex = self.remote.client.export();
        self.volume.as_ref().filter(|_| len > 0 && len <= ex.request_max_bytes() as usize && ex.aligned(offset, len as u64))
    }

    /// Reads through the export's client. A pool's pieces come as its members sent them,
    /// and are copied into the parked buffer once, on the worker.
    fn read_by_client(&self, done: Completer, offset: u64, len: usize) {
        let remote = Arc::clone(&self.remote);
        self.spawn(done, async move {
            match remote.client.read_pieces(offset, len).await {
                Ok(pieces) => {
                    let n = pieces.iter().map(Vec::len).sum::<usize>() as i32;
                    (n, Payload::Pieces { pieces, spent: sluice_client::read_buffers::give_back })
                }
                Err(e) => (remote.result(Err(e)), Payload::Nothing),
            }
        });
    }

    /// Runs `work` on the runtime and completes the parked operation with what it returns.
    fn spawn(&self, done: Completer, work: impl Future<Output = (i32, Payload)> + Send + 'static) {
        self.runtime.spawn(async move {
            let (result, payload) = work.await;
            done.complete(result, payload);
        });
    }
}

/// Why a remote export did not open, keeping the kind of an error from the socket.
fn open_error(e: Error) -> io::Error {
    let kind = match &e {
        Error::Io(inner) => inner.kind(),
        Error::Uri(_) => io::ErrorKind::InvalidInput,
        Error::Timeout => io::ErrorKind::TimedOut,
        _ => io::ErrorKind::Other,
    };
    io::Error::new(kind, e)
}

/// Appends the client's extents as base:allocation descriptors (at most `one`, or the
/// reply's bound). The client never reports past the range asked for.
fn descriptors(found: Vec<sluice_client::Extent>, one: bool, len: u64, out: &mut Vec<Extent>) {
    let max = if one { 1 } else { EXTENTS_PER_REPLY_MAX };
    for e in found.into_iter().filter(|e| e.length > 0).take(max) {
        let flags = if e.hole { STATE_HOLE } else { 0 } | if e.zero { STATE_ZERO } else { 0 };
        out.push(Extent { length: e.length.min(len), flags });
    }
    if out.is_empty() {
        // Data is always a true answer.
        out.push(Extent { length: len, flags: 0 });
    }
}

impl Backend for RemoteBackend {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn close(&self) {
        self.goodbye();
    }

    fn pool_status(&self) -> Option<sluice_client::pool::Status> {
        self.remote.client.pool_status()
    }

    fn cache_status(&self) -> Option<sluice_client::cache::Status> {
        // The metrics thread asks; inside a runtime, blocking on another is not allowed.
        if self.kind != "cache" || tokio::runtime::Handle::try_current().is_ok() {
            return None;
        }
        let limit = Duration::from_millis(REMOTE_STATUS_TIMEOUT_MS);
        self.runtime.block_on(async { tokio::time::timeout(limit, self.remote.client.cache_status()).await.ok().flatten() })
    }

    fn pool_client(&self) -> Option<&sluice_client::Client> {
        (self.kind == "pool").then_some(&self.remote.client)
    }

    fn pool_grow(&self, uris: &[sluice_client::Uri]) -> Result<(), String> {
        // On the runtime the pool's member connections live on: the new ones must outlast
        // the call.
        self.runtime.block_on(self.remote.client.grow_pool(uris)).map_err(|e| e.to_string())
    }

    fn size(&self) -> u64 {
        self.remote.client.size()
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn pipe_share(&self) -> usize {
        self.links.as_ref().map_or(1, Links::pipe_share)
    }

    fn start(&self, op: StorageOp, id: StorageId, ring: &mut Ring) -> Option<Outcome> {
        let remote = Arc::clone(&self.remote);
        let ex = self.remote.client.export();
        match op {
            StorageOp::Read { offset, len, into: Held::Buf(buf), at, .. } => {
                if let Some(volume) = self.volume(offset, len) {
                    let done = ring.defer(id, Held::Buf(buf), at);
                    volume.submit(ring, CMD_READ, false, offset, len, None, done, move |r| remote.result(r.map(|()| 0)));
                    return None;
                }
                let buf = match self.link(ring, offset, len) {
                    Some(link) => match link.read(offset, len, buf, at, id, ring) {
                        Ok(()) => return None,
                        Err(buf) => buf,
                    },
                    None => buf,
                };
                let done = ring.defer(id, Held::Buf(buf), at);
                self.read_by_client(done, offset, len);
            }
            // Spliced from the worker's own connection when it is up.
            StorageOp::Read { offset, len, into: Held::Pipe(pipe), at, .. } => {
                let pipe = match self.link(ring, offset, len) {
                    Some(link) => match link.read_into_pipe(offset, len, pipe, at, id, ring) {
                        Ok(()) => return None,
                        Err(pipe) => pipe,
                    },
                    None => pipe,
                };
                if at > 0 {
                    // Data of an earlier part is in the pipe, and the export's client
                    // answers in a buffer. A link's reads are never short, so no caller
                    // continues one.
                    return Some(Outcome { result: -libc::EIO, held: Held::Pipe(pipe) });
                }
                // Until the worker's own connection is up: the data comes back in a buffer
                // in place of the pipe.
                let done = ring.defer(id, Held::Pipe(pipe), 0);
                self.read_by_client(done, offset, len);
            }
            StorageOp::Read { into, .. } => return Some(Outcome { result: -libc::EINVAL, held: into }),
            StorageOp::Write { offset, buf, at, len, fua, .. } => {
                let buf = match self.link(ring, offset, len) {
                    Some(link) => match link.write(offset, buf, at, len, fua, id, ring) {
                        Ok(()) => return None,
                        Err(buf) => buf,
                    },
                    None => buf,
                };
                // The one copy of a write: the buffer belongs to the worker thread.
                let data = buf.as_slice()[at..at + len].to_vec();
                let done = ring.defer(id, Held::Buf(buf), 0);
                if let Some(volume) = self.volume(offset, len) {
                    volume.submit(ring, CMD_WRITE, fua, offset, len, Some(data), done, move |r| remote.result(r.map(|()| len)));
                    return None;
                }
                self.spawn(done, async move {
                    let written = remote.client.write_owned(offset, data, fua).await;
                    (remote.result(written.map(|()| len)), Payload::Nothing)
                });
            }
            StorageOp::Flush => {
                // A remote without flush says its writes are durable when answered; the
                // client then sends nothing, and so must the link.
                if let Some(link) = ex.can_flush().then(|| self.link(ring, 0, 0)).flatten() {
                    if link.flush(id, ring) {
                        return None;
                    }
                }
                if let Some(volume) = self.volume.as_ref().filter(|_| ex.can_flush()) {
                    let done = ring.defer(id, Held::Nothing, 0);
                    volume.submit(ring, CMD_FLUSH, false, 0, 0, None, done, move |r| remote.result(r.map(|()| 0)));
                    return None;
                }
                self.spawn(ring.defer(id, Held::Nothing, 0), async move { remote.done(remote.client.flush().await) })
            }
            StorageOp::Trim { offset, len } => self.spawn(ring.defer(id, Held::Nothing, 0), async move {
                remote.done(remote.client.trim(offset, len, false).await)
            }),
            StorageOp::Zero { offset, len, may_trim, fast } => {
                if !ex.can_zero() || (fast && !ex.can_fast_zero()) {
                    // The emulation layer writes zeros instead, or fails a FAST_ZERO at once.
                    return Some(Outcome { result: -libc::EOPNOTSUPP, held: Held::Nothing });
                }
                let zero = async move { remote.done(remote.client.write_zeroes(offset, len, false, may_trim, fast).await) };
                self.spawn(ring.defer(id, Held::Nothing, 0), zero);
            }
            // A hint; a server without CACHE simply gets none.
            StorageOp::Cache { .. } if !ex.can_cache() => return Some(Outcome { result: 0, held: Held::Nothing }),
            StorageOp::Cache { offset, len } => self.spawn(ring.defer(id, Held::Nothing, 0), async move {
                remote.done(remote.client.cache(offset, len).await)
            }),
            StorageOp::Extents { offset, len, one, mut out } => {
                // Parked with an empty list, which comes back even if the call is cancelled.
                let done = ring.defer(id, Held::Extents(Vec::new()), 0);
                self.spawn(done, async move {
                    let found = remote.client.block_status(offset, len).await;
                    let (result, _) = remote.done(found.map(|found| descriptors(found, one, len, &mut out)));
                    (result, Payload::Extents(out))
                });
            }
        }
        None
    }
}

impl RemoteBackend {
    /// A clean goodbye, so the remote server logs no broken connection and a pool is
    /// released for the next coordinator; bounded, as the remote may be stalled. Once.
    fn goodbye(&self) {
        if self.remote.closed.swap(true, Ordering::SeqCst) {
            return;
        }
        if tokio::runtime::Handle::try_current().is_ok() {
            // Blocking inside another runtime is not allowed; the sockets just close.
            return;
        }
        let limit = Duration::from_millis(REMOTE_DISCONNECT_TIMEOUT_MS);
        let remote = Arc::clone(&self.remote);
        let _ = self.runtime.block_on(async move { tokio::time::timeout(limit, remote.client.disconnect()).await });
    }
}

impl Drop for RemoteBackend {
    fn drop(&mut self) {
        // Dropping the runtime then cancels whatever is left, and each cancelled operation
        // is answered (ECANCELED) to a ring that may no longer exist.
        self.goodbye();
    }
}
