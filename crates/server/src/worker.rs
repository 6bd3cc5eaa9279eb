//! A worker thread: one ring, one buffer pool, one byte budget, and the connections handed
//! to it. It routes each completion to its connection's core, carries out the operations
//! the core asks for (socket operations on the ring, storage operations through the
//! export's backend; a splice to the socket, or a storage operation, that can be done at
//! once without waiting is done here), and never blocks except in the ring's wait.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_ktls::sys::ktls_send_record;
use sluice_proto::Session;

use crate::access::Client;
use crate::admission::{Budget, Permit};
use crate::busy_poll::Waits;
use crate::conn::{Conn, Env, Io, Shutdown};
use crate::engine::{splice_out_now, unacked_bytes, Buf, Completion, ConnId, LinkIo, Pipe, Pipes, Pool, Ring, StorageId, Token};
use crate::export::Export;
use crate::limits::{Limits, PIPES_PER_WORKER_MAX, PIPE_BYTES, RING_ENTRIES, SHUTDOWN_DRAIN_TIMEOUT_MS, SHUTDOWN_POLL_MS};
use crate::metrics::{Board, Look, Metrics};
use crate::qos::{Parts, Qos};
use crate::tls::{Answer, Encryption, TlsLink, Wire};

/// A connection that finished its handshake, on its way to a worker.
pub struct NewConnection {
    pub fd: OwnedFd,
    pub peer: String,
    pub export: Arc<Export>,
    pub session: Session,
    /// Who encrypts records, when the client started TLS.
    pub tls: Option<Encryption>,
    /// The TLS version and the client's identity, for the log.
    pub tls_client: Option<String>,
    /// Released when the connection closes; counts against the connection limit.
    pub permit: Permit,
    /// Who the client is, for its QoS class.
    pub client: Client,
}

/// The acceptor's handle on a worker.
#[derive(Clone)]
pub struct WorkerHandle {
    tx: Sender<NewConnection>,
    wake: Arc<OwnedFd>,
}

impl WorkerHandle {
    pub fn hand_over(&self, conn: NewConnection) {
        if self.tx.send(conn).is_ok() {
            self.wake();
        }
    }

    pub fn wake(&self) {
        let _ = rustix::io::write(self.wake.as_fd(), &1u64.to_ne_bytes());
    }
}

/// How a worker thread runs: where, and how it waits.
#[derive(Clone, Copy, Debug)]
pub struct Placement {
    /// The CPU the thread is pinned to, if any.
    pub cpu: Option<usize>,
    /// Longest spin on the ring before sleeping (`BusyPoll`); zero sleeps at once.
    pub busy_poll: Duration,
}

pub fn spawn(
    id: usize,
    limits: Limits,
    placement: Placement,
    shutdown: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    qos: Arc<Qos>,
) -> std::io::Result<(WorkerHandle, std::thread::JoinHandle<()>)> {
    let wake = Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?);
    let (tx, rx) = channel();
    let handle = WorkerHandle { tx, wake: Arc::clone(&wake) };
    // The ring belongs to its thread; setup errors come back before serving starts.
    let (ready_tx, ready_rx) = channel();
    let join = std::thread::Builder::new().name(format!("sluice-worker-{id}")).spawn(move || {
        if let Some(cpu) = placement.cpu {
            pin_to(cpu);
        }
        let mut ring = match Ring::new(RING_ENTRIES) {
            Ok(r) => r,
            Err(e) => return drop(ready_tx.send(Err(e))),
        };
        ring.set_owner(id);
        let quiet = Duration::from_millis(limits.buffer_pool_quiet_ms);
        let pool = Pool::new(limits.buffer_pool_bytes_per_worker, quiet, Arc::clone(&metrics.buffers));
        let held = Held { qos, worker: id, generations: Vec::new(), ready: Vec::new() };
        let mut worker = Worker::new(ring, pool, limits, rx, wake, shutdown, metrics, held);
        worker.busy_poll = Waits::new(placement.busy_poll);
        let _ = ready_tx.send(Ok(()));
        if let Err(e) = worker.run() {
            log::error!("worker {id} stopped: {e}");
        }
    })?;
    ready_rx.recv().map_err(|_| std::io::Error::other("worker thread died during setup"))??;
    Ok((handle, join))
}

/// Pins the calling thread to `cpu`; a CPU the system refuses is logged and left alone.
fn pin_to(cpu: usize) {
    let mut set = rustix::thread::CpuSet::new();
    set.set(cpu);
    if let Err(e) = rustix::thread::sched_setaffinity(None, &set) {
        log::warn!("could not pin a worker to CPU {cpu}: {e}");
    }
}

/// The CPUs this process may run on, in order: what `--pin-threads` spreads workers over,
/// so that a server started under `taskset` pins inside its set.
pub fn allowed_cpus() -> Vec<usize> {
    match rustix::thread::sched_getaffinity(None) {
        Ok(set) => (0..rustix::thread::CpuSet::MAX_CPU).filter(|&c| set.is_set(c)).collect(),
        Err(_) => Vec::new(),
    }
}

/// A connection of this worker: its core and what the core must not own.
struct Entry {
    conn: Conn,
    fd: OwnedFd,
    /// Records are encrypted and decrypted here when the client started TLS and the
    /// kernel did not take the session over.
    tls: Option<TlsLink>,
    /// The kernel encrypts and decrypts records (kTLS): the socket is used as a plain one,
    /// except that it refuses MSG_WAITALL and reports records it cannot pass on as errors.
    ktls: bool,
    export: Arc<Export>,
    /// Who the connection is, for its closing log line: export, read-only, TLS identity.
    label: String,
    _permit: Permit,
}

/// The worker's resources a connection borrows while the worker drives it.
struct Shared<'a> {
    ring: &'a mut Ring,
    pool: &'a mut Pool,
    pipes: &'a mut Pipes,
    budget: &'a mut Budget,
    waits: &'a mut Waits,
}

impl Shared<'_> {
    fn env(&mut self) -> Env<'_> {
        Env { now: Instant::now(), pool: self.pool, pipes: self.pipes, budget: self.budget }
    }
}

struct Worker {
    // Dropped first: the ring cancels and waits for operations that use the pool and pipes.
    ring: Ring,
    pool: Pool,
    pipes: Pipes,
    budget: Budget,
    limits: Limits,
    inbox: Receiver<NewConnection>,
    wake: Arc<OwnedFd>,
    shutdown: Arc<AtomicBool>,
    entries: Vec<Option<Entry>>,
    free: Vec<u32>,
    live: usize,
    metrics: Arc<Metrics>,
    /// How long to spin, by what the worker waits for (`busy_poll.rs`).
    busy_poll: Waits,
    /// Where this worker posts what it sees of requests held at a backend, when it next
    /// looks (only while storage operations are in flight), the per-export sums of a look,
    /// and whether the last one posted found anything.
    board: Arc<Board>,
    next_look: Option<Instant>,
    looks: Vec<Look>,
    posted: bool,
    /// What a link's completion asked for and finished, reused between completions.
    link_work: (Vec<LinkIo>, Vec<Completion>),
    held: Held,
}

/// The worker's side of the QoS scheduler: its number (in request ids), the generation of
/// each connection place (an id of a closed connection is known as stale), and the ids
/// its mailbox gave.
struct Held {
    qos: Arc<Qos>,
    worker: usize,
    generations: Vec<u16>,
    ready: Vec<sluice_qos::Id>,
}

impl Worker {
    // The worker's parts, each made by the thread that spawns it.
    #[allow(clippy::too_many_arguments)]
    fn new(
        mut ring: Ring,
        pool: Pool,
        limits: Limits,
        inbox: Receiver<NewConnection>,
        wake: Arc<OwnedFd>,
        shutdown: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
        held: Held,
    ) -> Worker {
        if let Err(e) = ring.reserve_fixed(pool.slots()) {
            log::warn!("could not set up registered I/O buffers ({e}); using unregistered buffers");
        }
        // Operations other threads complete wake the worker as new connections do; the
        // wake-up read is always in flight (`run`, `route`).
        ring.set_waker(Arc::clone(&wake));
        let board = metrics.board();
        let looks = vec![Look::default(); board.exports()];
        Worker {
            ring,
            pool,
            pipes: Pipes::new(PIPES_PER_WORKER_MAX, PIPE_BYTES),
            budget: Budget::new(limits.inflight_bytes_per_worker),
            limits,
            inbox,
            wake,
            shutdown,
            entries: Vec::new(),
            free: Vec::new(),
            live: 0,
            metrics,
            busy_poll: Waits::new(Duration::ZERO),
            board,
            next_look: None,
            looks,
            posted: false,
            held,
            link_work: (Vec::new(), Vec::new()),
        }
    }

    fn run(&mut self) -> std::io::Result<()> {
        self.ring.recv_wake(self.wake.as_raw_fd(), Buf::heap(8));
        let mut completions: Vec<Completion> = Vec::with_capacity(RING_ENTRIES as usize);
        let mut draining_since: Option<Instant> = None;
        loop {
            if self.shutdown.load(Ordering::Relaxed) && draining_since.is_none() {
                draining_since = Some(Instant::now());
                self.stop_all();
            }
            if let Some(t) = draining_since {
                if self.live == 0 {
                    return Ok(());
                }
                if t.elapsed() > Duration::from_millis(SHUTDOWN_DRAIN_TIMEOUT_MS) {
                    log::warn!("{} connections still busy after {SHUTDOWN_DRAIN_TIMEOUT_MS} ms; closing them", self.live);
                    return Ok(());
                }
            }
            // Slabs of the buffer pool that went quiet are given back; a wait ends when the
            // next one is due, and with nothing left to give back it has no deadline.
            let now = Instant::now();
            let ring = &mut self.ring;
            let release = self.pool.tick(now, |slab| ring.unfix(slab)).map(|due| due.saturating_duration_since(now));
            let drain = draining_since.map(|_| Duration::from_millis(SHUTDOWN_POLL_MS));
            let look = self.next_look.map(|due| due.saturating_duration_since(now));
            let qos = self.held.qos.due(self.held.worker).map(|due| due.saturating_duration_since(now));
            let timeout = [release, drain, look, qos].into_iter().flatten().min();
            self.wait(&mut completions, timeout, draining_since.is_none())?;
            for c in completions.drain(..) {
                self.route(c);
            }
            self.resume_waiters();
            self.start_held();
            self.look_if_due();
        }
    }

    /// Looks for requests held at a backend when a look is due. Looks run while storage
    /// operations are in flight; once none is, no request is at a backend, so the board is
    /// cleared at once (if the last look found any) and no timer is left: an idle worker
    /// never wakes for this.
    fn look_if_due(&mut self) {
        if self.ring.storage_in_flight() == 0 {
            if self.next_look.take().is_some() && self.posted {
                self.looks.fill(Look::default());
                self.board.post(&self.looks);
                self.posted = false;
            }
            return;
        }
        let now = Instant::now();
        match self.next_look {
            None => self.next_look = Some(now + self.limits.slow_watch_interval()),
            Some(due) if now >= due => {
                self.look(now);
                self.next_look = Some(now + self.limits.slow_watch_interval());
            }
            Some(_) => {}
        }
    }

    fn look(&mut self, now: Instant) {
        self.looks.fill(Look::default());
        for entry in self.entries.iter_mut().flatten() {
            let look = entry.conn.watch(now);
            self.looks[entry.conn.metrics_export()].add(look);
        }
        self.board.post(&self.looks);
        self.posted = self.looks.iter().any(|l| *l != Look::default());
    }

    /// Spins for the busy-poll budget (when `spin`), then sleeps until something completes
    /// or `timeout` passes, and adapts the budget to what happened.
    fn wait(&mut self, completions: &mut Vec<Completion>, timeout: Option<Duration>, spin: bool) -> std::io::Result<()> {
        let poll = self.busy_poll.next(self.ring.storage_in_flight() > 0);
        let budget = poll.budget();
        let idle = Instant::now();
        // Deferred operations (an RBD image's, a remote's) complete on other threads, which
        // post through the eventfd: a spin waiting for them takes a CPU those threads may
        // need. On 2 cores, RBD reads cost the server 8-10 µs more each with it, and were
        // no faster even one at a time.
        let only_deferred = self.ring.deferred() > 0 && self.ring.storage_in_flight() == self.ring.deferred();
        let caught = spin && !only_deferred && !budget.is_zero() && self.ring.spin(budget)?;
        // One wait, with the timer, whatever the spin saw: a spin that saw the kernel busy
        // need not end in a completion for this ring, and the timer is what releases a
        // request the QoS scheduler holds and runs the slow watch. A wait without it after
        // such a spin once left a worker whose every request was held asleep for good.
        self.ring.wait(completions, timeout)?;
        if caught {
            poll.caught();
        } else {
            poll.slept(idle.elapsed());
        }
        Ok(())
    }

    /// Hands a completion to the connection it belongs to.
    fn route(&mut self, Completion { token, result }: Completion) {
        match token {
            Token::Wake { buf } => {
                self.accept_new();
                self.ring.recv_wake(self.wake.as_raw_fd(), buf);
            }
            Token::Recv { conn, buf } => self.on_entry(conn, |e, s, _| {
                s.waits.received();
                if e.ktls && result < 0 {
                    ktls_recv_failed(e.conn.peer(), result);
                }
                e.conn.handle_recv(&mut s.env(), result, buf)
            }),
            Token::RecvBytes { conn, bytes } => self.on_entry(conn, |e, s, id| {
                let link = e.tls.as_mut().expect("only TLS links receive bytes");
                s.waits.received();
                link.on_recv(&mut Wire { ring: s.ring, fd: e.fd.as_raw_fd(), id }, result, bytes);
            }),
            Token::Send { conn, batch } => self.on_entry(conn, |e, s, id| {
                s.waits.sent(result.max(0) as usize);
                match &mut e.tls {
                    Some(link) => link.on_send(&mut Wire { ring: s.ring, fd: e.fd.as_raw_fd(), id }, result, batch),
                    None => {
                        // What the peer has yet to take shows the link's own rate (conn/pace.rs).
                        if e.conn.wants_socket_backlog(result) {
                            e.conn.socket_backlog(unacked_bytes(e.fd.as_fd()));
                        }
                        e.conn.handle_send(&mut s.env(), result, batch)
                    }
                }
            }),
            Token::SpliceOut { conn, pipe } => self.on_entry(conn, |e, s, _| spliced_out(e, s, result, pipe)),
            Token::Storage { id: StorageId { conn, tag }, held } => {
                self.on(conn, |c, env| c.handle_storage(env, tag, result, held))
            }
            Token::Link { link, op } => {
                let (mut next, mut done) = std::mem::take(&mut self.link_work);
                link.completed(op, result, &mut next, &mut done);
                for io in next.drain(..) {
                    self.ring.link_io(&link, io);
                }
                for c in done.drain(..) {
                    self.ring.link_finished();
                    self.route(c);
                }
                self.link_work = (next, done);
            }
            Token::Carried { end, held } => end.done(result, held, &mut self.ring as &mut dyn std::any::Any),
        }
    }

    /// Runs `event` on a connection's core, carries out what it asks for, and closes the
    /// connection when it is done.
    fn on(&mut self, id: ConnId, event: impl FnOnce(&mut Conn, &mut Env)) {
        self.on_entry(id, |e, s, _| event(&mut e.conn, &mut s.env()));
    }

    /// `on` for events that need more of the connection than its core (its TLS link).
    fn on_entry(&mut self, id: ConnId, event: impl FnOnce(&mut Entry, &mut Shared, ConnId)) {
        let Some(entry) = self.entries.get_mut(id.0 as usize).and_then(Option::as_mut) else {
            debug_assert!(false, "a completion for connection {id:?}, which is closed");
            return;
        };
        let mut shared = Shared {
            ring: &mut self.ring,
            pool: &mut self.pool,
            pipes: &mut self.pipes,
            budget: &mut self.budget,
            waits: &mut self.busy_poll,
        };
        event(entry, &mut shared, id);
        drive(entry, id, &mut shared);
        if entry.conn.is_done() && entry.tls.as_ref().is_none_or(TlsLink::is_idle) {
            entry.conn.unrestrict(&mut shared.env());
            self.close(id);
        }
    }

    fn accept_new(&mut self) {
        while let Ok(new) = self.inbox.try_recv() {
            if self.shutdown.load(Ordering::Relaxed) {
                continue;
            }
            let index = self.free.pop().unwrap_or_else(|| {
                self.entries.push(None);
                self.held.generations.push(0);
                (self.entries.len() - 1) as u32
            });
            let metrics = Arc::clone(&self.metrics);
            let label = label(&new.export, new.session.read_only(), new.tls_client.as_deref());
            let mut conn = Conn::new(new.peer, Arc::clone(&new.export), new.session, self.limits, metrics);
            if let Some(mut port) = self.held.qos.attach(&new.export.name, &new.client, self.held.worker) {
                debug_assert!((index as usize) < crate::qos::PLACES_MAX);
                port.place(index, self.held.generations[index as usize]);
                conn.restrict(port);
            }
            let (tls, ktls) = secure(&mut conn, &label, new.tls);
            self.entries[index as usize] =
                Some(Entry { conn, fd: new.fd, tls, ktls, export: new.export, label, _permit: new.permit });
            self.live += 1;
            self.on(ConnId(index), |c, env| c.resume(env));
        }
    }

    /// Lets connections that waited for the worker's byte budget read again.
    fn resume_waiters(&mut self) {
        while let Some(id) = self.budget.next_waiter() {
            if self.entries.get(id.0 as usize).is_some_and(Option::is_some) {
                self.on(id, |c, env| c.resume(env));
            }
        }
    }

    /// Starts the held requests the QoS scheduler let go (polling it first when this
    /// worker's timer is due), until none is left: starting one may let go another.
    fn start_held(&mut self) {
        let now = Instant::now();
        if self.held.qos.due(self.held.worker).is_some_and(|due| due <= now) {
            self.held.qos.tick(self.held.worker, now);
        }
        loop {
            let mut ready = std::mem::take(&mut self.held.ready);
            self.held.qos.take_ready(self.held.worker, &mut ready);
            if ready.is_empty() {
                self.held.ready = ready;
                return;
            }
            for id in ready.drain(..) {
                self.start_one(Parts::of(id));
            }
            self.held.ready = ready;
        }
    }

    fn start_one(&mut self, p: Parts) {
        let place = p.place as usize;
        let live = self.entries.get(place).is_some_and(Option::is_some) && self.held.generations[place] == p.generation;
        let mut started = false;
        if live {
            self.on(ConnId(p.place), |c, env| started = c.handle_qos_start(env, p.slot));
        }
        if !started {
            self.held.qos.stray(self.held.worker);
        }
    }

    fn stop_all(&mut self) {
        for index in 0..self.entries.len() {
            if self.entries[index].is_some() {
                self.on(ConnId(index as u32), |c, env| c.stop(env, "server shutting down"));
            }
        }
    }

    fn close(&mut self, id: ConnId) {
        if let Some(mut entry) = self.entries[id.0 as usize].take() {
            if let Some(link) = &mut entry.tls {
                link.close_notify(entry.fd.as_fd());
            }
            if entry.ktls {
                // close_notify through the kernel's TLS, best effort as in user space.
                let _ = ktls_send_record(entry.fd.as_fd(), ALERT, &CLOSE_NOTIFY);
            }
            log::info!("{}: closed {}; {}", entry.conn.peer(), entry.label, entry.conn.audit());
            self.budget.forget(id);
            let generation = &mut self.held.generations[id.0 as usize];
            *generation = Parts::next_generation(*generation);
            self.free.push(id.0);
            self.live -= 1;
        }
    }
}

/// TLS record content type of an alert, and the close_notify alert (warning level),
/// RFC 8446 §6 / RFC 5246 §7.2.
const ALERT: u8 = 21;
const CLOSE_NOTIFY: [u8; 2] = [1, 0];

/// `export "vm7" (read-only) over TLSv1.3 psk:node7`: what the log says of a connection
/// when it opens and when it closes. Read-only as this client is served it (the export's
/// own setting, or an access rule's `read-only-for`).
fn label(export: &Export, read_only: bool, tls_client: Option<&str>) -> String {
    let ro = if read_only { " (read-only)" } else { "" };
    let tls = tls_client.map(|t| format!(" over {t}")).unwrap_or_default();
    format!("export {:?}{ro}{tls}", export.name)
}

/// Logs the connection's kind of TLS and sets the core up for it: a TLS link for records
/// encrypted in user space (and true when the kernel encrypts them).
fn secure(conn: &mut Conn, label: &str, tls: Option<Encryption>) -> (Option<TlsLink>, bool) {
    let peer = conn.peer().to_owned();
    match tls {
        None => {
            log::info!("{peer}: opened {label}");
            (None, false)
        }
        Some(Encryption::Kernel { describe }) => {
            log::info!("{peer}: opened {label} (kTLS)");
            log::debug!("{peer}: {describe}");
            (None, true)
        }
        Some(Encryption::User { session, why }) => {
            log::info!("{peer}: opened {label} (user-space)");
            if let Some(why) = why {
                log::info!("{peer}: kTLS not used: {why}");
            }
            let link = TlsLink::new(session);
            log::debug!("{peer}: user-space TLS, {}", link.describe());
            // Records are encrypted in user space: data must pass through a buffer.
            conn.copy_only();
            (Some(link), false)
        }
    }
}

/// What a failed receive on a kTLS socket means. The core ends the connection as for any
/// failed receive; this only says why in the log.
fn ktls_recv_failed(peer: &str, result: i32) {
    match -result {
        libc::EBADMSG => log::info!("{peer}: kTLS: a record failed to decrypt"),
        libc::EIO => log::debug!("{peer}: kTLS: a record other than data arrived (an alert such as close_notify, or a key update)"),
        libc::EKEYEXPIRED => log::debug!("{peer}: kTLS: the client updated its keys, which the kernel cannot follow"),
        e => log::debug!("{peer}: kTLS: receive failed: {}", std::io::Error::from_raw_os_error(e)),
    }
}

/// Carries out every operation a connection's core has asked for. Storage operations that
/// a backend finishes at once are answered here, and their replies flushed together once
/// the burst is through, which may ask for more; so are the TLS link's answers.
fn drive(entry: &mut Entry, id: ConnId, shared: &mut Shared) {
    loop {
        let mut again = carry_out(entry, id, shared);
        while let Some(answer) = entry.tls.as_mut().and_then(TlsLink::answer) {
            match answer {
                Answer::Recv { result, buf } => entry.conn.handle_recv(&mut shared.env(), result, buf),
                Answer::Send { result, batch } => entry.conn.handle_send(&mut shared.env(), result, batch),
            }
            again = true;
        }
        if !again {
            return;
        }
        entry.conn.flush(&mut shared.env());
    }
}

/// Tells the core how a splice to its socket went.
fn spliced_out(entry: &mut Entry, shared: &mut Shared, result: i32, pipe: Pipe) {
    shared.waits.sent(result.max(0) as usize);
    if entry.conn.wants_socket_backlog(result) {
        entry.conn.socket_backlog(unacked_bytes(entry.fd.as_fd()));
    }
    entry.conn.handle_splice_out(&mut shared.env(), result, pipe)
}

/// Carries out what the core asked for; true when some storage operation or splice
/// finished at once.
fn carry_out(entry: &mut Entry, id: ConnId, shared: &mut Shared) -> bool {
    let fd = entry.fd.as_raw_fd();
    let mut answered_now = false;
    while let Some(io) = entry.conn.poll_io() {
        match io {
            Io::Recv { buf, at, whole } => match &mut entry.tls {
                Some(link) => link.recv(&mut Wire { ring: shared.ring, fd, id }, buf, at),
                // Not on kTLS: its receive is left as it was tested.
                None => shared.ring.recv(fd, buf, at, id, whole && !entry.ktls),
            },
            Io::Send { batch } => match &mut entry.tls {
                Some(link) => link.send(&mut Wire { ring: shared.ring, fd, id }, batch),
                None => shared.ring.send(fd, batch, id, !entry.ktls),
            },
            Io::SpliceOut { pipe, len } => match splice_out_now(&pipe, entry.fd.as_fd(), len) {
                Ok(n) if n > 0 => {
                    spliced_out(entry, shared, n as i32, pipe);
                    answered_now = true;
                }
                // Full, or failing: the ring waits for room, or reports the error.
                _ => shared.ring.splice_out(pipe, fd, len, id),
            },
            Io::Storage { tag, op } => {
                if let Some(done) = entry.export.backend.start(op, StorageId { conn: id, tag }, shared.ring) {
                    entry.conn.handle_storage_now(&mut shared.env(), tag, done.result, done.held);
                    answered_now = true;
                }
            }
            Io::Shutdown(how) => {
                if let Some(link) = &mut entry.tls {
                    link.shut_read();
                }
                let how = match how {
                    Shutdown::Read => rustix::net::Shutdown::Read,
                    Shutdown::Both => rustix::net::Shutdown::Both,
                };
                let _ = rustix::net::shutdown(&entry.fd, how);
            }
            Io::AwaitBudget => shared.budget.wait(id),
        }
    }
    answered_now
}
