//! Opening a pool by its file: connect every member, read its metadata, make sure no live
//! coordinator owns the pool, assemble, and describe the volume as an NBD export.

use super::driver::PoolDriver;
use super::found::{connect_all, member_uris, read_all};
use super::lease::take_over;
use super::member::Member;
use super::session::session;
use crate::error::Error;
use crate::export::Export;
use crate::limits::{POOL_BLOCK_MAX_BYTES, POOL_BLOCK_MIN_BYTES, POOL_BLOCK_PREFERRED_BYTES};
use crate::uri::Uri;
use sluice_pool::{Coordinator, Found, PoolSpec};
use sluice_proto::wire::*;
use std::path::Path;
use std::time::Instant;

/// Opens the pool `path` describes. Every member must answer, unless `degraded`: then a
/// redundant pool is assembled without those that do not, as long as every set keeps an
/// in-sync copy.
pub(crate) async fn open<M: Member>(path: &Path, options: &M::Options, degraded: bool) -> Result<(Export, PoolDriver<M>), Error> {
    let named = |e: Error| match e {
        Error::Pool(m) => Error::Pool(format!("pool {}: {m}", path.display())),
        other => other,
    };
    let spec = PoolSpec::load(path).map_err(Error::Pool)?;
    let uris = member_uris(&spec).map_err(named)?;
    let members = reach(&spec, &uris, options, degraded).await.map_err(named)?;
    let (present, present_uris): (Vec<M>, Vec<_>) = members.iter().zip(&uris).filter_map(|(m, u)| Some((m.clone()?, u.clone()))).unzip();
    let found = read_all(&present, &present_uris).await.map_err(named)?;
    let mut found = take_over(&present, &present_uris, found).await?.into_iter();
    let found: Vec<Option<Found>> = members.iter().map(|m| m.as_ref().and_then(|_| found.next())).collect();
    let start = Instant::now();
    let mut coord = Coordinator::assemble(&spec, found, session(), degraded, 0).map_err(|e| Error::Refused(format!("pool {}: {e}", path.display())))?;
    // The coordinator's clock starts at `start`; scrub records carry dates.
    let wall = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    coord.set_wall_clock(wall.saturating_sub(start.elapsed().as_millis() as u64));
    coord.wall_clock(std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()));
    let missing: Vec<String> = members.iter().zip(&uris).filter(|(m, _)| m.is_none()).map(|(_, u)| u.to_string()).collect();
    if !missing.is_empty() {
        log::warn!("pool {}: DEGRADED: assembled without {}; they are tried again in the background and rebuilt when they answer", path.display(), missing.join(", "));
    }
    let export = export(path, &spec, coord.size(), members.iter().flatten());
    let pool_id = coord.status().pool_id;
    let driver = PoolDriver::start(coord, members, uris, options.clone(), start, spec.member_timeout_ms, Some(path.to_path_buf()));
    if spec.layout.redundant() {
        driver.listen_control(&pool_id);
    }
    Ok((export, driver))
}

/// Connects to every member; one that cannot be reached is None when `degraded` allows
/// it (a redundant layout), and otherwise an error that says how to go on without it.
async fn reach<M: Member>(spec: &PoolSpec, uris: &[Uri], options: &M::Options, degraded: bool) -> Result<Vec<Option<M>>, Error> {
    let mut members = Vec::with_capacity(uris.len());
    for m in connect_all(uris, |u| M::connect(u, options)).await {
        members.push(match m {
            Ok(m) => Some(m),
            Err(e) if degraded && spec.layout.redundant() => {
                log::warn!("{e}");
                None
            }
            Err(Error::Pool(m)) if spec.layout.redundant() => {
                return Err(Error::Pool(format!("{m} (--degraded assembles the pool without it, if it holds nothing newer than the others)")))
            }
            Err(e) => return Err(e),
        });
    }
    Ok(members)
}

/// The volume as an export: what any client of one coherent volume may use. Blocks are
/// no smaller than any member's, so that no member refuses a piece of a request.
fn export<'a, M: Member>(path: &Path, spec: &PoolSpec, size: u64, members: impl Iterator<Item = &'a M> + Clone) -> Export {
    let block_min = members.clone().map(|m| m.export().block_min).fold(POOL_BLOCK_MIN_BYTES, u32::max);
    let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_CAN_MULTI_CONN;
    // A write must reach every copy, so one member that refuses writes makes the pool
    // refuse them.
    if members.clone().any(|m| m.export().read_only()) {
        flags |= FLAG_READ_ONLY;
    }
    Export {
        name: path.display().to_string(),
        description: Some(format!("{} pool of {} members", spec.layout.name(), spec.members.len())),
        size,
        flags,
        block_min,
        block_preferred: POOL_BLOCK_PREFERRED_BYTES.max(block_min),
        block_max: POOL_BLOCK_MAX_BYTES,
        structured: true,
        extended: false,
        base_allocation: false,
        tls: None,
    }
}

#[cfg(test)]
mod tests {
    use super::super::fake::Fake;
    use super::*;

    #[test]
    fn the_export_is_one_coherent_volume() {
        let spec = PoolSpec::parse("layout = \"mirror\"\nmembers = [\"nbd://a/x\", \"nbd://b/x\"]").unwrap();
        let members = [Fake::new(1 << 21, false, false, false), Fake::new(1 << 21, true, true, true)];
        let e = export(Path::new("/etc/p.toml"), &spec, 1 << 20, members.iter());
        assert_eq!((e.name.as_str(), e.size, e.block_min, e.block_preferred, e.block_max), ("/etc/p.toml", 1 << 20, 512, 4096, 32 << 20));
        assert!(e.can_flush() && e.can_fua() && e.can_trim() && e.can_zero() && e.can_multi_conn());
        assert!(!e.read_only() && !e.can_cache() && !e.can_fast_zero() && e.structured && !e.base_allocation);
        assert_eq!(e.description.as_deref(), Some("mirror pool of 2 members"));
    }

    #[test]
    fn the_largest_member_block_and_any_read_only_member_count() {
        let spec = PoolSpec::parse("layout = \"stripe\"\nmembers = [\"nbd://a/x\", \"nbd://b/x\"]").unwrap();
        let members = [Fake::new(1 << 21, true, true, true).with_flags(0, 4096), Fake::new(1 << 21, true, true, true).with_flags(FLAG_READ_ONLY, 1)];
        let e = export(Path::new("p"), &spec, 1 << 20, members.iter());
        assert_eq!((e.block_min, e.block_preferred), (4096, 4096));
        assert!(e.read_only());
    }
}
