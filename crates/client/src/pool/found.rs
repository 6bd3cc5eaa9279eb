//! Connecting to a pool's members and reading what their metadata area holds.

use super::member::{Connecting, Member};
use crate::error::Error;
use crate::uri::Address;
use crate::uri::Uri;
use sluice_pool::limits::{META_BLOCK_BYTES, META_BYTES, SUPERBLOCK_REREADS, SUPERBLOCK_REREAD_DELAY_MS};
use sluice_pool::{Found, PoolSpec, Superblock};
use std::time::Duration;

/// The member URIs of a pool file, parsed, or an error naming the bad one.
pub(crate) fn member_uris(spec: &PoolSpec) -> Result<Vec<Uri>, Error> {
    let parse = |i: usize, m: &str| match Uri::parse(m) {
        Ok(Uri { address: Address::Pool(_), .. }) => Err(Error::Pool(format!("member {} ({m}): a pool cannot be a member of a pool", i + 1))),
        Ok(u) => Ok(u),
        Err(e) => Err(Error::Pool(format!("member {} ({m}): {e}", i + 1))),
    };
    for (i, s) in spec.spares.iter().enumerate() {
        parse(i, s).map_err(|e| Error::Pool(e.to_string().replacen("member", "spare", 1)))?;
    }
    spec.members.iter().enumerate().map(|(i, m)| parse(i, m)).collect()
}

/// Connects to every member at once with `connect`; each result names its member when it
/// fails.
pub(crate) async fn connect_all<M: Member>(uris: &[Uri], connect: impl Fn(&Uri) -> Connecting<M>) -> Vec<Result<M, Error>> {
    let tasks: Vec<_> = uris
        .iter()
        .map(|u| {
            let connecting = connect(u);
            let name = u.to_string();
            tokio::spawn(async move { connecting.await.map_err(|e| Error::Pool(format!("member {name} cannot be reached: {e}"))) })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap_or_else(|e| Err(Error::Pool(format!("connecting to a member failed: {e}")))));
    }
    out
}

/// Every member's metadata area, read at once.
pub(crate) async fn read_all<M: Member>(members: &[M], uris: &[Uri]) -> Result<Vec<Found>, Error> {
    let tasks: Vec<_> = members.iter().cloned().map(|m| tokio::spawn(async move { read_found(&m).await })).collect();
    let mut out = Vec::with_capacity(tasks.len());
    for (t, u) in tasks.into_iter().zip(uris) {
        let found = t.await.unwrap_or_else(|e| Err(Error::Pool(e.to_string())));
        out.push(found.map_err(|e| Error::Pool(format!("member {u}: cannot read its pool metadata: {e}")))?);
    }
    Ok(out)
}

/// What a member holds: its size and its first `META_BYTES` (all of it, when smaller).
/// A superblock that fails its checksum is read again a few times before the caller sees
/// it: one that a live coordinator was rewriting reads whole on the next try, one that is
/// really damaged stays damaged.
pub(crate) async fn read_found<M: Member>(m: &M) -> Result<Found, Error> {
    let ex = m.export();
    let len = ex.size.min(META_BYTES);
    let mut meta = m.read(0, len as usize).await?;
    let block = (META_BLOCK_BYTES as usize).min(meta.len());
    for _ in 0..SUPERBLOCK_REREADS {
        if Superblock::decode(&meta).is_ok() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(SUPERBLOCK_REREAD_DELAY_MS)).await;
        let again = m.read(0, block).await?;
        meta[..block].copy_from_slice(&again);
    }
    Ok(Found { size: ex.size, meta, read_only: ex.read_only() })
}

#[cfg(test)]
mod tests {
    use super::super::fake::Fake;
    use super::*;
    use sluice_proto::wire::FLAG_READ_ONLY;

    #[test]
    fn found_is_the_metadata_area_or_the_whole_member() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let big = Fake::new(META_BYTES + 8192, true, true, true);
        big.put(0, b"SLUICEPL");
        let f = rt.block_on(read_found(&big)).unwrap();
        assert_eq!((f.size, f.meta.len(), &f.meta[..8], f.read_only), (META_BYTES + 8192, META_BYTES as usize, &b"SLUICEPL"[..], false));
        let small = Fake::new(8192, true, true, true).with_flags(FLAG_READ_ONLY, 512);
        let f = rt.block_on(read_found(&small)).unwrap();
        assert_eq!((f.size, f.meta.len(), f.read_only), (8192, 8192, true));
    }

    fn superblock() -> Vec<u8> {
        let spec = PoolSpec::parse("layout = \"mirror\"\nmembers = [\"nbd://a/x\", \"nbd://b/x\"]").unwrap();
        let blank = Found { size: 64 << 20, meta: vec![0; META_BYTES as usize], read_only: false };
        let formatted = sluice_pool::coordinator::format(&spec, &[blank.clone(), blank], [7; 16], false).unwrap();
        formatted[0][..META_BLOCK_BYTES as usize].to_vec()
    }

    #[test]
    fn a_superblock_torn_by_a_concurrent_write_is_read_again() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let m = Fake::new(META_BYTES + 8192, true, true, true);
        m.put(0, &superblock());
        m.tear_next_reads(3);
        let f = rt.block_on(read_found(&m)).unwrap();
        assert!(matches!(Superblock::decode(&f.meta), Ok(Some(_))), "a superblock whole on the fourth read");
        assert_eq!(m.calls().len(), 4, "{:?}", m.calls());
    }

    #[test]
    fn a_damaged_superblock_stays_damaged_after_a_bounded_number_of_reads() {
        let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
        let m = Fake::new(META_BYTES + 8192, true, true, true);
        let mut sb = superblock();
        sb[100] ^= 1;
        m.put(0, &sb);
        let f = rt.block_on(read_found(&m)).unwrap();
        assert!(Superblock::decode(&f.meta).unwrap_err().contains("checksum"));
        assert_eq!(m.calls().len(), 1 + SUPERBLOCK_REREADS as usize, "{:?}", m.calls());
        // A blank member is read once.
        let blank = Fake::new(META_BYTES + 8192, true, true, true);
        rt.block_on(read_found(&blank)).unwrap();
        assert_eq!(blank.calls().len(), 1);
    }

    #[test]
    fn member_uris_name_the_bad_one() {
        let spec = PoolSpec::parse("layout = \"stripe\"\nmembers = [\"nbd://a/x\", \"http://b/\"]").unwrap();
        let e = member_uris(&spec).unwrap_err().to_string();
        assert!(e.contains("member 2 (http://b/)"), "{e}");
        let spec = PoolSpec::parse("layout = \"stripe\"\nmembers = [\"pool:/p.toml\"]").unwrap();
        let e = member_uris(&spec).unwrap_err().to_string();
        assert!(e.contains("a pool cannot be a member"), "{e}");
    }
}
