//! What `sluice pool` does without assembling a pool: write a new pool's metadata to its
//! members, and report the state their metadata records.

use super::found::{connect_all, member_uris, read_all, read_found};
use super::member::Connecting;
use super::member_io::{self, Payload};
use super::session::pool_id;
use crate::client::Client;
use crate::options::Options;
use crate::error::Error;
use crate::uri::Uri;
use sluice_pool::coordinator::{format, survey};
use sluice_pool::{Coordinator, Found, MemberCmd, PoolSpec, Status};
use std::path::Path;

/// Reads and checks a pool file (what `pool:PATH` names).
pub fn load(path: &Path) -> Result<PoolSpec, Error> {
    PoolSpec::load(path).map_err(Error::Pool)
}

/// One connection per member is plenty for a megabyte of metadata.
fn connect(uri: &Uri) -> Connecting<Client> {
    let (uri, options) = (uri.clone(), Options { block_status: false, ..Options::default() });
    Box::pin(async move { Client::connect_with(&uri, &options).await })
}

/// Writes a new pool's metadata (superblock and clean bitmap) at the start of every
/// member, durably, and returns the pool's state as the members now record it. Every
/// member must answer (`Error::Pool` otherwise); a member that refuses writes, or already
/// carries pool metadata and `force` is not set, is refused (`Error::Refused`) before
/// anything is written.
pub async fn init(spec: &PoolSpec, force: bool) -> Result<Status, Error> {
    let uris = member_uris(spec)?;
    let mut members = Vec::with_capacity(uris.len());
    for m in connect_all(&uris, connect).await {
        members.push(m?);
    }
    let found = read_all(&members, &uris).await?;
    if let Some(i) = found.iter().position(|f| f.read_only) {
        return Err(Error::Refused(format!("member {} is read-only", uris[i])));
    }
    let images = format(spec, &found, pool_id(), force).map_err(Error::Refused)?;
    let writes: Vec<_> = members
        .iter()
        .cloned()
        .zip(images)
        .map(|(m, image)| {
            let cmd = MemberCmd::Write { offset: 0, len: image.len() as u64, fua: true };
            tokio::spawn(async move { member_io::run(&m, cmd, Payload::Owned(image)).await })
        })
        .collect();
    for (w, u) in writes.into_iter().zip(&uris) {
        let written = w.await.unwrap_or_else(|e| Err(Error::Pool(e.to_string())));
        written.map_err(|e| Error::Pool(format!("member {u}: writing the pool metadata failed: {e}")))?;
    }
    // Read back what is there now: the status then shows what the members hold.
    let found = read_all(&members, &uris).await?;
    for m in &members {
        m.disconnect().await;
    }
    survey(spec, &found.into_iter().map(Some).collect::<Vec<_>>()).map_err(Error::Refused)
}

/// The pool's state as its members' metadata records it, without assembling the pool:
/// members that do not answer count as missing.
pub async fn status(spec: &PoolSpec) -> Result<Status, Error> {
    Ok(status_and_assembly(spec, false).await?.0)
}

/// `status`, and whether a coordinator could assemble the pool from what answers now (with
/// members missing when `degraded`): Ok, or the refusal a start would meet.
pub async fn status_and_assembly(spec: &PoolSpec, degraded: bool) -> Result<(Status, Result<(), String>), Error> {
    let found = survey_members(spec).await?;
    let status = survey(spec, &found).map_err(Error::Refused)?;
    let session = sluice_pool::Session { id: 1, pid: std::process::id(), host: "status".into() };
    let assembly = Coordinator::assemble(spec, found, session, degraded, 0).map(drop);
    Ok((status, assembly))
}

/// What each member's metadata area holds; None for a member that does not answer.
async fn survey_members(spec: &PoolSpec) -> Result<Vec<Option<Found>>, Error> {
    let uris = member_uris(spec)?;
    // A stopped member accepts connections and then says nothing: give each the time the
    // pool itself gives a member.
    let limit = std::time::Duration::from_millis(spec.member_timeout_ms);
    let looks: Vec<_> = uris
        .iter()
        .map(|u| {
            let u = u.clone();
            tokio::spawn(async move {
                let look = async {
                    let m = connect(&u).await?;
                    let f = read_found(&m).await;
                    m.disconnect().await;
                    f
                };
                tokio::time::timeout(limit, look).await.unwrap_or(Err(Error::Timeout))
            })
        })
        .collect();
    let mut found = Vec::with_capacity(uris.len());
    for (look, u) in looks.into_iter().zip(&uris) {
        let f = look.await.unwrap_or_else(|e| Err(Error::Pool(e.to_string())));
        if let Err(e) = &f {
            log::info!("pool member {u} does not answer: {e}");
        }
        found.push(f.ok());
    }
    Ok(found)
}
