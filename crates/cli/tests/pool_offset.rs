//! A raid10 with `placement = "offset"`: the copies of a member's units lie on every other
//! member (a different partner each 1 MiB period), the pool survives the loss of any one
//! member with every byte readable and every write taken, each returning member is
//! resynced, a check finds the copies equal afterwards; replacing a member whose partner
//! somewhere is gone is refused, and so is growing it.
mod common;
use common::*;

use common::pool::{wait_states, Pool, MIB};
use sluice_client::pool::MemberState;
use sluice_client::{Client, Options, Uri};

/// Eight placement periods of 1 MiB per member: each of the three pairings comes round.
const MEMBER_DATA: u64 = 8 * MIB;

async fn write_range(pool: &Client, shadow: &mut [u8], from: u64, to: u64, seed: u64) {
    let chunk = 256 * 1024;
    for at in (from..to).step_by(chunk) {
        let data = pattern(chunk, seed ^ at);
        shadow[at as usize..][..chunk].copy_from_slice(&data);
        pool.write(at, &data, false).await.expect("a write to the pool failed with one member lost");
    }
}

async fn read_all(pool: &Client, shadow: &[u8], when: &str) {
    let chunk = 2 * MIB as usize;
    for (i, expected) in shadow.chunks(chunk).enumerate() {
        let at = (i * chunk) as u64;
        let got = pool.read_owned(at, vec![0; chunk]).await.unwrap_or_else(|e| panic!("{when}: reading volume offset {at}: {e}"));
        assert!(got == expected, "{when}: the volume did not read back what was written at {at}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offset_placement_survives_the_loss_of_any_one_member() {
    let Pool { dir: _dir, mut members, spec } = Pool::raid10(MEMBER_DATA, "placement = \"offset\"\nmember-timeout = \"2s\"");
    let (ok, out, err) = run(SLUICE, &["pool", "status", &spec]);
    assert!(ok && out.contains("2 copies, offset placement"), "pool status: {out}{err}");

    let pool = Client::connect_with(&Uri::parse(&spec).unwrap(), &Options::default()).await.expect("open the pool");
    let size = pool.size();
    assert_eq!(size, 2 * MEMBER_DATA);
    let mut shadow = vec![0u8; size as usize];
    write_range(&pool, &mut shadow, 0, size, 1).await;
    for i in 0..members.len() {
        members[i].kill();
        // Every set that lost a copy keeps one; writes go on, into every period.
        write_range(&pool, &mut shadow, 0, size / 2, 10 + i as u64).await;
        wait_states(&pool, &format!("member {i} declared missing"), |s| s[i] == MemberState::Missing).await;
        read_all(&pool, &shadow, &format!("member {i} lost")).await;
        members[i].start();
        wait_states(&pool, &format!("member {i} resynced"), |s| s.iter().all(|&m| m == MemberState::InSync)).await;
    }
    read_all(&pool, &shadow, "every member back").await;
    pool.disconnect().await;

    let (ok, out, err) = run(SLUICE, &["pool", "check", &spec]);
    assert!(ok && out.contains("mismatched regions: 0\n"), "pool check: {out}{err}");
    // The circle method's pairings, one per 1 MiB period of member data: {0,3} {1,2}, then
    // {1,3} {0,2}, then {2,3} {0,1}, and round again.
    let data: Vec<Vec<u8>> = members.iter().map(|m| m.data()).collect();
    let period = |m: usize, p: usize| &data[m][p * MIB as usize..][..MIB as usize];
    for (p, pairs) in [[(0, 3), (1, 2)], [(1, 3), (0, 2)], [(2, 3), (0, 1)], [(0, 3), (1, 2)]].iter().enumerate() {
        for &(a, b) in pairs {
            assert!(period(a, p) == period(b, p), "period {p}: members {a} and {b} should hold the same units");
        }
        assert!(period(pairs[0].0, p) != period(pairs[1].0, p), "period {p}: the two sets hold different units");
    }

    // With member 1 gone, member 3 has no other copy in the period where they are paired
    // (near would allow it: its set is {2,3}).
    members[1].kill();
    let (ok, out, err) = run(SLUICE, &["pool", "replace", &spec, &members[3].uri(), "nbd://node9/disk"]);
    assert!(!ok && err.contains("nothing is left to rebuild"), "pool replace of member 3 with member 1 gone: {out}{err}");

    let (ok, out, err) = run(SLUICE, &["pool", "grow", &spec, "--add", "nbd://node5/disk", "nbd://node6/disk"]);
    assert!(!ok && err.contains("offset") && err.contains("cannot be grown"), "pool grow of an offset raid10: {out}{err}");
}

#[test]
fn the_placement_a_pool_was_made_with_cannot_change() {
    let p = Pool::raid10(MEMBER_DATA, "placement = \"offset\"");
    let c = p.serve();
    let file = p.spec.strip_prefix("pool:").unwrap();
    let text = std::fs::read_to_string(file).unwrap();
    std::fs::write(file, text.replace("placement = \"offset\"", "placement = \"near\"")).unwrap();
    // Served: the reload is refused and the pool goes on as it was.
    signal(c.pid(), libc::SIGHUP);
    let refused = |log: &str| log.contains("reload refused") && log.contains("placement cannot change");
    wait_until("the refused reload", std::time::Duration::from_secs(30), || refused(&c.log_text()), || c.log_text());
    c.stop_clean();
    let (ok, out, err) = run(SLUICE, &["info", &p.spec]);
    assert!(!ok && err.contains("placement \"offset\"") && err.contains("cannot change"), "info after the placement was edited: {out}{err}");
}
