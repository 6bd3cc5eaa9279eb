//! The cache core behind one lock, and the driver's side of every action it asks for.
//! Every entry point (a request, a backing or member operation's answer, the timer, a
//! member connecting, a stop) locks, tells the core, then carries out what it asks for:
//! backing operations and member operations run as tasks of their own that lock again
//! when they finish, or, when the request came from a server's worker (`crate::carry`), a
//! member read or write goes on that worker's own connection to the member and its answer
//! comes back on the same thread. One task (`run`) sleeps towards the core's next timeout,
//! connects members after their backoff, and closes everything at the stop. The lock is a
//! std mutex and is never held across an await.

use super::io;
use super::status::{MemberStatus, Status};
use crate::carry::{Answered, Back, Carried, Carrier, Cmd, Target};
use crate::error::Error;
use crate::pool::member::Member as Conn;
use crate::uri::Uri;
use sluice_cache::limits::reconnect_backoff_ms;
use sluice_cache::{Action, BackingCmd, Cache, Config, Failure, MemberCmd, MemberState, OpId, Outcome, Params, ReqId, Request};
use std::any::Any;
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};
use tokio::runtime::Handle;
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

/// What the task is told.
pub(super) enum Event<M> {
    /// The core's next timeout may be sooner than the one the task sleeps towards, or a
    /// stop may be done.
    Timer,
    /// A backing operation's task ended without an answer.
    BackingLost(OpId),
    /// A member's connection attempt ended.
    Connected { member: usize, result: Result<M, String> },
    /// Stop once the requests in flight are answered (and say so, if asked).
    Stop(Option<oneshot::Sender<()>>),
}

/// Where a request's answer goes.
pub(super) enum Answer {
    /// A caller awaiting it.
    Channel(oneshot::Sender<Result<Vec<u8>, Failure>>),
    /// A server's worker, called on whatever thread finishes the request.
    Call(Answered),
}

impl Answer {
    fn send(self, result: Result<Vec<u8>, Failure>) {
        match self {
            // The caller may have given up waiting; nothing to tell then.
            Answer::Channel(tx) => drop(tx.send(result)),
            Answer::Call(call) => call(result.map(|d| vec![d]).map_err(|f| Error::Server { errno: f.errno.code(), message: Some(f.message) })),
        }
    }
}

/// Everything the cache's tasks and callers share.
pub(super) struct Shared<M: Conn> {
    state: Mutex<Shell<M>>,
    /// Time zero of the core's clock.
    start: Instant,
    /// The file, for logs.
    name: String,
    backing: M,
    /// Where the backing is, for a carrier's own connections to it (as the member after
    /// the last: `members.len()`); it never changes.
    backing_target: Arc<Target>,
    options: M::Options,
    inbox: mpsc::UnboundedSender<Event<M>>,
    /// Where tasks run, whichever thread starts them (a server's worker is not the
    /// runtime's).
    runtime: Handle,
    connections: Arc<AtomicUsize>,
    /// Told when a member's connection is dropped: whoever carries member operations on
    /// connections of its own closes its connections to that member.
    on_cut: OnceLock<Box<dyn Fn(usize) + Send + Sync>>,
}

pub(super) struct Shell<M> {
    core: Cache,
    members: Vec<Member<M>>,
    /// Requests the core has not answered yet.
    waiting: HashMap<ReqId, Answer>,
    next_req: u64,
    /// The timeout the task sleeps towards.
    armed: Option<u64>,
    /// A stop was asked for: no new requests; these are told when it is done.
    stopping: Option<Vec<oneshot::Sender<()>>>,
    /// The stop is under way: the members and the backing are being let go, and what the
    /// core still asks for (a late prefetch's fill, a member it now finds gone) is not done.
    closing: bool,
    /// The stop is done.
    closed: bool,
}

struct Member<M> {
    uri: Uri,
    /// None while down.
    client: Option<M>,
    /// Its operations on tasks, aborted when it is dropped (a stalled member never answers
    /// them, and they hold its connection). A carrier's are not here: its connections to
    /// the member are cut instead.
    ops: HashMap<OpId, AbortHandle>,
    /// Its connection attempt (after its backoff) while down, aborted at the stop: a
    /// sleeping one would otherwise wake after it and connect for nothing.
    connecting: Option<AbortHandle>,
    /// Failures in a row: the core's count when it dropped the member, plus connection
    /// attempts that failed since.
    failures: u32,
    /// What a carrier's connections must reach while `client` is this one: made the first
    /// time an operation is offered, forgotten when the client goes.
    target: Option<Arc<Target>>,
}

/// A backing operation's completion, told once: by its task, or, if the task ends without
/// an answer (a panic under the client), when dropped: then through the inbox, since a
/// task that never ran is dropped where it was spawned, under the lock. A member's
/// operation needs none: the member timeout answers for it.
struct BackingReport<M: Conn> {
    shared: Option<Arc<Shared<M>>>,
    op: OpId,
}

impl<M: Conn> BackingReport<M> {
    fn send(mut self, outcome: Outcome) {
        if let Some(shared) = self.shared.take() {
            shared.with(None, |s, now| s.core.handle_backing_done(now, self.op, outcome));
        }
    }
}

impl<M: Conn> Drop for BackingReport<M> {
    fn drop(&mut self) {
        if let Some(shared) = self.shared.take() {
            let _ = shared.inbox.send(Event::BackingLost(self.op));
        }
    }
}

/// Starts the cache and its task.
pub(super) fn spawn<M: Conn>(path: &Path, config: Config, backing: M, backing_uri: &Uri, uris: Vec<Uri>, options: M::Options, connections: Arc<AtomicUsize>) -> Arc<Shared<M>> {
    let (inbox, events) = mpsc::unbounded_channel();
    let core = Cache::new(Params::new(&config, backing.export().size, identity()));
    let members = uris.into_iter().map(|uri| Member { uri, client: None, ops: HashMap::new(), connecting: None, failures: 0, target: None }).collect();
    let state = Shell { core, members, waiting: HashMap::new(), next_req: 0, armed: None, stopping: None, closing: false, closed: false };
    let name = path.display().to_string();
    let runtime = Handle::current();
    let backing_target = Target::new(backing_uri, backing.export());
    let shared = Arc::new(Shared { state: Mutex::new(state), start: Instant::now(), name, backing, backing_target, options, inbox, runtime, connections, on_cut: OnceLock::new() });
    tokio::spawn(Arc::clone(&shared).run(events));
    shared
}

/// A fresh random identity, not zero: slots written by an earlier run never validate.
fn identity() -> u64 {
    let mut bytes = [0u8; 8];
    openssl::rand::rand_bytes(&mut bytes).expect("the system's random source");
    u64::from_le_bytes(bytes).max(1)
}

/// Sleeps until `at`, or for ever.
async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at.into()).await,
        None => std::future::pending().await,
    }
}

impl<M: Conn> Shared<M> {
    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn lock(&self) -> MutexGuard<'_, Shell<M>> {
        self.state.lock().expect("nothing panics holding the cache's lock")
    }

    /// Tells the core something (`f`), then carries out what it asks for, offering member
    /// reads and writes to `carrier` first.
    pub(super) fn with<T>(self: &Arc<Self>, mut carrier: Option<&mut dyn Carrier>, f: impl FnOnce(&mut Shell<M>, u64) -> T) -> T {
        let mut s = self.lock();
        // Read under the lock, so that the core's clock never goes back.
        let now = self.now();
        let out = f(&mut s, now);
        while let Some(action) = s.core.poll_action() {
            match action {
                // Only replies still matter (there are none left to give, since the stop
                // waits for them, but they are given if there are).
                Action::Backing { .. } | Action::Member { .. } | Action::Reconnect { .. } if s.closing => {}
                Action::Backing { op, cmd } => self.backing_op(&s, op, cmd, carrier.as_mut().map(|c| &mut **c as &mut dyn Carrier)),
                Action::Member { op, member, cmd } => self.member_op(&mut s, now, op, member, cmd, carrier.as_mut().map(|c| &mut **c as &mut dyn Carrier)),
                Action::Reply { req, result } => {
                    if let Some(done) = s.waiting.remove(&req) {
                        done.send(result);
                    }
                }
                Action::Reconnect { member, failures } => self.drop_member(&mut s, member, failures),
            }
        }
        // Only a timeout sooner than the one armed needs the task now: a later one is found
        // when the armed one fires (`handle_tick` may come early). Under load every request
        // moves the earliest timeout, and waking the task for each would cost a thread hop.
        let next = s.core.next_timeout();
        let sooner = next.is_some_and(|n| s.armed.is_none_or(|armed| n < armed));
        if sooner || (s.stopping.is_some() && s.waiting.is_empty()) {
            let _ = self.inbox.send(Event::Timer);
        }
        out
    }

    /// Looks at the state without telling the core anything.
    pub(super) fn look<T>(&self, f: impl FnOnce(&Shell<M>) -> T) -> T {
        f(&self.lock())
    }

    /// A request; `done` gets its answer. Refused once a stop began.
    pub(super) fn request(self: &Arc<Self>, carrier: Option<&mut dyn Carrier>, request: Request, done: Answer) -> Result<(), Error> {
        self.with(carrier, |s, now| {
            if s.stopping.is_some() || s.closed {
                return Err(Error::Closed);
            }
            let req = ReqId(s.next_req);
            s.next_req += 1;
            s.waiting.insert(req, done);
            s.core.handle_request(now, req, request);
            Ok(())
        })
    }

    /// Asks the task to stop once the requests in flight are answered; false if it is gone.
    pub(super) fn stop(&self, told: Option<oneshot::Sender<()>>) -> bool {
        self.inbox.send(Event::Stop(told)).is_ok()
    }

    /// Sets `on_cut` (once).
    pub(super) fn set_on_cut(&self, cut: Box<dyn Fn(usize) + Send + Sync>) {
        let _ = self.on_cut.set(cut);
    }

    async fn run(self: Arc<Self>, mut events: mpsc::UnboundedReceiver<Event<M>>) {
        self.with(None, |s, _| (0..s.members.len()).for_each(|m| self.connect_later(s, m, 0)));
        loop {
            let (timer, done) = {
                let mut s = self.lock();
                s.armed = s.core.next_timeout();
                (s.armed.map(|n| self.start + Duration::from_nanos(n)), s.stopping.is_some() && s.waiting.is_empty())
            };
            if done {
                break;
            }
            tokio::select! {
                event = events.recv() => match event {
                    Some(Event::Timer) => {}
                    Some(Event::BackingLost(op)) => self.with(None, |s, now| s.core.handle_backing_done(now, op, Err("its task ended without an answer".into()))),
                    Some(Event::Connected { member, result }) => self.connected(member, result),
                    Some(Event::Stop(tx)) => self.with(None, |s, _| s.stopping.get_or_insert_with(Vec::new).extend(tx)),
                    // The inbox's sender lives in `self`.
                    None => break,
                },
                () = sleep_until(timer) => self.with(None, |s, now| s.core.handle_tick(now)),
            }
        }
        self.close(events).await;
    }

    /// A backing operation: a read, write or flush on a carrier's own connection to the
    /// backing when it takes it, else on a task.
    fn backing_op(self: &Arc<Self>, s: &Shell<M>, op: OpId, cmd: BackingCmd, carrier: Option<&mut dyn Carrier>) {
        let cmd = match (carrier, carried_backing_cmd(cmd, self.backing.export())) {
            (Some(carrier), Ok(c)) => {
                let target = Arc::clone(&self.backing_target);
                let back = Box::new(CacheBack { op, epoch: target.epoch, shared: Arc::clone(self), on: On::Backing });
                match carrier.carry(Carried::new(s.members.len(), target, c, back)) {
                    Ok(()) => return,
                    Err(refused) => backing_cmd(refused.into_parts().0),
                }
            }
            (_, Ok(c)) => backing_cmd(c),
            (_, Err(cmd)) => cmd,
        };
        self.spawn_backing_op(op, cmd);
    }

    fn spawn_backing_op(self: &Arc<Self>, op: OpId, cmd: BackingCmd) {
        let (client, report) = (self.backing.clone(), BackingReport { shared: Some(Arc::clone(self)), op });
        self.runtime.spawn(async move {
            let outcome = io::backing(&client, cmd).await;
            report.send(outcome);
        });
    }

    fn member_op(self: &Arc<Self>, s: &mut Shell<M>, now: u64, op: OpId, member: usize, cmd: MemberCmd, carrier: Option<&mut dyn Carrier>) {
        let m = &mut s.members[member];
        let Some(client) = m.client.clone() else {
            // The core only uses members that are up; answered anyway, as a failure.
            s.core.handle_member_done(now, op, Err("not connected".into()));
            return;
        };
        let cmd = match (carrier, carried_cmd(cmd)) {
            (Some(carrier), Ok(c)) => {
                let target = Arc::clone(m.target.get_or_insert_with(|| Target::new(&m.uri, client.export())));
                let back = Box::new(CacheBack { op, epoch: target.epoch, shared: Arc::clone(self), on: On::Member });
                match carrier.carry(Carried::new(member, target, c, back)) {
                    Ok(()) => return,
                    Err(refused) => member_cmd(refused.into_parts().0),
                }
            }
            (_, Ok(c)) => member_cmd(c),
            (_, Err(cmd)) => cmd,
        };
        self.spawn_member_op(m, op, member, client, cmd);
    }

    fn spawn_member_op(self: &Arc<Self>, m: &mut Member<M>, op: OpId, member: usize, client: M, cmd: MemberCmd) {
        let shared = Arc::clone(self);
        let task = self.runtime.spawn(async move {
            let outcome = io::member(&client, cmd).await;
            shared.with(None, |s, now| {
                s.members[member].ops.remove(&op);
                s.core.handle_member_done(now, op, outcome);
            });
        });
        m.ops.insert(op, task.abort_handle());
    }

    /// The core dropped a member (a failed operation, a timeout): close its connection,
    /// abandon its operations (the core forgot them), and connect again after the backoff.
    fn drop_member(self: &Arc<Self>, s: &mut Shell<M>, member: usize, failures: u32) {
        let m = &mut s.members[member];
        for (_, task) in m.ops.drain() {
            task.abort();
        }
        m.failures = failures;
        if m.target.take().is_some() {
            self.cut(member);
        }
        if let Some(old) = m.client.take() {
            goodbye(&self.runtime, old, s.core.member_timeout_ms());
        }
        let wait = reconnect_backoff_ms(failures);
        log::warn!("cache {}: member {} is down (failure {failures}); connecting again in {wait} ms", self.name, m.uri);
        self.count_connections(s);
        self.connect_later(s, member, wait);
    }

    /// Tells a carrier that `member`'s connection is gone (`on_cut`).
    fn cut(&self, member: usize) {
        if let Some(cut) = self.on_cut.get() {
            cut(member);
        }
    }

    fn connect_later(self: &Arc<Self>, s: &mut Shell<M>, member: usize, wait_ms: u64) {
        let (uri, options, inbox) = (s.members[member].uri.clone(), self.options.clone(), self.inbox.clone());
        let task = self.runtime.spawn(async move {
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
            let result = M::connect(&uri, &options).await.map_err(|e| e.to_string());
            let _ = inbox.send(Event::Connected { member, result });
        });
        s.members[member].connecting = Some(task.abort_handle());
    }

    /// A connection attempt ended: the member comes up (empty), or is tried again later.
    fn connected(self: &Arc<Self>, member: usize, result: Result<M, String>) {
        self.with(None, |s, now| {
            s.members[member].connecting = None;
            let (slot_bytes, limit_ms) = (s.core.slot_bytes(), s.core.member_timeout_ms());
            if s.stopping.is_some() || s.closed {
                if let Ok(c) = result {
                    goodbye(&self.runtime, c, limit_ms);
                }
                return;
            }
            let usable = result.and_then(|c| match usable_slots(&c, slot_bytes) {
                Ok(slots) => Ok((c, slots)),
                Err(e) => {
                    goodbye(&self.runtime, c, limit_ms);
                    Err(e)
                }
            });
            let m = &mut s.members[member];
            match usable {
                Ok((client, slots)) => {
                    (m.client, m.failures, m.target) = (Some(client), 0, None);
                    s.core.handle_member_up(now, member, slots);
                    // What the core uses, which its bound on a member's slots may make fewer.
                    let used = s.core.members().get(member).map_or(0, |(_, (slots, _))| *slots);
                    log::info!("cache {}: member {} is up with {used} slots of {slot_bytes} bytes (of {slots} it could hold)", self.name, s.members[member].uri);
                    self.count_connections(s);
                }
                Err(e) => {
                    m.failures += 1;
                    let wait = reconnect_backoff_ms(m.failures);
                    // Said once; a node gone for long would fill the log.
                    match m.failures {
                        1 => log::warn!("cache {}: member {}: {e}; trying again in {wait} ms, and later with backoff", self.name, m.uri),
                        _ => log::debug!("cache {}: member {}: {e}; trying again in {wait} ms", self.name, m.uri),
                    }
                    self.connect_later(s, member, wait);
                }
            }
        })
    }

    fn count_connections(&self, s: &Shell<M>) {
        let members: usize = s.members.iter().filter_map(|m| m.client.as_ref()).map(M::connections).sum();
        self.connections.store(self.backing.connections() + members, Ordering::Relaxed);
    }

    /// The counters and the members' state now; None once the stop is done.
    pub(super) fn status(&self) -> Option<Status> {
        self.look(|s| {
            if s.closed {
                return None;
            }
            let members = s.core.members().into_iter().zip(&s.members).map(|((state, (slots, used)), m)| MemberStatus {
                uri: m.uri.to_string(),
                up: state == MemberState::Up,
                failures: match state {
                    MemberState::Up => 0,
                    MemberState::Down { failures } => failures.max(m.failures),
                },
                slots,
                used,
            });
            Some(Status { block_bytes: s.core.block_bytes(), counters: s.core.counters(), members: members.collect() })
        })
    }

    /// Says goodbye to the backing and the members (connected, or connecting when the stop
    /// came), then to whoever asked for the stop.
    async fn close(self: Arc<Self>, mut events: mpsc::UnboundedReceiver<Event<M>>) {
        let limit_ms = self.look(|s| s.core.member_timeout_ms());
        let mut clients = Vec::new();
        {
            let mut s = self.lock();
            s.closing = true;
            for (i, m) in s.members.iter_mut().enumerate() {
                for (_, task) in m.ops.drain() {
                    task.abort();
                }
                if let Some(task) = m.connecting.take() {
                    task.abort();
                }
                if m.target.take().is_some() {
                    self.cut(i);
                }
                clients.extend(m.client.take());
            }
            // The workers' connections to the backing, the member after the last.
            self.cut(s.members.len());
        }
        // Connections made before their task was aborted wait in the inbox.
        events.close();
        while let Ok(event) = events.try_recv() {
            if let Event::Connected { result: Ok(c), .. } = event {
                clients.push(c);
            }
        }
        let goodbyes: Vec<_> = clients.into_iter().map(|c| goodbye(&self.runtime, c, limit_ms)).collect();
        for g in goodbyes {
            let _ = g.await;
        }
        self.backing.disconnect().await;
        let told = {
            let mut s = self.lock();
            s.closed = true;
            s.stopping.take()
        };
        for tx in told.into_iter().flatten() {
            let _ = tx.send(());
        }
    }
}

/// An operation on a carrier's connection, on its way back to the cache.
struct CacheBack<M: Conn> {
    op: OpId,
    /// The `Target` it went to.
    epoch: u64,
    shared: Arc<Shared<M>>,
    on: On,
}

/// Where a carried operation went.
#[derive(Clone, Copy, PartialEq, Eq)]
enum On {
    Member,
    Backing,
}

impl<M: Conn> Back for CacheBack<M> {
    fn finish(self: Box<Self>, carrier: Option<&mut dyn Carrier>, _member: usize, result: Result<Option<Vec<u8>>, Error>) {
        let outcome = result.map(Option::unwrap_or_default).map_err(io::failure);
        self.shared.with(carrier, |s, now| match self.on {
            On::Member => s.core.handle_member_done(now, self.op, outcome),
            On::Backing => s.core.handle_backing_done(now, self.op, outcome),
        });
    }

    /// A member's read or fill runs again on a task while the member's connection is the
    /// one it was for: a read is harmless twice, and a slot write that lands late only makes
    /// that slot fail its check. A backing read or flush runs again too; a backing write
    /// fails (it may have left whole and still land, after a later write to the same place
    /// that a copy sent again would let through).
    fn abandoned(self: Box<Self>, member: usize, cmd: Cmd) {
        let CacheBack { op, epoch, shared, on } = *self;
        if on == On::Backing {
            match cmd {
                Cmd::Write { .. } => shared.with(None, |s, now| s.core.handle_backing_done(now, op, Err("its connection to the backing went away with the write on it".into()))),
                cmd => shared.spawn_backing_op(op, backing_cmd(cmd)),
            }
            return;
        }
        shared.with(None, |s, now| {
            let m = &mut s.members[member];
            match m.client.clone().filter(|_| m.target.as_ref().is_some_and(|t| t.epoch == epoch)) {
                Some(client) => shared.spawn_member_op(m, op, member, client, member_cmd(cmd)),
                None => s.core.handle_member_done(now, op, Err("its connection is gone".into())),
            }
        });
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}

/// A backing operation a carrier may take (a write, a flush the backing has), or the
/// command back. Reads stay on the cache's own connections: on a worker's one connection
/// a cold sequential pass (prefetch's runs beside the demand reads) read a throttled disk
/// at 0.77-0.82x its rate, against 0.99x on the cache's (bench/results/
/// 2026-11-28-netmem-carry-vm).
fn carried_backing_cmd(cmd: BackingCmd, export: &crate::export::Export) -> Result<Cmd, BackingCmd> {
    match cmd {
        BackingCmd::Write { offset, data, fua } if !data.is_empty() && (!fua || export.can_fua()) => {
            let range = 0..data.len();
            Ok(Cmd::Write { offset, data: Arc::new(data), range, fua })
        }
        BackingCmd::Flush if export.can_flush() => Ok(Cmd::Flush),
        cmd => Err(cmd),
    }
}

/// A carried command as a backing task runs it.
fn backing_cmd(cmd: Cmd) -> BackingCmd {
    match cmd {
        Cmd::Read { offset, len } => BackingCmd::Read { offset, len: len as u64 },
        Cmd::Write { offset, data, range, fua } => BackingCmd::Write { offset, data: owned(data, range), fua },
        Cmd::Flush => BackingCmd::Flush,
    }
}

/// A carried write's bytes, as a task sends them.
fn owned(data: Arc<Vec<u8>>, range: std::ops::Range<usize>) -> Vec<u8> {
    match Arc::try_unwrap(data) {
        Ok(v) if range == (0..v.len()) => v,
        Ok(v) => v[range].to_vec(),
        Err(shared) => shared[range].to_vec(),
    }
}

/// A member operation a carrier may take (a slot's read or fill), or the command back.
fn carried_cmd(cmd: MemberCmd) -> Result<Cmd, MemberCmd> {
    match cmd {
        MemberCmd::Read { offset, len } if len > 0 => Ok(Cmd::Read { offset, len: len as usize }),
        MemberCmd::Write { offset, data } if !data.is_empty() => {
            let range = 0..data.len();
            // No FUA: a member's memory is never the only copy of anything.
            Ok(Cmd::Write { offset, data: Arc::new(data), range, fua: false })
        }
        cmd => Err(cmd),
    }
}

/// A carried command as a task runs it.
fn member_cmd(cmd: Cmd) -> MemberCmd {
    match cmd {
        Cmd::Read { offset, len } => MemberCmd::Read { offset, len: len as u64 },
        Cmd::Write { offset, data, range, .. } => MemberCmd::Write { offset, data: owned(data, range) },
        Cmd::Flush => unreachable!("the cache never flushes a member"),
    }
}

/// Says goodbye to a member on a task of its own (at the stop, all at once), for the
/// member timeout at most: a stalled member (its socket full) never takes it, and would
/// hold up the stop, or its old connection, for as long as it stalls.
fn goodbye<M: Conn>(runtime: &Handle, c: M, limit_ms: u64) -> tokio::task::JoinHandle<()> {
    let limit = Duration::from_millis(limit_ms);
    runtime.spawn(async move {
        let _ = tokio::time::timeout(limit, c.disconnect()).await;
    })
}

/// Slots a connected member can hold: its size over the slot size (a slot is one block).
/// A read-only member, one too small for a slot, or one whose minimum block does not divide
/// the slot (a block smaller than it: its every slot operation would be refused as
/// unaligned, and it would go down and up for ever) cannot be used.
fn usable_slots<M: Conn>(c: &M, slot_bytes: u64) -> Result<u64, String> {
    let ex = c.export();
    if ex.read_only() {
        return Err("it is read-only; a member must take writes (a RAM export)".into());
    }
    if !slot_bytes.is_multiple_of(ex.block_min as u64) {
        return Err(format!("its minimum block of {} bytes does not divide the slot of {slot_bytes} bytes", ex.block_min));
    }
    match ex.size / slot_bytes {
        0 => Err(format!("its {} bytes hold no slot of {slot_bytes} bytes", ex.size)),
        slots => Ok(slots),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::pool::fake::Fake;
    use sluice_proto::wire::FLAG_READ_ONLY;

    #[test]
    fn a_member_must_take_whole_slots() {
        // A slot is one block.
        let slot = 65536;
        assert_eq!(usable_slots(&Fake::new(10 * slot + 4096, true, true, true).with_flags(0, 4096), slot), Ok(10));
        assert_eq!(usable_slots(&Fake::new(10 * slot, true, true, true).with_flags(0, 65536), slot), Ok(10));
        let e = usable_slots(&Fake::new(10 * 4096, true, true, true).with_flags(0, 8192), 4096).unwrap_err();
        assert!(e.contains("8192") && e.contains("does not divide"), "{e}");
        assert!(usable_slots(&Fake::new(slot - 1, true, true, true), slot).unwrap_err().contains("no slot"));
        assert!(usable_slots(&Fake::new(slot, true, true, true).with_flags(FLAG_READ_ONLY, 1), slot).unwrap_err().contains("read-only"));
    }
}
