//! A deterministic simulation of a pool: a seeded workload against simulated members that
//! crash (keeping their page cache, or losing what was not flushed), stall past the
//! timeout, fail operations, answer in any order, and come back; and a coordinator that
//! crashes and is assembled again from the members. After every answer it checks that
//! acknowledged writes read back; at the end, with everything healed, that the volume
//! reads back whole, that the copies of every set agree, and that a clean stop releases
//! the pool.
//!
//! One assumption of the real world is kept explicitly: a member that was dropped is only
//! taken back once it has processed what was already sent to it on the old connection.

#![cfg_attr(not(test), allow(dead_code))] // the scrub's helpers serve its tests only

mod grow;
mod member;
mod model;
mod restart;
mod report;
mod scrub;
mod sets;

use std::collections::BTreeMap;

use crate::coordinator::{Action, Command, Coordinator, CopyId, Data, Found, MemberState, OpOutcome, ReqId, Session};
use crate::limits::META_BYTES;
use crate::meta::Superblock;
use crate::spec::{Layout, PoolSpec};
use member::{Done, Health, Pending, SimMember, SECTOR};
use model::Model;
pub use report::Report;
pub use sluice_proto::rng::Rng;

struct Req {
    cmd: Command,
    /// Versions: what a write sends, or what a read got.
    buf: Vec<u64>,
}

struct World {
    rng: Rng,
    now: u64,
    spec: PoolSpec,
    members: Vec<SimMember>,
    coord: Coordinator,
    model: Model,
    reqs: BTreeMap<ReqId, Req>,
    copies: BTreeMap<CopyId, Vec<u64>>,
    sessions: u64,
    read_errors: u64,
    report: Report,
    log: Vec<String>,
    /// A live replacement: (the member replaced, the shadow's slot in `members`).
    shadow: Option<(usize, usize)>,
    /// The member whose place a live replacement's successor took last, under this
    /// coordinator: until its own superblock lands, it is blank to the next one.
    successor: Option<usize>,
    /// Volume sectors whose copies a scrub test made differ: the workload leaves them alone.
    diverged: std::collections::BTreeSet<u64>,
    /// Data bytes of every member (new ones too).
    member_bytes: u64,
    /// The step at which the pool grows, if it does.
    grow_at: Option<u64>,
    /// A write was just acknowledged mid-reshape: the coordinator crashes at the next step.
    crash_after_ack: bool,
}

const MEMBER_DATA_BYTES: u64 = 64 << 20;
const STEPS: u64 = 3_000;
const SETTLE_STEPS_MAX: u64 = 400_000;

/// Grow runs use small members (and units of 16 KiB or more), so that a reshape moves a
/// few hundred units and finishes within the run, crashes and all.
const GROW_MEMBER_DATA_BYTES: u64 = 8 << 20;

/// Whether and at which step this run grows its pool.
fn plan_grow(rng: &mut Rng, spec: &mut PoolSpec) -> Option<u64> {
    // An offset placement cannot be grown (its sets depend on the member count).
    if rng.below(2) == 0 || spec.placement == crate::spec::Placement::Offset {
        return None;
    }
    if spec.layout != Layout::Mirror {
        spec.stripe_unit = 16384 << rng.below(4);
    }
    Some(rng.below(STEPS / 2))
}

fn spec_for(rng: &mut Rng) -> PoolSpec {
    let (layout, members, copies) = match rng.below(4) {
        0 => (Layout::Stripe, 2 + rng.below(2) as usize, 1),
        1 => (Layout::Mirror, 2, 2),
        2 => (Layout::Mirror, 3, 3),
        _ => (Layout::Raid10, 4 + 2 * rng.below(2) as usize, 2),
    };
    let placement = match layout == Layout::Raid10 && rng.below(2) == 0 {
        true => crate::spec::Placement::Offset,
        false => crate::spec::Placement::Near,
    };
    let unit = if layout == Layout::Mirror { u64::MAX } else { 4096 << rng.below(6) };
    let spares = if layout.redundant() { rng.below(3) as usize } else { 0 };
    PoolSpec {
        layout,
        placement,
        stripe_unit: unit,
        copies,
        members: (0..members).map(|i| format!("sim://member{i}")).collect(),
        member_timeout_ms: 300,
        resync_rate_bytes_per_s: 64 << 20,
        spares: (0..spares).map(|i| format!("sim://spare{i}")).collect(),
        // Within the time a crashed member stays down, sometimes.
        spare_after_ms: 300 + rng.below(1_200),
        scrub_interval_ms: None,
    }
}

/// Runs one seeded simulation.
pub fn run(rng: Rng) -> Result<Report, String> {
    let mut w = World::new(rng, true)?;
    for i in 0..STEPS {
        if w.grow_at == Some(i) {
            // A pool does not grow while a member is being replaced: it waits.
            match w.shadow {
                Some(_) => w.grow_at = Some(i + 1),
                None => w.grow().map_err(|e| w.explain(e))?,
            }
        }
        if let Err(e) = w.step(true) {
            return Err(w.explain(e));
        }
    }
    w.settle().map_err(|e| w.explain(e))?;
    w.verify().map_err(|e| w.explain(e))?;
    w.report.resynced_bytes += w.coord.status().resynced_bytes;
    Ok(w.report)
}

impl World {
    /// A freshly formatted pool of a seeded layout, and its coordinator; with `grows`, the
    /// pool may be planned to grow mid-run.
    fn new(rng: Rng, grows: bool) -> Result<World, String> {
        let mut rng = rng;
        let mut spec = spec_for(&mut rng);
        let grow_at = if grows { plan_grow(&mut rng, &mut spec) } else { None };
        let member_bytes = if grow_at.is_some() { GROW_MEMBER_DATA_BYTES } else { MEMBER_DATA_BYTES };
        let mut members: Vec<SimMember> = (0..spec.members.len()).map(|_| SimMember::new(member_bytes)).collect();
        let found: Vec<Found> = members.iter().map(|m| Found { size: m.size, meta: m.meta.clone(), read_only: false }).collect();
        let region = 64 << (10 + rng.below(7));
        let formatted = crate::coordinator::format_with(&spec, &found, [rng.below(255) as u8 + 1; 16], false, Some(region))?;
        for (m, bytes) in members.iter_mut().zip(formatted) {
            m.meta[..bytes.len()].copy_from_slice(&bytes);
        }
        let found = members.iter().map(|m| Some(Found { size: m.size, meta: m.meta.clone(), read_only: false })).collect();
        let coord = Coordinator::assemble(&spec, found, session(1), false, 0)?;
        let offset = spec.placement == crate::spec::Placement::Offset;
        let report = Report { layout: if offset { "raid10 offset" } else { spec.layout.name() }, offset_runs: offset as u64, ..Report::default() };
        let mut w = World {
            rng,
            now: 0,
            spec,
            members,
            coord,
            model: Model::new(),
            reqs: BTreeMap::new(),
            copies: BTreeMap::new(),
            sessions: 1,
            read_errors: 0,
            report,
            log: Vec::new(),
            diverged: std::collections::BTreeSet::new(),
            shadow: None,
            successor: None,
            member_bytes,
            grow_at,
            crash_after_ack: false,
        };
        w.pump()?;
        Ok(w)
    }
}

fn session(id: u64) -> Session {
    Session { id, pid: 1, host: "sim".into() }
}

impl World {
    fn explain(&self, e: String) -> String {
        let tail: Vec<&String> = self.log.iter().rev().filter(|l| !l.contains("time jumps")).take(std::env::var("SIM_LOG").map_or(60, |_| 100000)).collect();
        let queues: Vec<(usize, Health, bool)> = self.members.iter().map(|m| (m.queue.len(), m.health, m.dropped)).collect();
        format!("{e}\nnow {} requests {} status: {:?}\nqueues {queues:?} wakeup {:?}\nlast events (newest first):\n{tail:#?}", self.now, self.reqs.len(), self.coord.status().members, self.coord.next_wakeup())
    }

    /// One step of the workload: time passes, and one thing happens.
    fn step(&mut self, faults: bool) -> Result<(), String> {
        self.now += self.rng.below(4);
        self.heal();
        if faults {
            self.crash_while_reshaping()?;
        }
        match self.rng.below(100) {
            0..=49 if faults => self.submit_random(),
            50..=51 if faults && self.rng.below(4) == 0 => self.fault(),
            _ => Ok(()),
        }?;
        // Members carry out every operation whose time has come, in any order.
        while self.deliver()? {}
        if self.coord.next_wakeup().is_some_and(|t| t <= self.now) {
            self.coord.tick(self.now);
        }
        // What the tick decided (a member dropped, a spare taken) is carried out before a
        // member is taken back, as the driver does: it acts on each answer at once.
        self.pump()?;
        self.reconnect();
        self.pump()
    }

    /// Members whose stall or down time is over carry on.
    fn heal(&mut self) {
        for m in &mut self.members {
            match m.health {
                Health::Stalled { until } | Health::Down { until } if until <= self.now => m.health = Health::Up,
                _ => {}
            }
        }
    }

    fn submit_random(&mut self) -> Result<(), String> {
        if self.reqs.len() >= 6 {
            return Ok(());
        }
        let size = self.coord.size();
        let len = (1 + self.rng.below(64)) * SECTOR;
        // Most writes land in a hot eighth of the volume, so resyncs have something to skip.
        let span = if self.rng.below(16) == 0 { size } else { size / 8 };
        let offset = match self.reshape_frontier(len) {
            Some(offset) => offset,
            None => self.rng.below((span - len) / SECTOR + 1) * SECTOR,
        };
        if !self.model.free(offset, len) {
            return Ok(());
        }
        let cmd = match self.rng.below(20) {
            0..=8 => Command::Read { offset, len },
            9..=16 => Command::Write { offset, len, fua: self.rng.below(8) == 0 },
            17 => Command::Zero { offset, len, fua: false, may_trim: self.rng.below(2) == 0 },
            18 => Command::Trim { offset, len, fua: false },
            _ => Command::Flush,
        };
        if cmd.is_write() && self.diverged.range(offset / SECTOR..(offset + len) / SECTOR).next().is_some() {
            return Ok(());
        }
        let buf = match cmd {
            Command::Write { .. } => self.model.versions(len),
            Command::Read { .. } | Command::Zero { .. } | Command::Trim { .. } => vec![0; (len / SECTOR) as usize],
            Command::Flush => Vec::new(),
        };
        if cmd != Command::Flush {
            self.model.hold(offset, len);
        }
        self.report.requests += 1;
        let id = self.coord.submit(cmd, self.now);
        self.reqs.insert(id, Req { cmd, buf });
        Ok(())
    }

    /// One member carries out one operation whose time has come; false when there is none.
    fn deliver(&mut self) -> Result<bool, String> {
        let now = self.now;
        let ready: Vec<(usize, usize)> = (0..self.members.len())
            .filter(|&m| self.members[m].health == Health::Up)
            .flat_map(|m| self.members[m].queue.iter().enumerate().filter(|(_, p)| p.ready_at <= now).map(move |(i, _)| (m, i)))
            .collect();
        if ready.is_empty() {
            return Ok(false);
        }
        let (m, at) = ready[self.rng.below(ready.len() as u64) as usize];
        let p = self.members[m].queue.remove(at).expect("index in range");
        let done = self.members[m].apply(&p);
        if p.conn != self.members[m].conn || self.members[m].dropped {
            return Ok(true);
        }
        let outcome = match done {
            Done::Ok => OpOutcome::Done,
            Done::Meta(bytes) => OpOutcome::Data(bytes),
            Done::Failed => OpOutcome::Failed("I/O error".into()),
            Done::Read(versions) => {
                match &p.data {
                    Data::Request { req, at } => {
                        if let Some(r) = self.reqs.get_mut(req) {
                            let first = (at / SECTOR) as usize;
                            r.buf[first..first + versions.len()].copy_from_slice(&versions);
                        }
                    }
                    Data::Copy(c) => {
                        self.copies.insert(*c, versions);
                    }
                    _ => return Err("a data read without a destination".into()),
                }
                OpOutcome::Done
            }
        };
        self.coord.handle(p.op, outcome, self.now);
        Ok(true)
    }

    /// Injects one fault. Redundant pools get at most one fault per set at a time, so that
    /// every acknowledged write keeps a copy.
    fn fault(&mut self) -> Result<(), String> {
        self.report.faults += 1;
        if self.coord.status().reshape.is_some() {
            self.report.reshape_faults += 1;
        }
        if self.rng.below(6) == 0 {
            // Forgetting an unrecorded power loss, or a member being replaced, would be a
            // set's second fault.
            if self.power_loss_unrecorded() || self.handover_at_risk() {
                return Ok(());
            }
            return if self.rng.below(3) == 0 { self.restart_cleanly() } else { self.crash_coordinator() };
        }
        let status = self.coord.status();
        let redundant = self.spec.layout.redundant();
        let candidates: Vec<usize> = (0..self.spec.members.len())
            .filter(|&m| {
                !redundant || self.mates(m).into_iter().all(|x| status.members[x].state == MemberState::InSync && self.members[x].health == Health::Up && !self.members[x].fail_next)
            })
            .collect();
        if candidates.is_empty() {
            return Ok(());
        }
        let m = candidates[self.rng.below(candidates.len() as u64) as usize];
        let until = self.now + 100 + self.rng.below(1_500);
        if let Some((_, slot)) = self.shadow.filter(|_| self.rng.below(4) == 0) {
            self.log.push(format!("{} the shadow (slot {slot}) crashes", self.now));
            self.members[slot].crash(&mut self.rng, false, until);
            self.coord.member_lost(slot, "connection reset", self.now);
            return Ok(());
        }
        if redundant && self.rng.below(8) == 0 {
            return self.replace(m);
        }
        match self.rng.below(3) {
            0 => {
                let power = redundant && self.rng.below(2) == 0;
                self.log.push(format!("{} member {m} crashes (power loss: {power})", self.now));
                self.members[m].crash(&mut self.rng, power, until);
                self.coord.member_lost(m, "connection reset", self.now);
            }
            1 => {
                self.log.push(format!("{} member {m} stalls until {until}", self.now));
                self.members[m].health = Health::Stalled { until: self.now + 100 + self.rng.below(800) };
            }
            _ => {
                self.log.push(format!("{} member {m} fails its next operation", self.now));
                self.members[m].fail_next = true;
            }
        }
        Ok(())
    }

    /// Whether a member lost power and no other member of its set records it yet as
    /// anything but in sync. Only those others still hold the writes it lost (acknowledged,
    /// not flushed); a coordinator that crashed then would leave the next one no way to
    /// tell which copy is stale, and it reconciles from the first in-sync member of a set.
    fn power_loss_unrecorded(&mut self) -> bool {
        let status = self.coord.status();
        for (m, member) in self.members.iter_mut().enumerate().take(status.members.len()) {
            if status.members[m].state == MemberState::InSync {
                // Rebuilt since (the last copy flushed before it counted as in sync).
                member.power_lost = false;
            }
        }
        (0..self.spec.members.len()).filter(|&m| self.members[m].power_lost).any(|m| {
            !self.mates(m).into_iter().filter(|&x| x != m).any(|x| match Superblock::decode(&self.members[x].meta) {
                Ok(Some(sb)) => sb.roles.get(m).is_some_and(|r| *r != crate::meta::Role::Active),
                _ => false,
            })
        })
    }

    /// Members the coordinator dropped are taken back once they answer and have drained
    /// their old connection.
    fn reconnect(&mut self) {
        for i in 0..self.members.len() {
            let m = &mut self.members[i];
            if m.dropped && m.health == Health::Up && m.queue.is_empty() && self.now >= m.retry_at {
                m.dropped = false;
                let found = Found { size: m.size, meta: m.meta.clone(), read_only: false };
                self.log.push(format!("{} member {i} answers again", self.now));
                self.coord.member_back(i, found, self.now);
            }
        }
    }

    /// Carries out everything the coordinator asked for.
    fn pump(&mut self) -> Result<(), String> {
        while let Some(a) = self.coord.poll() {
            match a {
                Action::Member { op, member, cmd, data } => {
                    let payload = match &data {
                        Data::Request { req, at } => {
                            let r = self.reqs.get(req).ok_or("an operation for an unknown request")?;
                            match (r.cmd, cmd) {
                                (Command::Write { .. }, crate::coordinator::MemberCmd::Write { len, .. }) => {
                                    let first = (at / SECTOR) as usize;
                                    r.buf[first..first + (len / SECTOR) as usize].to_vec()
                                }
                                _ => Vec::new(),
                            }
                        }
                        Data::Copy(c) => self.copies.get(c).cloned().unwrap_or_default(),
                        _ => Vec::new(),
                    };
                    let conn = self.members[member].conn;
                    let ready_at = self.now + self.rng.below(20);
                    self.members[member].queue.push_back(Pending { op, cmd, data, payload, conn, ready_at });
                }
                Action::Complete { req, result } => {
                    let r = self.reqs.remove(&req).ok_or("an answer to an unknown request")?;
                    if let (Command::Read { .. }, Err(e)) = (r.cmd, &result) {
                        self.log.push(format!("{} read failed: {e}", self.now));
                    }
                    self.finish_request(r, result.is_ok())?;
                }
                Action::Drop { member } => {
                    let m = &mut self.members[member];
                    m.dropped = true;
                    m.conn += 1;
                    m.retry_at = self.now + 50 + self.rng.below(200);
                }
                Action::Release { copy } => {
                    self.copies.remove(&copy);
                }
                Action::SpareTaken { member, uri, .. } => self.take_spare(member, uri),
                Action::Swap { member, shadow } => self.swap(member, shadow)?,
                Action::Compare { id, copies } => {
                    let diffs = self.compare_copies(&copies);
                    self.coord.compared(id, diffs, self.now);
                }
                Action::Log { text } => {
                    let queues: Vec<(usize, Health, bool)> = self.members.iter().map(|m| (m.queue.len(), m.health, m.dropped)).collect();
                    self.log.push(format!("{} {text} {queues:?}", self.now));
                }
            }
        }
        Ok(())
    }

    fn finish_request(&mut self, r: Req, ok: bool) -> Result<(), String> {
        let (offset, len) = r.cmd.range();
        if let Ok(s) = std::env::var("SIM_DEBUG_SECTOR").map(|v| v.parse::<u64>().unwrap()) {
            if offset / SECTOR <= s && s < (offset + len) / SECTOR && r.cmd.is_write() {
                self.log.push(format!("{} DEBUG {:?} ok {ok} version {:?}", self.now, r.cmd, r.buf.get((s - offset / SECTOR) as usize)));
            }
        }
        match r.cmd {
            Command::Read { .. } if ok => self.model.read(offset, &r.buf)?,
            Command::Read { .. } => self.read_errors += 1,
            Command::Write { .. } => {
                self.model.wrote(offset, &r.buf, ok);
                self.crash_after_ack |= ok && self.grow_at.is_some() && self.rng.below(8) == 0;
            }
            Command::Zero { .. } | Command::Trim { .. } => self.model.wrote(offset, &r.buf, ok),
            Command::Flush => {}
        }
        if r.cmd != Command::Flush {
            self.model.release(offset, len);
        }
        Ok(())
    }

    fn quiet(&self) -> bool {
        let status = self.coord.status();
        self.reqs.is_empty() && status.replacing.is_none() && status.reshape.is_none() && status.members.iter().all(|m| m.state == MemberState::InSync)
    }

    /// Heals everything and runs until requests are answered and every member is in sync.
    fn settle(&mut self) -> Result<(), String> {
        for m in &mut self.members {
            m.fail_next = false;
            if let Health::Stalled { until } | Health::Down { until } = m.health {
                m.health = if until > self.now { Health::Down { until: self.now } } else { Health::Up };
            }
        }
        for _ in 0..SETTLE_STEPS_MAX {
            if self.quiet() && self.members.iter().all(|m| m.queue.is_empty()) {
                return Ok(());
            }
            let idle = self.members.iter().all(|m| m.queue.is_empty());
            if idle {
                if let Some(t) = self.coord.next_wakeup() {
                    self.log.push(format!("{} settle: idle, time jumps to {t}", self.now));
                    self.now = self.now.max(t);
                }
            }
            self.step(false)?;
        }
        Err(format!("the pool did not settle in {SETTLE_STEPS_MAX} steps"))
    }

    /// Stops the coordinator cleanly: requests in flight finish, and it says it is stopped.
    fn stop_cleanly(&mut self) -> Result<(), String> {
        self.coord.stop(self.now);
        self.pump()?;
        for _ in 0..SETTLE_STEPS_MAX {
            if self.coord.is_stopped() {
                return Ok(());
            }
            if self.members.iter().all(|m| m.queue.is_empty()) {
                let t = self.coord.next_wakeup().unwrap_or(self.now).max(self.now + 1);
                self.log.push(format!("{} stop: idle, time jumps to {t}", self.now));
                self.now = t;
            }
            self.step(false)?;
        }
        Err("the clean stop did not finish".into())
    }

    /// With everything healed: every sector reads back, copies agree, and a clean stop
    /// releases the pool.
    fn verify(&mut self) -> Result<(), String> {
        if self.read_errors > 0 && self.spec.layout.redundant() {
            return Err(format!("{} reads failed on a redundant pool with one fault per set at most", self.read_errors));
        }
        let size = self.coord.size();
        let want = self.member_bytes * self.spec.sets() as u64;
        if size != want {
            return Err(format!("the volume is {size} bytes; {} members of {} data bytes in {} sets make {want}", self.members.len(), self.member_bytes, self.spec.sets()));
        }
        let step = 1 << 20;
        for offset in (0..size).step_by(step as usize) {
            let len = step.min(size - offset);
            self.model.hold(offset, len);
            let id = self.coord.submit(Command::Read { offset, len }, self.now);
            self.reqs.insert(id, Req { cmd: Command::Read { offset, len }, buf: vec![0; (len / SECTOR) as usize] });
            self.read_errors = 0;
            self.pump()?;
            self.settle()?;
            if self.read_errors > 0 {
                return Err(format!("reading back volume offset {offset} failed with every member healthy"));
            }
        }
        self.copies_agree()?;
        self.stop_cleanly()?;
        for (i, m) in self.members.iter().enumerate() {
            match Superblock::decode(&m.meta[..META_BYTES as usize]) {
                Ok(Some(sb)) if sb.owner.session == 0 || !self.spec.layout.redundant() => {}
                other => return Err(format!("member {i}'s superblock after a clean stop: {other:?}")),
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_runs_keep_every_acknowledged_write() {
        let seeds: u64 = std::env::var("SLUICE_POOL_SIM_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(120);
        let mut totals = Report::default();
        // SLUICE_POOL_SIM_SEED=N runs that one seed (with SIM_LOG=1 for its whole log).
        let one: Option<u64> = std::env::var("SLUICE_POOL_SIM_SEED").ok().and_then(|s| s.parse().ok());
        if let Some(seed) = one {
            run(Rng::seeded(seed)).unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            return;
        }
        for seed in 0..seeds {
            totals.add(&run(Rng::seeded(seed)).unwrap_or_else(|e| panic!("seed {seed}: {e}")));
        }
        eprintln!("{seeds} seeds: {totals:?}");
        // The runs must actually have exercised failures, not just passed quietly.
        assert!(totals.faults > seeds / 2 && totals.coordinator_crashes > 0 && totals.resynced_bytes > 0, "{totals:?}");
        assert!(seeds < 20 || totals.degraded_starts > 0, "no run started degraded: {totals:?}");
        assert!(seeds < 20 || totals.replacements > 0, "no run replaced a member: {totals:?}");
        assert!(seeds < 20 || totals.handovers > 0, "no live replacement took its member's place: {totals:?}");
        assert!(seeds < 20 || totals.spares_taken > 0, "no run took a spare: {totals:?}");
        assert!(seeds < 20 || totals.offset_faults > 0, "no run of an offset placement had a fault: {totals:?}");
        assert!(seeds < 20 || (totals.grows > 0 && totals.reshape_crashes > 0 && totals.reshape_faults > 0), "no run grew a pool with crashes and faults mid-reshape: {totals:?}");
    }
}

/// Two coordinators assembling the same mirror at the same moment (both found it released):
/// whatever the interleaving of their operations at the members, at most one of them ever
/// sends a data write.
#[cfg(test)]
mod takeover {
    use super::*;
    use crate::coordinator::MemberCmd;

    #[test]
    fn two_coordinators_started_together_never_both_write() {
        for seed in 0..200 {
            let mut rng = Rng::seeded(seed);
            let spec = PoolSpec { member_timeout_ms: 10_000, ..spec_for_mirror() };
            let mut members: Vec<SimMember> = (0..2).map(|_| SimMember::new(8 << 20)).collect();
            let found: Vec<Found> = members.iter().map(|m| Found { size: m.size, meta: m.meta.clone(), read_only: false }).collect();
            for (m, bytes) in members.iter_mut().zip(crate::coordinator::format(&spec, &found, [9; 16], false).unwrap()) {
                m.meta[..bytes.len()].copy_from_slice(&bytes);
            }
            let found = || members_found(&members);
            let mut coords = [
                Coordinator::assemble(&spec, found(), session(1), false, 0).unwrap(),
                Coordinator::assemble(&spec, found(), session(2), false, 0).unwrap(),
            ];
            let mut wrote = [false, false];
            let mut queue: Vec<(usize, Pending)> = Vec::new();
            for coord in coords.iter_mut() {
                coord.submit(Command::Write { offset: 0, len: SECTOR, fua: false }, 0);
            }
            for now in 0..5_000u64 {
                for (c, coord) in coords.iter_mut().enumerate() {
                    coord.tick(now);
                    while let Some(a) = coord.poll() {
                        if let Action::Member { op, member, cmd, data } = a {
                            if let MemberCmd::Write { offset, .. } = cmd {
                                wrote[c] |= offset >= META_BYTES;
                            }
                            let payload = vec![c as u64 + 1];
                            queue.push((c, Pending { op, cmd, data, payload, conn: member as u64, ready_at: 0 }));
                        }
                    }
                }
                // The members carry out a random part of what arrived, in a random order.
                let n = rng.below(queue.len() as u64 + 1) as usize;
                for _ in 0..n {
                    let (c, p) = queue.remove(rng.below(queue.len() as u64) as usize);
                    let outcome = match members[p.conn as usize].apply(&p) {
                        Done::Meta(bytes) => OpOutcome::Data(bytes),
                        Done::Failed => OpOutcome::Failed("I/O error".into()),
                        _ => OpOutcome::Done,
                    };
                    coords[c].handle(p.op, outcome, now);
                }
            }
            assert!(!(wrote[0] && wrote[1]), "seed {seed}: both coordinators wrote data");
            assert!(coords.iter().any(|c| c.fenced().is_some()), "seed {seed}: neither coordinator stood down");
        }
    }

    fn spec_for_mirror() -> PoolSpec {
        PoolSpec {
            layout: Layout::Mirror,
            placement: crate::spec::Placement::Near,
            stripe_unit: u64::MAX,
            copies: 2,
            members: vec!["sim://a".into(), "sim://b".into()],
            member_timeout_ms: 300,
            resync_rate_bytes_per_s: 64 << 20,
            spares: Vec::new(),
            spare_after_ms: 60_000,
            scrub_interval_ms: None,
        }
    }

    fn members_found(members: &[SimMember]) -> Vec<Option<Found>> {
        members.iter().map(|m| Some(Found { size: m.size, meta: m.meta.clone(), read_only: false })).collect()
    }
}

#[cfg(test)]
mod one_seed {
    #[test]
    fn one_seed() {
        let Ok(seed) = std::env::var("SIM_SEED").map(|s| s.parse::<u64>().unwrap()) else { return };
        if let Err(e) = super::run(super::Rng::seeded(seed)) {
            panic!("{e}");
        }
    }
}
