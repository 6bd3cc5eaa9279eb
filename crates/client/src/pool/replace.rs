//! `sluice pool replace`: another server takes a member's place. The new member is checked
//! and blanked, the pool file is edited in place (its comments and layout kept), and the
//! new member is rebuilt from the other copies of its set: by the coordinator that serves
//! the pool, once it is reloaded, or here, when no one serves it.

use super::admin::status_and_assembly;
use super::file::edit;
use super::found::read_found;
use crate::client::Client;
use crate::error::Error;
use crate::options::Options;
use crate::uri::{Address, Uri};
use sluice_pool::limits::META_BYTES;
use sluice_pool::{Map, MemberState, PoolSpec, Status, Superblock};
use std::path::Path;

/// What a replacement's progress counts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Copying {
    /// Everything, to the new member, while the old one serves.
    WhileOldServes,
    /// What the new member lacks, from the rest of its set, once it took the place.
    Rebuild,
}

/// What `replace` did.
pub enum Replaced {
    /// The pool file names the new member; no coordinator served the pool, so it was
    /// assembled here and the new member rebuilt.
    Rebuilt,
    /// The pool file names the new member; the coordinator that serves the pool (this
    /// error says which) rebuilds it once it is reloaded.
    Served(String),
}

/// Puts the server `new` in the place of member `old` of the pool in `path`. Refused,
/// before anything is written, for a stripe, for a member whose set has no other in-sync
/// copy, and for a new member that is too small, read-only, or (without `force`) carries
/// pool metadata. `progress` is called while the new member is rebuilt here. A member in
/// sync goes on serving while everything is copied to the new one (md's `--replace`), so
/// its set keeps its copies meanwhile.
pub async fn replace(path: &Path, old: &str, new: &str, force: bool, progress: impl Fn(Copying, u64, u64)) -> Result<Replaced, Error> {
    let spec = PoolSpec::load(path).map_err(Error::Pool)?;
    let index = spec.members.iter().position(|m| m == old).ok_or_else(|| Error::Pool(format!("{old} is not a member of the pool (its members: {})", spec.members.join(", "))))?;
    if spec.members.iter().any(|m| m == new) {
        return Err(Error::Pool(format!("{new} is a member of the pool already")));
    }
    if spec.spares.iter().any(|m| m == new) {
        return Err(Error::Pool(format!("{new} is a spare of the pool: take it out of spares first (a spare takes a missing member's place by itself)")));
    }
    let uri = Uri::parse(new)?;
    if matches!(uri.address, Address::Pool(_)) {
        return Err(Error::Pool("a pool cannot be a member of a pool".into()));
    }
    let (status, _) = status_and_assembly(&spec, false).await?;
    check_set(&spec, &status, index)?;
    let member_bytes = status.size / (spec.members.len() / spec.copies) as u64;
    prepare(&uri, member_bytes, force).await?;
    let edited = |text: &str| sluice_pool::spec::replace_member_in_text(text, old, new);
    if status.members[index].state == MemberState::InSync {
        return hand_over(path, index, &uri, edited, progress).await;
    }
    edit(path, edited)?;
    rebuild(path, new, progress).await.map_err(|e| {
        let why = format!("the pool file now names {new} in {old}'s place, but the pool could not be assembled here to rebuild it ({e}); start the pool (with --degraded if a member is missing) and it rebuilds {new}");
        match e {
            Error::Refused(_) => Error::Refused(why),
            _ => Error::Pool(why),
        }
    })
}

/// Adds the server `uri` to the spares of the pool in `path`, once it is checked like a
/// new member (large enough, writable, no pool metadata unless `force`) and its metadata
/// area blanked. Returns who serves the pool, if a live coordinator does: it takes the new
/// spare into account once reloaded.
pub async fn add_spare(path: &Path, uri: &str, force: bool) -> Result<Option<String>, Error> {
    let spec = PoolSpec::load(path).map_err(Error::Pool)?;
    if !spec.layout.redundant() {
        return Err(Error::Pool("a stripe keeps one copy of every unit, so there is nothing to rebuild a spare from".into()));
    }
    if spec.members.iter().any(|m| m == uri) {
        return Err(Error::Pool(format!("{uri} is a member of the pool")));
    }
    let parsed = Uri::parse(uri)?;
    if matches!(parsed.address, Address::Pool(_)) {
        return Err(Error::Pool("a pool cannot be a member of a pool".into()));
    }
    // Refused before anything is checked or blanked when it is listed already.
    let text = std::fs::read_to_string(path).map_err(|e| Error::Pool(format!("cannot read {}: {e}", path.display())))?;
    sluice_pool::spec::add_spare_in_text(&text, uri).map_err(Error::Pool)?;
    let (status, _) = status_and_assembly(&spec, true).await?;
    let member_bytes = status.size / (spec.members.len() / spec.copies) as u64;
    prepare(&parsed, member_bytes, force).await?;
    edit(path, |text| sluice_pool::spec::add_spare_in_text(text, uri))?;
    Ok(status.owner.map(|o| format!("the members name {o} as the pool's coordinator")))
}

/// A stripe has no other copy to rebuild from, nor has a set whose only in-sync member
/// is the one to go.
fn check_set(spec: &PoolSpec, status: &sluice_pool::Status, index: usize) -> Result<(), Error> {
    let old = &spec.members[index];
    if !spec.layout.redundant() {
        let why = match status.members[index].state {
            MemberState::Missing => format!("{old} is missing and a stripe keeps one copy of every unit: nothing is left to rebuild a new member from"),
            _ => format!("a stripe keeps one copy of every unit: replace {old} by copying it (sluice copy) while no client uses the pool, then edit the pool file"),
        };
        return Err(Error::Refused(why));
    }
    let states: Vec<MemberState> = status.members.iter().map(|m| m.state).collect();
    if !others_in_sync(spec, status.stripe_unit, status.size, &states, index) {
        return Err(Error::Refused(format!("no other member of {old}'s set is in sync: nothing is left to rebuild a new member from")));
    }
    Ok(())
}

/// Whether every set that member `index` belongs to (with offset placement, one per
/// placement period) has another member in sync.
fn others_in_sync(spec: &PoolSpec, unit: u64, size: u64, states: &[MemberState], index: usize) -> bool {
    let sets = spec.members.len() / spec.copies;
    let map = Map { layout: spec.layout, placement: spec.placement, unit, copies: spec.copies, sets, member_bytes: size / sets as u64 };
    for (set, at) in map.groups_of(index) {
        if !map.members_at(set, at).any(|m| m != index && states[m] == MemberState::InSync) {
            return false;
        }
    }
    true
}

/// Checks the new member and blanks its metadata area, so that the pool rebuilds it in
/// full and no other pool can claim it by mistake.
pub(super) async fn prepare(uri: &Uri, member_bytes: u64, force: bool) -> Result<(), Error> {
    let options = Options { block_status: false, ..Options::default() };
    let m = Client::connect_with(uri, &options).await.map_err(|e| Error::Pool(format!("{uri} cannot be reached: {e}")))?;
    let result = async {
        let ex = m.export();
        if ex.read_only() {
            return Err(Error::Refused(format!("{uri} is read-only")));
        }
        if ex.size < META_BYTES + member_bytes {
            return Err(Error::Refused(format!("{uri} has {} bytes; a member of this pool needs {}", ex.size, META_BYTES + member_bytes)));
        }
        let found = read_found(&m).await?;
        if let (Ok(Some(sb)), false) = (Superblock::decode(&found.meta), force) {
            let id = sluice_pool::meta::id_text(&sb.pool_id);
            return Err(Error::Refused(format!("{uri} carries the metadata of pool {id} (member {}); --force overwrites it", sb.index + 1)));
        }
        m.write(0, &vec![0; META_BYTES as usize], true).await?;
        m.flush().await
    }
    .await;
    m.disconnect().await;
    result
}

/// Assembles the pool here and waits until the new member is in sync, then stops cleanly;
/// when a live coordinator serves the pool, leaves the rebuild to it.
async fn rebuild(path: &Path, new: &str, progress: impl Fn(Copying, u64, u64)) -> Result<Replaced, Error> {
    let pool = match assemble(path).await? {
        Ok(p) => p,
        Err(by) => return Ok(Replaced::Served(by)),
    };
    let done = wait_in_sync(&pool, new, progress).await;
    pool.disconnect().await;
    done.map(|()| Replaced::Rebuilt)
}

/// The pool in `path`, assembled here; or, when a live coordinator serves it, who that is.
async fn assemble(path: &Path) -> Result<Result<Client, String>, Error> {
    let uri = Uri { address: Address::Pool(path.to_path_buf()), export: String::new(), tls: None };
    match Client::connect_with(&uri, &Options::default()).await {
        Ok(p) => Ok(Ok(p)),
        Err(Error::Refused(why)) if why.contains("being served") => Ok(Err(why.trim_end_matches("; stop that first").to_owned())),
        Err(e) => Err(e),
    }
}

/// Replaces member `index`, in sync, by `new` while it serves: the pool is assembled with
/// it, the pool file is edited (first, as for a serving coordinator: a crash during the
/// copy leaves a file that names the new member, which the next start rebuilds in full),
/// and everything is copied to the new member before it takes the old one's place.
async fn hand_over(
    path: &Path,
    index: usize,
    new: &Uri,
    edited: impl Fn(&str) -> Result<String, String>,
    progress: impl Fn(Copying, u64, u64),
) -> Result<Replaced, Error> {
    let pool = match assemble(path).await? {
        Ok(p) => p,
        Err(by) => {
            edit(path, edited)?;
            return Ok(Replaced::Served(by));
        }
    };
    let mut done = edit(path, edited);
    if done.is_ok() {
        done = pool.replace_pool_member(index, new);
    }
    if done.is_ok() {
        done = wait_in_sync(&pool, &new.to_string(), progress).await;
    }
    pool.disconnect().await;
    done.map(|()| Replaced::Rebuilt)
}

/// Waits until the member at `new` is in sync, calling `progress` with the copy's bytes
/// (while a live replacement copies, then while the rest is rebuilt).
async fn wait_in_sync(pool: &Client, new: &str, progress: impl Fn(Copying, u64, u64)) -> Result<(), Error> {
    loop {
        let status = pool.pool_status().expect("a pool has a status");
        match (&status.replacing, status.members.iter().find(|m| m.uri == new)) {
            (Some(r), _) => progress(Copying::WhileOldServes, r.done, r.total),
            (None, Some(m)) if m.state == MemberState::InSync => return Ok(()),
            (None, Some(m)) => match m.state {
                MemberState::Resyncing { done, total } => progress(Copying::Rebuild, done, total),
                _ => progress(Copying::Rebuild, 0, 0),
            },
            (None, None) => return Err(Error::Pool(format!("the pool gave up replacing a member by {new}: see its log"))),
        }
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
}

/// Assembles the pool here and looks at its state every half second, calling `progress`,
/// until `done` holds; then stops cleanly. `Some(who)` instead when a live coordinator
/// serves the pool: the work is left to it.
pub(super) async fn assemble_until(path: &Path, done: impl Fn(&Status) -> bool, progress: impl Fn(&Status)) -> Result<Option<String>, Error> {
    let pool = match assemble(path).await? {
        Ok(p) => p,
        Err(by) => return Ok(Some(by)),
    };
    loop {
        let status = pool.pool_status().expect("a pool has a status");
        if done(&status) {
            break;
        }
        progress(&status);
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    }
    pool.disconnect().await;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_pool::{Layout, Placement};

    #[test]
    fn a_member_is_replaced_only_when_each_of_its_sets_keeps_a_copy() {
        let text = "layout = \"raid10\"\nstripe-unit = \"64K\"\nmembers = [\"nbd://a/x\", \"nbd://b/x\", \"nbd://c/x\", \"nbd://d/x\"]\n";
        let near = PoolSpec::parse(text).unwrap();
        let offset = PoolSpec { placement: Placement::Offset, ..near.clone() };
        assert_eq!(offset.layout, Layout::Raid10);
        let mut states = vec![MemberState::InSync; 4];
        states[2] = MemberState::Missing;
        let size = 2 * (16 << 20);
        // Near: member 0's set is {0, 1}. Offset: member 0 shares a set with member 2 too.
        assert!(others_in_sync(&near, 64 << 10, size, &states, 0));
        assert!(!others_in_sync(&offset, 64 << 10, size, &states, 0));
        assert!(!others_in_sync(&near, 64 << 10, size, &states, 3));
        assert!(!others_in_sync(&offset, 64 << 10, size, &states, 3));
        states[2] = MemberState::InSync;
        states[1] = MemberState::Missing;
        assert!(others_in_sync(&offset, 64 << 10, size, &states, 1));
        assert!(!others_in_sync(&offset, 64 << 10, size, &states, 2));
    }
}
