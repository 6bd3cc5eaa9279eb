//! `sluice pool check` and `repair` run here: the pool is assembled in this process (as
//! `sluice copy pool:` does), the scrub runs to its end, and the pool stops cleanly. A pool
//! that a live coordinator serves is refused with the coordinator named: two coordinators
//! never hold one pool.

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
        Err(Error::Refused(why)) if why.contains("being served") => {
            return Err(Error::Refused(format!("{why}; this sluice cannot ask a serving coordinator to scrub yet")));
        }
        Err(e) => return Err(e),
    };
    let result = run(&pool, repair, from, progress).await;
    pool.disconnect().await;
    result
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
