//! `sluice pool replace`: another server takes a member's place. The new member is checked
//! and blanked, the pool file is edited in place (its comments and layout kept), and the
//! new member is rebuilt from the other copies of its set: by the coordinator that serves
//! the pool, once it is reloaded, or here, when no one serves it.

use super::admin::status_and_assembly;
use super::found::read_found;
use crate::client::Client;
use crate::error::Error;
use crate::options::Options;
use crate::uri::{Address, Uri};
use sluice_pool::limits::META_BYTES;
use sluice_pool::{MemberState, PoolSpec, Status, Superblock};
use std::path::Path;

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
/// pool metadata. `progress` is called while the new member is rebuilt here.
pub async fn replace(path: &Path, old: &str, new: &str, force: bool, progress: impl Fn(u64, u64)) -> Result<Replaced, Error> {
    let spec = PoolSpec::load(path).map_err(Error::Pool)?;
    let index = spec.members.iter().position(|m| m == old).ok_or_else(|| Error::Pool(format!("{old} is not a member of the pool (its members: {})", spec.members.join(", "))))?;
    if spec.members.iter().any(|m| m == new) {
        return Err(Error::Pool(format!("{new} is a member of the pool already")));
    }
    let uri = Uri::parse(new)?;
    if matches!(uri.address, Address::Pool(_)) {
        return Err(Error::Pool("a pool cannot be a member of a pool".into()));
    }
    let (status, _) = status_and_assembly(&spec, false).await?;
    check_set(&spec, &status, index)?;
    let member_bytes = status.size / (spec.members.len() / spec.copies) as u64;
    prepare(&uri, member_bytes, force).await?;
    let text = std::fs::read_to_string(path).map_err(|e| Error::Pool(format!("cannot read {}: {e}", path.display())))?;
    let edited = sluice_pool::spec::replace_member_in_text(&text, old, new).map_err(Error::Pool)?;
    write_in_place(path, &edited)?;
    rebuild(path, new, progress).await.map_err(|e| {
        let why = format!("the pool file now names {new} in {old}'s place, but the pool could not be assembled here to rebuild it ({e}); start the pool (with --degraded if a member is missing) and it rebuilds {new}");
        match e {
            Error::Refused(_) => Error::Refused(why),
            _ => Error::Pool(why),
        }
    })
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
    let set = index / spec.copies;
    let others_in_sync = (set * spec.copies..(set + 1) * spec.copies).any(|m| m != index && status.members[m].state == MemberState::InSync);
    if !others_in_sync {
        return Err(Error::Refused(format!("no other member of {old}'s set is in sync: nothing is left to rebuild a new member from")));
    }
    Ok(())
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

/// Writes `text` to `path` (the file a symbolic link points to, when it is one) through a
/// temporary file beside it, synced, then renamed over it, so that a crash leaves the old
/// file or the new one, never half of one; the file keeps its mode and owner.
pub(super) fn write_in_place(path: &Path, text: &str) -> Result<(), Error> {
    use std::io::Write;
    use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
    let fail = |e: std::io::Error| Error::Pool(format!("cannot write {}: {e}", path.display()));
    let path = std::fs::canonicalize(path).map_err(fail)?;
    let meta = std::fs::metadata(&path).map_err(fail)?;
    let dir = path.parent().unwrap_or(Path::new("/"));
    let name = path.file_name().map_or_else(Default::default, |n| n.to_string_lossy().into_owned());
    let tmp = dir.join(format!(".{name}.sluice-{}", std::process::id()));
    let written = (|| {
        let mut f = std::fs::OpenOptions::new().write(true).create_new(true).mode(meta.mode() & 0o7777).open(&tmp)?;
        std::os::unix::fs::fchown(&f, Some(meta.uid()), Some(meta.gid()))?;
        f.write_all(text.as_bytes())?;
        f.sync_all()?;
        std::fs::rename(&tmp, &path)?;
        std::fs::File::open(dir)?.sync_all()
    })();
    if written.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    written.map_err(fail)
}

/// Assembles the pool here and waits until the new member is in sync, then stops cleanly;
/// when a live coordinator serves the pool, leaves the rebuild to it.
async fn rebuild(path: &Path, new: &str, progress: impl Fn(u64, u64)) -> Result<Replaced, Error> {
    let state = |s: &Status| s.members.iter().find(|m| m.uri == new).map(|m| m.state);
    let done = |s: &Status| state(s).is_none_or(|st| st == MemberState::InSync);
    let shown = |s: &Status| match state(s) {
        Some(MemberState::Resyncing { done, total }) => progress(done, total),
        _ => progress(0, 0),
    };
    Ok(match assemble_until(path, done, shown).await? {
        None => Replaced::Rebuilt,
        Some(by) => Replaced::Served(by),
    })
}

/// Assembles the pool here and looks at its state every half second, calling `progress`,
/// until `done` holds; then stops cleanly. `Some(who)` instead when a live coordinator
/// serves the pool: the work is left to it.
pub(super) async fn assemble_until(path: &Path, done: impl Fn(&Status) -> bool, progress: impl Fn(&Status)) -> Result<Option<String>, Error> {
    let uri = Uri { address: Address::Pool(path.to_path_buf()), export: String::new(), tls: None };
    let pool = match Client::connect_with(&uri, &Options::default()).await {
        Ok(p) => p,
        Err(Error::Refused(why)) if why.contains("being served") => return Ok(Some(why.trim_end_matches("; stop that first").to_owned())),
        Err(e) => return Err(e),
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
