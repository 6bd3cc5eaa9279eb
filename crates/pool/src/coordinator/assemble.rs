//! From the members' metadata to a running coordinator (`assemble`), to what `pool init`
//! writes (`format`), and to what `pool status` shows without assembling (`survey`).

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use super::api::{Found, MemberState, MemberStatus, Session, Status};
use super::state::{Job, JobKind, Member, Stopping};
use super::Coordinator;
use crate::layout::Map;
use crate::limits::{HEARTBEAT_MS, META_BLOCK_BYTES, META_BYTES};
use crate::meta::{bitmap_blocks, bitmap_words, id_text, region_bytes, Owner, Role, Superblock};
use crate::spec::{Layout, PoolSpec};

/// Each member's superblock (`Ok(None)`: blank), or why the pool cannot be assembled.
fn decode_all(spec: &PoolSpec, found: &[Option<Found>]) -> Result<Vec<Option<Superblock>>, String> {
    let mut out = Vec::with_capacity(found.len());
    for (i, f) in found.iter().enumerate() {
        let sb = match f {
            None => None,
            Some(f) => Superblock::decode(&f.meta).map_err(|e| format!("member {i} ({}): {e}", spec.members[i]))?,
        };
        out.push(sb);
    }
    Ok(out)
}

/// The superblock with the most recent history, after checking that every member with
/// metadata belongs to the pool the file describes, in its place.
fn authority<'a>(spec: &PoolSpec, sbs: &'a [Option<Superblock>]) -> Result<&'a Superblock, String> {
    let first = sbs.iter().flatten().next().ok_or("no member carries pool metadata (run `sluice pool init` first)")?;
    for (i, sb) in sbs.iter().enumerate() {
        let Some(sb) = sb else { continue };
        let who = format!("member {i} ({})", spec.members[i]);
        if sb.pool_id != first.pool_id {
            return Err(format!(
                "{who} belongs to pool {}, not to pool {} like the others",
                id_text(&sb.pool_id),
                id_text(&first.pool_id)
            ));
        }
        if sb.index != i {
            return Err(format!("{who} was initialised as member {}: the member list's order changed", sb.index));
        }
        let unit = if spec.layout == Layout::Mirror { u64::MAX } else { spec.stripe_unit };
        if sb.layout != spec.layout || sb.copies != spec.copies || sb.members() != spec.members.len() || sb.stripe_unit != unit {
            return Err(format!(
                "{who} was initialised as {} with {} members and {} copies, but the pool file says {} with {} members and {} copies",
                sb.layout.name(),
                sb.members(),
                sb.copies,
                spec.layout.name(),
                spec.members.len(),
                spec.copies
            ));
        }
    }
    Ok(sbs.iter().flatten().max_by_key(|sb| sb.events).unwrap_or(first))
}

pub(super) fn assemble(spec: &PoolSpec, found: Vec<Option<Found>>, session: Session, degraded: bool, now: u64) -> Result<Coordinator, String> {
    if found.len() != spec.members.len() {
        return Err(format!("{} members found for {} in the pool file", found.len(), spec.members.len()));
    }
    let missing: Vec<&str> = (0..found.len()).filter(|&i| found[i].is_none()).map(|i| spec.members[i].as_str()).collect();
    if !missing.is_empty() && !degraded {
        return Err(format!("cannot reach member(s) {}; assemble degraded only if you know they hold nothing newer", missing.join(", ")));
    }
    for (i, f) in found.iter().enumerate() {
        if f.as_ref().is_some_and(|f| f.read_only) {
            return Err(format!("member {i} ({}) is read-only", spec.members[i]));
        }
    }
    let sbs = decode_all(spec, &found)?;
    let auth = authority(spec, &sbs)?.clone();
    for (i, f) in found.iter().enumerate() {
        if let Some(f) = f {
            if f.size < META_BYTES + auth.member_bytes {
                return Err(format!("member {i} ({}) is {} bytes, smaller than the pool needs", spec.members[i], f.size));
            }
        }
        if sbs[i].is_none() && found[i].is_some() && !spec.layout.redundant() {
            return Err(format!("member {i} ({}) carries no pool metadata; a stripe cannot rebuild it", spec.members[i]));
        }
    }
    let map = Map { layout: spec.layout, unit: auth.stripe_unit, copies: spec.copies, sets: spec.sets(), member_bytes: auth.member_bytes };
    let regions = auth.regions();
    // Every current member's bitmap counts: a clean may have reached some and not others.
    let mut bits = vec![0u64; regions.div_ceil(64) as usize];
    for (i, sb) in sbs.iter().enumerate() {
        if let (Some(sb), Some(f)) = (sb, &found[i]) {
            if sb.events == auth.events && f.meta.len() > META_BLOCK_BYTES as usize {
                for (w, x) in bits.iter_mut().zip(bitmap_words(&f.meta[META_BLOCK_BYTES as usize..], regions)) {
                    *w |= x;
                }
            }
        }
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
        requests: BTreeMap::new(),
        blocked: VecDeque::new(),
        ops: BTreeMap::new(),
        jobs: Vec::new(),
        locks: Vec::new(),
        cleaning: None,
        actions: VecDeque::new(),
        next_id: 0,
        now,
        startup_gen: 1,
        next_heartbeat: now + HEARTBEAT_MS,
        fence_reads_out: 0,
        fenced: None,
        next_clean: now,
        pace_origin: now,
        paced_bytes: 0,
        resynced_bytes: 0,
        stopping: Stopping::Running,
    };
    c.place_members(&auth, &sbs);
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

impl Coordinator {
    /// Each member's role from the authoritative superblock and what it holds itself.
    fn place_members(&mut self, auth: &Superblock, sbs: &[Option<Superblock>]) {
        let all: BTreeSet<u64> = (0..self.regions).collect();
        for m in 0..self.members.len() {
            let role = auth.roles.get(m).copied().unwrap_or(Role::Active);
            let own = sbs[m].as_ref();
            if !self.members[m].connected {
                let since = match role {
                    Role::Missing { since } => since,
                    _ => auth.events,
                };
                self.members[m].role = Role::Missing { since };
                continue;
            }
            if !self.redundant() {
                continue;
            }
            let todo = match (role, own) {
                (_, None) => Some(all.clone()),
                (Role::Active, Some(_)) => None,
                (Role::Missing { since }, Some(sb)) if sb.events == since => Some(self.dirty_regions()),
                (Role::Missing { .. }, Some(_)) => Some(all.clone()),
                (Role::Rebuilding { .. }, Some(_)) => Some(self.dirty_regions()),
            };
            if let Some(todo) = todo {
                self.members[m].role = Role::Rebuilding { done: 0, total: 0 };
                self.add_job(JobKind::Rebuild, m, todo);
            }
        }
    }

    /// After a crash: every in-sync member but the first of its set gets the dirty regions
    /// from the first.
    fn reconcile_dirty(&mut self) {
        let dirty = self.dirty_regions();
        if dirty.is_empty() {
            return;
        }
        for set in 0..self.map.sets {
            let synced: Vec<usize> = self.map.members_of(set).filter(|&m| self.members[m].in_sync()).collect();
            for &m in synced.iter().skip(1) {
                self.add_job(JobKind::Reconcile, m, dirty.clone());
            }
        }
    }

    pub(super) fn dirty_regions(&self) -> BTreeSet<u64> {
        (0..self.regions).filter(|&r| crate::meta::bit(&self.bits, r)).collect()
    }

    pub(super) fn add_job(&mut self, kind: JobKind, target: usize, todo: BTreeSet<u64>) {
        let total_bytes = todo.iter().map(|&r| self.region_len(r)).sum();
        if let Role::Rebuilding { .. } = self.members[target].role {
            self.members[target].role = Role::Rebuilding { done: 0, total: total_bytes };
        }
        let job = Job {
            kind,
            set: self.map.set_of(target),
            target,
            cursor: todo.first().map(|&r| r * self.region_bytes),
            todo,
            chunks: BTreeSet::new(),
            done_bytes: 0,
            total_bytes,
            flushing: false,
        };
        match self.jobs.iter().position(Option::is_none) {
            Some(i) => self.jobs[i] = Some(job),
            None => self.jobs.push(Some(job)),
        }
    }

    /// Member data bytes in region `r` (the last one may be short).
    pub(super) fn region_len(&self, r: u64) -> u64 {
        let start = r * self.region_bytes;
        (start + self.region_bytes).min(self.map.member_bytes) - start
    }
}

/// What `pool init` writes at offset 0 of each member: its superblock and a clean bitmap.
/// Refuses a member that already carries pool metadata unless `force`.
pub fn format(spec: &PoolSpec, found: &[Found], pool_id: [u8; 16], force: bool) -> Result<Vec<Vec<u8>>, String> {
    if found.len() != spec.members.len() {
        return Err(format!("{} members found for {} in the pool file", found.len(), spec.members.len()));
    }
    for (i, f) in found.iter().enumerate() {
        let who = format!("member {i} ({})", spec.members[i]);
        if f.read_only {
            return Err(format!("{who} is read-only"));
        }
        if force {
            continue;
        }
        match Superblock::decode(&f.meta) {
            Ok(None) => {}
            Ok(Some(sb)) => {
                return Err(format!(
                    "{who} already carries the metadata of pool {} (member {} of a {}); use --force to overwrite it",
                    id_text(&sb.pool_id),
                    sb.index,
                    sb.layout.name()
                ))
            }
            Err(e) => return Err(format!("{who} already carries pool metadata ({e}); use --force to overwrite it")),
        }
    }
    let smallest = found.iter().map(|f| f.size).min().unwrap_or(0);
    let unit = if spec.layout == Layout::Mirror { u64::MAX } else { spec.stripe_unit };
    let map = Map::new(spec.layout, unit, spec.copies, spec.members.len(), smallest)?;
    let region = region_bytes(map.member_bytes);
    let blocks = bitmap_blocks(map.member_bytes.div_ceil(region));
    let out = (0..found.len())
        .map(|index| {
            let sb = Superblock {
                pool_id,
                layout: spec.layout,
                copies: spec.copies,
                index,
                stripe_unit: unit,
                member_bytes: map.member_bytes,
                region_bytes: region,
                events: 1,
                owner: Owner::default(),
                roles: vec![Role::Active; found.len()],
            };
            let mut bytes = sb.encode();
            bytes.resize(((1 + blocks) * META_BLOCK_BYTES) as usize, 0);
            bytes
        })
        .collect();
    Ok(out)
}

/// The pool's state as the members' metadata records it, without assembling it (for
/// `pool status`; `None`: unreachable).
pub fn survey(spec: &PoolSpec, found: &[Option<Found>]) -> Result<Status, String> {
    let sbs = decode_all(spec, found)?;
    let auth = authority(spec, &sbs)?;
    let regions = auth.regions();
    let mut dirty = vec![0u64; regions.div_ceil(64) as usize];
    for (i, sb) in sbs.iter().enumerate() {
        if let (Some(sb), Some(f)) = (sb, &found[i]) {
            if sb.events == auth.events && f.meta.len() > META_BLOCK_BYTES as usize {
                for (w, x) in dirty.iter_mut().zip(bitmap_words(&f.meta[META_BLOCK_BYTES as usize..], regions)) {
                    *w |= x;
                }
            }
        }
    }
    let members = (0..found.len())
        .map(|i| {
            let state = match (&found[i], &sbs[i], auth.roles.get(i).copied().unwrap_or(Role::Active)) {
                (None, _, _) => MemberState::Missing,
                (Some(_), None, _) => MemberState::Stale,
                (Some(_), Some(_), Role::Active) => MemberState::InSync,
                (Some(_), Some(_), Role::Missing { .. }) => MemberState::Stale,
                (Some(_), Some(_), Role::Rebuilding { done, total }) => MemberState::Resyncing { done, total },
            };
            MemberStatus { uri: spec.members[i].clone(), state }
        })
        .collect();
    Ok(Status {
        pool_id: id_text(&auth.pool_id),
        layout: auth.layout,
        stripe_unit: auth.stripe_unit,
        copies: auth.copies,
        size: auth.member_bytes * (auth.members() / auth.copies) as u64,
        events: auth.events,
        region_bytes: auth.region_bytes,
        dirty_regions: dirty.iter().map(|w| w.count_ones() as u64).sum(),
        resynced_bytes: 0,
        members,
    })
}
