//! A deterministic simulation of the cache core: an in-memory backing and members whose
//! operations complete after random delays (so out of order), clients that read at random
//! and in sequential streams, write (overlapping writes in flight at once too), zero,
//! trim, flush and send cache hints, a backing whose operations take effect at any time
//! between their start and their completion and sometimes fail (a write at times failing
//! and landing up to 3 ms later, perhaps after its failure was reported: its connection
//! gone), and members
//! that die (reported or not), hang, restart empty behind the gateway's back, drop pages of
//! their slots, and have old writes land after they restarted. Every read reply is checked
//! against the model of acknowledged writes; after every step, the core's invariants and
//! bounds; at the end, that every request was replied exactly once.

mod faults;
mod gen;
mod model;
mod seeds;
mod setup;
mod store;

use std::collections::BTreeMap;

use crate::api::{Action, BackingCmd, MemberCmd, Nanos, Params, ReqId, Request};
use crate::core::Cache;
use crate::counters::Counters;
use crate::limits::{paced_fills_max, paced_run_blocks, PREFETCH_WINDOW_BLOCKS_MAX, STREAMS_MAX};
use model::Model;
use sluice_proto::rng::Rng;
use store::{Cmd, InFlight, Member, Target};

/// The message of a backing failure the simulation injects.
const INJECTED: &str = "injected backing failure";

const US: Nanos = 1_000;

/// What a run does, chosen from the seed.
#[derive(Clone, Copy, Debug)]
pub struct Knobs {
    pub steps: u64,
    pub depth: usize,
    pub faults: bool,
    /// Percent of requests that are writes, zeroes or trims.
    pub write_percent: u64,
    /// Percent of requests that continue a sequential stream (reads).
    pub sequential_percent: u64,
    /// Members lend a slot for every block (else fewer, so eviction runs).
    pub ample: bool,
    /// Prefetch on whatever the seed says.
    pub force_prefetch: bool,
    pub break_stale_rule: bool,
    pub break_failed_write_rule: bool,
    /// A hit's pages taken unchecked.
    pub break_verify: bool,
    /// A hit's check seeded with another generation, or another volume identity: it fails
    /// for good pages (caught as verify failures in a run without faults).
    pub break_generation: bool,
    pub break_identity: bool,
    /// A hit's first page checked, the others taken unchecked.
    pub break_pages: bool,
    /// Of the faults, only pages changed while a hit reads them (`page_under_hit`), more
    /// often.
    pub only_torn_hits: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Read,
    Write,
    Other,
}

struct Req {
    kind: Kind,
    offset: u64,
    len: u64,
    started: u64,
    /// A write's id in the model.
    write: Option<usize>,
}

pub struct World {
    rng: Rng,
    now: Nanos,
    /// Orders starts and replies for the model.
    event: u64,
    p: Params,
    knobs: Knobs,
    cache: Cache,
    backing: Vec<u8>,
    members: Vec<Member>,
    /// When a member that is down comes back.
    restart_at: Vec<Option<Nanos>>,
    inflight: Vec<InFlight>,
    /// Backing writes reported failed before they landed (their connection died with them
    /// on the way), and when each lands.
    late: Vec<(Nanos, Cmd, usize)>,
    model: Model,
    reqs: BTreeMap<ReqId, Req>,
    next_req: u64,
    cursors: Vec<u64>,
    /// Recent slot writes by member, for faults that land one again late.
    past_writes: Vec<(usize, Cmd)>,
    /// The write being submitted (its model id), for the backing write it starts.
    submitting: Option<usize>,
    /// Blocks and bytes the reads touched: each is a hit or a miss, once.
    read_blocks: u64,
    read_bytes: u64,
    log: Vec<String>,
}

impl World {
    pub fn new(seed: u64, knobs: Knobs) -> World {
        let mut rng = Rng::seeded(seed);
        let mut p = setup::params(&mut rng);
        p.prefetch |= knobs.force_prefetch;
        let mut cache = Cache::new(p.clone());
        cache.break_stale_rule = knobs.break_stale_rule;
        cache.break_failed_write_rule = knobs.break_failed_write_rule;
        cache.break_verify = knobs.break_verify;
        cache.break_generation = knobs.break_generation;
        cache.break_identity = knobs.break_identity;
        cache.break_pages = knobs.break_pages;
        let backing = vec![0; p.volume_bytes as usize];
        let members = (0..p.members.len()).map(|_| Member { bytes: Vec::new(), alive: false, hung: false, epoch: 0 }).collect();
        let restart_at = vec![Some(0); p.members.len()];
        World {
            rng,
            now: 0,
            event: 1,
            p,
            knobs,
            cache,
            backing,
            members,
            restart_at,
            inflight: Vec::new(),
            late: Vec::new(),
            model: Model::default(),
            reqs: BTreeMap::new(),
            next_req: 0,
            cursors: vec![0, 0],
            past_writes: Vec::new(),
            submitting: None,
            read_blocks: 0,
            read_bytes: 0,
            log: Vec::new(),
        }
    }

    pub fn run(&mut self) -> Result<Counters, String> {
        for _ in 0..self.knobs.steps {
            self.step(true)?;
        }
        for _ in 0..1_000_000 {
            if self.reqs.is_empty() && self.inflight.is_empty() && self.late.is_empty() {
                return self.finish();
            }
            self.step(false)?;
        }
        Err(format!("no end: {} requests and {} operations still in flight", self.reqs.len(), self.inflight.len()))
    }

    fn step(&mut self, busy: bool) -> Result<(), String> {
        self.now += 1 + self.rng.below(20 * US);
        if busy && self.knobs.faults {
            self.fault();
        }
        self.restarts();
        while busy && self.reqs.len() < self.knobs.depth && self.rng.below(3) == 0 {
            self.arrive()?;
        }
        if self.members.iter().any(|m| m.hung) && self.rng.below(200) == 0 {
            self.now += (self.cache.member_timeout_ms() + 1) * 1_000_000;
        }
        self.complete_due()?;
        self.cache.handle_tick(self.now);
        self.drain()?;
        self.check_bounds()
    }

    fn submit(&mut self, kind: Kind, offset: u64, len: u64, r: Request) -> Result<(), String> {
        let req = ReqId(self.next_req);
        self.next_req += 1;
        if kind == Kind::Read && len > 0 {
            let bs = self.p.block_bytes;
            self.read_blocks += (offset + len).div_ceil(bs) - offset / bs;
            self.read_bytes += len;
        }
        self.event += 1;
        self.log.push(format!("{} event {} req {} {:?}", self.now, self.event, req.0, short(&r)));
        self.reqs.insert(req, Req { kind, offset, len, started: self.event, write: self.submitting });
        self.cache.handle_request(self.now, req, r);
        self.drain()?;
        match self.submitting.take() {
            Some(w) => Err(format!("write {w} started no backing write")),
            None => Ok(()),
        }
    }

    /// Lands backing operations whose time came and delivers those that are due, in
    /// random order (an operation lands before it is delivered).
    fn complete_due(&mut self) -> Result<(), String> {
        self.land_late();
        loop {
            let due: Vec<usize> = (0..self.inflight.len()).filter(|&i| self.landable(&self.inflight[i]) || self.deliverable(&self.inflight[i])).collect();
            if due.is_empty() {
                return Ok(());
            }
            let i = due[self.rng.below(due.len() as u64) as usize];
            if self.inflight[i].target == Target::Backing && self.inflight[i].landed.is_none() {
                self.land(i);
                continue;
            }
            let op = self.inflight.swap_remove(i);
            self.deliver(op);
            self.drain()?;
        }
    }

    fn landable(&self, op: &InFlight) -> bool {
        op.target == Target::Backing && op.landed.is_none() && op.lands <= self.now
    }

    /// A backing operation takes effect; a write that lands is a version from now on. Or,
    /// sometimes, a write fails first and lands later (`late`).
    fn land(&mut self, i: usize) {
        let cmd = self.inflight[i].cmd.clone();
        if let Some(w) = self.inflight[i].write.filter(|_| self.knobs.faults && self.rng.below(60) == 0) {
            let at = self.now + self.rng.below(3_000 * US);
            self.log.push(format!("{} write {w} fails, its connection gone; it lands at {at}", self.now));
            self.late.push((at, cmd, w));
            self.inflight[i].landed = Some(Err(format!("{INJECTED}: the connection died").into()));
            return;
        }
        let (out, applied) = self.backing_op(&cmd);
        self.event += 1;
        if let (true, Some(w)) = (applied, self.inflight[i].write) {
            self.model.write_landed(w, self.event);
            self.log.push(format!("{} event {} write {w} lands", self.now, self.event));
        }
        self.inflight[i].landed = Some(out);
    }

    /// Failed writes whose time came land on the backing after all.
    fn land_late(&mut self) {
        while let Some(i) = self.late.iter().position(|&(at, _, _)| at <= self.now) {
            let (_, cmd, w) = self.late.swap_remove(i);
            if store::apply(&mut self.backing, &cmd).is_ok() {
                self.event += 1;
                self.model.write_landed(w, self.event);
                self.log.push(format!("{} event {} write {w} lands late", self.now, self.event));
            }
        }
    }

    fn deliverable(&self, op: &InFlight) -> bool {
        let hung = matches!(op.target, Target::Member { member, epoch } if self.members[member].hung && self.members[member].epoch == epoch);
        op.due <= self.now && !hung
    }

    fn deliver(&mut self, f: InFlight) {
        match f.target {
            Target::Backing => {
                let out = f.landed.expect("landed before it is delivered");
                self.cache.handle_backing_done(self.now, f.op, out);
            }
            Target::Member { member, epoch } => {
                let m = &mut self.members[member];
                if m.epoch != epoch || !m.alive {
                    // An old connection's write may still land on the restarted member.
                    if m.alive && matches!(f.cmd, Cmd::Member(_)) && self.rng.below(2) == 0 {
                        let _ = store::apply(&mut m.bytes, &f.cmd);
                    }
                    // And its answer may still reach the core: the shell forwards a
                    // completion that was on its way when the member was dropped.
                    if self.rng.below(2) == 0 {
                        let out = self.late_answer(member, &f.cmd);
                        self.cache.handle_member_done(self.now, f.op, out);
                    }
                    return;
                }
                if let Cmd::Member(crate::api::MemberCmd::Read { offset, len }) = f.cmd {
                    self.page_under_hit(member, offset, len);
                }
                let out = store::apply(&mut self.members[member].bytes, &f.cmd);
                if let Cmd::Member(crate::api::MemberCmd::Write { .. }) = f.cmd {
                    self.remember_write(member, f.cmd.clone());
                }
                self.cache.handle_member_done(self.now, f.op, out);
            }
        }
    }

    /// What an operation of a member's earlier incarnation reports when it comes in after
    /// the core dropped that member: success, a failure, or for a read the bytes there are
    /// now (a restarted member's, or another fill's). The core must take none of it.
    fn late_answer(&mut self, member: usize, cmd: &Cmd) -> crate::api::Outcome {
        match (cmd, self.rng.below(3)) {
            (_, 0) => Err("late: the connection was dropped".into()),
            (Cmd::Member(MemberCmd::Read { offset, len }), _) => {
                let at = |b: &Vec<u8>| b.get(*offset as usize..(*offset + *len) as usize).map(<[u8]>::to_vec);
                Ok(at(&self.members[member].bytes).unwrap_or_else(|| vec![0; *len as usize]))
            }
            _ => Ok(Vec::new()),
        }
    }

    fn drain(&mut self) -> Result<(), String> {
        while let Some(a) = self.cache.poll_action() {
            match a {
                Action::Backing { op, cmd } => {
                    let delay = self.delay();
                    let (due, lands) = (self.now + delay, self.now + self.rng.below(delay + 1));
                    let write = match cmd {
                        BackingCmd::Write { .. } | BackingCmd::Zero { .. } | BackingCmd::Trim { .. } => {
                            Some(self.submitting.take().ok_or("a backing write no client write started")?)
                        }
                        BackingCmd::Read { .. } | BackingCmd::Flush => None,
                    };
                    let target = Target::Backing;
                    self.inflight.push(InFlight { op, target, cmd: Cmd::Backing(cmd), lands, landed: None, write, due });
                }
                Action::Member { op, member, cmd } => {
                    let (due, epoch) = (self.now + self.delay() / 4, self.members[member].epoch);
                    let target = Target::Member { member, epoch };
                    self.check_trim_alone(target, &cmd)?;
                    self.inflight.push(InFlight { op, target, cmd: Cmd::Member(cmd), lands: due, landed: None, write: None, due });
                }
                Action::Reply { req, result } => self.reply(req, result)?,
                Action::Reconnect { member, .. } => {
                    self.members[member].alive = false;
                    self.schedule_restart(member);
                }
            }
        }
        Ok(())
    }

    fn delay(&mut self) -> Nanos {
        match self.rng.below(10) {
            0 => 200 * US + self.rng.below(800 * US),
            _ => 5 * US + self.rng.below(100 * US),
        }
    }

    fn reply(&mut self, req: ReqId, result: Result<Vec<u8>, crate::api::Failure>) -> Result<(), String> {
        self.event += 1;
        let r = self.reqs.remove(&req).ok_or_else(|| format!("reply to request {} that is not in flight (twice?)", req.0))?;
        self.log.push(format!("{} event {} reply {} {}", self.now, self.event, req.0, if result.is_ok() { "ok" } else { "failed" }));
        if let Some(w) = r.write {
            self.model.write_replied(w, self.event, result.is_ok()).map_err(|e| format!("request {}: {e}", req.0))?;
        }
        let data = match result {
            Ok(data) => data,
            // Only the backing's failures reach a client; a member's never do.
            Err(e) if e.message.contains(INJECTED) => return Ok(()),
            Err(e) => return Err(format!("request {} failed: {}", req.0, e.message)),
        };
        match r.kind {
            Kind::Read if data.len() as u64 != r.len => Err(format!("read {} replied {} bytes of {}", req.0, data.len(), r.len)),
            Kind::Read => self.model.check_read(r.offset, &data, r.started).map_err(|e| format!("read {}: {e}", req.0)),
            Kind::Write | Kind::Other => Ok(()),
        }
    }

    /// A trim never shares its range with another operation of this incarnation of the
    /// member in flight (a slot being trimmed is neither read nor refilled until the trim
    /// is reported), so it can never land after a fill's write.
    fn check_trim_alone(&self, target: Target, cmd: &MemberCmd) -> Result<(), String> {
        let range = |c: &MemberCmd| match c {
            MemberCmd::Read { offset, len } => ("read", *offset, offset + len),
            MemberCmd::Trim { offset, len } => ("trim", *offset, offset + len),
            MemberCmd::Write { offset, data } => ("write", *offset, offset + data.len() as u64),
        };
        let (what, lo, hi) = range(cmd);
        for f in self.inflight.iter().filter(|f| f.target == target) {
            let Cmd::Member(other) = &f.cmd else { continue };
            let (was, a, b) = range(other);
            if (what == "trim" || was == "trim") && a < hi && lo < b {
                return Err(format!("a {what} of {lo}..{hi} sent while a {was} of {a}..{b} is in flight on {target:?}"));
            }
        }
        Ok(())
    }

    fn check_bounds(&self) -> Result<(), String> {
        self.cache.check()?;
        let f = self.cache.inflight();
        let run_max = setup::RUN_BLOCKS_MAX.max(paced_run_blocks(self.p.block_bytes) as usize);
        if f.paced > paced_fills_max(self.p.block_bytes) || f.fills > f.ops * run_max || f.directory as u64 > f.slots {
            return Err(format!("bounds broken: {f:?}"));
        }
        if f.prefetch_queue > STREAMS_MAX * PREFETCH_WINDOW_BLOCKS_MAX as usize || f.requests != self.reqs.len() {
            return Err(format!("bounds broken: {f:?} with {} requests in flight", self.reqs.len()));
        }
        Ok(())
    }

    fn finish(&mut self) -> Result<Counters, String> {
        let f = self.cache.inflight();
        if f.requests != 0 || f.fills != 0 || f.paced != 0 {
            return Err(format!("idle, yet the core holds {f:?}"));
        }
        self.cache.check_idle()?;
        let c = self.cache.counters();
        if !self.knobs.faults && c.verify_failures != 0 {
            return Err(format!("no faults, yet {} hits failed their check: the check refuses good slots", c.verify_failures));
        }
        if c.hits + c.misses != self.read_blocks || c.hit_bytes + c.miss_bytes != self.read_bytes {
            return Err(format!("reads touched {} blocks, {} bytes; counted {c:?}", self.read_blocks, self.read_bytes));
        }
        Ok(self.cache.counters())
    }

    /// A failed run's report: the seed, the error, the end of the log.
    pub fn failure(&self, seed: u64, error: &str) -> String {
        let tail: Vec<&str> = self.log.iter().rev().take(25).rev().map(String::as_str).collect();
        format!("seed {seed} ({:?}, {} blocks of {}): {error}\n{}", self.knobs, self.p.volume_bytes.div_ceil(self.p.block_bytes), self.p.block_bytes, tail.join("\n"))
    }
}

fn short(r: &Request) -> String {
    match r {
        Request::Write { offset, data, .. } => format!("Write {offset}+{}", data.len()),
        other => format!("{other:?}"),
    }
}
