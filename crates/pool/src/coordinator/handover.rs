//! Replacing a live member without losing a copy (md's `--replace`): the new server is
//! connected beside the old one as a *shadow* (a slot past the members) and every region
//! of the set is copied to it while the old member goes on serving. From the copy's start,
//! every write to the set goes to the shadow too (a write is answered when the shadow has
//! it as well; a copy holds back writes to its range, as resync does, so a region copied
//! after a write carries it, and one written after its copy gets the write itself). When
//! the copy is flushed, writes to the set wait for those still at the shadow, and the
//! shadow takes the old member's place as an in-sync member: the set never has a copy
//! fewer.
//!
//! The shadow's metadata area stays blank until it takes the place: a coordinator that
//! stops or crashes during the copy, or after the swap before the new member's own
//! superblock landed, leaves a new member that the next start rebuilds in full, never one
//! that passes for in sync.

use super::api::{Action, Data, Found, MemberCmd, OpOutcome};
use super::state::{Handover, Job, JobKind, Member, Purpose};
use super::Coordinator;
use crate::limits::META_BYTES;
use crate::meta::Role;

impl Coordinator {
    /// Whether `replace_member` would copy to the new member while `member` serves: it is
    /// in sync and no other replacement is copying.
    pub(super) fn may_hand_over(&self, member: usize) -> bool {
        self.redundant() && self.members[member].in_sync() && self.handover.is_none() && self.reshape.is_none()
    }

    /// Starts a handover of `member` to the server at `uri`; returns the shadow's slot.
    pub(super) fn begin_handover(&mut self, member: usize, uri: &str) -> usize {
        let shadow = self.members.len();
        self.handover = Some(Handover { member, uri: uri.to_owned(), shadow, job: None, connected: false, copied: false, flushed: false });
        let text = format!("is being replaced by {uri}: everything is copied to it while this member serves");
        self.log_member(member, &text);
        shadow
    }

    pub(super) fn is_shadow(&self, slot: usize) -> bool {
        self.handover.as_ref().is_some_and(|h| h.shadow == slot)
    }

    /// The shadow answers (again): the copy starts over, since what it holds is unknown.
    pub(super) fn shadow_back(&mut self, found: Found) {
        let Some(h) = self.handover.as_ref() else { return };
        if h.job.is_some() {
            return;
        }
        let (member, uri) = (h.member, h.uri.clone());
        if found.read_only || found.size < META_BYTES + self.map.member_bytes {
            return self.log_member(member, &format!("is not replaced yet: {uri} is read-only or smaller than the pool needs"));
        }
        let todo: std::collections::BTreeSet<u64> = (0..self.regions).collect();
        let total_bytes = todo.iter().map(|&r| self.region_len(r)).sum();
        let job = Job {
            kind: JobKind::Rebuild,
            place: member,
            target: h.shadow,
            cursor: Some(0),
            todo,
            chunks: Default::default(),
            done_bytes: 0,
            total_bytes,
            flushing: false,
        };
        self.jobs.push(Some(job));
        let h = self.handover.as_mut().expect("checked above");
        h.job = Some(self.jobs.len() - 1);
        h.connected = true;
        h.copied = false;
    }

    /// The shadow a write to `set` at member offset `at` also goes to, while one is connected.
    pub(super) fn mirror_to(&self, set: usize, at: u64) -> Option<usize> {
        self.handover.as_ref().filter(|h| h.connected && self.map.set_at(h.member, at) == set).map(|h| h.shadow)
    }

    /// Writes to `set` (at `at`) wait while a copied shadow's last writes drain before the swap.
    pub(super) fn swap_pending(&self, set: usize, at: u64) -> bool {
        self.handover.as_ref().is_some_and(|h| h.copied && self.map.set_at(h.member, at) == set)
    }

    /// The shadow failed or went silent: its copy ends, and starts again when it answers.
    pub(super) fn shadow_lost(&mut self, why: &str) {
        let Some(h) = self.handover.as_mut() else { return };
        let (member, shadow, uri) = (h.member, h.shadow, h.uri.clone());
        h.connected = false;
        h.copied = false;
        h.flushed = false;
        if let Some(j) = h.job.take() {
            self.jobs[j] = None;
            self.locks.retain(|l| l.job != j);
        }
        let out: Vec<_> = self.ops.iter().filter(|(_, o)| o.member == shadow).map(|(&id, _)| id).collect();
        for id in out {
            if let Some(op) = self.ops.remove(&id) {
                self.settle_ok_or_failed(&op, &OpOutcome::Failed(why.into()));
            }
        }
        self.actions.push_back(Action::Drop { member: shadow });
        self.log_member(member, &format!("is not replaced yet: {uri} failed during the copy ({why}); it is copied again when it answers"));
    }

    /// The shadow's copy is flushed: it takes the place once the set has another copy.
    pub(super) fn shadow_copied(&mut self, job: usize) {
        self.jobs[job] = None;
        self.locks.retain(|l| l.job != job);
        if let Some(h) = self.handover.as_mut() {
            h.job = None;
            h.copied = true;
            let (member, text) = (h.member, format!("has been copied to {}, which takes its place once its last writes are done", h.uri));
            self.log_member(member, &text);
        }
    }

    /// Puts a copied shadow in the old member's place once no write is out at it: it holds
    /// the copy and every write since, so it is in sync.
    pub(super) fn finish_handover(&mut self) -> bool {
        let Some(h) = self.handover.as_ref().filter(|h| h.copied && self.fenced.is_none()) else { return false };
        let (member, shadow, flushed) = (h.member, h.shadow, h.flushed);
        if self.ops.values().any(|o| o.member == shadow) {
            return false;
        }
        if !flushed {
            // The writes it took since the copy's flush must be durable before it counts.
            self.issue(shadow, MemberCmd::Flush, Data::None, Purpose::ShadowFlush);
            return true;
        }
        let h = self.handover.take().expect("checked above");
        // The old member's operations end with it, and the driver swaps the connections
        // before anything is sent to the new member at its place.
        let out: Vec<_> = self.ops.iter().filter(|(_, o)| o.member == member).map(|(&id, _)| id).collect();
        let out: Vec<_> = out.into_iter().filter_map(|id| self.ops.remove(&id)).collect();
        self.actions.push_back(Action::Swap { member, shadow: h.shadow });
        self.requests_saw_failure(member);
        self.jobs_lost_member(member);
        let blocks = self.gen.len();
        self.members[member] = Member {
            role: Role::Active,
            connected: true,
            durable_events: 0,
            written: vec![0; blocks],
            writing: vec![None; blocks],
        };
        self.new_device(member);
        self.events += 1;
        self.gen[0] += 1;
        self.fail_gen = self.gen[0];
        let old = std::mem::replace(&mut self.spec.members[member], h.uri);
        self.log_member(member, &format!("took {old}'s place, in sync"));
        // What the old member's operations were for goes on without it: a read it had may
        // go to the new member at its place, another copy than the one tried.
        for r in self.requests.values_mut() {
            r.pieces.iter_mut().for_each(|p| p.tried &= !(1 << member));
        }
        for op in out {
            self.settle_ok_or_failed(&op, &OpOutcome::Failed("replaced".into()));
        }
        true
    }

    /// Whether job target `t` takes copies now (a member that is live, or the shadow).
    pub(super) fn target_live(&self, t: usize) -> bool {
        match self.members.get(t) {
            Some(m) => m.live(),
            None => self.is_shadow(t) && self.fenced.is_none(),
        }
    }
}
