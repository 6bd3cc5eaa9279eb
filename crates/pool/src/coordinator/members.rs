//! Members: their metadata (superblock and bitmap, written block by block and in order),
//! failure, return, and the heartbeat that keeps one coordinator per pool.

use std::collections::BTreeSet;

use super::api::{Action, Data, Found, MemberCmd, OpOutcome};
use super::state::{JobKind, Op, Purpose};
use super::Coordinator;
use crate::limits::{HEARTBEAT_MS, META_BLOCK_BYTES};
use crate::meta::{bitmap_block_bytes, id_text, Owner, Role, Superblock};

impl Coordinator {
    /// Routes an operation's outcome to what it was for.
    pub(super) fn settle(&mut self, op: Op, outcome: OpOutcome) {
        if let OpOutcome::Failed(why) = &outcome {
            let why = why.clone();
            self.settle_ok_or_failed(&op, &outcome);
            self.fail_member(op.member, &why);
            return;
        }
        self.settle_ok_or_failed(&op, &outcome);
    }

    pub(super) fn settle_ok_or_failed(&mut self, op: &Op, outcome: &OpOutcome) {
        let ok = !matches!(outcome, OpOutcome::Failed(_));
        match op.purpose {
            Purpose::Piece { .. } | Purpose::Flush { .. } => self.settle_request(op, outcome),
            Purpose::MetaWrite { block, gen, events } => {
                let m = &mut self.members[op.member];
                m.writing[block] = None;
                if ok {
                    m.written[block] = m.written[block].max(gen);
                    if block == 0 {
                        m.durable_events = m.durable_events.max(events);
                    }
                }
            }
            Purpose::FenceCheck => {
                self.fence_reads_out -= 1;
                if let OpOutcome::Data(bytes) = outcome {
                    self.check_owner(op.member, bytes);
                }
                if self.fence_reads_out == 0 && self.fenced.is_none() {
                    self.heartbeat += 1;
                    self.gen[0] += 1;
                }
            }
            Purpose::CleanFlush => self.settle_clean_flush(ok),
            Purpose::CopyRead { job, chunk, copy } => self.settle_copy_read(job, chunk, copy, ok),
            Purpose::CopyWrite { job, chunk, copy } => self.settle_copy_write(job, chunk, copy, ok),
            Purpose::JobFlush { job } => self.settle_job_flush(job, ok),
            Purpose::ShadowFlush => {
                if let Some(h) = self.handover.as_mut().filter(|_| ok) {
                    h.flushed = true;
                }
            }
            // The request does not count the shadow's answer: a failure drops the shadow.
            Purpose::ShadowPiece { req } => self.one_back(req),
            Purpose::ScrubRead { chunk } => self.settle_scrub_read(chunk, op.member, ok),
            Purpose::ScrubWrite { chunk } => self.settle_scrub_write(chunk, ok),
            Purpose::ScrubFlush => self.settle_scrub_flush(),
            Purpose::ReshapeRead { unit } => self.settle_reshape_read(unit, ok),
            Purpose::ReshapeWrite { unit } => self.settle_reshape_write(unit, ok),
            Purpose::ReshapeZero => self.settle_reshape_zero(ok),
        }
    }

    /// Declares a member missing: its operations are settled as failed now, the survivors'
    /// superblocks will record it, and the driver drops it.
    pub(super) fn fail_member(&mut self, member: usize, why: &str) {
        if self.is_shadow(member) {
            return self.shadow_lost(why);
        }
        if !self.members[member].connected {
            return;
        }
        self.log_member(member, &format!("declared missing: {why}"));
        let m = &self.members[member];
        let was_in_sync = m.in_sync();
        let since = match m.role {
            Role::Missing { since } => since,
            // No history can make an interrupted full rebuild partial.
            Role::Rebuilding { full: true, .. } => u64::MAX,
            _ => m.durable_events,
        };
        // The last in-sync copy of a set stays "active" while away: nothing can be written
        // to any of its sets without it (`write_refusal`), so it still holds their newest
        // data when it returns.
        let last = self.map.groups_of(member).any(|(set, at)| self.map.members_at(set, at).all(|x| x == member || !self.members[x].in_sync()));
        self.members[member].connected = false;
        if !(last && self.members[member].role == Role::Active) {
            self.members[member].role = Role::Missing { since };
        }
        self.members[member].writing.iter_mut().for_each(|w| *w = None);
        self.actions.push_back(Action::Drop { member });
        if self.redundant() {
            self.events += 1;
            self.gen[0] += 1;
            self.fail_gen = self.gen[0];
        }
        self.requests_saw_failure(member);
        let out: Vec<_> = self.ops.iter().filter(|(_, o)| o.member == member).map(|(&id, _)| id).collect();
        for id in out {
            if let Some(op) = self.ops.remove(&id) {
                self.settle_ok_or_failed(&op, &OpOutcome::Failed(why.to_string()));
            }
        }
        self.jobs_lost_member(member);
        if was_in_sync {
            self.copies_lost_source();
        }
    }

    /// Why `members` cannot all be replaced now, if they cannot: a stripe has no other copy
    /// to rebuild a new member from, nor has a set left without an in-sync member that
    /// stays.
    pub(super) fn replace_refusal(&self, members: &[usize]) -> Option<String> {
        if let Some(m) = members.iter().find(|&&m| m >= self.members.len()) {
            return Some(format!("there is no member {m}"));
        }
        if !self.redundant() {
            return Some("a stripe keeps one copy of every unit, so there is nothing to rebuild a new member from".into());
        }
        if let Some(h) = self.handover.as_ref().filter(|h| members.contains(&h.member)) {
            return Some(format!("member {} is being replaced by {} already", h.member, h.uri));
        }
        // A dead member may be replaced mid-reshape (the reshape waits for its successor to
        // be rebuilt); a live one's copy would race the units the reshape moves.
        if self.reshape.is_some() && members.iter().any(|&m| self.members[m].in_sync()) {
            return Some("the pool is being reshaped (grown): a live member can be replaced once that is done (a dead one can be now)".into());
        }
        for &m in members {
            for (set, at) in self.map.groups_of(m) {
                if !self.map.members_at(set, at).any(|x| !members.contains(&x) && self.members[x].in_sync()) {
                    return Some(format!("no member of set {set} that stays is in sync, so there is nothing to rebuild a new member from"));
                }
            }
        }
        None
    }

    /// A new member takes `member`'s place: the old one is dropped if connected, and the
    /// place is recorded missing with no history, so the new one is rebuilt in full from
    /// its set when the driver hands it back (`member_back`).
    pub(super) fn replace(&mut self, member: usize) {
        if self.members[member].connected {
            self.fail_member(member, "replaced");
        } else {
            // Not connected: its operations were settled when it went, and the driver has
            // no connection to it; the drop restarts the driver's reconnecting (to the new
            // member, once it knows the new address).
            self.actions.push_back(Action::Drop { member });
        }
        self.members[member].role = Role::Missing { since: u64::MAX };
        self.new_device(member);
        self.events += 1;
        self.gen[0] += 1;
        self.log_member(member, "replaced: the new member is rebuilt in full from its set once it answers");
    }

    /// A dropped member answers again with `found` in its metadata area.
    pub(super) fn rejoin(&mut self, member: usize, found: Found) {
        let sb = match Superblock::decode(&found.meta) {
            Ok(sb) => sb,
            Err(e) if self.redundant() => {
                self.log_member(member, &format!("{e}: it gets a full resync"));
                None
            }
            Err(e) => return self.log_member(member, &format!("stays out: {e}")),
        };
        if let Some(sb) = &sb {
            if sb.pool_id != self.pool_id || sb.index != member {
                let why = format!("stays out: it now belongs to pool {} as member {}", id_text(&sb.pool_id), sb.index);
                return self.log_member(member, &why);
            }
        }
        let other = sb.as_ref().and_then(|sb| sb.devices.get(member).copied()).is_some_and(|d| d != 0 && self.devices[member] != 0 && d != self.devices[member]);
        let sb = match other && self.redundant() {
            true => {
                self.log_member(member, "is another device than the pool knows in its place (one that was replaced): it gets a full resync");
                None
            }
            false => sb,
        };
        if found.read_only || found.size < crate::limits::META_BYTES + self.map.member_bytes {
            return self.log_member(member, "stays out: it is read-only or smaller than the pool needs");
        }
        if !self.redundant() {
            if sb.is_none() {
                return self.log_member(member, "stays out: it lost its pool metadata, and a stripe cannot rebuild it");
            }
            self.members[member].connected = true;
            self.members[member].role = Role::Active;
            return self.log_member(member, "is back");
        }
        let since = match self.members[member].role {
            Role::Missing { since } => Some(since),
            Role::Active if sb.is_some() => {
                let m = &mut self.members[member];
                m.connected = true;
                m.written.iter_mut().for_each(|w| *w = 0);
                self.events += 1;
                self.gen[0] += 1;
                self.log_member(member, "is back; it holds its set's newest data");
                // In its other sets, a partner that stayed may hold writes it lacks (in
                // flight when it left, or unflushed and lost with its server).
                let dirty = self.dirty_regions();
                if !dirty.is_empty() {
                    self.add_job(JobKind::CatchUp, member, dirty);
                }
                return;
            }
            _ => None,
        };
        // Everything written to it carried an event counter from `since` up to the one it
        // was dropped at (below the current one): then it lacks only dirty regions, which
        // are not cleaned while it is away. Anything else is unknown history.
        let todo: BTreeSet<u64> = match (&sb, since) {
            (Some(sb), Some(since)) if since <= sb.events && sb.events < self.events => self.dirty_regions(),
            _ => (0..self.regions).collect(),
        };
        let m = &mut self.members[member];
        m.connected = true;
        m.durable_events = sb.as_ref().map_or(0, |s| s.events);
        m.written.iter_mut().for_each(|w| *w = 0);
        m.role = Role::Rebuilding { done: 0, total: 0, full: false };
        self.events += 1;
        self.gen[0] += 1;
        let what = if todo.len() as u64 == self.regions { "everything" } else { "the regions it missed" };
        let history = match (&sb, since) {
            (Some(sb), Some(since)) => format!("its superblock is at event {}, it left at event {since}, the pool is at {}", sb.events, self.events),
            _ => "it carries no metadata of this pool's history".to_string(),
        };
        self.log_member(member, &format!("is back ({history}); copying {what} ({} regions) to it", todo.len()));
        self.add_job(JobKind::Rebuild, member, todo);
    }

    /// Sends every metadata block that a live member lacks, one write per block at a time
    /// so that an older content never lands after a newer one.
    pub(super) fn write_metadata(&mut self) -> bool {
        if !self.meta_kept || self.fenced.is_some() {
            return false;
        }
        let mut moved = false;
        for m in 0..self.members.len() {
            if !self.members[m].live() {
                continue;
            }
            for block in 0..self.gen.len() {
                let member = &self.members[m];
                if member.written[block] >= self.gen[block] || member.writing[block].is_some() {
                    continue;
                }
                let gen = self.gen[block];
                self.members[m].writing[block] = Some(gen);
                let bytes = match block {
                    0 => self.superblock(m).encode(),
                    b => bitmap_block_bytes(&self.bits, b as u64 - 1),
                };
                let cmd = MemberCmd::Write { offset: block as u64 * META_BLOCK_BYTES, len: META_BLOCK_BYTES, fua: true };
                self.issue(m, cmd, Data::Bytes(bytes), Purpose::MetaWrite { block, gen, events: self.events });
                moved = true;
            }
        }
        moved
    }

    /// Member `index`'s superblock as the pool stands now.
    fn superblock(&self, index: usize) -> Superblock {
        let roles = self
            .members
            .iter()
            .enumerate()
            .map(|(i, m)| match m.role {
                Role::Rebuilding { full, .. } => {
                    let job = self.jobs.iter().flatten().find(|j| j.target == i);
                    Role::Rebuilding { done: job.map_or(0, |j| j.done_bytes), total: job.map_or(0, |j| j.total_bytes), full }
                }
                r => r,
            })
            .collect();
        // A stripe has no owner (it may have many writers) except while this coordinator
        // reshapes it: a second one must not move its units too.
        let released = self.stopping_released() || !self.meta_kept;
        Superblock {
            pool_id: self.pool_id,
            layout: self.spec.layout,
            placement: self.spec.placement,
            copies: self.spec.copies,
            index,
            stripe_unit: self.map.unit,
            member_bytes: self.map.member_bytes,
            region_bytes: self.region_bytes,
            // A member still catching up (`JobKind::CatchUp`) is written as behind the
            // others, so that the next coordinator, after a stop or a crash, has it catch up
            // again rather than take it for a source.
            events: match self.jobs.iter().flatten().any(|j| j.kind == JobKind::CatchUp && j.target == index) {
                true => self.events.saturating_sub(1),
                false => self.events,
            },
            owner: match released {
                true => Owner::default(),
                false => Owner {
                    session: self.session.id,
                    heartbeat: self.heartbeat,
                    pid: self.session.pid,
                    host: self.session.host.clone(),
                },
            },
            roles,
            scrub: self.scrub.record,
            devices: self.devices.clone(),
            reshape: self.reshape_mark(),
        }
    }

    /// Starts a heartbeat when one is due: read every live superblock to see that the pool
    /// is still ours, then write the next heartbeat.
    pub(super) fn heartbeat_due(&mut self) {
        if self.heartbeat_wakeup().is_none_or(|t| self.now < t) {
            return;
        }
        if !self.durable(0, self.startup_gen) {
            return;
        }
        self.next_heartbeat = self.now + HEARTBEAT_MS;
        for m in 0..self.members.len() {
            if self.members[m].live() {
                self.fence_reads_out += 1;
                self.issue(m, MemberCmd::Read { offset: 0, len: META_BLOCK_BYTES }, Data::Meta, Purpose::FenceCheck);
            }
        }
        if self.fence_reads_out == 0 {
            // No member to ask: no one else can have claimed one either.
            self.heartbeat += 1;
        }
    }

    pub(super) fn heartbeat_wakeup(&self) -> Option<u64> {
        let possible = self.meta_kept && self.fenced.is_none() && self.fence_reads_out == 0 && !self.stopping_released();
        (possible && self.durable(0, self.startup_gen)).then_some(self.next_heartbeat)
    }

    /// Stops all writing if another coordinator has taken the pool over.
    fn check_owner(&mut self, member: usize, bytes: &[u8]) {
        let Ok(Some(sb)) = Superblock::decode(bytes) else { return };
        if sb.pool_id != self.pool_id || sb.owner.session == self.session.id {
            return;
        }
        let why = format!(
            "member {member} says pool {} is now coordinated by {} pid {}; this coordinator stopped writing",
            id_text(&self.pool_id),
            sb.owner.host,
            sb.owner.pid
        );
        self.actions.push_back(Action::Log { text: why.clone() });
        self.fenced = Some(why.clone());
        self.fail_all(&why);
        self.blocked.clear();
    }

    pub(super) fn log_member(&mut self, member: usize, what: &str) {
        let text = format!("pool member {member} ({}) {what}", self.spec.members[member]);
        self.actions.push_back(Action::Log { text });
    }
}
