//! Regression tests from a review of live replacement (handover) and spares, driven
//! through the coordinator's public API over members kept in memory.

use sluice_pool::coordinator::format;
use sluice_pool::*;
use std::collections::HashMap;

mod common;
use common::*;


fn spec() -> PoolSpec {
    PoolSpec {
        layout: Layout::Raid10,
        placement: sluice_pool::Placement::Near,
        stripe_unit: 64 << 10,
        copies: 2,
        members: vec!["m0".into(), "m1".into(), "m2".into(), "m3".into()],
        member_timeout_ms: 3_600_000,
        resync_rate_bytes_per_s: 1 << 40,
        spares: vec!["s0".into()],
        spare_after_ms: 1_000,
        scrub_interval_ms: None,
    }
}


fn raid10() -> W {
    let size = MB + DATA;
    let blank = vec![Found { size, meta: vec![0; MB as usize], read_only: false }; 4];
    let images = format(&spec(), &blank, [3; 16], false).unwrap();
    let mut disks: Vec<Vec<u8>> = vec![vec![0u8; size as usize]; 4];
    for (m, image) in images.iter().enumerate() {
        disks[m][..image.len()].copy_from_slice(image);
    }
    let found = disks.iter().map(|d| Some(Found { size, meta: d[..MB as usize].to_vec(), read_only: false })).collect();
    let c = Coordinator::assemble(&spec(), found, Session { id: 1, pid: 2, host: "h".into() }, false, 0).unwrap();
    let mut w = W { c, disks, pending: vec![], copies: HashMap::new(), reads: HashMap::new(), writes: HashMap::new(), done: HashMap::new(), swaps: vec![], spares_taken: vec![], now: 0 };
    w.pump();
    w.settle(|_| false);
    w.tick(1000);
    w.settle(|_| false);
    w
}

/// A member of a raid10 dies for good while the pool is being grown: the reshape pauses
/// until every member is in sync, so the only way on is a spare (or `pool replace`).
/// Both are refused while a reshape runs: the pool stays degraded and never grows.
#[test]
fn a_member_lost_mid_reshape_can_be_replaced_by_a_spare() {
    let mut w = raid10();
    let size = MB + DATA;
    for _ in 0..2 {
        w.disks.push(vec![0u8; size as usize]);
    }
    let added = vec![("m4".to_string(), w.found(4)), ("m5".to_string(), w.found(5))];
    w.c.grow(added, 1, w.now).unwrap();
    w.pump();
    // Member 1 dies as the reshape starts.
    assert!(w.c.status().reshape.is_some(), "the reshape is still running");
    w.c.member_lost(1, "disk died", w.now);
    w.pump();
    w.settle(|p| p.1 == 1);
    w.pending.retain(|p| p.1 != 1);
    for _ in 0..30 {
        w.tick(100);
        w.settle(|p| p.1 == 1);
    }
    assert!(w.c.status().reshape.is_some(), "paused while member 1 is missing");
    assert_eq!(w.spares_taken, vec![1], "member 1 has been missing past spare-after; replace refused: {:?}", w.c.can_replace(&[1]));
    // The spare answers blank, is rebuilt, and the reshape goes on to the end.
    w.disks[1] = vec![0u8; size as usize];
    let f = w.found(1);
    w.c.member_back(1, f, w.now);
    w.pump();
    for _ in 0..2000 {
        w.tick(100);
        w.settle(|_| false);
        if w.c.status().reshape.is_none() {
            break;
        }
    }
    assert!(w.c.status().reshape.is_none(), "the reshape finished");
}

/// A repair's chunk is read from member 0 before a grow and from member 1 after the
/// reshape moved units into the chunk's range: the copies "differ", and the repair writes
/// member 0's pre-reshape bytes over member 1's moved units.
#[test]
fn a_scrub_chunk_in_flight_does_not_undo_a_reshape() {
    let mut w = raid10();
    let size = MB + DATA;
    let len = 4 * MB;
    let pattern: Vec<u8> = (0..len).map(|i| (i / (64 << 10)) as u8 + 1).collect();
    let id = w.c.submit(Command::Write { offset: 0, len, fua: false }, w.now);
    w.writes.insert(id, pattern.clone());
    w.pump();
    w.settle(|_| false);
    assert!(matches!(w.done.get(&id), Some(Ok(()))));
    w.c.start_scrub(true, None, w.now).unwrap();
    w.pump();
    w.settle(|p| p.1 == 1 && matches!((&p.2, &p.3), (MemberCmd::Read { .. }, Data::Copy(_))));
    let held: Vec<OpId> = w.pending.iter().filter(|p| p.1 == 1).map(|p| p.0).collect();
    assert!(!held.is_empty(), "scrub reads of member 1 are out");
    for _ in 0..2 {
        w.disks.push(vec![0u8; size as usize]);
    }
    let added = vec![("m4".to_string(), w.found(4)), ("m5".to_string(), w.found(5))];
    w.c.grow(added, 1, w.now).unwrap();
    w.pump();
    for _ in 0..2000 {
        w.tick(100);
        w.settle(|p| held.contains(&p.0));
        if w.c.status().reshape.is_none() {
            break;
        }
    }
    for _ in 0..50 {
        w.tick(100);
        w.settle(|_| false);
    }
    let d = MB as usize..(MB + 4 * MB) as usize;
    assert!(w.disks[0][d.clone()] == w.disks[1][d.clone()], "copies of set 0 differ after the repair");
    let back = w.read(0, len, |_| false);
    assert!(back == pattern, "the volume reads back other bytes than were written");
}
