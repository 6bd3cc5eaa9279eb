//! A raid10 with offset placement: its rules that differ from "near", driven through the
//! coordinator's public API over members kept in memory. With 4 members, every two members
//! share a set in one of the three placement periods.

use sluice_pool::coordinator::format;
use sluice_pool::*;
use std::collections::HashMap;

mod common;
use common::*;

fn spec(placement: Placement) -> PoolSpec {
    PoolSpec {
        layout: Layout::Raid10,
        placement,
        stripe_unit: 64 << 10,
        copies: 2,
        members: vec!["m0".into(), "m1".into(), "m2".into(), "m3".into()],
        member_timeout_ms: 3_600_000,
        resync_rate_bytes_per_s: 1 << 40,
        spares: vec![],
        spare_after_ms: 60_000,
        scrub_interval_ms: None,
    }
}

fn pool(placement: Placement, gone: &[usize], degraded: bool) -> Result<W, String> {
    let size = MB + DATA;
    let blank = vec![Found { size, meta: vec![0; MB as usize], read_only: false }; 4];
    let images = format(&spec(placement), &blank, [3; 16], false).unwrap();
    let mut disks: Vec<Vec<u8>> = vec![vec![0u8; size as usize]; 4];
    for (m, image) in images.iter().enumerate() {
        disks[m][..image.len()].copy_from_slice(image);
    }
    let found = disks.iter().enumerate().map(|(i, d)| (!gone.contains(&i)).then(|| Found { size, meta: d[..MB as usize].to_vec(), read_only: false })).collect();
    let c = Coordinator::assemble(&spec(placement), found, Session { id: 1, pid: 2, host: "h".into() }, degraded, 0)?;
    let mut w = W { c, disks, pending: vec![], copies: HashMap::new(), reads: HashMap::new(), writes: HashMap::new(), done: HashMap::new(), swaps: vec![], spares_taken: vec![], now: 0 };
    w.pump();
    w.settle(|p| gone.contains(&p.1));
    w.pending.retain(|p| !gone.contains(&p.1));
    w.tick(1000);
    w.settle(|p| gone.contains(&p.1));
    w.pending.retain(|p| !gone.contains(&p.1));
    Ok(w)
}

const UNIT: u64 = 64 << 10;

/// Writes `byte` over the whole volume, a stripe unit (one set) at a time; whether each
/// unit's write was acknowledged.
fn write_all(w: &mut W, byte: u8) -> Vec<bool> {
    let size = w.c.size();
    let ids: Vec<ReqId> = (0..size / UNIT)
        .map(|i| {
            let id = w.c.submit(Command::Write { offset: i * UNIT, len: UNIT, fua: false }, w.now);
            w.writes.insert(id, vec![byte; UNIT as usize]);
            id
        })
        .collect();
    w.pump();
    w.settle(|_| false);
    ids.iter().map(|id| matches!(w.done.get(id), Some(Ok(())))).collect()
}

#[test]
fn two_members_gone_leave_some_set_without_a_copy() {
    // Near keeps sets {0,1} and {2,3}: losing 0 and 2 leaves a copy of everything.
    assert!(pool(Placement::Near, &[0, 2], true).is_ok());
    // Offset pairs every two members somewhere: no two may be gone.
    for gone in [[0, 1], [0, 2], [1, 3], [2, 3]] {
        let e = pool(Placement::Offset, &gone, true).err().expect("refused");
        assert!(e.contains("is in sync"), "{gone:?}: {e}");
    }
    assert!(pool(Placement::Offset, &[2], true).is_ok());
}

#[test]
fn replacing_a_member_needs_every_one_of_its_sets_to_keep_a_copy() {
    let mut w = pool(Placement::Offset, &[], false).unwrap();
    w.c.member_lost(1, "disk died", w.now);
    w.pump();
    w.settle(|p| p.1 == 1);
    w.pending.retain(|p| p.1 != 1);
    // Member 2 shares a set with member 1 in one period: nothing to rebuild it from there.
    assert!(w.c.can_replace(&[2]).is_err_and(|e| e.contains("nothing to rebuild")), "{:?}", w.c.can_replace(&[2]));
    assert!(w.c.can_replace(&[1]).is_ok());
    let mut near = pool(Placement::Near, &[], false).unwrap();
    near.c.member_lost(1, "disk died", near.now);
    near.pump();
    assert!(near.c.can_replace(&[2]).is_ok(), "near: member 2's set {{2,3}} keeps member 3");
}

/// Member 1 is gone, then member 0, the last in-sync copy of their shared set, goes too.
/// Member 0 keeps its place as the holder of that set's newest data; its other sets still
/// have a copy, but a write there would leave member 0 behind, so every set of member 0
/// refuses writes until it returns, and the sets without it take them.
#[test]
fn the_last_copy_away_stops_writes_to_all_its_sets() {
    let mut w = pool(Placement::Offset, &[], false).unwrap();
    assert!(write_all(&mut w, 1).iter().all(|&ok| ok));
    for m in [1, 0] {
        w.c.member_lost(m, "disk died", w.now);
        w.pump();
        w.settle(|p| p.1 <= 1);
        w.pending.retain(|p| p.1 > 1);
    }
    let states: Vec<&str> = w.c.status().members.iter().map(|m| m.state.name()).collect();
    assert_eq!(states[1], "missing");
    let acked = write_all(&mut w, 2);
    let (ok, refused) = (acked.iter().filter(|&&a| a).count(), acked.iter().filter(|&&a| !a).count());
    // Each period has one set of the two without member 0: half the units.
    assert_eq!((ok, refused), (acked.len() / 2, acked.len() / 2), "the sets without member 0 take writes, the others wait for it");
    // Member 0 returns: it holds every write acknowledged in its sets, so reads agree with
    // what was acknowledged, wherever they go.
    let f = w.found(0);
    w.c.member_back(0, f, w.now);
    w.pump();
    for _ in 0..50 {
        w.tick(100);
        w.settle(|p| p.1 == 1);
        w.pending.retain(|p| p.1 != 1);
    }
    for (i, &a) in acked.iter().enumerate() {
        let got = w.read(i as u64 * UNIT, UNIT, |p| p.1 == 1);
        let want = if a { 2 } else { 1 };
        assert!(got.iter().all(|&b| b == want), "unit {i}: acknowledged {a}, read {}", got[0]);
    }
}
