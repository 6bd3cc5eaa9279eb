//! The task that owns the cache core: it takes events from one inbox (requests, the
//! completions of backing and member operations, members connecting, status asked for,
//! a stop), tells the core, and carries out every action the core then asks for. Backing
//! and member operations, and connecting a member after its backoff, run as tasks of
//! their own that report back through the inbox; the core's timer (`next_timeout`) wakes
//! the loop for `handle_tick`.

use super::io;
use super::status::{MemberStatus, Status};
use crate::pool::member::Member as Conn;
use crate::uri::Uri;
use sluice_cache::limits::reconnect_backoff_ms;
use sluice_cache::{Action, BackingCmd, Cache, Config, Failure, MemberCmd, MemberState, OpId, Outcome, Params, ReqId, Request};
use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};
use tokio::task::AbortHandle;

/// What the task is told.
pub(super) enum Event<M> {
    Request { request: Request, done: oneshot::Sender<Result<Vec<u8>, Failure>> },
    Backing { op: OpId, outcome: Outcome },
    Member { op: OpId, member: usize, outcome: Outcome },
    /// A member's connection attempt ended.
    Connected { member: usize, result: Result<M, String> },
    Status(oneshot::Sender<Status>),
    /// Stop once the requests in flight are answered (and say so, if asked).
    Stop(Option<oneshot::Sender<()>>),
}

struct Shell<M: Conn> {
    core: Cache,
    /// Time zero of the core's clock.
    start: Instant,
    /// The file, for logs.
    name: String,
    backing: M,
    members: Vec<Member<M>>,
    options: M::Options,
    /// Requests the core has not answered yet.
    waiting: HashMap<ReqId, oneshot::Sender<Result<Vec<u8>, Failure>>>,
    next_req: u64,
    /// For the tasks this one starts, to report back.
    inbox: mpsc::UnboundedSender<Event<M>>,
    connections: Arc<AtomicUsize>,
    /// A stop was asked for: no new requests; these are told when it is done.
    stopping: Option<Vec<oneshot::Sender<()>>>,
}

struct Member<M> {
    uri: Uri,
    /// None while down.
    client: Option<M>,
    /// Its operations in flight, aborted when it is dropped (a stalled member never
    /// answers them, and they hold its connection).
    ops: HashMap<OpId, AbortHandle>,
    /// Its connection attempt (after its backoff) while down, aborted at the stop: a
    /// sleeping one would otherwise wake after it and connect for nothing.
    connecting: Option<AbortHandle>,
    /// Failures in a row: the core's count when it dropped the member, plus connection
    /// attempts that failed since.
    failures: u32,
}

/// A backing operation's completion, sent once: by its task, or, if the task ends without
/// sending it (a panic under the client), when dropped. A member's operation needs none:
/// the member timeout answers for it.
struct BackingReport<M> {
    inbox: Option<mpsc::UnboundedSender<Event<M>>>,
    op: OpId,
}

impl<M> BackingReport<M> {
    fn send(mut self, outcome: Outcome) {
        if let Some(inbox) = self.inbox.take() {
            let _ = inbox.send(Event::Backing { op: self.op, outcome });
        }
    }
}

impl<M> Drop for BackingReport<M> {
    fn drop(&mut self) {
        if let Some(inbox) = self.inbox.take() {
            let _ = inbox.send(Event::Backing { op: self.op, outcome: Err("its task ended without an answer".into()) });
        }
    }
}

/// Starts the task; returns its inbox.
pub(super) fn spawn<M: Conn>(path: &Path, config: Config, backing: M, uris: Vec<Uri>, options: M::Options, connections: Arc<AtomicUsize>) -> mpsc::UnboundedSender<Event<M>> {
    let (inbox, events) = mpsc::unbounded_channel();
    let core = Cache::new(Params::new(&config, backing.export().size, identity()));
    let members = uris.into_iter().map(|uri| Member { uri, client: None, ops: HashMap::new(), connecting: None, failures: 0 }).collect();
    let name = path.display().to_string();
    let shell = Shell { core, start: Instant::now(), name, backing, members, options, waiting: HashMap::new(), next_req: 0, inbox: inbox.clone(), connections, stopping: None };
    tokio::spawn(shell.run(events));
    inbox
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

impl<M: Conn> Shell<M> {
    async fn run(mut self, mut events: mpsc::UnboundedReceiver<Event<M>>) {
        for m in 0..self.members.len() {
            self.connect_later(m, 0);
        }
        loop {
            let timer = self.core.next_timeout().map(|n| self.start + Duration::from_nanos(n));
            tokio::select! {
                event = events.recv() => match event {
                    Some(event) => self.handle(event),
                    None => break,
                },
                () = sleep_until(timer) => {
                    let now = self.now();
                    self.core.handle_tick(now);
                }
            }
            self.carry_out();
            if self.stopping.is_some() && self.waiting.is_empty() {
                break;
            }
        }
        self.close(events).await;
    }

    fn now(&self) -> u64 {
        self.start.elapsed().as_nanos() as u64
    }

    fn handle(&mut self, event: Event<M>) {
        let now = self.now();
        match event {
            // After a stop, the dropped sender answers `Closed`.
            Event::Request { .. } if self.stopping.is_some() => {}
            Event::Request { request, done } => {
                let req = ReqId(self.next_req);
                self.next_req += 1;
                self.waiting.insert(req, done);
                self.core.handle_request(now, req, request);
            }
            Event::Backing { op, outcome } => self.core.handle_backing_done(now, op, outcome),
            Event::Member { op, member, outcome } => {
                self.members[member].ops.remove(&op);
                self.core.handle_member_done(now, op, outcome);
            }
            Event::Connected { member, result } => self.connected(member, result),
            Event::Status(tx) => {
                let _ = tx.send(self.status());
            }
            Event::Stop(tx) => self.stopping.get_or_insert_with(Vec::new).extend(tx),
        }
    }

    /// Carries out what the core asks for, until it asks for nothing.
    fn carry_out(&mut self) {
        while let Some(action) = self.core.poll_action() {
            match action {
                Action::Backing { op, cmd } => self.backing_op(op, cmd),
                Action::Member { op, member, cmd } => self.member_op(op, member, cmd),
                Action::Reply { req, result } => {
                    if let Some(done) = self.waiting.remove(&req) {
                        let _ = done.send(result);
                    }
                }
                Action::Reconnect { member, failures } => self.drop_member(member, failures),
            }
        }
    }

    fn backing_op(&mut self, op: OpId, cmd: BackingCmd) {
        let (client, report) = (self.backing.clone(), BackingReport { inbox: Some(self.inbox.clone()), op });
        tokio::spawn(async move {
            let outcome = io::backing(&client, cmd).await;
            report.send(outcome);
        });
    }

    fn member_op(&mut self, op: OpId, member: usize, cmd: MemberCmd) {
        let inbox = self.inbox.clone();
        let Some(client) = self.members[member].client.clone() else {
            // The core only uses members that are up; answered anyway, as a failure.
            let _ = inbox.send(Event::Member { op, member, outcome: Err("not connected".into()) });
            return;
        };
        let task = tokio::spawn(async move {
            let outcome = io::member(&client, cmd).await;
            let _ = inbox.send(Event::Member { op, member, outcome });
        });
        self.members[member].ops.insert(op, task.abort_handle());
    }

    /// The core dropped a member (a failed operation, a timeout): close its connection,
    /// abandon its operations (the core forgot them), and connect again after the backoff.
    fn drop_member(&mut self, member: usize, failures: u32) {
        let m = &mut self.members[member];
        for (_, task) in m.ops.drain() {
            task.abort();
        }
        m.failures = failures;
        if let Some(old) = m.client.take() {
            goodbye(old, self.core.member_timeout_ms());
        }
        let wait = reconnect_backoff_ms(failures);
        log::warn!("cache {}: member {} is down (failure {failures}); connecting again in {wait} ms", self.name, m.uri);
        self.count_connections();
        self.connect_later(member, wait);
    }

    fn connect_later(&mut self, member: usize, wait_ms: u64) {
        let (uri, options, inbox) = (self.members[member].uri.clone(), self.options.clone(), self.inbox.clone());
        let task = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(wait_ms)).await;
            let result = M::connect(&uri, &options).await.map_err(|e| e.to_string());
            let _ = inbox.send(Event::Connected { member, result });
        });
        self.members[member].connecting = Some(task.abort_handle());
    }

    /// A connection attempt ended: the member comes up (empty), or is tried again later.
    fn connected(&mut self, member: usize, result: Result<M, String>) {
        self.members[member].connecting = None;
        if self.stopping.is_some() {
            if let Ok(c) = result {
                goodbye(c, self.core.member_timeout_ms());
            }
            return;
        }
        let (slot_bytes, limit_ms) = (self.core.slot_bytes(), self.core.member_timeout_ms());
        let usable = result.and_then(|c| match usable_slots(&c, slot_bytes) {
            Ok(slots) => Ok((c, slots)),
            Err(e) => {
                goodbye(c, limit_ms);
                Err(e)
            }
        });
        let m = &mut self.members[member];
        match usable {
            Ok((client, slots)) => {
                (m.client, m.failures) = (Some(client), 0);
                let now = self.now();
                self.core.handle_member_up(now, member, slots);
                // What the core uses, which its bound on a member's slots may make fewer.
                let used = self.core.members().get(member).map_or(0, |(_, (slots, _))| *slots);
                log::info!("cache {}: member {} is up with {used} slots of {slot_bytes} bytes (of {slots} it could hold)", self.name, self.members[member].uri);
                self.count_connections();
            }
            Err(e) => {
                m.failures += 1;
                let wait = reconnect_backoff_ms(m.failures);
                // Said once; a node gone for long would fill the log.
                match m.failures {
                    1 => log::warn!("cache {}: member {}: {e}; trying again in {wait} ms, and later with backoff", self.name, m.uri),
                    _ => log::debug!("cache {}: member {}: {e}; trying again in {wait} ms", self.name, m.uri),
                }
                self.connect_later(member, wait);
            }
        }
    }

    fn count_connections(&self) {
        let members: usize = self.members.iter().filter_map(|m| m.client.as_ref()).map(M::connections).sum();
        self.connections.store(self.backing.connections() + members, Ordering::Relaxed);
    }

    fn status(&self) -> Status {
        let members = self.core.members().into_iter().zip(&self.members).map(|((state, (slots, used)), m)| MemberStatus {
            uri: m.uri.to_string(),
            up: state == MemberState::Up,
            failures: match state {
                MemberState::Up => 0,
                MemberState::Down { failures } => failures.max(m.failures),
            },
            slots,
            used,
        });
        Status { block_bytes: self.core.block_bytes(), counters: self.core.counters(), members: members.collect() }
    }

    /// Says goodbye to the backing and the members (connected, or connecting when the stop
    /// came), then to whoever asked for the stop.
    async fn close(mut self, mut events: mpsc::UnboundedReceiver<Event<M>>) {
        for m in &mut self.members {
            for (_, task) in m.ops.drain() {
                task.abort();
            }
            if let Some(task) = m.connecting.take() {
                task.abort();
            }
        }
        // Connections made before their task was aborted wait in the inbox.
        events.close();
        let (mut goodbyes, limit_ms) = (Vec::new(), self.core.member_timeout_ms());
        while let Ok(event) = events.try_recv() {
            if let Event::Connected { result: Ok(c), .. } = event {
                goodbyes.push(goodbye(c, limit_ms));
            }
        }
        goodbyes.extend(self.members.iter_mut().filter_map(|m| m.client.take()).map(|c| goodbye(c, limit_ms)));
        for g in goodbyes {
            let _ = g.await;
        }
        self.backing.disconnect().await;
        for tx in self.stopping.take().into_iter().flatten() {
            let _ = tx.send(());
        }
    }
}

/// Says goodbye to a member on a task of its own (at the stop, all at once), for the
/// member timeout at most: a stalled member (its socket full) never takes it, and would
/// hold up the stop, or its old connection, for as long as it stalls.
fn goodbye<M: Conn>(c: M, limit_ms: u64) -> tokio::task::JoinHandle<()> {
    let limit = Duration::from_millis(limit_ms);
    tokio::spawn(async move {
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
