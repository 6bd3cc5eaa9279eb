//! A worker thread: one ring, one buffer pool, and the connections handed to it. The
//! thread never blocks except in the ring's wait.

use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::Session;

use crate::connection::{Budget, Connection, Ctx};
use std::rc::Rc;
use crate::engine::{Buf, Completion, Pipes, Pool, Ring};
use crate::export::Export;
use crate::metrics::Metrics;
use crate::limits::{Limits, PIPES_PER_WORKER_MAX, PIPE_BYTES, RING_ENTRIES, SHUTDOWN_DRAIN_TIMEOUT_MS};

/// A connection that finished its handshake, on its way to a worker.
pub struct NewConnection {
    pub fd: OwnedFd,
    pub peer: String,
    pub export: Arc<Export>,
    pub session: Session,
    /// Released when the connection closes; counts against the connection limit.
    pub permit: crate::listen::Permit,
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

/// User data of the eventfd read that wakes the worker.
const WAKE_USER: u64 = u64::MAX - 1;

pub fn spawn(
    id: usize,
    limits: Limits,
    shutdown: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
) -> std::io::Result<(WorkerHandle, std::thread::JoinHandle<()>)> {
    let wake = Arc::new(rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?);
    let (tx, rx) = channel();
    let handle = WorkerHandle { tx, wake: Arc::clone(&wake) };
    // The ring belongs to its thread; setup errors come back before serving starts.
    let (ready_tx, ready_rx) = channel();
    let join = std::thread::Builder::new().name(format!("sluice-worker-{id}")).spawn(move || {
        let ring = match Ring::new(RING_ENTRIES) {
            Ok(r) => r,
            Err(e) => return drop(ready_tx.send(Err(e))),
        };
        let pool = match Pool::new(limits.buffer_pool_bytes_per_worker, REQUEST_PAYLOAD_MAX_BYTES as usize) {
            Ok(p) => p,
            Err(e) => return drop(ready_tx.send(Err(e))),
        };
        let mut worker = Worker::new(ring, pool, limits, rx, wake, shutdown, metrics);
        let _ = ready_tx.send(Ok(()));
        if let Err(e) = worker.run() {
            log::error!("worker {id} stopped: {e}");
        }
    })?;
    ready_rx.recv().map_err(|_| std::io::Error::other("worker thread died during setup"))??;
    Ok((handle, join))
}

struct Worker {
    // Dropped first: the ring cancels and waits for operations that use the pool and pipes.
    ring: Ring,
    pool: Pool,
    pipes: Pipes,
    limits: Limits,
    inbox: Receiver<NewConnection>,
    wake: Arc<OwnedFd>,
    shutdown: Arc<AtomicBool>,
    conns: Vec<Option<(Connection, crate::listen::Permit)>>,
    free: Vec<u32>,
    live: usize,
    budget: Rc<Budget>,
    metrics: Arc<Metrics>,
}

impl Worker {
    fn new(
        mut ring: Ring,
        pool: Pool,
        limits: Limits,
        inbox: Receiver<NewConnection>,
        wake: Arc<OwnedFd>,
        shutdown: Arc<AtomicBool>,
        metrics: Arc<Metrics>,
    ) -> Worker {
        if let Err(e) = ring.register(&pool) {
            log::warn!("could not register I/O buffers ({e}); using unregistered buffers (raise RLIMIT_MEMLOCK to fix)");
        }
        let budget = Rc::new(Budget::new(limits.inflight_bytes_per_worker));
        let pipes = Pipes::new(PIPES_PER_WORKER_MAX, PIPE_BYTES);
        Worker {
            ring,
            pool,
            pipes,
            limits,
            inbox,
            wake,
            shutdown,
            conns: Vec::new(),
            free: Vec::new(),
            live: 0,
            budget,
            metrics,
        }
    }

    fn run(&mut self) -> std::io::Result<()> {
        self.ring.recv_eventfd(self.wake.as_raw_fd(), Buf::heap(8), WAKE_USER);
        let mut completions: Vec<Completion> = Vec::with_capacity(RING_ENTRIES as usize);
        let mut draining_since: Option<Instant> = None;
        loop {
            if self.shutdown.load(Ordering::Relaxed) && draining_since.is_none() {
                draining_since = Some(Instant::now());
                self.stop_all();
            }
            if let Some(t) = draining_since {
                if self.live == 0 {
                    log::debug!("worker done; {} buffers came from the heap", self.pool.heap_fallbacks());
                    return Ok(());
                }
                if t.elapsed() > Duration::from_millis(SHUTDOWN_DRAIN_TIMEOUT_MS) {
                    log::warn!("{} connections still busy after {SHUTDOWN_DRAIN_TIMEOUT_MS} ms; closing them", self.live);
                    return Ok(());
                }
            }
            let timeout = draining_since.map(|_| Duration::from_millis(100));
            self.ring.wait(&mut completions, timeout)?;
            for c in completions.drain(..) {
                if c.user == WAKE_USER {
                    self.accept_new();
                    self.ring.recv_eventfd(self.wake.as_raw_fd(), c.buf.expect("eventfd buffer"), WAKE_USER);
                    continue;
                }
                let index = (c.user >> 32) as u32;
                let op = c.user as u32;
                let mut ctx = Ctx { ring: &mut self.ring, pool: &mut self.pool, pipes: &mut self.pipes, index };
                let (conn, _) = self.conns[index as usize].as_mut().expect("completion for a live connection");
                conn.complete(&mut ctx, op, c.result, c.buf, c.batch);
                conn.pump_output(&mut ctx);
                if conn.finished() {
                    self.close(index);
                }
            }
            self.resume_waiters();
        }
    }

    fn accept_new(&mut self) {
        while let Ok(new) = self.inbox.try_recv() {
            if self.shutdown.load(Ordering::Relaxed) {
                continue;
            }
            let index = match self.free.pop() {
                Some(i) => i,
                None => {
                    self.conns.push(None);
                    (self.conns.len() - 1) as u32
                }
            };
            log::info!("{}: serving export {:?}", new.peer, new.export.name);
            let budget = Rc::clone(&self.budget);
            let metrics = Arc::clone(&self.metrics);
            let conn = Connection::new(new.fd, new.peer, new.export, new.session, self.limits, budget, metrics);
            self.conns[index as usize] = Some((conn, new.permit));
            self.live += 1;
            let mut ctx = Ctx { ring: &mut self.ring, pool: &mut self.pool, pipes: &mut self.pipes, index };
            let (conn, _) = self.conns[index as usize].as_mut().expect("just stored");
            conn.start(&mut ctx);
        }
    }

    /// Lets connections that waited for the worker's byte budget read again.
    fn resume_waiters(&mut self) {
        while let Some(index) = self.budget.next_waiter() {
            let mut ctx = Ctx { ring: &mut self.ring, pool: &mut self.pool, pipes: &mut self.pipes, index };
            if let Some((conn, _)) = self.conns.get_mut(index as usize).and_then(Option::as_mut) {
                conn.start(&mut ctx);
                conn.pump_output(&mut ctx);
            }
        }
    }

    fn stop_all(&mut self) {
        for index in 0..self.conns.len() {
            if let Some((conn, _)) = self.conns[index].as_mut() {
                conn.stop_reading("server shutting down");
                if conn.finished() {
                    self.close(index as u32);
                }
            }
        }
    }

    fn close(&mut self, index: u32) {
        if let Some((conn, _permit)) = self.conns[index as usize].take() {
            log::info!("{}: connection closed", conn.peer);
            self.free.push(index);
            self.live -= 1;
        }
    }
}
