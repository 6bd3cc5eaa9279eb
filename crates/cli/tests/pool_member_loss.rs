//! A raid10 pool used through the client library survives losing a member: a member killed
//! with SIGKILL during writes costs no write an error, comes back when restarted, gets only
//! the regions it missed, and then serves every byte alone when its partner is killed.
mod common;
use common::*;

use common::pool::{wait_states, Pool, MIB};
use sluice_client::pool::MemberState;
use sluice_client::{Client, Options, Uri};

/// Data bytes per member after its 1 MiB of metadata: 8 write-intent regions of 4 MiB.
const MEMBER_DATA: u64 = 32 * MIB;

async fn write_range(pool: &Client, shadow: &mut [u8], from: u64, to: u64, seed: u64) {
    let chunk = 256 * 1024;
    let tasks: Vec<_> = (from..to)
        .step_by(chunk)
        .map(|at| {
            let data = pattern(chunk, seed ^ at);
            shadow[at as usize..][..chunk].copy_from_slice(&data);
            let pool = pool.clone();
            tokio::spawn(async move { pool.write(at, &data, false).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().expect("a write to the pool failed although a copy was in sync");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_is_resynced_with_only_what_it_missed() {
    let Pool { dir: _dir, mut members, spec } = Pool::raid10(MEMBER_DATA, "");
    let pool = Client::connect_with(&Uri::parse(&spec).unwrap(), &Options::default()).await.expect("open the pool");
    let size = pool.size();
    assert_eq!(size, 2 * MEMBER_DATA);
    let mut shadow = vec![0u8; size as usize];
    write_range(&pool, &mut shadow, 0, 16 * MIB, 1).await;

    // Member 1 (set 0, with member 0) dies; writes touch only the first 8 MiB from now on,
    // which is 4 MiB of each set: one region of member 1's.
    members[1].kill();
    write_range(&pool, &mut shadow, 0, 8 * MIB, 2).await;
    wait_states(&pool, "member 1 declared missing", |s| s[1] == MemberState::Missing).await;

    members[1].start();
    wait_states(&pool, "member 1 resynced", |s| s.iter().all(|&m| m == MemberState::InSync)).await;
    let resynced = pool.pool_status().unwrap().resynced_bytes;
    assert!(resynced > 0 && resynced <= 8 * MIB, "resynced {resynced} bytes; member 1 missed at most two regions");

    // Its partner dies: every byte of set 0 now comes from the resynced member alone.
    members[0].kill();
    let chunk = 4 * MIB as usize;
    for (i, expected) in shadow.chunks(chunk).enumerate() {
        let at = (i * chunk) as u64;
        let got = pool.read_owned(at, vec![0; chunk]).await.expect("read the volume back");
        assert!(got == expected, "the volume did not read back what was written at {at}");
    }
    pool.disconnect().await;
}
