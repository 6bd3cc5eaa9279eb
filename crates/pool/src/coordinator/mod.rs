//! The coordinator: one pool's live state, without I/O.
//!
//! The rules it keeps (docs/pool.md says why):
//! - A write to a mirrored pool first marks its regions dirty in the write-intent bitmap on
//!   every live member, durably (FUA), and waits for that; then it goes to every copy; it is
//!   acknowledged when every copy that is in sync has it (DRBD's protocol C).
//! - A member that fails an operation or does not answer within the timeout is declared
//!   missing: the survivors' superblocks record it (and the event counter moves) before any
//!   write that found it missing is acknowledged. Dirty bits are not cleaned while a member
//!   is missing or rebuilding, so they name every region it lacks.
//! - A member that returns with the history the survivors recorded gets only the dirty
//!   regions; otherwise all of them. Copying holds back writes to the range being copied.
//! - After a coordinator crash, the dirty regions are copied from the first in-sync member
//!   of each set to the others, and reads of them go to that first member until then.

mod api;
mod assemble;
mod handover;
mod members;
mod request;
mod reshape;
mod reshape_state;
mod reshape_tail;
mod resync;
mod spares;
mod scrub;
mod source;
mod scrub_job;
mod scrub_report;
mod scrub_state;
mod state;
mod survey;

pub use api::*;
pub use scrub_report::differing_ranges;
pub use survey::{format, survey};
#[cfg(any(test, feature = "sim"))]
pub(crate) use survey::format_with;

use std::collections::{BTreeMap, VecDeque};

use crate::layout::Map;
use crate::meta::Role;
use crate::spec::PoolSpec;
use state::{Cleaning, Job, Lock, Member, Op, RegionUse, Stopping};

/// One pool's coordinator.
pub struct Coordinator {
    spec: PoolSpec,
    map: Map,
    pool_id: [u8; 16],
    region_bytes: u64,
    regions: u64,
    events: u64,
    session: Session,
    heartbeat: u64,
    members: Vec<Member>,
    /// The write-intent bitmap as it should be on the members.
    bits: Vec<u64>,
    /// Per metadata block (0: superblock, 1..: bitmap): the generation of its contents.
    gen: Vec<u64>,
    /// Writes in flight per dirty region, and when one last touched it.
    uses: BTreeMap<u64, RegionUse>,
    requests: state::Requests,
    blocked: VecDeque<ReqId>,
    /// Running requests with no operation out: answered as soon as their verdict may be
    /// given (`finish_requests`), so that no step looks through every request.
    drained: Vec<ReqId>,
    ops: BTreeMap<OpId, Op>,
    jobs: Vec<Option<Job>>,
    locks: Vec<Lock>,
    cleaning: Option<Cleaning>,
    actions: VecDeque<Action>,
    next_id: u64,
    now: u64,
    /// The superblock generation that takes the pool over; writes wait for it.
    startup_gen: u64,
    /// The superblock generation that records the latest member failure: no write is
    /// answered before it is durable, whether or not it used that member.
    fail_gen: u64,
    next_heartbeat: u64,
    fence_reads_out: usize,
    fenced: Option<String>,
    next_clean: u64,
    /// Resync pacing: bytes started since `pace_origin`.
    pace_origin: u64,
    paced_bytes: u64,
    resynced_bytes: u64,
    stopping: Stopping,
    spare: state::Spares,
    /// The device identity of each place (see `meta::Superblock::devices`).
    devices: Vec<u64>,
    handover: Option<state::Handover>,
    scrub: scrub_state::Scrub,
    /// Superblocks are kept on the members: always for redundant layouts, and for a stripe
    /// once a reshape needs its checkpoints there.
    meta_kept: bool,
    reshape: Option<reshape_state::Reshaping>,
}

impl Coordinator {
    /// Assembles the pool from what the driver found on each member (`None`: unreachable).
    /// Refuses when a member is unreachable (unless `degraded`), when members disagree about
    /// the pool, or when one belongs to another pool. The superblocks must have no live
    /// owner: the driver checks the lease (see `meta::Owner`) before calling this.
    pub fn assemble(spec: &PoolSpec, found: Vec<Option<Found>>, session: Session, degraded: bool, now: u64) -> Result<Coordinator, String> {
        Coordinator::build(spec, found, session, degraded, now)
    }

    /// Usable bytes of the volume: during a reshape, the old size.
    pub fn size(&self) -> u64 {
        self.reshape.as_ref().map_or(self.map.size(), |r| r.layout.from.size())
    }

    /// Starts a volume request.
    pub fn submit(&mut self, cmd: Command, now: u64) -> ReqId {
        self.now = self.now.max(now);
        let id = ReqId(self.fresh_id());
        self.start_request(id, cmd);
        self.advance();
        id
    }

    /// Reports a member operation's outcome.
    pub fn handle(&mut self, op: OpId, outcome: OpOutcome, now: u64) {
        self.now = self.now.max(now);
        // Operations of a member that was dropped were settled then; late news is ignored.
        if let Some(op) = self.ops.remove(&op) {
            self.settle(op, outcome);
        }
        self.advance();
    }

    /// The driver lost a member's connection (a read or write on it failed outside any
    /// operation, or it closed).
    pub fn member_lost(&mut self, member: usize, why: &str, now: u64) {
        self.now = self.now.max(now);
        if member < self.members.len() || self.is_shadow(member) {
            self.fail_member(member, why);
        }
        self.advance();
    }

    /// A member that was dropped answers again; `found` is what its metadata area holds now.
    pub fn member_back(&mut self, member: usize, found: Found, now: u64) {
        self.now = self.now.max(now);
        if self.is_shadow(member) {
            self.shadow_back(found);
        } else if member < self.members.len() && !self.members[member].connected {
            self.rejoin(member, found);
        }
        self.advance();
    }

    /// Whether `members` could all be replaced now: Ok, or why not (see `replace_member`).
    pub fn can_replace(&self, members: &[usize]) -> Result<(), String> {
        self.replace_refusal(members).map_or(Ok(()), Err)
    }

    /// Puts a new member, at `uri`, in `member`'s place. When the old one is in sync (and no
    /// other replacement is copying), it goes on serving while everything is copied to the
    /// new one, which takes its place once copied (see handover.rs): the answer is then
    /// `Some(shadow)`, a slot past the members where the driver connects the new server
    /// and reports it (`member_back`, `member_lost`, operations) until `Action::Swap`.
    /// Otherwise (`None`) the old one is dropped, and the new one, connected by the driver
    /// at `member`'s slot and handed over with `member_back`, is rebuilt in full from the
    /// other copies of its set. Refused for a stripe, and for the only in-sync member of a
    /// set.
    pub fn replace_member(&mut self, member: usize, uri: &str, now: u64) -> Result<Option<usize>, String> {
        self.can_replace(&[member])?;
        self.now = self.now.max(now);
        if self.may_hand_over(member) {
            let shadow = self.begin_handover(member, uri);
            self.advance();
            return Ok(Some(shadow));
        }
        self.replace(member);
        // Logs and status name the member where it is now.
        self.spec.members[member] = uri.to_owned();
        self.advance();
        Ok(None)
    }

    /// Whether `count` members could be added now: Ok, or why not (see `grow`).
    pub fn can_grow(&self, count: usize) -> Result<(), String> {
        self.grow_refusal(count).map_or(Ok(()), Err)
    }

    /// Adds members at the end of the list (`sluice pool grow`), connected by the driver,
    /// with `found` what their metadata area holds (it is overwritten). A stripe or raid10
    /// (whole mirror sets) reshapes the volume onto them while serving, and `size()` grows
    /// when that is done; a mirror gets them as copies more, rebuilt in full.
    /// `unix_secs` is recorded as the reshape's start.
    pub fn grow(&mut self, added: Vec<(String, Found)>, unix_secs: u64, now: u64) -> Result<(), String> {
        self.now = self.now.max(now);
        self.start_grow(added, unix_secs)?;
        self.advance();
        Ok(())
    }

    /// The wall clock (unix seconds), for a reshape that assembly started or resumed with
    /// no start recorded (a grown pool file found at start-up): it is recorded as its start,
    /// so that status can tell its rate.
    pub fn wall_clock(&mut self, unix_secs: u64) {
        if let Some(r) = self.reshape.as_mut().filter(|r| r.started == 0) {
            r.started = unix_secs;
            self.gen[0] += 1;
            self.advance();
        }
    }

    /// Lets time pass: time-outs, heartbeats, cleaning dirty regions, resync pacing. Call it
    /// at `next_wakeup()` (or any time).
    pub fn tick(&mut self, now: u64) {
        self.now = self.now.max(now);
        let late: Vec<usize> = self.ops.values().take_while(|o| o.deadline <= self.now).map(|o| o.member).collect();
        for m in late {
            let ms = self.spec.member_timeout_ms;
            self.fail_member(m, &format!("no answer within {ms} ms"));
        }
        self.heartbeat_due();
        self.clean_due();
        self.take_spares();
        self.scrub_due();
        self.advance();
    }

    /// When `tick` next has something to do.
    pub fn next_wakeup(&self) -> Option<u64> {
        let deadline = self.ops.values().next().map(|o| o.deadline);
        let timers = [deadline, self.heartbeat_wakeup(), self.clean_wakeup(), self.pace_wakeup(), self.spare_wakeup(), self.scrub_wakeup(), self.reshape_wakeup()];
        timers.into_iter().flatten().min()
    }

    /// The next thing for the driver to do.
    pub fn poll(&mut self) -> Option<Action> {
        self.actions.pop_front()
    }

    /// Starts a clean stop: new requests fail, those in flight finish, dirty regions are
    /// cleaned where every copy is in sync, and the superblocks are released. `is_stopped`
    /// says when it is done (members can then be disconnected).
    pub fn stop(&mut self, now: u64) {
        self.now = self.now.max(now);
        if self.stopping == Stopping::Running {
            self.stopping = Stopping::Draining;
        }
        self.advance();
    }

    pub fn is_stopped(&self) -> bool {
        self.stopping == Stopping::Stopped
    }

    /// Why the coordinator stopped writing, when another one took the pool over.
    pub fn fenced(&self) -> Option<&str> {
        self.fenced.as_deref()
    }

    pub fn status(&self) -> Status {
        let members = (0..self.members.len()).map(|m| MemberStatus { uri: self.spec.members[m].clone(), state: self.member_state(m) }).collect();
        Status {
            pool_id: crate::meta::id_text(&self.pool_id),
            layout: self.spec.layout,
            placement: self.spec.placement,
            stripe_unit: self.map.unit,
            copies: self.spec.copies,
            size: self.size(),
            events: self.events,
            region_bytes: self.region_bytes,
            dirty_regions: self.bits.iter().map(|w| w.count_ones() as u64).sum(),
            spares: self.spec.spares.clone(),
            spares_taken: self.spare.taken,
            replacing: self.handover.as_ref().map(|h| {
                let job = h.job.and_then(|j| self.jobs[j].as_ref());
                let (done, total) = job.map_or((0, 0), |j| (j.done_bytes, j.total_bytes));
                Replacing { member: h.member, uri: h.uri.clone(), done, total }
            }),
            resynced_bytes: self.resynced_bytes,
            owner: (self.meta_kept && !self.stopping_released()).then(|| format!("{} pid {}", self.session.host, self.session.pid)),
            members,
            scrub: self.scrub_report(),
            scrubs_completed: self.scrub.completed,
            reshape: self.reshape_status(),
        }
    }

    fn member_state(&self, m: usize) -> MemberState {
        let job = self.jobs.iter().flatten().find(|j| j.target == m);
        match (self.members[m].role, job) {
            (Role::Missing { .. }, _) => MemberState::Missing,
            (_, Some(j)) => MemberState::Resyncing { done: j.done_bytes, total: j.total_bytes },
            (Role::Rebuilding { .. }, None) => MemberState::Stale,
            (Role::Active, None) if !self.members[m].connected => MemberState::Missing,
            (Role::Active, None) => MemberState::InSync,
        }
    }

    fn fresh_id(&mut self) -> u64 {
        self.next_id += 1;
        self.next_id
    }

    /// Another device now holds place `member`: a new identity for it.
    fn new_device(&mut self, member: usize) {
        let n = self.fresh_id();
        self.devices[member] = crate::meta::device_id(self.session.id, n);
    }

    /// Redundant layouts keep the write-intent bitmap, the owner and resync.
    fn redundant(&self) -> bool {
        self.spec.layout.redundant()
    }

    /// Sends an operation to a member. Ids grow, the clock never goes back and the timeout
    /// is the pool's, so `ops` in id order is in deadline order: the first one is the
    /// earliest to time out (`tick`, `next_wakeup`).
    fn issue(&mut self, member: usize, cmd: MemberCmd, data: Data, purpose: state::Purpose) -> OpId {
        let op = OpId(self.fresh_id());
        let deadline = self.now + self.spec.member_timeout_ms;
        debug_assert!(self.ops.last_key_value().is_none_or(|(_, o)| o.deadline <= deadline));
        self.ops.insert(op, Op { member, purpose, deadline });
        self.actions.push_back(Action::Member { op, member, cmd, data });
        op
    }

    /// Carries on with whatever the last event made possible, until nothing moves.
    fn advance(&mut self) {
        loop {
            let mut moved = self.write_metadata();
            moved |= self.unblock_requests();
            moved |= self.finish_requests();
            moved |= self.run_jobs();
            moved |= self.run_scrub();
            moved |= self.run_reshape();
            moved |= self.step_stop();
            moved |= self.finish_handover();
            self.note_missing();
            if !moved {
                break;
            }
        }
    }
}
