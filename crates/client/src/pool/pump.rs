//! The pump: the coordinator behind one lock, and the driver's side of every action it
//! asks for. Every entry point (a request, a member's answer, the timer, a member coming
//! back) locks, tells the coordinator, then drains `poll()` and carries each action out:
//! member I/O goes to a task of its own, which comes back through `finish`. The lock is a
//! std mutex and is never held across an await.

use super::carry::{self, PoolSide, Sink};
use crate::carry::{Carrier, Target};
use super::member::Member;
use super::member_io::{self, Payload};
use super::requests::Request;
use crate::error::Error;
use crate::uri::Uri;
use sluice_pool::{Action, Coordinator, CopyId, Data, Failure, Found, MemberCmd, OpId, OpOutcome, ReqId};
use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch};
use tokio::task::AbortHandle;

/// What the background task is woken for.
pub(crate) enum Wake {
    /// The coordinator's next wake-up changed.
    Timer,
    /// A member was dropped: reconnect it.
    Reconnect(usize),
}

/// Everything a pool's tasks share.
pub(crate) struct Shared<M: Member> {
    core: Mutex<Core<M>>,
    /// Time zero of the coordinator's clock.
    start: Instant,
    pub(crate) options: M::Options,
    wake: mpsc::UnboundedSender<Wake>,
    stopped: watch::Sender<bool>,
    /// The runtime member I/O runs on, so that the pool can be told things from any
    /// thread (a reload replacing a member runs on a signal thread).
    runtime: tokio::runtime::Handle,
    /// The pool file, edited when a spare takes a member's place.
    file: Option<PathBuf>,
    /// Told when a member's connection is dropped or replaced: whoever carries member
    /// operations on connections of its own closes its connections to that member.
    pub(crate) on_cut: std::sync::OnceLock<Box<dyn Fn(usize) + Send + Sync>>,
}

pub(crate) struct Core<M> {
    pub(crate) coord: Coordinator,
    pub(crate) requests: HashMap<ReqId, Request>,
    /// Resync buffers, from the read that fills them to their `Release`.
    copies: HashMap<CopyId, Arc<Vec<u8>>>,
    members: Vec<Slot<M>>,
    /// Where each member is; one changes when a member is replaced.
    pub(crate) uris: Vec<Uri>,
    /// The wake-up the background task sleeps towards.
    armed: Option<u64>,
    /// A stop began: no new requests, no reconnecting.
    pub(crate) closed: bool,
}

struct Slot<M> {
    /// `None` while the member is dropped.
    client: Option<M>,
    /// Its operations in flight: a task's, aborted when it is dropped (a stalled member
    /// never answers them), or None for one a carrier has (its connection is cut).
    ops: HashMap<OpId, Option<AbortHandle>>,
    reconnecting: bool,
    /// What a carrier's connections must reach while `client` is this one: made the first
    /// time an operation is offered, forgotten when the client goes.
    target: Option<Arc<Target>>,
}

impl<M> Slot<M> {
    fn new(client: Option<M>, reconnecting: bool) -> Slot<M> {
        Slot { client, ops: HashMap::new(), reconnecting, target: None }
    }
}


impl<M: Member> Shared<M> {
    /// `members[i]` is None for a member the pool was assembled without (degraded): it
    /// is tried again at once, as one that was dropped.
    pub(crate) fn new(coord: Coordinator, members: Vec<Option<M>>, uris: Vec<Uri>, options: M::Options, start: Instant, file: Option<PathBuf>) -> (Arc<Self>, mpsc::UnboundedReceiver<Wake>) {
        let (wake, woken) = mpsc::unbounded_channel();
        let mut slots = Vec::with_capacity(members.len());
        for (i, client) in members.into_iter().enumerate() {
            let reconnecting = client.is_none();
            if reconnecting {
                let _ = wake.send(Wake::Reconnect(i));
            }
            slots.push(Slot::new(client, reconnecting));
        }
        let core = Core { coord, requests: HashMap::new(), copies: HashMap::new(), members: slots, uris, armed: None, closed: false };
        let runtime = tokio::runtime::Handle::current();
        let on_cut = std::sync::OnceLock::new();
        let shared = Shared { core: Mutex::new(core), start, options, wake, stopped: watch::Sender::new(false), runtime, file, on_cut };
        (Arc::new(shared), woken)
    }

    /// Milliseconds on the coordinator's clock.
    pub(crate) fn now(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Tells the coordinator something (`f`), then carries out what it asks for.
    pub(crate) fn run<T>(self: &Arc<Self>, f: impl FnOnce(&mut Core<M>, u64) -> T) -> T {
        self.run_with(None, f)
    }

    /// `run`, offering the member reads, writes and flushes it starts to `carrier` first.
    pub(crate) fn run_with<T>(self: &Arc<Self>, mut carrier: Option<&mut dyn Carrier>, f: impl FnOnce(&mut Core<M>, u64) -> T) -> T {
        let now = self.now();
        let mut core = self.core.lock().unwrap();
        let out = f(&mut core, now);
        while let Some(action) = core.coord.poll() {
            match action {
                Action::Member { op, member, cmd, data } => self.start_op(&mut core, op, member, cmd, data, now, carrier.as_mut().map(|c| &mut **c as &mut dyn Carrier)),
                Action::Complete { req, result } => core.complete(req, result),
                Action::Drop { member } => self.drop_member(&mut core, member),
                Action::Release { copy } => {
                    core.copies.remove(&copy);
                }
                Action::SpareTaken { member, old, uri } => self.spare_taken(&mut core, member, old, uri),
                Action::Swap { member, shadow } => self.swap(&mut core, member, shadow),
                Action::Compare { id, copies } => {
                    let diffs = core.compare(&copies);
                    core.coord.compared(id, diffs, now);
                }
                Action::Log { text } => log::info!("pool: {text}"),
            }
        }
        // Only a wake-up sooner than the one armed needs the timer task now: a later one is
        // found when the armed one fires (`tick` may come early). Under load every request
        // moves the earliest deadline, and waking the task for each cost a thread hop.
        let next = core.coord.next_wakeup();
        if next.is_some_and(|n| core.armed.is_none_or(|armed| n < armed)) {
            let _ = self.wake.send(Wake::Timer);
        }
        if core.coord.is_stopped() {
            self.stopped.send_replace(true);
        }
        out
    }

    /// Looks at the state without telling the coordinator anything.
    pub(crate) fn look<T>(&self, f: impl FnOnce(&Core<M>) -> T) -> T {
        f(&self.core.lock().unwrap())
    }

    /// The instant the coordinator next wants `tick`, now noted as armed.
    pub(crate) fn arm(&self) -> Option<tokio::time::Instant> {
        let mut core = self.core.lock().unwrap();
        core.armed = core.coord.next_wakeup();
        core.armed.map(|ms| tokio::time::Instant::from_std(self.start + Duration::from_millis(ms)))
    }

    /// Resolves once the coordinator has stopped.
    pub(crate) fn stopped(&self) -> watch::Receiver<bool> {
        self.stopped.subscribe()
    }

    #[allow(clippy::too_many_arguments)]
    fn start_op(self: &Arc<Self>, core: &mut Core<M>, op: OpId, member: usize, cmd: MemberCmd, data: Data, now: u64, carrier: Option<&mut dyn Carrier>) {
        let Some(client) = core.members[member].client.clone() else {
            core.coord.handle(op, OpOutcome::Failed("the member is not connected".into()), now);
            return;
        };
        let Some((payload, sink)) = core.route(&cmd, data) else {
            // The coordinator named a buffer the driver does not have: a bug in one of them.
            debug_assert!(false, "member operation {op:?} names a buffer that is gone");
            core.coord.handle(op, OpOutcome::Failed("pool driver: the operation's buffer is gone".into()), now);
            return;
        };
        let (cmd, payload, sink) = match carrier {
            Some(carrier) if carry::fits(&cmd, client.export()) => {
                let slot = &mut core.members[member];
                let target = slot.target.get_or_insert_with(|| Target::new(&core.uris[member], client.export()));
                let pool = Arc::clone(self) as Arc<dyn PoolSide>;
                match carry::carried(pool, member, op, Arc::clone(target), cmd, payload, sink) {
                    Ok(carried) => match carrier.carry(carried) {
                        Ok(()) => {
                            core.members[member].ops.insert(op, None);
                            return;
                        }
                        Err(back) => carry::parts(back),
                    },
                    Err(parts) => parts,
                }
            }
            _ => (cmd, payload, sink),
        };
        self.spawn_op(core, member, op, client, cmd, payload, sink);
    }

    /// Runs a member operation on a task of its own.
    #[allow(clippy::too_many_arguments)]
    fn spawn_op(self: &Arc<Self>, core: &mut Core<M>, member: usize, op: OpId, client: M, cmd: MemberCmd, payload: Payload, sink: Sink) {
        let shared = self.clone();
        let task = self.runtime.spawn(async move {
            let result = member_io::run(&client, cmd, payload).await;
            shared.finish(member, op, sink, result);
        });
        core.members[member].ops.insert(op, Some(task.abort_handle()));
    }

    /// A carried operation its carrier gave up on runs on a task, unless it is settled
    /// already (its member dropped meanwhile).
    pub(crate) fn rerun_op(self: &Arc<Self>, core: &mut Core<M>, member: usize, op: OpId, cmd: MemberCmd, payload: Payload, sink: Sink) {
        let Some(slot) = core.members.get_mut(member).filter(|s| matches!(s.ops.get(&op), Some(None))) else { return };
        match slot.client.clone() {
            Some(client) => self.spawn_op(core, member, op, client, cmd, payload, sink),
            None => debug_assert!(false, "a member without a connection has no operation in flight"),
        }
    }

    /// A member operation's task is done.
    fn finish(self: &Arc<Self>, member: usize, op: OpId, sink: Sink, result: Result<Option<Vec<u8>>, Error>) {
        self.finish_with(None, member, op, sink, result)
    }

    /// A member operation is done, its task's or a carrier's (who may carry what follows).
    pub(crate) fn finish_with(self: &Arc<Self>, carrier: Option<&mut dyn Carrier>, member: usize, op: OpId, sink: Sink, result: Result<Option<Vec<u8>>, Error>) {
        self.run_with(carrier, |core, now| {
            // (A replacement's shadow slot may be gone since.)
            if core.members.get_mut(member).and_then(|s| s.ops.remove(&op)).is_none() {
                // Settled already: the member was dropped (its operations failed with it) and
                // this task finished before its abort took. Its bytes are nobody's now.
                return;
            }
            let outcome = match result {
                Ok(bytes) => core.deliver(sink, bytes),
                Err(e) => OpOutcome::Failed(format!("{}: {e}", core.uris[member])),
            };
            core.coord.handle(op, outcome, now);
        })
    }

    fn drop_member(&self, core: &mut Core<M>, member: usize) {
        let slot = &mut core.members[member];
        for op in slot.ops.drain().filter_map(|(_, op)| op) {
            op.abort();
        }
        if slot.target.take().is_some() {
            self.cut(member);
        }
        if let Some(client) = slot.client.take() {
            self.close(client);
        }
        if !slot.reconnecting && !core.closed {
            slot.reconnecting = true;
            let _ = self.wake.send(Wake::Reconnect(member));
        }
    }

    /// A dropped member answers again at `uri`, with `found` in its metadata area. False
    /// when the member was replaced meanwhile (another server is now in its place): the
    /// connection is closed and the caller goes on trying the new address.
    pub(crate) fn member_back(self: &Arc<Self>, member: usize, uri: &Uri, client: M, found: Found) -> bool {
        self.run(|core, now| {
            if member >= core.members.len() {
                // A replacement's shadow slot, gone since.
                self.close(client);
                return true;
            }
            if core.uris[member] != *uri && !core.closed {
                self.close(client);
                return false;
            }
            core.members[member].reconnecting = false;
            // Connected meanwhile (a replacement's shadow took the place): one is enough.
            if core.closed || core.members[member].client.is_some() {
                self.close(client);
                return true;
            }
            core.members[member].client = Some(client);
            core.coord.member_back(member, found, now);
            true
        })
    }

    /// Puts the server at `uri` in `member`'s place: the old one is dropped, and the new one
    /// is connected (with backoff, as a returning member) and rebuilt in full.
    pub(crate) fn replace(self: &Arc<Self>, member: usize, uri: Uri) -> Result<(), Error> {
        self.run(|core, now| {
            if core.closed {
                return Err(Error::Closed);
            }
            match core.coord.replace_member(member, &uri.to_string(), now).map_err(Error::Refused)? {
                None => {
                    log::info!("pool member {} replaced by {uri}", core.uris[member]);
                    core.uris[member] = uri;
                }
                Some(shadow) => {
                    // Connected beside the member it replaces, for the copy, until the swap.
                    debug_assert_eq!(shadow, core.members.len());
                    log::info!("pool member {} is being replaced by {uri}: copying while it serves", core.uris[member]);
                    core.members.push(Slot::new(None, true));
                    core.uris.push(uri);
                    let _ = self.wake.send(Wake::Reconnect(shadow));
                }
            }
            Ok(())
        })
    }

    /// A spare took `member`'s place: it is reconnected at its address, and the pool file
    /// is edited to say so (in the background: it is file I/O).
    fn spare_taken(&self, core: &mut Core<M>, member: usize, old: String, uri: String) {
        match Uri::parse(&uri) {
            Ok(u) => core.uris[member] = u,
            // Spares are checked when the pool file is read; this is a bug if it happens.
            Err(e) => return log::error!("pool: spare {uri} has a bad address ({e}); member {} stays at {old}", member + 1),
        }
        log::warn!("pool member {} ({old}) was missing too long: spare {uri} takes its place and is rebuilt in full", member + 1);
        if let Some(file) = self.file.clone() {
            self.runtime.spawn_blocking(move || super::file::record_spare(&file, &old, &uri));
        }
    }

    /// A replacement's shadow takes `member`'s place: its connection (and its operations in
    /// flight) become the member's, the old member's connection is closed, and the
    /// shadow's slot goes.
    fn swap(&self, core: &mut Core<M>, member: usize, shadow: usize) {
        if shadow + 1 != core.members.len() {
            debug_assert!(false, "a swap with slot {shadow} of {}", core.members.len());
            return;
        }
        let new = core.members.pop().expect("checked above");
        let uri = core.uris.pop().expect("one address per slot");
        let old = std::mem::replace(&mut core.members[member], new);
        for op in old.ops.into_values().flatten() {
            op.abort();
        }
        // Both places changed hands: a carrier's connections for either go.
        core.members[member].target = None;
        self.cut(member);
        self.cut(shadow);
        if let Some(client) = old.client {
            self.close(client);
        }
        log::info!("pool member {} is now {uri}", core.uris[member]);
        core.uris[member] = uri;
        let slot = &mut core.members[member];
        if slot.client.is_none() && !slot.reconnecting {
            slot.reconnecting = true;
            let _ = self.wake.send(Wake::Reconnect(member));
        }
    }

    /// Adds connected members at the end of the list (`Coordinator::grow`); on a refusal
    /// they are handed back for disconnecting.
    pub(crate) fn add_members(self: &Arc<Self>, added: Vec<(Uri, M, Found)>, unix_secs: u64) -> Result<(), (Error, Vec<M>)> {
        self.run(|core, now| {
            let found = added.iter().map(|(u, _, f)| (u.to_string(), f.clone())).collect();
            let refused = match core.closed {
                true => Some(Error::Closed),
                false => core.coord.grow(found, unix_secs, now).err().map(Error::Refused),
            };
            if let Some(e) = refused {
                return Err((e, added.into_iter().map(|(_, m, _)| m).collect()));
            }
            for (uri, m, _) in added {
                log::info!("pool member {uri} added");
                core.members.push(Slot::new(Some(m), false));
                core.uris.push(uri);
            }
            Ok(())
        })
    }

    /// Takes every member out for disconnecting, stopping what is in flight on them.
    pub(crate) fn take_members(&self) -> Vec<M> {
        let mut core = self.core.lock().unwrap();
        let mut taken = Vec::new();
        for (i, s) in core.members.iter_mut().enumerate() {
            s.ops.drain().filter_map(|(_, op)| op).for_each(|op| op.abort());
            if s.target.take().is_some() {
                self.cut(i);
            }
            taken.extend(s.client.take());
        }
        taken
    }

    pub(crate) fn connections(&self) -> usize {
        self.look(|core| core.members.iter().filter_map(|s| s.client.as_ref()).map(M::connections).sum())
    }
}

impl<M: Member> Shared<M> {
    /// Tells a carrier that `member`'s connection is gone (`on_cut`).
    fn cut(&self, member: usize) {
        if let Some(cut) = self.on_cut.get() {
            cut(member);
        }
    }

    /// Disconnects a member in the background; one that stalls is given up on after a while.
    fn close(&self, client: M) {
        self.runtime.spawn(async move {
            let _ = tokio::time::timeout(Duration::from_secs(1), client.disconnect()).await;
        });
    }
}

impl<M> Core<M> {
    /// What a member operation sends, and where what it reads goes; `None` when the
    /// buffer it names is not here.
    fn route(&self, cmd: &MemberCmd, data: Data) -> Option<(Payload, Sink)> {
        let write_len = match *cmd {
            MemberCmd::Write { len, .. } => Some(len as usize),
            _ => None,
        };
        Some(match (data, write_len) {
            (Data::None, _) => (Payload::None, Sink::Nothing),
            (Data::Request { req, at }, None) => (Payload::None, Sink::Request { req, at }),
            (Data::Request { req, at }, Some(len)) => {
                let bytes = self.requests.get(&req)?.write.clone()?;
                let range = at as usize..at as usize + len;
                (range.end <= bytes.len()).then_some(())?;
                (Payload::Shared(bytes, range), Sink::Nothing)
            }
            (Data::Copy(id), None) => (Payload::None, Sink::Copy(id)),
            (Data::Copy(id), Some(_)) => {
                let bytes = self.copies.get(&id)?.clone();
                let all = 0..bytes.len();
                (Payload::Shared(bytes, all), Sink::Nothing)
            }
            (Data::Bytes(v), _) => (Payload::Owned(v), Sink::Nothing),
            (Data::Meta, _) => (Payload::None, Sink::Meta),
        })
    }

    /// Puts a finished member read where it belongs.
    fn deliver(&mut self, sink: Sink, bytes: Option<Vec<u8>>) -> OpOutcome {
        match (sink, bytes) {
            (Sink::Request { req, at }, Some(b)) => {
                // A request that already failed has no buffers left to fill.
                if let Some(r) = self.requests.get_mut(&req) {
                    r.read.land(at, b);
                }
            }
            (Sink::Copy(id), Some(b)) => {
                self.copies.insert(id, Arc::new(b));
            }
            (Sink::Meta, Some(b)) => return OpOutcome::Data(b),
            _ => {}
        }
        OpOutcome::Done
    }

    /// Where each scrub buffer after the first differs from the first.
    fn compare(&self, copies: &[CopyId]) -> Result<Vec<Vec<(u64, u64)>>, String> {
        let bufs: Vec<&Arc<Vec<u8>>> = copies.iter().map(|c| self.copies.get(c).ok_or("pool driver: a scrub buffer is gone")).collect::<Result<_, _>>()?;
        let (first, rest) = bufs.split_first().ok_or("pool driver: nothing to compare")?;
        Ok(rest.iter().map(|b| sluice_pool::coordinator::differing_ranges(first, b)).collect())
    }

    fn complete(&mut self, req: ReqId, result: Result<(), Failure>) {
        if let Some(r) = self.requests.remove(&req) {
            r.done.send(result.map(|()| r.read.finish()));
        }
    }
}
