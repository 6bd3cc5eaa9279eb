//! Regression tests from a review of live replacement (handover) and spares, driven
//! through the coordinator's public API over members kept in memory.

use sluice_pool::coordinator::format;
use sluice_pool::*;
use std::collections::HashMap;

mod common;
use common::*;


fn spec() -> PoolSpec {
    PoolSpec {
        layout: Layout::Mirror,
        placement: sluice_pool::Placement::Near,
        stripe_unit: u64::MAX,
        copies: 2,
        members: vec!["m0".into(), "m1".into()],
        member_timeout_ms: 3_600_000,
        resync_rate_bytes_per_s: 1 << 40,
        spares: Vec::new(),
        spare_after_ms: 60_000,
        scrub_interval_ms: None,
    }
}


/// A coordinator crashed while writing region 0: member 0 holds 0xAA there, member 1 still
/// 0x11. The new coordinator reconciles member 1 from member 0, and reads go to member 0
/// meanwhile. Replacing member 0 live must not make reads of region 0 change.
#[test]
fn replacing_the_reconcile_source_live_keeps_reads_stable() {
    let size = MB + DATA;
    let blank = vec![Found { size, meta: vec![0; MB as usize], read_only: false }; 2];
    let images = format(&spec(), &blank, [3; 16], false).unwrap();
    let mut disks: Vec<Vec<u8>> = vec![vec![0u8; size as usize]; 2];
    for (m, image) in images.iter().enumerate() {
        let mut sb = Superblock::decode(image).unwrap().unwrap();
        sb.owner = Owner { session: 77, heartbeat: 5, pid: 1, host: "crashed".into() };
        sb.events = 9;
        let enc = sb.encode();
        disks[m][..enc.len()].copy_from_slice(&enc);
        disks[m][4096] = 1; // region 0 dirty
    }
    disks[0][MB as usize..(MB + 4096) as usize].fill(0xAA);
    disks[1][MB as usize..(MB + 4096) as usize].fill(0x11);
    let found = disks.iter().map(|d| Some(Found { size, meta: d[..MB as usize].to_vec(), read_only: false })).collect();
    let c = Coordinator::assemble(&spec(), found, Session { id: 1, pid: 2, host: "h".into() }, false, 0).unwrap();
    let mut w = W { c, disks, pending: vec![], copies: HashMap::new(), reads: HashMap::new(), writes: HashMap::new(), done: HashMap::new(), swaps: vec![], spares_taken: vec![], now: 0 };
    w.pump();
    // The reconcile's copies of region 0 (member 0 -> member 1) are slow: hold them.
    let held: Vec<OpId> = w.pending.iter().filter(|p| matches!(p.3, Data::Copy(_))).map(|p| p.0).collect();
    assert!(!held.is_empty(), "no reconcile copy started");
    w.settle(|p| held.contains(&p.0));
    w.tick(1000);
    w.settle(|p| held.contains(&p.0));
    let before = w.read(0, 4096, |p| held.contains(&p.0));
    assert_eq!(before[0], 0xAA, "reads of a region being reconciled come from the set's first member");

    // Replace member 0 live; the shadow answers blank and is copied to.
    let shadow = w.c.replace_member(0, "new", w.now).unwrap().expect("member 0 is in sync: a live replacement");
    w.pump();
    w.disks.push(vec![0u8; size as usize]);
    let f = w.found(shadow);
    w.c.member_back(shadow, f, w.now);
    w.pump();
    for _ in 0..50 {
        w.tick(100);
        w.settle(|p| held.contains(&p.0));
        if !w.swaps.is_empty() {
            break;
        }
    }
    // Whatever else happens, reads of region 0 must keep returning what they returned.
    for _ in 0..50 {
        w.tick(100);
        w.settle(|_| false);
    }
    let after = w.read(0, 4096, |_| false);
    assert_eq!(after[0], before[0], "region 0 read 0x{:02x} before member 0 was replaced and 0x{:02x} after (swaps {:?}); status {:?}", before[0], after[0], w.swaps, w.c.status().members);
    assert_eq!(w.disks[0][MB as usize], w.disks[1][MB as usize], "copies unequal");
}

