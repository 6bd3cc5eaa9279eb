//! The driver with the real coordinator over members in memory: requests reach every copy
//! and come back, a member that fails is dropped without failing the write, and a clean
//! stop releases the superblocks.

use super::driver::PoolDriver;
use super::fake::Fake;
use super::found::read_found;
use super::session::session;
use crate::connection::Outcome;
use crate::error::Error;
use crate::uri::Uri;
use sluice_pool::coordinator::format;
use sluice_pool::limits::META_BYTES;
use sluice_pool::{Coordinator, Found, MemberState, PoolSpec, Superblock};
use sluice_proto::wire::*;
use std::io::IoSlice;
use std::time::Instant;

/// A mirror over two members in memory, initialized and assembled.
async fn mirror(fakes: &[Fake]) -> PoolDriver<Fake> {
    let spec = PoolSpec::parse("layout = \"mirror\"\nmembers = [\"nbd://a/x\", \"nbd://b/x\"]").unwrap();
    let found = read_all(fakes).await;
    for (f, image) in fakes.iter().zip(format(&spec, &found, [7; 16], false).unwrap()) {
        f.put(0, &image);
    }
    let found = read_all(fakes).await.into_iter().map(Some).collect();
    let coord = Coordinator::assemble(&spec, found, session(), false, 0).unwrap();
    let uris = spec.members.iter().map(|m| Uri::parse(m).unwrap()).collect();
    PoolDriver::start(coord, fakes.iter().cloned().map(Some).collect(), uris, (), Instant::now(), spec.member_timeout_ms, None)
}

async fn read_all(fakes: &[Fake]) -> Vec<Found> {
    let mut out = Vec::new();
    for f in fakes {
        out.push(read_found(f).await.unwrap());
    }
    out
}

fn fakes() -> Vec<Fake> {
    (0..2).map(|_| Fake::new(META_BYTES + (4 << 20), true, true, true)).collect()
}

async fn write(pool: &PoolDriver<Fake>, offset: u64, data: &[u8], fua: bool) -> Result<Outcome, Error> {
    let flags = if fua { CMD_FLAG_FUA } else { 0 };
    pool.call(CMD_WRITE, flags, offset, data.len() as u32, &[IoSlice::new(data)], Vec::new()).await
}

#[tokio::test]
async fn writes_reach_every_copy_and_reads_come_back_scattered() {
    let fakes = fakes();
    let pool = mirror(&fakes).await;
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 7) as u8).collect();
    assert!(matches!(write(&pool, 4096, &data, true).await, Ok(Outcome::Done)));
    for f in &fakes {
        assert_eq!(f.bytes(META_BYTES + 4096, 8192), data, "a copy lacks the write");
    }
    let bufs = vec![vec![0xee; 1024], vec![0xee; 7168]];
    let Ok(Outcome::Read(got)) = pool.call(CMD_READ, 0, 4096 + 512, 8192, &[], bufs).await else { panic!("read failed") };
    assert_eq!(got.concat()[..7680], data[512..]);
    assert!(got.concat()[7680..].iter().all(|&b| b == 0));
    assert!(pool.status().members.iter().all(|m| m.state == MemberState::InSync));

    pool.disconnect().await;
    for f in &fakes {
        let sb = Superblock::decode(&f.bytes(0, 4096)).unwrap().unwrap();
        assert_eq!(sb.owner.session, 0, "a clean stop leaves the superblocks without an owner");
    }
    assert!(matches!(write(&pool, 0, &data, false).await, Err(Error::Closed)));
}

#[tokio::test]
async fn a_failing_member_is_dropped_and_the_write_lands_on_the_other() {
    let fakes = fakes();
    let pool = mirror(&fakes).await;
    fakes[1].fail_next();
    let data = vec![0x5a; 4096];
    assert!(matches!(write(&pool, 0, &data, false).await, Ok(Outcome::Done)));
    assert_eq!(fakes[0].bytes(META_BYTES, 4096), data);
    let states: Vec<MemberState> = pool.status().members.iter().map(|m| m.state).collect();
    assert_eq!(states, [MemberState::InSync, MemberState::Missing]);
    let Ok(Outcome::Read(got)) = pool.call(CMD_READ, 0, 0, 4096, &[], vec![vec![0; 4096]]).await else { panic!("read failed") };
    assert_eq!(got, vec![data]);
    pool.disconnect().await;
}

#[tokio::test]
async fn a_pool_assembled_without_a_member_serves_from_the_others() {
    let fakes = fakes();
    let spec = PoolSpec::parse("layout = \"mirror\"\nmembers = [\"nbd://a/x\", \"nbd://b/x\"]").unwrap();
    let found = read_all(&fakes).await;
    for (f, image) in fakes.iter().zip(format(&spec, &found, [7; 16], false).unwrap()) {
        f.put(0, &image);
    }
    let found = vec![Some(read_found(&fakes[0]).await.unwrap()), None];
    let coord = Coordinator::assemble(&spec, found, session(), true, 0).unwrap();
    let uris = spec.members.iter().map(|m| Uri::parse(m).unwrap()).collect();
    let pool = PoolDriver::start(coord, vec![Some(fakes[0].clone()), None], uris, (), Instant::now(), spec.member_timeout_ms, None);
    let data = vec![0x3c; 4096];
    assert!(matches!(write(&pool, 8192, &data, true).await, Ok(Outcome::Done)));
    assert_eq!(fakes[0].bytes(META_BYTES + 8192, 4096), data);
    assert!(fakes[1].calls().iter().all(|c| !matches!(c, super::fake::Call::Write { .. })), "the missing member got a write: {:?}", fakes[1].calls());
    let Ok(Outcome::Read(got)) = pool.call(CMD_READ, 0, 8192, 4096, &[], vec![vec![0; 4096]]).await else { panic!("read failed") };
    assert_eq!(got, vec![data]);
    let states: Vec<MemberState> = pool.status().members.iter().map(|m| m.state).collect();
    assert_eq!(states, [MemberState::InSync, MemberState::Missing]);
    pool.disconnect().await;
}

/// A reload compares the pool file's members with `member_uris` (serve_catalog::moves):
/// during a live replacement they must still be the members, one per place, or every
/// reload is refused until the copy is through.
#[tokio::test]
async fn member_uris_name_only_the_members_during_a_live_replacement() {
    let fakes = fakes();
    let pool = mirror(&fakes).await;
    pool.replace(1, Uri::parse("nbd://c/x").unwrap()).unwrap();
    assert!(pool.status().replacing.is_some(), "member 1 is in sync: a live replacement");
    assert_eq!(pool.member_uris().len(), 2, "{:?}", pool.member_uris());
    pool.disconnect().await;
}
