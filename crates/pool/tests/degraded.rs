//! Degraded assembly: a redundant pool starts with members missing only when asked to, and
//! only while every set still has an in-sync copy; a stripe never does.

use sluice_pool::coordinator::format;
use sluice_pool::*;

const MB: u64 = 1 << 20;

fn spec(layout: Layout, members: usize, copies: usize) -> PoolSpec {
    PoolSpec {
        layout,
        placement: sluice_pool::Placement::Near,
        stripe_unit: if layout == Layout::Mirror { u64::MAX } else { 64 << 10 },
        copies,
        members: (0..members).map(|i| format!("nbd://node{i}/disk")).collect(),
        member_timeout_ms: 6_000,
        resync_rate_bytes_per_s: 0,
        spares: Vec::new(),
        spare_after_ms: 60_000,
        scrub_interval_ms: None,
    }
}

/// Every member formatted for `spec`, as each would be found.
fn formatted(spec: &PoolSpec) -> Vec<Found> {
    let blank: Vec<Found> = spec.members.iter().map(|_| Found { size: MB + 16 * MB, meta: vec![0; MB as usize], read_only: false }).collect();
    let metas = format(spec, &blank, [3; 16], false).unwrap();
    blank.into_iter().zip(metas).map(|(mut f, m)| { f.meta[..m.len()].copy_from_slice(&m); f }).collect()
}

fn without(found: &[Found], gone: &[usize]) -> Vec<Option<Found>> {
    found.iter().enumerate().map(|(i, f)| (!gone.contains(&i)).then(|| f.clone())).collect()
}

fn session() -> Session {
    Session { id: 4, pid: 1, host: "gateway".into() }
}

#[test]
fn a_missing_member_needs_the_flag_and_the_refusal_names_it() {
    let s = spec(Layout::Mirror, 2, 2);
    let found = formatted(&s);
    let e = Coordinator::assemble(&s, without(&found, &[1]), session(), false, 0).err().unwrap();
    assert!(e.contains("nbd://node1/disk") && e.contains("--degraded"), "{e}");
    let c = Coordinator::assemble(&s, without(&found, &[1]), session(), true, 0).unwrap();
    let states: Vec<&str> = c.status().members.iter().map(|m| m.state.name()).collect();
    assert_eq!(states, ["in-sync", "missing"]);
    assert_eq!(c.size(), 16 * MB);
}

#[test]
fn every_set_must_keep_an_in_sync_copy() {
    let s = spec(Layout::Raid10, 4, 2);
    let found = formatted(&s);
    // One of each set gone: served degraded.
    assert!(Coordinator::assemble(&s, without(&found, &[0, 3]), session(), true, 0).is_ok());
    // Both of set 0 gone: nothing can serve its units.
    let e = Coordinator::assemble(&s, without(&found, &[0, 1]), session(), true, 0).err().unwrap();
    assert!(e.contains("no member of set 0 is in sync") && e.contains("nbd://node0/disk (missing)"), "{e}");
}

#[test]
fn a_member_left_out_is_rebuilt_when_it_returns() {
    // node0 serves alone, degraded, and records node1's absence in its superblock. (node1
    // alone could not tell that it missed writes: that is why degraded assembly is asked
    // for by name, as mdadm's --run is.)
    let s = spec(Layout::Mirror, 2, 2);
    let mut found = formatted(&s);
    let mut c = Coordinator::assemble(&s, without(&found, &[1]), session(), true, 0).unwrap();
    // The degraded coordinator writes node1's absence into node0's superblock.
    let mut n = 0;
    while let Some(a) = c.poll() {
        n += 1;
        assert!(n < 10_000, "runaway actions");
        if let Action::Member { op, member, cmd: MemberCmd::Write { offset, .. }, data: Data::Bytes(b) } = a {
            assert_eq!(member, 0);
            found[0].meta[offset as usize..offset as usize + b.len()].copy_from_slice(&b);
            c.handle(op, OpOutcome::Done, 0);
        } else if let Action::Member { op, .. } = a {
            c.handle(op, OpOutcome::Done, 0);
        }
    }
    drop(c);
    // node0 comes back alone with the newer superblock: fine. Both back: node1 is rebuilt.
    let c = Coordinator::assemble(&s, without(&found, &[1]), session(), true, 0).unwrap();
    assert_eq!(c.status().members[0].state.name(), "in-sync");
    let c = Coordinator::assemble(&s, without(&found, &[]), session(), false, 0).unwrap();
    assert_ne!(c.status().members[1].state.name(), "in-sync", "node1 missed writes: it is rebuilt, not trusted");
}

#[test]
fn a_stripe_is_never_served_without_a_member() {
    let s = spec(Layout::Stripe, 2, 1);
    let found = formatted(&s);
    for degraded in [false, true] {
        let e = Coordinator::assemble(&s, without(&found, &[1]), session(), degraded, 0).err().unwrap();
        assert!(e.contains("a stripe keeps one copy") && !e.contains("--degraded"), "{e}");
    }
}

/// Carries out every action on `found` (metadata writes land there; data operations just
/// succeed) until the coordinator has nothing more to do without time passing.
fn drive(c: &mut Coordinator, found: &mut [Found]) {
    let mut n = 0;
    while let Some(a) = c.poll() {
        n += 1;
        assert!(n < 10_000, "runaway actions");
        match a {
            Action::Member { op, member, cmd: MemberCmd::Write { offset, .. }, data: Data::Bytes(b) } if offset < MB => {
                found[member].meta[offset as usize..offset as usize + b.len()].copy_from_slice(&b);
                c.handle(op, OpOutcome::Done, 0);
            }
            Action::Member { op, .. } => c.handle(op, OpOutcome::Done, 0),
            _ => {}
        }
    }
}

#[test]
fn a_pool_left_dirty_by_a_crash_is_not_started_degraded() {
    let s = spec(Layout::Mirror, 2, 2);
    let mut found = formatted(&s);
    let mut c = Coordinator::assemble(&s, without(&found, &[]), session(), false, 0).unwrap();
    drive(&mut c, &mut found);
    c.submit(Command::Write { offset: 4096, len: 4096, fua: false }, 0);
    drive(&mut c, &mut found);
    // The coordinator dies here: its region is still dirty, its session still the owner.
    drop(c);
    let e = Coordinator::assemble(&s, without(&found, &[1]), session(), true, 0).err().unwrap();
    assert!(e.contains("did not stop cleanly") && e.contains("nbd://node1/disk"), "{e}");
    // With every member back, the pool reconciles and serves.
    assert!(Coordinator::assemble(&s, without(&found, &[]), session(), false, 0).is_ok());
}

#[test]
fn a_replaced_member_left_out_mid_rebuild_is_rebuilt_in_full() {
    // node1 dies and is replaced by a blank member, and a clean stop cuts its full rebuild short
    // (the rate lets one chunk through). Left out of the next, degraded, start and handed
    // back later, it lacks everything not copied yet, not only the dirty regions.
    let s = spec(Layout::Mirror, 2, 2);
    let mut found = formatted(&s);
    let mut c = Coordinator::assemble(&s, without(&found, &[]), session(), false, 0).unwrap();
    drive(&mut c, &mut found);
    c.member_lost(1, "connection reset", 0);
    assert_eq!(c.replace_member(1, "nbd://node9/disk", 0).unwrap(), None, "a dead member is not copied from");
    found[1].meta.fill(0);
    c.member_back(1, found[1].clone(), 0);
    drive(&mut c, &mut found);
    assert!(matches!(c.status().members[1].state, MemberState::Resyncing { .. }));
    c.stop(0);
    drive(&mut c, &mut found);
    assert!(c.is_stopped());
    let mut c = Coordinator::assemble(&s, without(&found, &[1]), session(), true, 0).unwrap();
    drive(&mut c, &mut found);
    c.member_back(1, found[1].clone(), 0);
    let member_bytes = c.size();
    assert!(matches!(c.status().members[1].state, MemberState::Resyncing { total, .. } if total == member_bytes), "{:?}", c.status().members[1]);
}

#[test]
fn a_replaced_member_named_again_is_not_taken_for_in_sync() {
    // node1 dies and node9 takes its place, is rebuilt and in sync, and the pool stops
    // cleanly. Should node1 come back in that place (the pool file names it again: an
    // edit lost, an operator's slip), its superblock still says in sync, with the pool's
    // history; but it names another device for its place than the pool does, so it is
    // rebuilt in full instead of serving what it held before it died.
    let s = PoolSpec { resync_rate_bytes_per_s: 1 << 40, ..spec(Layout::Mirror, 2, 2) };
    let mut found = formatted(&s);
    let old = found[1].clone();
    let mut c = Coordinator::assemble(&s, without(&found, &[]), session(), false, 0).unwrap();
    drive(&mut c, &mut found);
    c.member_lost(1, "connection reset", 0);
    assert_eq!(c.replace_member(1, "nbd://node9/disk", 0).unwrap(), None);
    drive(&mut c, &mut found);
    found[1].meta.fill(0);
    c.member_back(1, found[1].clone(), 0);
    for t in 1..1000 {
        drive(&mut c, &mut found);
        if c.status().members[1].state == MemberState::InSync {
            break;
        }
        c.tick(t * 100);
    }
    assert_eq!(c.status().members[1].state, MemberState::InSync, "{:?}", c.status().members);
    c.stop(100_000);
    drive(&mut c, &mut found);
    assert!(c.is_stopped());

    found[1] = old;
    let c = Coordinator::assemble(&s, without(&found, &[]), session(), false, 0).unwrap();
    let member_bytes = c.size();
    assert!(matches!(c.status().members[1].state, MemberState::Resyncing { total, .. } if total == member_bytes), "{:?}", c.status().members[1]);
}
