//! `sluice pool grow`: more servers join a pool at the end of its member list. Each is
//! checked and blanked, the pool file is edited in place (comments and layout kept), and
//! the pool takes them: a stripe or raid10 reshapes the volume onto them, a mirror copies
//! itself to them. The coordinator that serves the pool does it once reloaded; when no one
//! serves it, it is assembled here and the work runs to its end.

use super::admin::status_and_assembly;
use super::file::edit;
use super::replace::{assemble_until, prepare};
use crate::error::Error;
use crate::uri::{Address, Uri};
use sluice_pool::{Layout, MemberState, Placement, PoolSpec, Status};
use std::path::Path;

/// Where the work runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum GrowWhere {
    /// Here, unless a live coordinator serves the pool (a redundant pool's owner says so).
    Auto,
    /// Here: the caller knows no one serves the pool (`--offline`).
    Here,
    /// In the server that serves the pool, once it is reloaded (`--served`).
    Served,
}

/// What `grow` did.
pub enum Grown {
    /// Reshaped (or copied, for a mirror) here, to the end.
    Done,
    /// The pool file names the new members; the coordinator that serves the pool (this
    /// says which, when known) takes them once it is reloaded.
    Served(String),
}

/// Adds the servers `add` to the pool in `path`. Refused, before anything is written, for
/// a raid10 grown by a number of members that is not a multiple of its copies, a member
/// listed already, a reshape still in progress, and a new member that is too small,
/// read-only, or (without `force`) carries pool metadata. `progress` sees the pool's state
/// while the work runs here.
pub async fn grow(path: &Path, add: &[String], force: bool, place: GrowWhere, progress: impl Fn(&Status)) -> Result<Grown, Error> {
    let spec = PoolSpec::load(path).map_err(Error::Pool)?;
    let uris = check_new(&spec, add)?;
    if spec.placement == Placement::Offset {
        return Err(Error::Refused(
            "a raid10 with placement = \"offset\" cannot be grown: its sets are regrouped by the member count, so growing would move every copy (make a new pool and copy the volume, or use placement \"near\")".into(),
        ));
    }
    if spec.layout == Layout::Stripe && place == GrowWhere::Auto {
        return Err(Error::Refused(
            "a stripe names no owner while it is served, so whether a server serves it cannot be told from here: add --served to edit the pool file and let the server that serves it reshape once reloaded (SIGHUP), or --offline to reshape here when no one does".into(),
        ));
    }
    let (status, _) = status_and_assembly(&spec, false).await?;
    if let Some(r) = status.reshape {
        return Err(Error::Refused(format!("a reshape from {} to {} members is in progress ({} of {} bytes moved); grow again once it is done", r.from_members, r.to_members, r.done_bytes, r.total_bytes)));
    }
    let member_bytes = status.size / (spec.members.len() / spec.copies) as u64;
    for uri in &uris {
        prepare(uri, member_bytes, force).await?;
    }
    if let Some(s) = add.iter().find(|a| spec.spares.contains(a)) {
        return Err(Error::Refused(format!("{s} is a spare of the pool: take it out of spares first")));
    }
    edit(path, |text| {
        let edited = sluice_pool::spec::append_members_in_text(text, add)?;
        PoolSpec::parse(&edited).map_err(|e| format!("the grown pool file would not be valid: {e}"))?;
        Ok(edited)
    })?;
    if place == GrowWhere::Served {
        return Ok(Grown::Served("the server that serves it".into()));
    }
    run(path, progress).await.map_err(|e| {
        let why = format!("the pool file now names the new members, but the pool could not be assembled here to take them ({e}); start the pool and it does");
        match e {
            Error::Refused(_) => Error::Refused(why),
            _ => Error::Pool(why),
        }
    })
}

/// The new members' addresses, or why they cannot join.
fn check_new(spec: &PoolSpec, add: &[String]) -> Result<Vec<Uri>, Error> {
    if add.is_empty() {
        return Err(Error::Refused("no member to add (--add URI...)".into()));
    }
    if spec.layout == Layout::Raid10 && !add.len().is_multiple_of(spec.copies) {
        return Err(Error::Refused(format!("a raid10 with {} copies grows by whole mirror sets: add a multiple of {} members", spec.copies, spec.copies)));
    }
    let mut uris = Vec::with_capacity(add.len());
    for (i, new) in add.iter().enumerate() {
        if spec.members.contains(new) || add[..i].contains(new) {
            return Err(Error::Refused(format!("{new} is listed twice (a pool member already, or twice in --add)")));
        }
        let uri = Uri::parse(new)?;
        if matches!(uri.address, Address::Pool(_)) {
            return Err(Error::Refused("a pool cannot be a member of a pool".into()));
        }
        uris.push(uri);
    }
    Ok(uris)
}

/// Assembles the pool here (which starts the reshape or the copying the pool file now asks
/// for), waits until it is done and every member in sync, then stops cleanly; when a live
/// coordinator serves the pool, leaves the work to it.
async fn run(path: &Path, progress: impl Fn(&Status)) -> Result<Grown, Error> {
    let done = |s: &Status| s.reshape.is_none() && s.members.iter().all(|m| m.state == MemberState::InSync);
    Ok(match assemble_until(path, done, progress).await? {
        None => Grown::Done,
        Some(by) => Grown::Served(by),
    })
}
