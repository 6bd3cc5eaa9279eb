//! From the members' metadata to a running coordinator.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::api::{Found, Session};
use super::state::{Job, JobKind, Member, Stopping};
use super::survey::{authority, decode_all, dirty_union};
use super::Coordinator;
use crate::layout::Map;
use crate::limits::{HEARTBEAT_MS, META_BYTES};
use crate::meta::{bitmap_blocks, Role, Superblock};
use crate::spec::PoolSpec;

impl Coordinator {
    /// Assembles the pool (see `Coordinator::assemble`).
    pub(super) fn build(spec: &PoolSpec, found: Vec<Option<Found>>, session: Session, degraded: bool, now: u64) -> Result<Coordinator, String> {
        if found.len() != spec.members.len() {
            return Err(format!("{} members found for {} in the pool file", found.len(), spec.members.len()));
        }
        let missing: Vec<&str> = (0..found.len()).filter(|&i| found[i].is_none()).map(|i| spec.members[i].as_str()).collect();
        if !missing.is_empty() && !spec.layout.redundant() {
            return Err(format!("cannot reach member(s) {}; a stripe keeps one copy of every unit, so it cannot be served without them", missing.join(", ")));
        }
        if !missing.is_empty() && !degraded {
            return Err(format!(
                "cannot reach member(s) {}; --degraded assembles without them, but only do that if you know they hold nothing newer than the others",
                missing.join(", ")
            ));
        }
        for (i, f) in found.iter().enumerate() {
            if f.as_ref().is_some_and(|f| f.read_only) {
                return Err(format!("member {i} ({}) is read-only", spec.members[i]));
            }
        }
        let sbs = decode_all(spec, &found)?;
        let auth = authority(spec, &sbs)?.clone();
        let resume = reshape_record(&sbs, &auth);
        let fresh = fresh_members(spec, &sbs, &auth, resume.as_ref());
        for (i, f) in found.iter().enumerate() {
            if let Some(f) = f {
                if f.size < META_BYTES + auth.member_bytes {
                    return Err(format!("member {i} ({}) is {} bytes, smaller than the pool needs", spec.members[i], f.size));
                }
            }
            if sbs[i].is_none() && found[i].is_some() && !spec.layout.redundant() && !fresh.contains(&i) {
                return Err(format!("member {i} ({}) carries no pool metadata; a stripe cannot rebuild it", spec.members[i]));
            }
        }
        let map = Map { layout: spec.layout, placement: spec.placement, unit: auth.stripe_unit, copies: spec.copies, sets: spec.sets(), member_bytes: auth.member_bytes };
        let regions = auth.regions();
        let bits = dirty_union(&sbs, &found, &auth);
        let dirty = bits.iter().map(|w| w.count_ones() as u64).sum::<u64>();
        if !missing.is_empty() && auth.owner.session != 0 && dirty > 0 {
            // md's "dirty degraded" rule: copies may differ where the last coordinator was
            // writing, and the missing member may be the copy an earlier coordinator served
            // those regions from; without it, reads could change under a client.
            return Err(format!(
                "the pool's last coordinator ({} pid {}) did not stop cleanly (it crashed, or stopped before reconciling the copies an earlier crash left unequal), so copies may differ in {dirty} region(s); a degraded start without {} could serve other data there than was read before: bring them back first",
                auth.owner.host,
                auth.owner.pid,
                missing.join(", ")
            ));
        }
        let blocks = 1 + bitmap_blocks(regions) as usize;
        let members = (0..found.len())
            .map(|i| Member {
                role: Role::Active,
                connected: found[i].is_some(),
                durable_events: sbs[i].as_ref().map_or(0, |sb| sb.events),
                written: vec![0; blocks],
                writing: vec![None; blocks],
            })
            .collect();
        let mut c = Coordinator {
            spec: spec.clone(),
            map,
            pool_id: auth.pool_id,
            region_bytes: auth.region_bytes,
            regions,
            events: auth.events,
            session,
            heartbeat: 0,
            members,
            bits,
            // Everything is written once to every member: the new owner, and one bitmap.
            gen: vec![1; blocks],
            uses: BTreeMap::new(),
            requests: super::state::Requests::default(),
            blocked: VecDeque::new(),
            drained: Vec::new(),
            ops: BTreeMap::new(),
            jobs: Vec::new(),
            locks: Vec::new(),
            cleaning: None,
            actions: VecDeque::new(),
            next_id: 0,
            now,
            startup_gen: 1,
            fail_gen: 0,
            next_heartbeat: now + HEARTBEAT_MS,
            fence_reads_out: 0,
            fenced: None,
            next_clean: now,
            pace_origin: now,
            paced_bytes: 0,
            resynced_bytes: 0,
            stopping: Stopping::Running,
            spare: super::state::Spares::new(found.len()),
            devices: (0..found.len()).map(|i| auth.devices.get(i).copied().unwrap_or(0)).collect(),
            handover: None,
            scrub: super::scrub_state::Scrub::new(&sbs, now),
            meta_kept: spec.layout.redundant(),
            reshape: None,
        };
        for m in 0..c.devices.len() {
            if c.devices[m] == 0 {
                c.new_device(m);
            }
        }
        c.place_members(&auth, &sbs, &fresh);
        c.resume_reshape(&auth, resume);
        c.check_every_set_has_a_copy()?;
        if spec.layout.redundant() && auth.owner.session != 0 {
            // The last coordinator did not stop cleanly: copies may differ where it was writing.
            c.reconcile_dirty();
        }
        if spec.layout.redundant() {
            c.events += 1;
        }
        c.advance();
        Ok(c)
    }

    /// Each member's role from the authoritative superblock and what it holds itself.
    fn place_members(&mut self, auth: &Superblock, sbs: &[Option<Superblock>], fresh: &BTreeSet<usize>) {
        let all: BTreeSet<u64> = (0..self.regions).collect();
        for (m, own) in sbs.iter().enumerate() {
            if fresh.contains(&m) && self.members[m].connected {
                if self.spec.layout == crate::spec::Layout::Mirror {
                    self.members[m].role = Role::Rebuilding { done: 0, total: 0, full: true };
                    self.add_job(JobKind::Rebuild, m, all.clone());
                }
                continue;
            }
            let role = auth.roles.get(m).copied().unwrap_or(Role::Active);
            // A device that is not the one the pool knows in this place holds nothing of it.
            let own = own.as_ref().filter(|sb| !sb.other_device_than(auth));
            if !self.members[m].connected {
                let since = match role {
                    Role::Missing { since } => since,
                    // No history can make an interrupted full rebuild partial (a replaced
                    // member whose copying a clean stop cut short, left out of a degraded
                    // start): it lacks whatever was not copied yet, dirty or not.
                    Role::Rebuilding { full: true, .. } => u64::MAX,
                    _ => auth.events,
                };
                self.members[m].role = Role::Missing { since };
                continue;
            }
            if !self.redundant() {
                continue;
            }
            if let (Role::Active, Some(sb)) = (role, own) {
                // Active, but behind the others' superblocks: it went away as the last copy
                // of some set (a clean stop writes every live member's), so it catches up
                // in its other sets (see `JobKind::CatchUp`).
                let dirty = self.dirty_regions();
                if sb.events < auth.events && !dirty.is_empty() {
                    self.add_job(JobKind::CatchUp, m, dirty);
                }
            }
            let todo = match (role, own) {
                (_, None) => Some(all.clone()),
                (Role::Active, Some(_)) => None,
                (Role::Missing { since }, Some(sb)) if since <= sb.events && sb.events < auth.events => Some(self.dirty_regions()),
                (Role::Missing { .. }, Some(_)) => Some(all.clone()),
                (Role::Rebuilding { full: true, .. }, Some(_)) => Some(all.clone()),
                (Role::Rebuilding { .. }, Some(_)) => Some(self.dirty_regions()),
            };
            if let Some(todo) = todo {
                self.members[m].role = Role::Rebuilding { done: 0, total: 0, full: false };
                self.add_job(JobKind::Rebuild, m, todo);
            }
        }
    }

    /// Carries on with a reshape the superblocks record, or starts the one a grown pool
    /// file asks for.
    fn resume_reshape(&mut self, auth: &Superblock, record: Option<crate::meta::Reshape>) {
        let sets = |members: usize| Map { sets: members / self.spec.copies, ..self.map };
        match record {
            Some(r) => self.begin_reshape(sets(r.from_members), r.at, r.started),
            None if auth.members() < self.members.len() && self.spec.layout != crate::spec::Layout::Mirror => {
                let from = sets(auth.members());
                self.begin_reshape(from, from.sets as u64, 0);
            }
            None => return,
        }
        let r = self.reshape_status().expect("just begun");
        self.actions.push_back(crate::coordinator::Action::Log {
            text: format!("pool reshape from {} to {} members goes on at volume byte {} of {}", r.from_members, r.to_members, r.done_bytes, r.total_bytes),
        });
    }

    /// A set with no in-sync member has no copy to serve its units from: the missing
    /// members are the only ones that may hold them.
    fn check_every_set_has_a_copy(&self) -> Result<(), String> {
        for (set, at) in self.map.groups() {
            if self.first_in_sync(set, at).is_none() {
                let names: Vec<String> = self.map.members_at(set, at).map(|m| format!("{} ({})", self.spec.members[m], self.member_state(m).name())).collect();
                return Err(format!("no member of set {set} is in sync ({}): the pool cannot be served until one returns", names.join(", ")));
            }
        }
        Ok(())
    }

    /// After a crash: every in-sync member gets the dirty regions from the first in-sync
    /// member of its set, except where it is that first member itself.
    fn reconcile_dirty(&mut self) {
        let dirty = self.dirty_regions();
        if dirty.is_empty() {
            return;
        }
        for m in 0..self.members.len() {
            if self.members[m].in_sync() && self.map.groups_of(m).any(|(set, at)| self.first_in_sync(set, at) != Some(m)) {
                self.add_job(JobKind::Reconcile, m, dirty.clone());
            }
        }
    }

    /// The member of `set` at member offset `at` that copies and reads agree on: the first
    /// in-sync one, passing over a member still catching up there (`JobKind::CatchUp`)
    /// unless it is the only one.
    pub(super) fn first_in_sync(&self, set: usize, at: u64) -> Option<usize> {
        let region = at / self.region_bytes;
        let catching_up = |m: usize| self.jobs.iter().flatten().any(|j| j.kind == JobKind::CatchUp && j.target == m && j.todo.contains(&region));
        let mut synced = self.map.members_at(set, at).filter(|&m| self.members[m].in_sync());
        synced.clone().find(|&m| !catching_up(m)).or_else(|| synced.next())
    }

    pub(super) fn dirty_regions(&self) -> BTreeSet<u64> {
        (0..self.regions).filter(|&r| crate::meta::bit(&self.bits, r)).collect()
    }

    pub(super) fn add_job(&mut self, kind: JobKind, target: usize, todo: BTreeSet<u64>) {
        let total_bytes = todo.iter().map(|&r| self.region_len(r)).sum();
        if let Role::Rebuilding { .. } = self.members[target].role {
            // Copying every region, for whatever reason, is remembered as such.
            let full = todo.len() as u64 == self.regions;
            self.members[target].role = Role::Rebuilding { done: 0, total: total_bytes, full };
        }
        let job = Job {
            kind,
            place: target,
            target,
            cursor: todo.first().map(|&r| r * self.region_bytes),
            todo,
            chunks: BTreeSet::new(),
            done_bytes: 0,
            total_bytes,
            flushing: false,
        };
        // Slots are never reused: a copy still out for an ended job must not find a new one.
        self.jobs.push(Some(job));
    }

    /// Member data bytes in region `r` (the last one may be short).
    pub(super) fn region_len(&self, r: u64) -> u64 {
        let start = r * self.region_bytes;
        (start + self.region_bytes).min(self.map.member_bytes) - start
    }
}


/// The reshape the newest superblocks record, with the largest checkpoint among them: each
/// is at least the one that was durable on every live member.
fn reshape_record(sbs: &[Option<Superblock>], auth: &Superblock) -> Option<crate::meta::Reshape> {
    let r = auth.reshape?;
    let at = sbs.iter().flatten().filter(|sb| sb.events == auth.events).filter_map(|sb| sb.reshape).filter(|x| x.from_members == r.from_members).map(|x| x.at).max();
    Some(crate::meta::Reshape { at: at.unwrap_or(r.at).max(r.at), ..r })
}

/// Members a grow added that are taken as they are: those the newest superblocks do not
/// name (the grow was not recorded: they hold nothing yet), and blank ones of a reshape that
/// moved nothing onto them. A stripe's new member may also have been away for every
/// checkpoint written so far: its superblock is blank, but what was copied to it (FUA,
/// before it left) is there, and a stripe has no other copy to rebuild it from.
fn fresh_members(spec: &PoolSpec, sbs: &[Option<Superblock>], auth: &Superblock, resume: Option<&crate::meta::Reshape>) -> BTreeSet<usize> {
    let n = spec.members.len();
    if auth.members() < n {
        return (auth.members()..n).collect();
    }
    match resume {
        Some(r) if !spec.layout.redundant() || r.at * spec.copies as u64 <= r.from_members as u64 => {
            (r.from_members..n).filter(|&i| sbs[i].is_none()).collect()
        }
        _ => BTreeSet::new(),
    }
}
