//! What the members' metadata says without assembling the pool: what `pool init` writes
//! (`format`), what `pool status` shows (`survey`), and the checks assembly starts from.

use super::api::{Found, MemberState, MemberStatus, ReshapeStatus, Status};
use crate::layout::Map;
use crate::limits::META_BLOCK_BYTES;
use crate::meta::{bitmap_blocks, bitmap_words, id_text, region_bytes, Owner, Role, Superblock};
use crate::spec::{Layout, Placement, PoolSpec};

/// Each member's superblock (`Ok(None)`: blank), or why the pool cannot be assembled.
pub(super) fn decode_all(spec: &PoolSpec, found: &[Option<Found>]) -> Result<Vec<Option<Superblock>>, String> {
    if found.iter().all(Option::is_none) {
        return Err(format!("none of the pool's {} members answers", found.len()));
    }
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
pub(super) fn authority<'a>(spec: &PoolSpec, sbs: &'a [Option<Superblock>]) -> Result<&'a Superblock, String> {
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
        if sb.placement != spec.placement {
            return Err(format!(
                "{who} was initialised with placement \"{}\", but the pool file says \"{}\" (placement cannot change: it moves every copy)",
                sb.placement.name(),
                spec.placement.name()
            ));
        }
        if spec.placement != Placement::Near && grown_shape(spec, sb) {
            return Err(format!("{who}: the pool file names more members than the pool has, and a raid10 with offset placement cannot be grown (its sets are regrouped by the member count)"));
        }
        if sb.layout != spec.layout || !(same_shape(spec, sb) || grown_shape(spec, sb)) || sb.stripe_unit != unit {
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

fn same_shape(spec: &PoolSpec, sb: &Superblock) -> bool {
    sb.members() == spec.members.len() && sb.copies == spec.copies
}

/// The pool file names more members than the superblock, as `pool grow` leaves it before
/// the coordinator has recorded them: whole mirror sets more, or copies more of a mirror.
pub(super) fn grown_shape(spec: &PoolSpec, sb: &Superblock) -> bool {
    let (n, m) = (sb.members(), spec.members.len());
    n < m
        && match spec.layout {
            Layout::Mirror => sb.copies == n && spec.copies == m,
            _ => sb.copies == spec.copies && (m - n).is_multiple_of(spec.copies),
        }
}

/// What `pool init` writes at offset 0 of each member: its superblock and a clean bitmap.
/// Refuses a member that already carries pool metadata unless `force`.
pub fn format(spec: &PoolSpec, found: &[Found], pool_id: [u8; 16], force: bool) -> Result<Vec<Vec<u8>>, String> {
    format_with(spec, found, pool_id, force, None)
}

/// `format` with a chosen region size (the simulation uses small regions, so that a short
/// run cleans and dirties many of them).
pub(crate) fn format_with(spec: &PoolSpec, found: &[Found], pool_id: [u8; 16], force: bool, region: Option<u64>) -> Result<Vec<Vec<u8>>, String> {
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
    let region = region.unwrap_or_else(|| region_bytes(map.member_bytes));
    let blocks = bitmap_blocks(map.member_bytes.div_ceil(region));
    let out = (0..found.len())
        .map(|index| {
            let sb = Superblock {
                pool_id,
                layout: spec.layout,
                placement: spec.placement,
                copies: spec.copies,
                index,
                stripe_unit: unit,
                member_bytes: map.member_bytes,
                region_bytes: region,
                events: 1,
                owner: Owner::default(),
                roles: vec![Role::Active; found.len()],
                scrub: None,
                devices: (0..found.len() as u64).map(|i| crate::meta::device_id(u64::from_le_bytes(pool_id[..8].try_into().unwrap()), i)).collect(),
                reshape: None,
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
/// The union of the bitmaps of every member of the pool: a clean may have reached some of
/// them and not others, and a member's new superblock may have landed before its bitmap.
/// Counting a region dirty that is not only costs a copy.
pub(super) fn dirty_union(sbs: &[Option<Superblock>], found: &[Option<Found>], auth: &Superblock) -> Vec<u64> {
    let regions = auth.regions();
    let mut bits = vec![0u64; regions.div_ceil(64) as usize];
    for (sb, f) in sbs.iter().zip(found) {
        if let (Some(sb), Some(f)) = (sb, f) {
            if sb.pool_id == auth.pool_id && f.meta.len() > META_BLOCK_BYTES as usize {
                for (w, x) in bits.iter_mut().zip(bitmap_words(&f.meta[META_BLOCK_BYTES as usize..], regions)) {
                    *w |= x;
                }
            }
        }
    }
    bits
}

pub fn survey(spec: &PoolSpec, found: &[Option<Found>]) -> Result<Status, String> {
    let sbs = decode_all(spec, found)?;
    let auth = authority(spec, &sbs)?;
    let dirty = dirty_union(&sbs, found, auth);
    let members = (0..found.len())
        .map(|i| {
            let state = match (&found[i], &sbs[i], auth.roles.get(i).copied().unwrap_or(Role::Active)) {
                (None, _, _) => MemberState::Missing,
                (Some(_), None, _) => MemberState::Stale,
                (Some(_), Some(_), Role::Active) => MemberState::InSync,
                (Some(_), Some(_), Role::Missing { .. }) => MemberState::Stale,
                (Some(_), Some(_), Role::Rebuilding { done, total, .. }) => MemberState::Resyncing { done, total },
            };
            MemberStatus { uri: spec.members[i].clone(), state }
        })
        .collect();
    let reshape = auth.reshape.map(|r| ReshapeStatus {
        from_members: r.from_members,
        to_members: auth.members(),
        done_bytes: r.at * auth.stripe_unit,
        total_bytes: auth.member_bytes * (r.from_members / auth.copies) as u64,
        started: r.started,
        rate_bytes_per_s: None,
    });
    Ok(Status {
        pool_id: id_text(&auth.pool_id),
        layout: auth.layout,
        placement: auth.placement,
        stripe_unit: auth.stripe_unit,
        copies: auth.copies,
        size: reshape.map_or(auth.member_bytes * (auth.members() / auth.copies) as u64, |r| r.total_bytes),
        events: auth.events,
        region_bytes: auth.region_bytes,
        dirty_regions: dirty.iter().map(|w| w.count_ones() as u64).sum(),
        resynced_bytes: 0,
        spares: spec.spares.clone(),
        spares_taken: 0,
        replacing: None,
        owner: (auth.owner.session != 0).then(|| format!("{} pid {}", auth.owner.host, auth.owner.pid)),
        members,
        scrub: super::scrub_report::recorded(&sbs),
        scrubs_completed: 0,
        reshape,
    })
}
