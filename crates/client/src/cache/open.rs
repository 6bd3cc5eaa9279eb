//! Opening a cached volume by its file: parse and check it, connect the backing, describe
//! the volume as an NBD export (the backing's, plus CACHE), and start the driver, which
//! connects the members in the background (a member that is not there yet is only a
//! smaller cache).

use super::driver::CacheDriver;
use crate::error::Error;
use crate::export::Export;
use crate::pool::member::Member;
use crate::uri::{Address, Uri};
use sluice_cache::Config;
use sluice_proto::wire::*;
use std::path::Path;

/// Reads and checks a cache file, without contacting anything: every key, and the
/// backing and members as URIs. Errors name the file and the key.
pub fn load(path: &Path) -> Result<Config, Error> {
    load_uris(path).map(|(config, _, _)| config)
}

fn load_uris(path: &Path) -> Result<(Config, Uri, Vec<Uri>), Error> {
    let named = |m: String| Error::Cache(format!("cache file {}: {m}", path.display()));
    let text = std::fs::read_to_string(path).map_err(|e| named(format!("cannot read it: {e}")))?;
    let config = sluice_cache::config::parse(&text).map_err(named)?;
    let backing = backing_uri(&config.backing).map_err(named)?;
    let members = member_uris(&config.members).map_err(named)?;
    Ok((config, backing, members))
}

/// Opens the cached volume `path` describes; the backing must answer.
pub(crate) async fn open<M: Member>(path: &Path, options: &M::Options) -> Result<(Export, CacheDriver<M>), Error> {
    let named = |m: String| Error::Cache(format!("cache file {}: {m}", path.display()));
    let (config, backing, members) = load_uris(path)?;
    let client = M::connect(&backing, options).await.map_err(|e| named(format!("backing {}: {e}", config.backing)))?;
    let export = export(path, &config, client.export());
    // `Member::connect` makes members connect without reconnecting by themselves: their
    // failures are the core's to see.
    let driver = CacheDriver::start(path, config, client, &backing, members, options.clone());
    Ok((export, driver))
}

/// The backing: an NBD URI or a pool. A plain file is refused: the client has no local
/// file path, and serving the file with `sluice serve` gives it one.
fn backing_uri(spec: &str) -> Result<Uri, String> {
    let uri = Uri::parse(spec).map_err(|e| {
        format!("backing {spec:?}: {e}; the backing is an NBD URI or pool:FILE (serve a file with `sluice serve` and name its nbd:// URI)")
    })?;
    match uri.address {
        Address::Cache(_) => Err(format!("backing {spec:?}: a cached volume cannot be the backing of another")),
        _ => Ok(uri),
    }
}

/// The members: NBD URIs of RAM exports, never pools or cached volumes.
fn member_uris(members: &[String]) -> Result<Vec<Uri>, String> {
    let mut uris = Vec::with_capacity(members.len());
    for (i, m) in members.iter().enumerate() {
        let uri = Uri::parse(m).map_err(|e| format!("members[{i}] {m:?}: {e}"))?;
        if matches!(uri.address, Address::Pool(_) | Address::Cache(_)) {
            return Err(format!("members[{i}] {m:?}: a member is an NBD URI of a RAM export (nbd://node/ram)"));
        }
        uris.push(uri);
    }
    Ok(uris)
}

/// The cached volume as an export: the backing's size, flags and block sizes (read-only if
/// it is; FUA and flush pass through), with CACHE (the hint fills the cache) and without
/// what the core does not carry (fast zero, block status, 64-bit lengths).
fn export(path: &Path, config: &Config, backing: &Export) -> Export {
    Export {
        name: path.display().to_string(),
        description: Some(format!("{} cached in the RAM of {} member(s)", config.backing, config.members.len())),
        size: backing.size,
        flags: (backing.flags & !(FLAG_SEND_FAST_ZERO | FLAG_SEND_DF)) | FLAG_HAS_FLAGS | FLAG_SEND_CACHE,
        block_min: backing.block_min,
        block_preferred: backing.block_preferred,
        block_max: backing.block_max,
        structured: true,
        extended: false,
        base_allocation: false,
        tls: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backing_is_a_uri_or_a_pool() {
        assert!(backing_uri("nbd://disk/vol").is_ok() && backing_uri("pool:/etc/p.toml").is_ok());
        let e = backing_uri("/var/lib/disk.img").unwrap_err();
        assert!(e.contains("backing \"/var/lib/disk.img\"") && e.contains("sluice serve"), "{e}");
    }

    #[test]
    fn the_volume_is_the_backing_with_cache() {
        let config = sluice_cache::config::parse("backing = \"nbd://d/v\"\nmembers = [\"nbd://a/ram\"]").unwrap();
        let flags = FLAG_HAS_FLAGS | FLAG_READ_ONLY | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_FAST_ZERO | FLAG_SEND_WRITE_ZEROES;
        let backing = Export {
            name: "v".into(),
            description: None,
            size: 1 << 30,
            flags,
            block_min: 512,
            block_preferred: 4096,
            block_max: 1 << 20,
            structured: true,
            extended: true,
            base_allocation: true,
            tls: Some("TLSv1.3".into()),
        };
        let e = export(Path::new("/etc/c.toml"), &config, &backing);
        assert_eq!((e.size, e.block_min, e.block_preferred, e.block_max, e.name.as_str()), (1 << 30, 512, 4096, 1 << 20, "/etc/c.toml"));
        assert!(e.read_only() && e.can_flush() && e.can_fua() && e.can_zero() && e.can_cache());
        assert!(!e.can_fast_zero() && !e.can_trim() && !e.extended && !e.base_allocation && e.tls.is_none());
    }

    #[test]
    fn members_are_nbd_uris() {
        assert_eq!(member_uris(&["nbd://a/ram".into()]).unwrap().len(), 1);
        let e = member_uris(&["nbd://a/ram".into(), "pool:/p".into()]).unwrap_err();
        assert!(e.starts_with("members[1]"), "{e}");
        assert!(member_uris(&["ram".into()]).unwrap_err().starts_with("members[0]"));
    }
}
