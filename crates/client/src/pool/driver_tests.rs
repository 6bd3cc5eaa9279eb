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

/// A carrier that holds what it is offered (but what it refuses, by member), as a worker's
/// links would until their answers come.
#[derive(Default)]
struct Holding {
    held: Vec<crate::carry::Carried>,
    refuse: Option<usize>,
}

impl crate::carry::Carrier for Holding {
    fn carry(&mut self, op: crate::carry::Carried) -> Result<(), crate::carry::Carried> {
        if self.refuse == Some(op.member) {
            return Err(op);
        }
        self.held.push(op);
        Ok(())
    }
}

/// Carries out everything `carrier` holds on the members in memory, and what that starts,
/// until nothing is left; member `fail` answers each of its operations with an error.
fn carry_all(fakes: &[Fake], carrier: &mut Holding, fail: Option<usize>) -> usize {
    use crate::carry::Cmd;
    let mut carried = 0;
    while let Some(op) = carrier.held.pop() {
        carried += 1;
        let f = &fakes[op.member];
        let result = match &op.cmd {
            _ if fail == Some(op.member) => Err(Error::Protocol("member says no".into())),
            Cmd::Read { offset, len } => Ok(Some(f.bytes(*offset, *len))),
            Cmd::Write { offset, data, range, .. } => {
                f.put(*offset, &data[range.clone()]);
                Ok(None)
            }
            Cmd::Flush => Ok(None),
        };
        op.finish(carrier, result);
    }
    carried
}

type Answer = tokio::sync::oneshot::Receiver<Result<Vec<Vec<u8>>, Error>>;

fn submit(direct: &crate::carry::Direct, carrier: &mut Holding, cmd: u16, offset: u64, len: u32, write: Option<Vec<u8>>) -> Answer {
    let (tx, rx) = tokio::sync::oneshot::channel();
    direct.submit(carrier, cmd, 0, offset, len, write, Box::new(move |r| drop(tx.send(r)))).unwrap();
    rx
}

async fn answered(rx: Answer) -> Vec<Vec<u8>> {
    match tokio::time::timeout(std::time::Duration::from_secs(20), rx).await {
        Ok(Ok(Ok(bytes))) => bytes,
        other => panic!("the request was not answered well: {other:?}"),
    }
}

/// Member operations a carrier takes finish requests as a task's would, what they start is
/// offered to the carrier again, and what it refuses goes to a task. A carried operation
/// that fails drops its member, and the carrier is told to cut its connections to it.
#[tokio::test]
async fn a_carrier_takes_member_operations_and_hears_when_a_member_is_cut() {
    let fakes = fakes();
    let pool = mirror(&fakes).await;
    let direct = pool.direct();
    let cuts = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let told = cuts.clone();
    direct.on_cut(Box::new(move |m| told.lock().unwrap().push(m)));
    let data: Vec<u8> = (0..8192u32).map(|i| (i * 13) as u8).collect();
    // What assembling started (superblocks written) is done first, by tasks.
    assert!(matches!(write(&pool, 0, &[1; 4096], false).await, Ok(Outcome::Done)));

    // A write: both copies, and whatever dirty tracking writes first, carried.
    let mut carrier = Holding::default();
    let rx = submit(&direct, &mut carrier, CMD_WRITE, 4096, 8192, Some(data.clone()));
    let n = carry_all(&fakes, &mut carrier, None);
    assert!(n >= 2, "carried {n}; calls {:?} {:?}", fakes[0].calls(), fakes[1].calls());
    answered(rx).await;
    for f in &fakes {
        assert_eq!(f.bytes(META_BYTES + 4096, 8192), data, "a copy lacks the carried write");
    }
    assert!(fakes.iter().all(|f| !f.calls().iter().any(|c| matches!(c, super::fake::Call::Write { len: 8192, .. }))), "a task wrote the data");

    // A read comes back with the bytes the carrier read.
    let rx = submit(&direct, &mut carrier, CMD_READ, 4096, 8192, None);
    assert_eq!(carry_all(&fakes, &mut carrier, None), 1);
    assert_eq!(answered(rx).await.concat(), data);

    // Refused for member 1: its copy goes by task, member 0's is carried.
    let mut refusing = Holding { refuse: Some(1), ..Holding::default() };
    let rx = submit(&direct, &mut refusing, CMD_WRITE, 0, 4096, Some(vec![0x77; 4096]));
    carry_all(&fakes, &mut refusing, None);
    answered(rx).await;
    assert!(fakes[1].calls().iter().any(|c| matches!(c, super::fake::Call::Write { offset, len: 4096, .. } if *offset == META_BYTES)));
    assert_eq!(fakes[0].bytes(META_BYTES, 4096), vec![0x77; 4096]);
    assert!(cuts.lock().unwrap().is_empty(), "no member was cut yet: {:?}", cuts.lock().unwrap());

    // Member 1 fails a carried write: it is dropped and cut, the write lands on member 0.
    let rx = submit(&direct, &mut carrier, CMD_WRITE, 8192, 4096, Some(vec![0x99; 4096]));
    carry_all(&fakes, &mut carrier, Some(1));
    answered(rx).await;
    assert_eq!(fakes[0].bytes(META_BYTES + 8192, 4096), vec![0x99; 4096]);
    assert_eq!(*cuts.lock().unwrap(), vec![1]);
    let states: Vec<MemberState> = pool.status().members.iter().map(|m| m.state).collect();
    assert_eq!(states, [MemberState::InSync, MemberState::Missing]);
    pool.disconnect().await;
}

/// A carried read dropped unfinished (its worker stopped) runs again on a task; a carried
/// write fails its member, which may yet receive that write after a later one and so must
/// be resynced.
#[tokio::test]
async fn a_carried_operation_dropped_unfinished_reads_again_or_fails_its_write() {
    let fakes = fakes();
    let pool = mirror(&fakes).await;
    let direct = pool.direct();
    let data = vec![0x42; 4096];
    assert!(matches!(write(&pool, 0, &data, false).await, Ok(Outcome::Done)));
    let mut carrier = Holding::default();
    let rx = submit(&direct, &mut carrier, CMD_READ, 0, 4096, None);
    assert_eq!(carrier.held.len(), 1, "one copy is read");
    drop(carrier.held.pop());
    assert_eq!(answered(rx).await.concat(), data, "the read ran again on a task");
    assert!(pool.status().members.iter().all(|m| m.state == MemberState::InSync));

    let rx = submit(&direct, &mut carrier, CMD_WRITE, 0, 4096, Some(vec![0x43; 4096]));
    let at = carrier.held.iter().position(|op| op.member == 1).expect("member 1's copy was offered");
    drop(carrier.held.remove(at));
    carry_all(&fakes, &mut carrier, None);
    answered(rx).await;
    assert_eq!(fakes[0].bytes(META_BYTES, 4096), vec![0x43; 4096]);
    let states: Vec<MemberState> = pool.status().members.iter().map(|m| m.state).collect();
    assert_eq!(states, [MemberState::InSync, MemberState::Missing]);
    pool.disconnect().await;
}
