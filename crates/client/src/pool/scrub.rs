//! `sluice pool check` and `repair`: when no one serves the pool, it is assembled in this
//! process (as `sluice copy pool:` does), the scrub runs to its end, and the pool stops
//! cleanly. When a live coordinator on this host serves it, the request goes to that
//! coordinator's control socket (two coordinators never hold one pool); one on another
//! host is named, to be asked there.

use crate::client::Client;
use crate::error::Error;
use crate::options::Options;
use crate::uri::{Address, Uri};
use sluice_pool::coordinator::ScrubReport;
use sluice_pool::PoolSpec;
use std::path::Path;
use std::time::Duration;

/// How often the progress callback sees the scrub.
const PROGRESS_EVERY: Duration = Duration::from_millis(200);

/// Checks (or, with `repair`, repairs from member `from`, a URI the pool file names) every
/// mirror set of the pool in `path`; `progress` sees the report as it grows.
pub async fn scrub(path: &Path, repair: bool, from: Option<&str>, progress: impl Fn(&ScrubReport)) -> Result<ScrubReport, Error> {
    let spec = PoolSpec::load(path).map_err(Error::Pool)?;
    if !spec.layout.redundant() {
        return Err(Error::Refused("a stripe keeps one copy of every unit: there is nothing to compare".into()));
    }
    let from = match from {
        None => None,
        Some(f) => Some(spec.members.iter().position(|m| m == f).ok_or_else(|| Error::Refused(format!("{f} is not a member of the pool (its members: {})", spec.members.join(", "))))?),
    };
    let uri = Uri { address: Address::Pool(path.to_path_buf()), export: String::new(), tls: None };
    let pool = match Client::connect_with(&uri, &Options::default()).await {
        Ok(p) => p,
        Err(Error::Refused(why)) if why.contains("being served") => return ask_owner(&spec, repair, from, progress, &why).await,
        Err(e) => return Err(e),
    };
    let result = run(&pool, repair, from, progress).await;
    pool.disconnect().await;
    result
}

/// Asks the coordinator that serves the pool, if it is on this host.
async fn ask_owner(spec: &PoolSpec, repair: bool, from: Option<usize>, progress: impl Fn(&ScrubReport), why: &str) -> Result<ScrubReport, Error> {
    let status = super::admin::status(spec).await?;
    let owner = status.owner.unwrap_or_default();
    let host = owner.rsplit_once(" pid ").map_or(owner.as_str(), |(h, _)| h);
    if host != super::session::host_name() {
        let why = why.trim_end_matches("; stop that first");
        return Err(Error::Refused(format!("{why}, on another host: run this command on {host}, where its coordinator can be asked")));
    }
    let from = from.map(|i| spec.members[i].as_str());
    super::control_ask::ask_scrub(&status.pool_id, repair, from, progress).await
}

async fn run(pool: &Client, repair: bool, from: Option<usize>, progress: impl Fn(&ScrubReport)) -> Result<ScrubReport, Error> {
    pool.start_pool_scrub(repair, from)?;
    loop {
        let status = pool.pool_status().ok_or_else(|| Error::Refused("not a pool".into()))?;
        let report = status.scrub.ok_or_else(|| Error::Pool("the scrub left no report".into()))?;
        if !report.running {
            return Ok(report);
        }
        progress(&report);
        tokio::time::sleep(PROGRESS_EVERY).await;
    }
}
