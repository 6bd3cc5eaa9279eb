//! Load restriction in the server (issue 27): the `sluice_qos` scheduler, shared by every
//! worker, and each connection's port to it.
//!
//! Threads: one scheduler for the whole server, behind a mutex. Classes may be `shared`
//! (one bucket for every client in them, whichever worker serves each) and the `[limits]`
//! storage caps are for the node as a whole, so per-worker schedulers would have to split
//! every cap and bucket between workers and would lose fairness between clients served by
//! different workers. One mutex is the simplest correct choice: it is taken only by
//! connections that are attached (none unless QoS is configured), for a few bucket checks
//! per request. A held request may be let go by whichever worker polls the scheduler; its
//! id names the owning worker, whose mailbox it is put in, and that worker is woken.
//!
//! Ids: a connection's worker, its place among the worker's connections, that place's
//! generation (so that an id let go just as its connection closed is known as stale) and
//! the request's slot.

use std::collections::{BTreeMap, HashMap};
use std::hash::{Hash, Hasher};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, OnceLock};
use std::time::Instant;

use sluice_qos::{Class, Handle, Id, Nanos, Op, Scheduler, Verdict};

use crate::access::{Client, Rule};
use crate::limits::Limits;
use crate::metrics::{QosRecorder, QosSample};

/// The class connections get when neither their export nor a `[[qos-match]]` rule names
/// one, while QoS is on (a class or a storage cap is configured): no limits, the default
/// weight, one instance per client. A `[qos.default]` table replaces it.
pub const DEFAULT_CLASS: &str = "default";

/// Bits of an id: the slot, the connection's place, its generation, the worker.
const SLOT_BITS: u32 = 16;
const PLACE_BITS: u32 = 24;
const GENERATION_BITS: u32 = 12;
const WORKER_BITS: u32 = 12;
const _: () = assert!(SLOT_BITS + PLACE_BITS + GENERATION_BITS + WORKER_BITS == 64);

/// Wakes one worker.
pub type Waker = Box<dyn Fn() + Send + Sync>;

/// No timer wanted.
const NO_WAKE: u64 = u64::MAX;

/// The `[qos.NAME]` classes, which export uses which, and the `[[qos-match]]` rules.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct QosConfig {
    pub classes: BTreeMap<String, Class>,
    /// Export name to class name (`qos = "NAME"`).
    pub exports: HashMap<String, String>,
    /// Tried in order; the first that matches a client gives its class, over the export's.
    pub matches: Vec<QosMatch>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct QosMatch {
    pub rule: Rule,
    pub class: String,
}

impl QosConfig {
    /// Refuses a class that cannot mean anything, and a class name nothing defines.
    pub fn check(&self, limits: &Limits) -> Result<(), String> {
        Scheduler::new(self.with_default(), limits.storage(), 0).map_err(|e| e.to_string())?;
        let known = |name: &str| self.classes.contains_key(name) || name == DEFAULT_CLASS;
        for (export, class) in &self.exports {
            if !known(class) {
                return Err(format!("export {export:?}: qos = {class:?} names no [qos.{class}] table"));
            }
        }
        for m in &self.matches {
            if !known(&m.class) {
                return Err(format!("qos-match {}: class {:?} names no [qos.{}] table", m.rule, m.class, m.class));
            }
        }
        Ok(())
    }

    /// Whether connections go through the scheduler: some class or storage cap is set.
    pub fn is_on(&self, limits: &Limits) -> bool {
        !self.classes.is_empty() || limits.caps_storage()
    }

    fn with_default(&self) -> BTreeMap<String, Class> {
        let mut classes = self.classes.clone();
        classes.entry(DEFAULT_CLASS.to_owned()).or_default();
        classes
    }

    fn class_for(&self, export: &str, client: &Client) -> &str {
        let matched = self.matches.iter().find(|m| m.rule.matches(client)).map(|m| m.class.as_str());
        matched.or(self.exports.get(export).map(String::as_str)).unwrap_or(DEFAULT_CLASS)
    }
}

/// The scheduler and what decides which class a new connection gets.
struct State {
    sched: Scheduler,
    config: QosConfig,
    on: bool,
    /// Ids let go by one `settle`, handed to their workers after.
    ready: Vec<Id>,
}

/// One worker's requests that may start now, and when it should next poll.
#[derive(Default)]
struct Mailbox {
    ready: Mutex<Vec<Id>>,
    /// Whether `ready` may hold ids: the worker looks at this, not the lock, on every turn
    /// of its loop, so a server without QoS never takes the lock.
    filled: AtomicBool,
    due: AtomicU64,
}

/// The server's scheduler, shared by its workers.
pub struct Qos {
    origin: Instant,
    state: Mutex<State>,
    mailboxes: Box<[Mailbox]>,
    wakers: OnceLock<Vec<Waker>>,
    recorder: Arc<QosRecorder>,
}

impl Qos {
    pub fn new(config: QosConfig, limits: &Limits, workers: usize, recorder: Arc<QosRecorder>) -> Result<Qos, String> {
        config.check(limits)?;
        let sched = Scheduler::new(config.with_default(), limits.storage(), 0).map_err(|e| e.to_string())?;
        let on = config.is_on(limits);
        let mailboxes = (0..workers).map(|_| Mailbox { due: AtomicU64::new(NO_WAKE), ..Mailbox::default() }).collect();
        let state = Mutex::new(State { sched, config, on, ready: Vec::new() });
        Ok(Qos { origin: Instant::now(), state, mailboxes, wakers: OnceLock::new(), recorder })
    }

    /// How to wake each worker when a request of theirs may start; set once they run.
    pub fn set_wakers(&self, wakers: Vec<Waker>) {
        let _ = self.wakers.set(wakers);
    }

    fn nanos(&self, now: Instant) -> Nanos {
        now.saturating_duration_since(self.origin).as_nanos() as Nanos
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// New classes and caps (a reload): held requests stay held and take them at once;
    /// connections opened from now on are classed by the new rules.
    pub fn reconfigure(&self, config: QosConfig, limits: &Limits) -> Result<(), String> {
        config.check(limits)?;
        let now = self.nanos(Instant::now());
        let mut st = self.lock();
        st.sched.reconfigure(now, config.with_default(), limits.storage()).map_err(|e| e.to_string())?;
        st.on = config.is_on(limits);
        st.config = config;
        // Caps may have been raised: whatever can start now should.
        self.settle(&mut st, now, None);
        Ok(())
    }

    /// A port for a new connection of `worker`, or None while QoS is off.
    pub fn attach(self: &Arc<Self>, export: &str, client: &Client, worker: usize) -> Option<Port> {
        let now = self.nanos(Instant::now());
        let mut st = self.lock();
        if !st.on {
            return None;
        }
        let class = st.config.class_for(export, client).to_owned();
        let handle = match st.sched.attach(&class, client_key(client), now) {
            Ok(h) => h,
            Err(e) => {
                log::warn!("qos: {e}; the connection is not restricted");
                return None;
            }
        };
        let samples = self.recorder.class(&class);
        Some(Port { qos: Arc::clone(self), handle, worker, base: 0, samples })
    }

    /// Polls the scheduler for held requests that may start, puts each in its worker's
    /// mailbox (waking workers other than `caller`), and sets the caller's timer.
    fn settle(&self, st: &mut State, now: Nanos, caller: Option<usize>) {
        let mut ready = std::mem::take(&mut st.ready);
        while let Some(id) = st.sched.poll(now) {
            ready.push(id);
        }
        if let Some(w) = caller {
            let due = st.sched.next_wake(now).unwrap_or(NO_WAKE);
            self.mailboxes[w].due.store(due, Ordering::Relaxed);
        }
        for id in ready.drain(..) {
            let w = Parts::of(id).worker;
            self.mailboxes[w].ready.lock().unwrap_or_else(|e| e.into_inner()).push(id);
            // Before the wake: the woken worker must see it.
            self.mailboxes[w].filled.store(true, Ordering::Release);
            if Some(w) != caller {
                if let Some(wake) = self.wakers.get().and_then(|h| h.get(w)) {
                    wake();
                }
            }
        }
        st.ready = ready;
    }

    /// When `worker` should poll next, if at all.
    pub fn due(&self, worker: usize) -> Option<Instant> {
        let due = self.mailboxes[worker].due.load(Ordering::Relaxed);
        (due != NO_WAKE).then(|| self.origin + std::time::Duration::from_nanos(due))
    }

    /// `worker`'s timer fired: let go what may start now.
    pub fn tick(&self, worker: usize, now: Instant) {
        let now = self.nanos(now);
        let mut st = self.lock();
        self.settle(&mut st, now, Some(worker));
    }

    /// The ids of `worker`'s requests that may start now, into `out`.
    pub fn take_ready(&self, worker: usize, out: &mut Vec<Id>) {
        let mailbox = &self.mailboxes[worker];
        if mailbox.filled.load(Ordering::Acquire) {
            let mut ready = mailbox.ready.lock().unwrap_or_else(|e| e.into_inner());
            mailbox.filled.store(false, Ordering::Relaxed);
            out.append(&mut ready);
        }
    }

    /// Whether `take_ready` would give anything now.
    #[cfg(any(test, feature = "sim"))]
    pub fn has_ready(&self, worker: usize) -> bool {
        self.mailboxes[worker].filled.load(Ordering::Acquire)
    }

    /// Nothing held, nothing counted at the storage.
    #[cfg(any(test, feature = "sim"))]
    pub fn is_idle(&self) -> bool {
        let st = self.lock();
        st.sched.held() == 0 && st.sched.inflight() == 0
    }

    /// A request let go after its connection closed: it never reaches the storage.
    pub fn stray(&self, worker: usize) {
        let now = self.nanos(Instant::now());
        let mut st = self.lock();
        st.sched.finished();
        self.settle(&mut st, now, Some(worker));
    }

    /// What the metrics show of each class now: every configured class (and `default`),
    /// so that a series does not come and go with the class's connections.
    pub fn samples(&self) -> Vec<QosSample> {
        let now = self.nanos(Instant::now());
        let st = self.lock();
        if !st.on {
            return Vec::new();
        }
        let sample = |class: &str| QosSample { class: class.to_owned(), held: 0, tokens: None };
        let mut by_class: BTreeMap<String, QosSample> = st.config.with_default().keys().map(|c| (c.clone(), sample(c))).collect();
        for s in st.sched.stats(now) {
            let entry = by_class.entry(s.class.clone()).or_insert_with(|| sample(&s.class));
            entry.held += s.held as u64;
            entry.tokens = match (entry.tokens, s.tokens) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
        }
        by_class.into_values().collect()
    }
}

/// A client's key for its class instance: the address, or a Unix peer's uid, as for
/// `connections-per-client`, hashed to the scheduler's u64.
fn client_key(client: &Client) -> u64 {
    let mut h = std::collections::hash_map::DefaultHasher::new();
    (client.addr, client.addr.is_none().then_some(client.uid).flatten()).hash(&mut h);
    h.finish()
}

/// What an id says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Parts {
    pub worker: usize,
    pub generation: u16,
    pub place: u32,
    pub slot: u16,
}

impl Parts {
    pub fn of(id: Id) -> Parts {
        let mask = |bits: u32| (1u64 << bits) - 1;
        Parts {
            slot: (id & mask(SLOT_BITS)) as u16,
            place: ((id >> SLOT_BITS) & mask(PLACE_BITS)) as u32,
            generation: ((id >> (SLOT_BITS + PLACE_BITS)) & mask(GENERATION_BITS)) as u16,
            worker: (id >> (SLOT_BITS + PLACE_BITS + GENERATION_BITS)) as usize,
        }
    }

    /// The id of slot 0 of a connection: its slots' ids are this plus the slot.
    pub fn base(worker: usize, place: u32, generation: u16) -> Id {
        debug_assert!(worker < 1 << WORKER_BITS && place < 1 << PLACE_BITS);
        let generation = generation as u64 & ((1 << GENERATION_BITS) - 1);
        (worker as u64) << (SLOT_BITS + PLACE_BITS + GENERATION_BITS) | generation << (SLOT_BITS + PLACE_BITS) | (place as u64) << SLOT_BITS
    }

    /// Generations wrap within their bits.
    pub fn next_generation(generation: u16) -> u16 {
        (generation + 1) & ((1 << GENERATION_BITS) - 1)
    }
}

/// Most workers and connections per worker that ids can name.
pub const WORKERS_MAX: usize = 1 << WORKER_BITS;
pub const PLACES_MAX: usize = 1 << PLACE_BITS;

/// A connection's way to the scheduler.
pub struct Port {
    qos: Arc<Qos>,
    handle: Handle,
    worker: usize,
    base: Id,
    samples: Arc<crate::metrics::QosClassRecorder>,
}

impl Port {
    /// Names the connection's place among its worker's connections (ids carry it).
    pub fn place(&mut self, place: u32, generation: u16) {
        self.base = Parts::base(self.worker, place, generation);
    }

    /// A request ready for the storage: start it now, or hold it until the scheduler lets
    /// it go (through the worker's mailbox).
    pub fn submit(&self, now: Instant, slot: u16, op: Op, bytes: u64) -> Verdict {
        let now = self.qos.nanos(now);
        let mut st = self.qos.lock();
        let verdict = st.sched.submit(now, self.handle, self.base | slot as Id, op, bytes);
        if verdict == Verdict::Start {
            self.samples.started(bytes);
        } else {
            self.qos.settle(&mut st, now, Some(self.worker));
        }
        verdict
    }

    /// A held request was let go after `held_ns`.
    pub fn released(&self, held_ns: u64, bytes: u64) {
        self.samples.released(held_ns, bytes);
    }

    /// A started request is done with the storage.
    pub fn finished(&self, now: Instant) {
        let now = self.qos.nanos(now);
        let mut st = self.qos.lock();
        st.sched.finished();
        self.qos.settle(&mut st, now, Some(self.worker));
    }

    /// Drops the held request of `slot`. False when it was let go already: its id is on
    /// its way to this worker's mailbox.
    pub fn remove(&self, now: Instant, slot: u16) -> bool {
        let now = self.qos.nanos(now);
        let mut st = self.qos.lock();
        let removed = st.sched.remove(self.handle, self.base | slot as Id, now);
        self.qos.settle(&mut st, now, Some(self.worker));
        removed
    }

    /// The connection closed: its instance is let go once nothing of it is held.
    pub fn detach(&self, now: Instant) {
        let now = self.qos.nanos(now);
        let mut st = self.qos.lock();
        st.sched.detach(self.handle, now);
        self.qos.settle(&mut st, now, Some(self.worker));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_round_trip() {
        let base = Parts::base(4095, (1 << 24) - 1, 4095);
        assert_eq!(Parts::of(base | 65535), Parts { worker: 4095, generation: 4095, place: (1 << 24) - 1, slot: 65535 });
        assert_eq!(Parts::of(Parts::base(3, 7, 9) | 2), Parts { worker: 3, generation: 9, place: 7, slot: 2 });
        assert_eq!(Parts::next_generation(4095), 0);
    }

    fn config(text: &[(&str, Class)], exports: &[(&str, &str)], matches: &[(&str, &str)]) -> QosConfig {
        QosConfig {
            classes: text.iter().map(|(n, c)| (n.to_string(), c.clone())).collect(),
            exports: exports.iter().map(|(e, c)| (e.to_string(), c.to_string())).collect(),
            matches: matches.iter().map(|(r, c)| QosMatch { rule: Rule::parse(r).unwrap(), class: c.to_string() }).collect(),
        }
    }

    #[test]
    fn unknown_class_names_are_refused() {
        let limits = Limits::default();
        let gold = Class { iops: Some(100), ..Class::default() };
        config(&[("gold", gold.clone())], &[("vm", "gold")], &[("10.0.0.0/8", "gold")]).check(&limits).unwrap();
        let e = config(&[("gold", gold.clone())], &[("vm", "silver")], &[]).check(&limits).unwrap_err();
        assert!(e.contains("export \"vm\": qos = \"silver\""), "{e}");
        let e = config(&[], &[], &[("10.0.0.0/8", "bronze")]).check(&limits).unwrap_err();
        assert!(e.contains("qos-match 10.0.0.0/8: class \"bronze\""), "{e}");
        let bad = Class { iops: Some(0), ..Class::default() };
        assert!(config(&[("z", bad)], &[], &[]).check(&limits).unwrap_err().contains("qos.z: iops = 0"));
    }

    #[test]
    fn a_matching_rule_wins_over_the_export() {
        let c = config(&[("a", Class::default()), ("b", Class::default())], &[("vm", "a")], &[("10.1.0.0/16", "b")]);
        let near = Client { addr: Some("10.1.2.3".parse().unwrap()), ..Client::default() };
        let far = Client { addr: Some("10.2.2.3".parse().unwrap()), ..Client::default() };
        assert_eq!((c.class_for("vm", &near), c.class_for("vm", &far), c.class_for("other", &far)), ("b", "a", DEFAULT_CLASS));
    }
}
