//! A deterministic simulation of the scheduler: seeded classes, caps and clients (floods,
//! trickles, bursts; 4 KiB, 1 MiB and mixed sizes) against a simulated storage that serves
//! what was started, with reconfigurations, closed connections and reconnections. After
//! every step it checks that no class instance or server-wide cap went past its limit over
//! any window beyond its burst, that nothing removed or already started starts, that the
//! scheduler does not sit idle while it could start something, and that it always says
//! when to wake; at the end, that no request was lost. `scenario` adds the statistical
//! checks: shares by weight, reservations under a flood, limited rates.

mod chaos;
mod gen;
mod scenario;
mod storage;
mod sweep;
mod watch;

use std::collections::BTreeMap;

use crate::class::{Class, Limits};
use crate::limits::NANOS_PER_SEC;
use crate::request::{Id, Nanos, Op, Verdict};
use crate::sched::{Handle, Scheduler};
pub use sluice_proto::rng::Rng;
use gen::{Arrival, Workload};
use storage::Storage;
use watch::{Meter, Watch};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    Held,
    Started,
    Removed,
}

struct Req {
    client: usize,
    class: String,
    op: Op,
    bytes: u64,
    state: State,
}

struct Client {
    class: String,
    key: u64,
    work: Workload,
    /// Open: its handle and the instance it was attached to.
    open: Option<(Handle, (String, Option<u64>))>,
    /// Closed: when it reconnects.
    reopen_at: Nanos,
    outstanding: u32,
    next_arrival: Nanos,
}

struct World {
    rng: Rng,
    now: Nanos,
    sched: Scheduler,
    storage: Storage,
    classes: BTreeMap<String, Class>,
    limits: Limits,
    clients: Vec<Client>,
    reqs: BTreeMap<Id, Req>,
    next_id: Id,
    /// Limits watched per class instance, since the last reconfiguration.
    watches: BTreeMap<(String, Option<u64>), Vec<Watch>>,
    node_watches: Vec<Watch>,
    meter: Meter,
    /// No arrivals (and no chaos) from here on.
    stop_at: Nanos,
    /// The next reconfiguration or connection event; None: none in this run.
    chaos_at: Option<Nanos>,
    steps: u64,
    log: Vec<String>,
    /// `SLUICE_QOS_SIM_TRACE=1`: every start on stderr (time, class, op, bytes).
    trace: bool,
}

const SEC: Nanos = NANOS_PER_SEC;
/// Steps (each one event time) a run may take, arrivals and drain together.
const STEPS_MAX: u64 = 5_000_000;

impl World {
    fn new(seed: u64, classes: BTreeMap<String, Class>, limits: Limits, storage: Storage, stop_at: Nanos) -> World {
        let sched = Scheduler::new(classes.clone(), limits, 0).expect("generated configurations are valid");
        World {
            rng: Rng::seeded(seed),
            now: 0,
            sched,
            storage,
            node_watches: watch::node_watches(&limits),
            classes,
            limits,
            clients: Vec::new(),
            reqs: BTreeMap::new(),
            next_id: 0,
            watches: BTreeMap::new(),
            meter: Meter { from: 0, until: Nanos::MAX, by_class: BTreeMap::new() },
            stop_at,
            chaos_at: None,
            steps: 0,
            log: Vec::new(),
            trace: std::env::var("SLUICE_QOS_SIM_TRACE").is_ok(),
        }
    }

    fn add_client(&mut self, class: &str, key: u64, work: Workload) {
        self.clients.push(Client { class: class.to_string(), key, work, open: None, reopen_at: 0, outstanding: 0, next_arrival: 0 });
        let c = self.clients.len() - 1;
        self.connect(c);
    }

    fn connect(&mut self, c: usize) {
        let client = &mut self.clients[c];
        if !self.classes.contains_key(&client.class) {
            client.class = self.classes.keys().next().expect("a class").clone();
        }
        let shared = self.classes[&client.class].shared;
        let inst = (client.class.clone(), (!shared).then_some(client.key));
        let h = self.sched.attach(&client.class, client.key, self.now).expect("the class exists");
        client.open = Some((h, inst));
        client.next_arrival = self.now;
        self.log.push(format!("{} client {c} attaches to {}", self.now, client.class));
    }

    fn run(&mut self) -> Result<(), String> {
        while !(self.now >= self.stop_at && self.sched.held() == 0 && self.storage.is_idle()) {
            self.steps += 1;
            if self.steps > STEPS_MAX {
                return Err(format!("no end after {STEPS_MAX} steps, {} held", self.sched.held()));
            }
            let Some(at) = self.next_event() else {
                return Err(format!("{} requests held and nothing will ever wake them", self.sched.held()));
            };
            self.now = at.max(self.now);
            self.step()?;
        }
        self.check_none_lost()
    }

    fn next_event(&self) -> Option<Nanos> {
        let arrivals = self.clients.iter().filter_map(|c| self.arrival_at(c)).min();
        let wake = self.sched.next_wake(self.now);
        let chaos = self.chaos_at.filter(|_| self.now < self.stop_at);
        [arrivals, wake, chaos, self.storage.next_done()].into_iter().flatten().min()
    }

    fn arrival_at(&self, c: &Client) -> Option<Nanos> {
        if self.now >= self.stop_at {
            return None;
        }
        match c.open {
            None => Some(c.reopen_at),
            Some(_) if c.outstanding >= c.work.depth => None,
            Some(_) => Some(c.next_arrival.max(self.now)),
        }
    }

    fn step(&mut self) -> Result<(), String> {
        while let Some(id) = self.storage.complete(self.now) {
            self.sched.finished();
            let c = self.reqs[&id].client;
            self.clients[c].outstanding -= 1;
        }
        if self.chaos_at.is_some_and(|t| t <= self.now) && self.now < self.stop_at {
            self.chaos()?;
        }
        for c in 0..self.clients.len() {
            while self.arrival_at(&self.clients[c]).is_some_and(|t| t <= self.now) {
                self.arrive(c)?;
            }
        }
        while let Some(id) = self.sched.poll(self.now) {
            self.started(id)?;
        }
        self.check_idle()
    }

    fn arrive(&mut self, c: usize) -> Result<(), String> {
        let Some((h, _)) = self.clients[c].open.clone() else {
            self.connect(c);
            return Ok(());
        };
        let work = self.clients[c].work;
        let (op, bytes) = (gen::op(&mut self.rng, &work), gen::size(&mut self.rng, work.sizes));
        let bytes = if op == Op::Other && self.rng.below(2) == 0 { 0 } else { bytes };
        let id = self.next_id;
        self.next_id += 1;
        let class = self.clients[c].class.clone();
        self.reqs.insert(id, Req { client: c, class, op, bytes, state: State::Held });
        self.clients[c].outstanding += 1;
        self.clients[c].next_arrival = self.next_arrival(c);
        // Fairness of the uncontended path: a request may start on arrival while others are
        // held only if every one of those waits for its own class's limits.
        let could_go = (self.sched.held() > 0).then(|| self.sched.probe(self.now).within_class_limits);
        if self.sched.submit(self.now, h, id, op, bytes) == Verdict::Start {
            if let Some(n @ 1..) = could_go {
                return Err(format!("{id} started on arrival past held requests of {n} instances that could start"));
            }
            self.started(id)?;
        }
        Ok(())
    }

    fn next_arrival(&mut self, c: usize) -> Nanos {
        match self.clients[c].work.arrival {
            Arrival::Flood => self.now,
            Arrival::Trickle { gap_ns } => self.now + gen::gap(&mut self.rng, gap_ns),
            Arrival::Bursts { on_ns, off_ns } => {
                let period = on_ns + off_ns;
                let phase = (self.now + c as u64 * 7_777_777) % period;
                if phase < on_ns { self.now } else { self.now + period - phase }
            }
        }
    }

    fn started(&mut self, id: Id) -> Result<(), String> {
        let now = self.now;
        let req = self.reqs.get_mut(&id).ok_or_else(|| format!("started {id}, never submitted"))?;
        if req.state != State::Held {
            return Err(format!("started {id} while {:?}", req.state));
        }
        req.state = State::Started;
        let (op, bytes, c) = (req.op, req.bytes, req.client);
        let inst = self.clients[c].open.as_ref().map(|(_, inst)| inst.clone()).ok_or("started a request of a closed client")?;
        let classes = &self.classes;
        let watches = self.watches.entry(inst.clone()).or_insert_with(|| {
            classes.get(&inst.0).map_or_else(Vec::new, |class| watch::class_watches(&inst.0, class))
        });
        for w in watches.iter_mut().chain(self.node_watches.iter_mut()) {
            w.start(now, op, bytes)?;
        }
        let cost = self.sched.cost(bytes);
        if self.trace {
            eprintln!("{now} {} {op:?} {bytes}", self.reqs[&id].class);
        }
        self.meter.count(now, &self.reqs[&id].class, op, bytes, cost);
        self.storage.start(now, id, bytes);
        Ok(())
    }

    /// Work conservation: after polling, with room at the storage, no held request is both
    /// within its class's limits and under server-wide caps that would take any request;
    /// and while requests are held and the storage has room, the scheduler names a wake-up.
    fn check_idle(&self) -> Result<(), String> {
        let p = self.sched.probe(self.now);
        if p.room && p.within_class_limits > 0 && p.caps_rested {
            return Err(format!("{} class instances could start a request, yet none was started", p.within_class_limits));
        }
        if self.sched.held() > 0 && p.room {
            match self.sched.next_wake(self.now) {
                Some(t) if t > self.now => {}
                other => return Err(format!("requests held, the storage has room, and the wake is {other:?}")),
            }
        }
        Ok(())
    }

    fn check_none_lost(&self) -> Result<(), String> {
        if let Some((id, _)) = self.reqs.iter().find(|(_, r)| r.state == State::Held) {
            return Err(format!("request {id} was never started"));
        }
        if self.sched.inflight() != 0 {
            return Err(format!("{} still counted at the storage", self.sched.inflight()));
        }
        Ok(())
    }
}

impl World {
    /// A failed run's report: the seed, the error, the end of the log.
    fn failure(&self, seed: u64, error: &str) -> String {
        let tail: Vec<&String> = self.log.iter().rev().take(20).collect();
        let tail: Vec<&str> = tail.into_iter().rev().map(String::as_str).collect();
        format!("seed {seed}: {error} (at {} ns, step {})\n{}", self.now, self.steps, tail.join("\n"))
    }
}
