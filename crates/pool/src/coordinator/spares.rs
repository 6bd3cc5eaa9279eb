//! Hot spares: a member missing for `spare-after` is replaced by the first spare of the
//! pool file, as `sluice pool replace` would, and rebuilt in full from its set. md takes a
//! spare at once; we wait a while, because a member that returns after a reboot or a
//! network blip needs only its dirty regions copied, and a spare needs everything.

use super::api::Action;
use super::state::Stopping;
use super::Coordinator;

impl Coordinator {
    /// Servers waiting to take a missing member's place, in order, and how long a member
    /// must be missing first. A reload of the pool file changes them.
    pub fn set_spares(&mut self, spares: Vec<String>, spare_after_ms: u64, now: u64) {
        self.now = self.now.max(now);
        // A reload may name a spare that was taken meanwhile, or one that is now a member.
        let taken = |s: &String| self.spec.members.contains(s) || self.handover.as_ref().is_some_and(|h| h.uri == *s);
        self.spec.spares = spares.into_iter().filter(|s| !taken(s)).collect();
        self.spec.spare_after_ms = spare_after_ms;
        self.advance();
    }

    /// Notes which members are missing since when (called after every event).
    pub(super) fn note_missing(&mut self) {
        let now = self.now;
        for (m, since) in self.spare.missing_since.iter_mut().enumerate() {
            match self.members[m].connected {
                true => *since = None,
                false => *since = since.or(Some(now)),
            }
        }
    }

    /// Replaces members missing for `spare-after` by spares while there are spares and the
    /// pool can rebuild them.
    pub(super) fn take_spares(&mut self) {
        if self.spec.spares.is_empty() || self.stopping != Stopping::Running || self.fenced.is_some() {
            return;
        }
        for m in 0..self.members.len() {
            let due = self.spare.missing_since[m].is_some_and(|t| t + self.spec.spare_after_ms <= self.now);
            if !due || self.spec.spares.is_empty() || self.replace_refusal(&[m]).is_some() {
                continue;
            }
            let uri = self.spec.spares.remove(0);
            let old = std::mem::replace(&mut self.spec.members[m], uri.clone());
            let after = self.spec.spare_after_ms;
            self.actions.push_back(Action::Log { text: format!("pool member {m} ({old}) has been missing for {after} ms: spare {uri} takes its place") });
            self.replace(m);
            self.spare.taken += 1;
            // It is not connected yet: the wait for it starts again, for the next spare.
            self.spare.missing_since[m] = Some(self.now);
            self.actions.push_back(Action::SpareTaken { member: m, old, uri });
        }
    }

    /// When a missing member is next due for a spare.
    pub(super) fn spare_wakeup(&self) -> Option<u64> {
        if self.spec.spares.is_empty() || self.stopping != Stopping::Running || self.fenced.is_some() {
            return None;
        }
        // Called after every event: only members that are missing are asked about.
        let due = |m: usize| self.spare.missing_since[m].map(|t| t + self.spec.spare_after_ms);
        (0..self.members.len()).filter_map(|m| due(m).filter(|_| self.replace_refusal(&[m]).is_none())).min()
    }
}
