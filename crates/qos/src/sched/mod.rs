//! The scheduler: requests in, "start this one now" out, time passed in.
//!
//! Each class instance has a FIFO queue. A request starts at once when nothing is held
//! anywhere and every limit lets it (the uncontended path: a few bucket checks, no queue).
//! Otherwise it is held, and `poll` hands held requests out in mClock's order: a class
//! behind its reservation first, then the smallest weight tag, never past a class limit or
//! the server-wide caps. `next_wake` says when the caller's timer should poll again.
//!
//! Memory: one `Instance` per class instance (its buckets and an empty queue), and one
//! 24-byte queue entry per held request. Held requests are bounded by the caller: each one
//! still counts against its connection's in-flight budgets, so a connection at its budget
//! stops reading requests and the queues stop growing.

mod instance;
mod node;
mod pick;
#[cfg(test)]
mod tests;

use std::collections::{BTreeMap, HashMap, VecDeque};

use crate::class::{Class, Limits};
use crate::limits::{COST_BYTES_PER_OP_DEFAULT, COST_UNITS_PER_OP, LINGERING_INSTANCES_MAX, LINGERING_SWEEP_COUNT, TAG_SCALE};
use crate::request::{Id, Nanos, Op, Verdict};
use instance::{Entry, Instance, Phase};
use node::Node;

/// A class instance, as `attach` gives it to a connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Handle(u32);

/// A configuration the scheduler refuses; nothing of it was taken.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ConfigError {
    Class { name: String, reason: String },
    Limits(String),
    /// `attach` named a class the configuration does not have.
    UnknownClass(String),
}

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            ConfigError::Class { name, reason } => write!(f, "qos.{name}: {reason}"),
            ConfigError::Limits(reason) => write!(f, "limits: {reason}"),
            ConfigError::UnknownClass(name) => write!(f, "no QoS class {name:?}"),
        }
    }
}

impl std::error::Error for ConfigError {}

/// What one class instance looks like now, for metrics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InstanceStats {
    pub class: String,
    pub client: Option<u64>,
    pub held: usize,
    /// Whole tokens in its tightest limit (None: no limit).
    pub tokens: Option<i64>,
}

/// The scheduler's state as work conservation is judged.
#[cfg(test)]
pub(crate) struct Probe {
    /// The storage may take another request (its queue depth).
    pub room: bool,
    /// Instances whose next held request their class limits would let start.
    pub within_class_limits: usize,
    /// The server-wide rate caps are full: any one request would fit them.
    pub caps_rested: bool,
}

pub struct Scheduler {
    classes: BTreeMap<String, Class>,
    node: Node,
    cost_bytes_per_op: u64,
    slots: Vec<Option<Instance>>,
    free: Vec<u32>,
    by_key: HashMap<(String, Option<u64>), u32>,
    /// Instances with held requests.
    active: Vec<u32>,
    /// Instances nobody is attached to whose buckets have not filled up yet: kept so that a
    /// client that reconnects finds its debts, freed by a later `attach` once rested.
    lingering: VecDeque<(u32, u64)>,
    /// Instances created so far: each one's serial, so a stale `lingering` entry is known.
    created: u64,
    held: usize,
    /// Until when every held request is known to wait for its own class's limits (0: not
    /// known). Before then a request of another instance may start at once, as when
    /// nothing is held: it passes nobody who could go. Found when `poll` finds nothing.
    blocked_until: Nanos,
    /// Start-time fair queueing's virtual time: the start tag of the last request chosen by
    /// weight. A class that wakes or was held by its limits starts from here.
    vtime: u128,
}

fn check(classes: &BTreeMap<String, Class>, limits: &Limits) -> Result<(), ConfigError> {
    for (name, class) in classes {
        class.validate().map_err(|reason| ConfigError::Class { name: name.clone(), reason })?;
    }
    limits.validate().map_err(ConfigError::Limits)
}

/// Bytes per operation in the weights' cost: the storage's own ratio when both its caps are
/// given (the device the operator described), else the default.
fn cost_bytes_per_op(limits: &Limits) -> u64 {
    match (limits.storage_bps, limits.storage_iops) {
        (Some(bps), Some(iops)) => (bps / iops).max(1),
        _ => COST_BYTES_PER_OP_DEFAULT,
    }
}

impl Scheduler {
    pub fn new(classes: BTreeMap<String, Class>, limits: Limits, now: Nanos) -> Result<Scheduler, ConfigError> {
        check(&classes, &limits)?;
        Ok(Scheduler {
            node: Node::new(&limits, now),
            cost_bytes_per_op: cost_bytes_per_op(&limits),
            classes,
            slots: Vec::new(),
            free: Vec::new(),
            by_key: HashMap::new(),
            active: Vec::new(),
            lingering: VecDeque::new(),
            created: 0,
            held: 0,
            blocked_until: 0,
            vtime: 0,
        })
    }

    /// A request's cost in the weights' currency, in `COST_UNITS_PER_OP` fixed point: one
    /// operation plus its bytes counted in operations of the storage's size.
    pub fn cost(&self, bytes: u64) -> u64 {
        let data = bytes as u128 * COST_UNITS_PER_OP as u128 / self.cost_bytes_per_op as u128;
        u64::try_from(COST_UNITS_PER_OP as u128 + data).unwrap_or(u64::MAX)
    }

    /// The instance of `class` that serves `client` (the key of a client connection set:
    /// its address, say): the class's one instance if it is shared. Each connection attaches
    /// once and detaches when it closes.
    pub fn attach(&mut self, class: &str, client: u64, now: Nanos) -> Result<Handle, ConfigError> {
        self.sweep(now);
        let config = self.classes.get(class).ok_or_else(|| ConfigError::UnknownClass(class.to_string()))?;
        let key = (class.to_string(), (!config.shared).then_some(client));
        let i = match self.by_key.get(&key) {
            Some(&i) => i,
            None => {
                self.created += 1;
                let inst = Instance::new(class, key.1, config, now, self.created);
                let i = match self.free.pop() {
                    Some(i) => {
                        self.slots[i as usize] = Some(inst);
                        i
                    }
                    None => {
                        self.slots.push(Some(inst));
                        (self.slots.len() - 1) as u32
                    }
                };
                self.by_key.insert(key, i);
                i
            }
        };
        self.inst_mut(i).refs += 1;
        Ok(Handle(i))
    }

    /// A connection closed. Remove its held requests first (`remove`); an instance nobody
    /// is attached to goes once its queue is empty and its buckets are full again.
    pub fn detach(&mut self, h: Handle, now: Nanos) {
        let inst = self.inst_mut(h.0);
        inst.refs = inst.refs.checked_sub(1).expect("detach after attach");
        self.release_if_unused(h.0, now);
    }

    fn release_if_unused(&mut self, i: u32, now: Nanos) {
        let inst = self.slots[i as usize].as_ref().expect("live instance");
        if inst.refs > 0 || !inst.queue.is_empty() {
            return;
        }
        if inst.rested(now) {
            return self.forget(i);
        }
        if !inst.lingering {
            let serial = inst.serial;
            self.inst_mut(i).lingering = true;
            self.lingering.push_back((i, serial));
        }
        if self.lingering.len() > LINGERING_INSTANCES_MAX {
            let oldest = self.lingering.pop_front().expect("over the maximum");
            if let Some(inst) = self.listed(oldest) {
                inst.lingering = false;
                if inst.refs == 0 && inst.queue.is_empty() {
                    self.forget(oldest.0);
                }
            }
        }
    }

    /// The instance a `lingering` entry names, unless the entry is stale.
    fn listed(&mut self, (i, serial): (u32, u64)) -> Option<&mut Instance> {
        self.slots[i as usize].as_mut().filter(|inst| inst.serial == serial)
    }

    /// Looks at a few of the oldest lingering instances: forgets those rested, drops the
    /// entries of those in use again, keeps the rest (at the back).
    fn sweep(&mut self, now: Nanos) {
        for _ in 0..LINGERING_SWEEP_COUNT.min(self.lingering.len()) {
            let entry = self.lingering.pop_front().expect("counted");
            let Some(inst) = self.listed(entry) else { continue };
            inst.lingering = false;
            if inst.refs > 0 || !inst.queue.is_empty() {
                continue;
            }
            if inst.rested(now) {
                self.forget(entry.0);
            } else {
                inst.lingering = true;
                self.lingering.push_back(entry);
            }
        }
    }

    fn forget(&mut self, i: u32) {
        let inst = self.slots[i as usize].take().expect("live instance");
        self.by_key.remove(&(inst.class, inst.client));
        self.free.push(i);
    }

    fn inst_mut(&mut self, i: u32) -> &mut Instance {
        self.slots[i as usize].as_mut().expect("a handle names a live instance")
    }

    /// A request arrives (after validation, before storage). `Start`: it is counted and
    /// may go to storage now. `Held`: it waits; `poll` gives its id back when it may start.
    /// While anything is held the uncontended path is off, so a held request may be
    /// startable at once: poll after every `Held`, as after every `finished` and wake.
    pub fn submit(&mut self, now: Nanos, h: Handle, id: Id, op: Op, bytes: u64) -> Verdict {
        let e = Entry { id, op, bytes };
        let uncontended = self.held == 0 || now < self.blocked_until;
        let node_free = uncontended && self.node.room() && self.node.allows(now, bytes);
        let inst = self.inst_mut(h.0);
        let was_idle = inst.queue.is_empty();
        if was_idle {
            inst.wake(now);
        }
        if node_free && was_idle && inst.allows(now, &e) {
            let phase = if inst.behind_ns(now).is_some_and(|b| b >= 0) { Phase::Reservation } else { Phase::Weight };
            self.start(now, h.0, &e, phase);
            return Verdict::Start;
        }
        inst.queue.push_back(e);
        if was_idle {
            self.active.push(h.0);
        }
        self.held += 1;
        self.blocked_until = 0;
        Verdict::Held
    }

    fn start(&mut self, now: Nanos, i: u32, e: &Entry, phase: Phase) {
        let step = self.cost(e.bytes) as u128 * TAG_SCALE;
        let vtime = self.vtime;
        let inst = self.inst_mut(i);
        let step = step.div_ceil(inst.weight as u128);
        let tag = inst.charge(now, e, phase, vtime, step);
        if phase == Phase::Weight {
            self.vtime = self.vtime.max(tag);
        }
        self.node.take(now, e.bytes);
    }

    /// The next held request to start now, already counted; None when none may start yet
    /// (ask `next_wake` when to try again, and poll after every `finished`).
    pub fn poll(&mut self, now: Nanos) -> Option<Id> {
        if self.held == 0 || !self.node.room() {
            return None;
        }
        self.blocked_until = 0;
        let Some((i, phase)) = pick::choose(&self.slots, &self.active, now, self.vtime) else {
            self.blocked_until = self.active.iter().map(|&i| self.class_allows_at(i, now)).min().unwrap_or(0);
            return None;
        };
        let inst = self.slots[i as usize].as_ref().expect("chosen instances are live");
        let head = *inst.queue.front().expect("chosen instances hold requests");
        if !self.node.allows(now, head.bytes) {
            return None;
        }
        self.inst_mut(i).queue.pop_front();
        self.start(now, i, &head, phase);
        self.after_dequeue(i, now);
        Some(head.id)
    }

    fn after_dequeue(&mut self, i: u32, now: Nanos) {
        self.held -= 1;
        if self.slots[i as usize].as_ref().is_some_and(|inst| inst.queue.is_empty()) {
            let at = self.active.iter().position(|&a| a == i).expect("an instance with requests is active");
            self.active.swap_remove(at);
            self.release_if_unused(i, now);
        }
    }

    /// When a held request could start, for the caller's timer: None when nothing is held,
    /// or when only a finished request can make room (the storage is at its queue depth).
    pub fn next_wake(&self, now: Nanos) -> Option<Nanos> {
        if self.held == 0 || !self.node.room() {
            return None;
        }
        let head_of = |i: u32| {
            let inst = self.slots[i as usize].as_ref().expect("active instances are live");
            (inst, inst.queue.front().expect("active instances hold requests"))
        };
        if let Some((i, _)) = pick::choose(&self.slots, &self.active, now, self.vtime) {
            return Some(self.node.allowed_at(now, head_of(i).1.bytes));
        }
        let at = |&i: &u32| self.class_allows_at(i, now).max(self.node.allowed_at(now, head_of(i).1.bytes));
        self.active.iter().map(at).min()
    }

    /// When the limits of an active instance's class let its next request start.
    fn class_allows_at(&self, i: u32, now: Nanos) -> Nanos {
        let inst = self.slots[i as usize].as_ref().expect("active instances are live");
        inst.allowed_at(now, inst.queue.front().expect("active instances hold requests"))
    }

    /// A started request has left the storage (completed or failed).
    pub fn finished(&mut self) {
        self.node.inflight = self.node.inflight.checked_sub(1).expect("finished after a start");
    }

    /// Drops a held request (its connection closed). False if it was not held there (it
    /// has started, or was never submitted).
    pub fn remove(&mut self, h: Handle, id: Id, now: Nanos) -> bool {
        let inst = self.inst_mut(h.0);
        let Some(at) = inst.queue.iter().position(|e| e.id == id) else { return false };
        inst.queue.remove(at);
        self.blocked_until = 0;
        self.after_dequeue(h.0, now);
        true
    }

    /// Drops every request held in `h`'s instance that `gone` picks (all of a closing
    /// connection's, say), in one pass over the queue; returns how many.
    pub fn remove_all(&mut self, h: Handle, now: Nanos, gone: impl Fn(Id) -> bool) -> usize {
        let queue = &mut self.inst_mut(h.0).queue;
        let before = queue.len();
        queue.retain(|e| !gone(e.id));
        let removed = before - queue.len();
        if removed > 0 {
            self.blocked_until = 0;
            // All but the last through the count; the last also retires an emptied instance.
            self.held -= removed - 1;
            self.after_dequeue(h.0, now);
        }
        removed
    }

    /// New classes and caps at run time. Held requests stay where they are; each instance
    /// takes its class's new settings, keeping its tokens (up to the new burst) and debts.
    /// An instance whose class is gone runs unlimited at the default weight until its last
    /// connection detaches; a class that changes `shared` applies to attachments made after.
    pub fn reconfigure(&mut self, now: Nanos, classes: BTreeMap<String, Class>, limits: Limits) -> Result<(), ConfigError> {
        check(&classes, &limits)?;
        self.blocked_until = 0;
        for inst in self.slots.iter_mut().flatten() {
            let config = classes.get(&inst.class).cloned().unwrap_or_default();
            inst.reconfigure(now, &config);
        }
        self.node.reconfigure(&limits, now);
        self.cost_bytes_per_op = cost_bytes_per_op(&limits);
        self.classes = classes;
        Ok(())
    }

    /// Requests held now, in all classes.
    pub fn held(&self) -> usize {
        self.held
    }

    /// Requests started and not yet `finished`.
    pub fn inflight(&self) -> u32 {
        self.node.inflight
    }

    /// What the simulation checks work conservation against, at `now`.
    #[cfg(test)]
    pub(crate) fn probe(&self, now: Nanos) -> Probe {
        let within = |&i: &u32| {
            let inst = self.slots[i as usize].as_ref().expect("active instances are live");
            inst.allows(now, inst.queue.front().expect("active instances hold requests"))
        };
        Probe { room: self.node.room(), within_class_limits: self.active.iter().filter(|i| within(i)).count(), caps_rested: self.node.rested(now) }
    }

    /// Every live class instance, for metrics.
    pub fn stats(&self, now: Nanos) -> Vec<InstanceStats> {
        let one = |inst: &Instance| InstanceStats {
            class: inst.class.clone(),
            client: inst.client,
            held: inst.queue.len(),
            tokens: inst.tokens(now),
        };
        self.slots.iter().flatten().map(one).collect()
    }
}
