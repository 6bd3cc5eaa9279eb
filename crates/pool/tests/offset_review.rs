//! Regression tests from a review of offset placement and of the per-chunk copy sources,
//! driven through the coordinator's public API over members kept in memory.

use sluice_pool::coordinator::format;
use sluice_pool::*;
use std::collections::HashMap;

mod common;
use common::*;

const UNIT: u64 = 64 << 10;

fn spec(layout: Layout, placement: Placement, members: usize, copies: usize) -> PoolSpec {
    PoolSpec {
        layout,
        placement,
        stripe_unit: if layout == Layout::Mirror { u64::MAX } else { UNIT },
        copies,
        members: (0..members).map(|m| format!("m{m}")).collect(),
        member_timeout_ms: 3_600_000,
        resync_rate_bytes_per_s: 1 << 40,
        spares: vec![],
        spare_after_ms: 60_000,
        scrub_interval_ms: None,
    }
}

/// Formatted members; `crashed` leaves them owned by a dead coordinator with region 0 dirty.
fn disks(spec: &PoolSpec, crashed: bool) -> Vec<Vec<u8>> {
    let size = MB + DATA;
    let n = spec.members.len();
    let blank = vec![Found { size, meta: vec![0; MB as usize], read_only: false }; n];
    let images = format(spec, &blank, [3; 16], false).unwrap();
    let mut disks: Vec<Vec<u8>> = vec![vec![0u8; size as usize]; n];
    for (m, image) in images.iter().enumerate() {
        disks[m][..image.len()].copy_from_slice(image);
        if crashed {
            let mut sb = Superblock::decode(image).unwrap().unwrap();
            sb.owner = Owner { session: 77, heartbeat: 5, pid: 1, host: "crashed".into() };
            sb.events = 9;
            let enc = sb.encode();
            disks[m][..enc.len()].copy_from_slice(&enc);
            disks[m][4096] = 1; // region 0 dirty
        }
    }
    disks
}

fn start(spec: &PoolSpec, disks: Vec<Vec<u8>>) -> W {
    let size = MB + DATA;
    let found = disks.iter().map(|d| Some(Found { size, meta: d[..MB as usize].to_vec(), read_only: false })).collect();
    let c = Coordinator::assemble(spec, found, Session { id: 1, pid: 2, host: "h".into() }, false, 0).unwrap();
    let mut w = W { c, disks, pending: vec![], copies: HashMap::new(), reads: HashMap::new(), writes: HashMap::new(), done: HashMap::new(), swaps: vec![], spares_taken: vec![], now: 0 };
    w.pump();
    w
}

/// A started pool of `spec` whose metadata has settled.
fn running(spec: &PoolSpec) -> W {
    let mut w = start(spec, disks(spec, false));
    w.settle(|_| false);
    w.tick(1000);
    w.settle(|_| false);
    w
}

/// The layout of a 4-member raid10 with offset placement.
fn offset_map() -> Map {
    Map { placement: Placement::Offset, ..Map::new(Layout::Raid10, UNIT, 2, 4, MB + DATA).unwrap() }
}

/// A unit whose set lists member 0 first and does not hold member 1, and its piece: a copy
/// from "the first in-sync member" would take member 0's contents.
fn unit_led_by_member_0(w: &W, map: &Map) -> (u64, layout::Piece) {
    (0..w.c.size() / UNIT)
        .map(|u| (u, map.pieces(u * UNIT, UNIT).next().unwrap()))
        .find(|(_, p)| {
            let g: Vec<usize> = map.members_at(p.set, p.member_offset).collect();
            g[0] == 0 && !g.contains(&1)
        })
        .unwrap()
}

fn lose(w: &mut W, m: usize) {
    w.c.member_lost(m, "disk died", w.now);
    w.pump();
    w.pending.retain(|p| p.1 != m);
    w.settle(|p| p.1 == m);
    w.pending.retain(|p| p.1 != m);
}

/// Offset placement, 4 members: member 1 is gone, so member 0 is the last copy of their
/// shared set. A write to another set of member 0's ({0, x}) is in flight when member 0
/// fails too: member x takes it, member 0 does not. Member 0 stays "active" while away and
/// is taken back as it is when it returns, holding what it held; the write must then not
/// have been acknowledged, or member 0 must get it.
#[test]
fn a_write_acknowledged_by_the_partner_of_the_last_copy_is_not_lost_when_it_returns() {
    let spec = spec(Layout::Raid10, Placement::Offset, 4, 2);
    let mut w = running(&spec);
    lose(&mut w, 1);
    let map = offset_map();
    let (unit, piece) = (0..w.c.size() / UNIT)
        .map(|u| (u, map.pieces(u * UNIT, UNIT).next().unwrap()))
        .find(|(_, p)| {
            let g: Vec<usize> = map.members_at(p.set, p.member_offset).collect();
            g.contains(&0) && !g.contains(&1)
        })
        .unwrap();
    let partner = map.members_at(piece.set, piece.member_offset).find(|&m| m != 0).unwrap();
    let id = w.c.submit(Command::Write { offset: unit * UNIT, len: UNIT, fua: false }, w.now);
    w.writes.insert(id, vec![0x77; UNIT as usize]);
    w.pump();
    // Member 0 does not get to carry out the write; its partner does.
    w.settle(|p| p.1 == 0 && matches!(p.3, Data::Request { .. }));
    lose(&mut w, 0);
    w.settle(|_| false);
    let acked = matches!(w.done.get(&id), Some(Ok(())));
    let f = w.found(0);
    w.c.member_back(0, f, w.now);
    w.pump();
    for _ in 0..50 {
        w.tick(100);
        w.settle(|p| p.1 == 1);
        w.pending.retain(|p| p.1 != 1);
    }
    let at = (MB + piece.member_offset) as usize;
    let (on0, on_partner) = (w.disks[0][at], w.disks[partner][at]);
    let mut seen = vec![];
    for _ in 0..4 {
        seen.push(w.read(unit * UNIT, UNIT, |p| p.1 == 1)[0]);
    }
    if acked {
        assert!(on0 == 0x77 && on_partner == 0x77 && seen.iter().all(|&b| b == 0x77), "the write was acknowledged, but member 0 holds 0x{on0:02x}, member {partner} 0x{on_partner:02x}, reads gave {seen:02x?}");
    }
    assert_eq!(on0, on_partner, "the copies of unit {unit} differ (acknowledged: {acked}); reads gave {seen:02x?}");
}

/// A mirror of three copies after a crash: member 0 holds 0xAA where the others hold 0x11.
/// Reconcile copies member 0's contents to members 1 and 2; member 2 gets it, member 1's
/// copy is still being read when member 0 fails. Member 1 becomes the first in-sync copy
/// and keeps 0x11, member 2 holds 0xAA: the copies must be made equal again (reads of a
/// write that was in flight at the crash may change once, when its source fails).
#[test]
fn the_reconcile_source_failing_midway_leaves_the_copies_equal() {
    let spec = spec(Layout::Mirror, Placement::Near, 3, 3);
    let mut d = disks(&spec, true);
    d[0][MB as usize..(MB + 4096) as usize].fill(0xAA);
    d[1][MB as usize..(MB + 4096) as usize].fill(0x11);
    d[2][MB as usize..(MB + 4096) as usize].fill(0x11);
    let mut w = start(&spec, d);
    // Find the first copy read of chunk 0 (member 0 is the source of both reconciles) and
    // hold it; let the other go through.
    let first = w.pending.iter().find(|p| matches!((&p.2, &p.3), (MemberCmd::Read { offset, .. }, Data::Copy(_)) if *offset == MB)).map(|p| p.0);
    let held = first.expect("no reconcile copy of chunk 0 started");
    w.settle(|p| p.0 == held);
    w.tick(1000);
    w.settle(|p| p.0 == held);
    let before = w.read(0, 4096, |p| p.0 == held)[0];
    assert_eq!(before, 0xAA, "reads of a region being reconciled come from the first member");
    assert!(w.disks[1][MB as usize] == 0xAA || w.disks[2][MB as usize] == 0xAA, "one reconcile of chunk 0 went through");
    lose(&mut w, 0);
    for _ in 0..50 {
        w.tick(100);
        w.settle(|p| p.1 == 0);
        w.pending.retain(|p| p.1 != 0);
    }
    let (a, b) = (w.disks[1][MB as usize], w.disks[2][MB as usize]);
    let mut seen = vec![];
    for _ in 0..4 {
        seen.push(w.read(0, 4096, |p| p.1 == 0)[0]);
    }
    // Member 0's contents are gone with it: what member 1 holds is what reads agree on now.
    assert!(seen.iter().all(|&x| x == a), "reads gave 0x{before:02x} before member 0 failed and {seen:02x?} after (member 1 0x{a:02x}, member 2 0x{b:02x})");
    assert_eq!(a, b, "members 1 and 2 differ after the reconcile (reads gave {seen:02x?})");
}

/// `sluice pool grow` refuses an offset pool, but a served pool grows when its reloaded
/// file appends members (the serve catalog asks `can_grow`, then `grow`): the coordinator
/// must refuse it too, since the new member count regroups every period's sets. Grown
/// anyway, the volume reads back other data than was written.
#[test]
fn a_served_offset_pool_refuses_to_grow() {
    let spec = spec(Layout::Raid10, Placement::Offset, 4, 2);
    let mut w = running(&spec);
    let size = w.c.size();
    let step = 256 << 10;
    for i in 0..size / step {
        let id = w.c.submit(Command::Write { offset: i * step, len: step, fua: false }, w.now);
        w.writes.insert(id, vec![(i % 251) as u8 + 1; step as usize]);
    }
    w.pump();
    w.settle(|_| false);
    assert!(w.done.values().all(|r| r.is_ok()));
    let refused = w.c.can_grow(2);
    if refused.is_ok() {
        for _ in 0..2 {
            w.disks.push(vec![0u8; (MB + DATA) as usize]);
        }
        let added = vec![("m4".to_string(), w.found(4)), ("m5".to_string(), w.found(5))];
        w.c.grow(added, 1, w.now).unwrap();
        w.pump();
        for _ in 0..3000 {
            w.tick(100);
            w.settle(|_| false);
            if w.c.status().reshape.is_none() {
                break;
            }
        }
        let mut wrong = 0;
        for i in 0..size / step {
            let got = w.read(i * step, step, |_| false);
            wrong += got.iter().filter(|&&b| b != (i % 251) as u8 + 1).count();
        }
        panic!("an offset pool was grown ({wrong} bytes of {size} read back wrong)");
    }
    assert!(refused.is_err_and(|e| e.contains("offset")));
}

/// Offset placement, 4 members, member 1 gone. A write to a set {0, x} is acknowledged by
/// both, then member 0's server crashes and loses it (it was not flushed) before it is
/// dropped; member 0 leaves as the last copy of its set with member 1. Member x holds the
/// write throughout and reads return it. When member 0 returns, it must be brought up to
/// date from member x, not the other way round: reads must go on returning the write.
#[test]
fn the_last_copy_returning_takes_what_its_partners_kept() {
    let spec = spec(Layout::Raid10, Placement::Offset, 4, 2);
    let mut w = running(&spec);
    lose(&mut w, 1);
    let map = offset_map();
    // A unit whose set lists member 0 first: a copy from "the first in-sync member" would
    // take member 0's contents.
    let (unit, piece) = unit_led_by_member_0(&w, &map);
    let partner = map.members_at(piece.set, piece.member_offset).find(|&m| m != 0).unwrap();
    let id = w.c.submit(Command::Write { offset: unit * UNIT, len: UNIT, fua: false }, w.now);
    w.writes.insert(id, vec![0x55; UNIT as usize]);
    w.pump();
    w.settle(|_| false);
    assert!(matches!(w.done.get(&id), Some(Ok(()))));
    // Member 0's server crashes and comes back without the unflushed write.
    let at = (MB + piece.member_offset) as usize;
    w.disks[0][at..at + UNIT as usize].fill(0);
    lose(&mut w, 0);
    assert_eq!(w.read(unit * UNIT, UNIT, |p| p.1 <= 1)[0], 0x55, "member {partner} serves the write");
    let f = w.found(0);
    w.c.member_back(0, f, w.now);
    w.pump();
    for _ in 0..50 {
        w.tick(100);
        w.settle(|p| p.1 == 1);
        w.pending.retain(|p| p.1 != 1);
    }
    let mut seen = vec![];
    for _ in 0..4 {
        seen.push(w.read(unit * UNIT, UNIT, |p| p.1 == 1)[0]);
    }
    assert!(seen.iter().all(|&b| b == 0x55), "reads returned the acknowledged write, then {seen:02x?} once member 0 was back (member 0 0x{:02x}, member {partner} 0x{:02x})", w.disks[0][at], w.disks[partner][at]);
}

/// As above, but the coordinator stops cleanly while member 0 is away, and the next one
/// assembles the pool (degraded, member 1 still gone) with member 0 back: member 0 is
/// recorded active, and must still be brought up to date from member x first.
#[test]
fn the_last_copy_returning_at_assembly_takes_what_its_partners_kept() {
    let spec = spec(Layout::Raid10, Placement::Offset, 4, 2);
    let mut w = running(&spec);
    lose(&mut w, 1);
    let map = offset_map();
    let (unit, piece) = unit_led_by_member_0(&w, &map);
    let id = w.c.submit(Command::Write { offset: unit * UNIT, len: UNIT, fua: false }, w.now);
    w.writes.insert(id, vec![0x66; UNIT as usize]);
    w.pump();
    w.settle(|_| false);
    assert!(matches!(w.done.get(&id), Some(Ok(()))));
    let at = (MB + piece.member_offset) as usize;
    w.disks[0][at..at + UNIT as usize].fill(0);
    lose(&mut w, 0);
    assert_eq!(w.read(unit * UNIT, UNIT, |p| p.1 <= 1)[0], 0x66);
    w.c.stop(w.now);
    w.pump();
    for _ in 0..20 {
        w.tick(100);
        w.settle(|p| p.1 <= 1);
        w.pending.retain(|p| p.1 > 1);
    }
    assert!(w.c.is_stopped());
    // The next coordinator, with member 0 back and member 1 still gone.
    let found = (0..4).map(|m| (m != 1).then(|| w.found(m))).collect();
    let c = Coordinator::assemble(&spec, found, Session { id: 2, pid: 3, host: "h".into() }, true, w.now).unwrap();
    let disks = std::mem::take(&mut w.disks);
    let mut w = W { c, disks, pending: vec![], copies: HashMap::new(), reads: HashMap::new(), writes: HashMap::new(), done: HashMap::new(), swaps: vec![], spares_taken: vec![], now: w.now };
    w.pump();
    for _ in 0..50 {
        w.tick(100);
        w.settle(|p| p.1 == 1);
        w.pending.retain(|p| p.1 != 1);
    }
    let mut seen = vec![];
    for _ in 0..4 {
        seen.push(w.read(unit * UNIT, UNIT, |p| p.1 == 1)[0]);
    }
    assert!(seen.iter().all(|&b| b == 0x66), "reads returned the acknowledged write before the restart, then {seen:02x?}");
}

/// Offset placement with three copies (6 members) after a crash: in region 0 every member
/// holds other contents. The reconcile runs; the source of one of its first copies fails
/// midway. In the end every set of every period has equal in-sync copies, and reads agree.
#[test]
fn a_three_copy_offset_reconcile_survives_its_source_failing() {
    let spec = spec(Layout::Raid10, Placement::Offset, 6, 3);
    let mut d = disks(&spec, true);
    for (m, disk) in d.iter_mut().enumerate() {
        for p in 0..4 {
            let at = (MB + p * MB) as usize;
            disk[at..at + 4096].fill(0x10 + m as u8);
        }
    }
    let mut w = start(&spec, d);
    let first = w.pending.iter().find(|p| matches!(&p.3, Data::Copy(_))).map(|p| (p.0, p.1));
    let (held, source) = first.expect("no reconcile copy started");
    w.settle(|p| p.0 == held);
    w.tick(1000);
    w.settle(|p| p.0 == held);
    lose(&mut w, source);
    for _ in 0..50 {
        w.tick(100);
        w.settle(|p| p.1 == source);
        w.pending.retain(|p| p.1 != source);
    }
    let map = Map { placement: Placement::Offset, ..Map::new(Layout::Raid10, UNIT, 3, 6, MB + DATA).unwrap() };
    for p in 0..4u64 {
        for set in 0..2 {
            let at = (MB + p * MB) as usize;
            let held: Vec<(usize, u8)> = map.members_at(set, p * MB).filter(|&m| m != source).map(|m| (m, w.disks[m][at])).collect();
            assert!(held.windows(2).all(|x| x[0].1 == x[1].1), "period {p} set {set} (member {source} failed): {held:02x?}");
        }
    }
    // Reads agree with the copies: every unit at member offset p * MB of each set.
    for v in (0..w.c.size()).step_by(UNIT as usize) {
        let piece = map.pieces(v, UNIT).next().unwrap();
        if !piece.member_offset.is_multiple_of(MB) || piece.member_offset >= 4 * MB {
            continue;
        }
        let want = map.members_at(piece.set, piece.member_offset).find(|&m| m != source).map(|m| w.disks[m][(MB + piece.member_offset) as usize]).unwrap();
        for _ in 0..3 {
            assert_eq!(w.read(v, 4096, |p| p.1 == source)[0], want, "volume offset {v}");
        }
    }
}

/// A live replacement of member 0 in an offset pool, with writes while it copies: the new
/// member ends up holding, in each period, what its partners there hold.
#[test]
fn a_live_replacement_in_an_offset_pool_copies_every_period_from_its_partners() {
    let spec = spec(Layout::Raid10, Placement::Offset, 4, 2);
    let mut w = running(&spec);
    let size = w.c.size();
    let step = 256 << 10;
    let write = |w: &mut W, i: u64, byte: u8| {
        let id = w.c.submit(Command::Write { offset: i * step, len: step, fua: false }, w.now);
        w.writes.insert(id, vec![byte; step as usize]);
        w.pump();
    };
    for i in 0..size / step {
        write(&mut w, i, 1 + (i % 200) as u8);
    }
    w.settle(|_| false);
    let shadow = w.c.replace_member(0, "new", w.now).unwrap().expect("a live replacement");
    w.pump();
    w.disks.push(vec![0u8; (MB + DATA) as usize]);
    let f = w.found(shadow);
    w.c.member_back(shadow, f, w.now);
    w.pump();
    for round in 0..400u64 {
        // Writes land while the copy goes on.
        write(&mut w, (round * 7) % (size / step), 0xF0 + (round % 8) as u8);
        w.tick(20);
        w.settle(|_| false);
        if !w.swaps.is_empty() {
            break;
        }
    }
    assert_eq!(w.swaps.len(), 1, "the replacement took its place");
    w.settle(|_| false);
    let map = offset_map();
    for (set, at) in map.groups() {
        let mut p = at;
        while p < map.member_bytes {
            if map.members_at(set, p).collect::<Vec<_>>() == map.members_at(set, at).collect::<Vec<_>>() {
                let g: Vec<usize> = map.members_at(set, p).collect();
                let a = &w.disks[g[0]][(MB + p) as usize..(MB + p + MB) as usize];
                let b = &w.disks[g[1]][(MB + p) as usize..(MB + p + MB) as usize];
                assert!(a == b, "members {g:?} differ at member offset {p}");
            }
            p += MB;
        }
    }
}

/// Small members (fewer placement periods than the circle has rotations): a member lost,
/// written around, and rebuilt blank ends with equal copies, and the volume reads back.
#[test]
fn an_offset_pool_of_small_members_rebuilds_a_lost_one() {
    let spec = spec(Layout::Raid10, Placement::Offset, 6, 2);
    let size = MB + 2 * MB + UNIT;
    let blank = vec![Found { size, meta: vec![0; MB as usize], read_only: false }; 6];
    let images = format(&spec, &blank, [3; 16], false).unwrap();
    let mut disks: Vec<Vec<u8>> = vec![vec![0u8; size as usize]; 6];
    for (m, image) in images.iter().enumerate() {
        disks[m][..image.len()].copy_from_slice(image);
    }
    let found = disks.iter().map(|d| Some(Found { size, meta: d[..MB as usize].to_vec(), read_only: false })).collect();
    let c = Coordinator::assemble(&spec, found, Session { id: 1, pid: 2, host: "h".into() }, false, 0).unwrap();
    let mut w = W { c, disks, pending: vec![], copies: HashMap::new(), reads: HashMap::new(), writes: HashMap::new(), done: HashMap::new(), swaps: vec![], spares_taken: vec![], now: 0 };
    w.pump();
    w.settle(|_| false);
    w.tick(1000);
    w.settle(|_| false);
    let map = Map { placement: Placement::Offset, ..Map::new(Layout::Raid10, UNIT, 2, 6, size).unwrap() };
    assert_eq!(map.rotations(), 3);
    lose(&mut w, 2);
    let vsize = w.c.size();
    for i in 0..vsize / UNIT {
        let id = w.c.submit(Command::Write { offset: i * UNIT, len: UNIT, fua: false }, w.now);
        w.writes.insert(id, vec![1 + (i % 250) as u8; UNIT as usize]);
    }
    w.pump();
    w.settle(|p| p.1 == 2);
    w.pending.retain(|p| p.1 != 2);
    assert!(w.done.values().all(|r| r.is_ok()), "writes with one member gone");
    w.disks[2] = vec![0u8; size as usize];
    let f = w.found(2);
    w.c.member_back(2, f, w.now);
    w.pump();
    for _ in 0..200 {
        w.tick(100);
        w.settle(|_| false);
    }
    assert_eq!(w.c.status().members[2].state, MemberState::InSync);
    for off in (0..map.member_bytes).step_by(UNIT as usize) {
        for set in 0..map.sets {
            let g: Vec<usize> = map.members_at(set, off).collect();
            let at = (MB + off) as usize;
            assert_eq!(w.disks[g[0]][at], w.disks[g[1]][at], "set {set} {g:?} at member offset {off}");
        }
    }
    for i in 0..vsize / UNIT {
        assert_eq!(w.read(i * UNIT, UNIT, |_| false)[0], 1 + (i % 250) as u8, "unit {i}");
    }
}

/// As `the_last_copy_returning_takes_what_its_partners_kept`, but the coordinator stops
/// before member 0 has caught up (`early`: member 0 answers while it stops; else its
/// catch-up is paced and has not reached the write when the stop comes), and the next one
/// assembles every member.
fn stop_before_the_last_copy_caught_up(early: bool) {
    let mut spec = spec(Layout::Raid10, Placement::Offset, 4, 2);
    if !early {
        spec.resync_rate_bytes_per_s = 1;
    }
    let mut w = running(&spec);
    lose(&mut w, 1);
    let map = offset_map();
    let (unit, piece) = (0..w.c.size() / UNIT)
        .map(|u| (u, map.pieces(u * UNIT, UNIT).next().unwrap()))
        .find(|(_, p)| {
            let g: Vec<usize> = map.members_at(p.set, p.member_offset).collect();
            g[0] == 0 && !g.contains(&1) && p.member_offset % (4 * MB) >= MB
        })
        .unwrap();
    let id = w.c.submit(Command::Write { offset: unit * UNIT, len: UNIT, fua: false }, w.now);
    w.writes.insert(id, vec![0x77; UNIT as usize]);
    w.pump();
    w.settle(|_| false);
    assert!(matches!(w.done.get(&id), Some(Ok(()))));
    let at = (MB + piece.member_offset) as usize;
    w.disks[0][at..at + UNIT as usize].fill(0);
    lose(&mut w, 0);
    let f = w.found(0);
    if early {
        w.c.stop(w.now);
        w.pump();
        w.c.member_back(0, f, w.now);
        w.pump();
    } else {
        w.c.member_back(0, f, w.now);
        w.pump();
        w.settle(|p| p.1 == 1);
        w.c.stop(w.now);
        w.pump();
    }
    for _ in 0..20 {
        w.tick(100);
        w.settle(|p| p.1 == 1);
        w.pending.retain(|p| p.1 != 1);
    }
    assert!(w.c.is_stopped());
    w.pending.clear();
    let found = (0..4).map(|m| Some(w.found(m))).collect();
    let c = Coordinator::assemble(&spec, found, Session { id: 2, pid: 3, host: "h".into() }, false, w.now).unwrap();
    let disks = std::mem::take(&mut w.disks);
    let mut w = W { c, disks, pending: vec![], copies: HashMap::new(), reads: HashMap::new(), writes: HashMap::new(), done: HashMap::new(), swaps: vec![], spares_taken: vec![], now: w.now };
    w.pump();
    for _ in 0..100 {
        w.tick(100);
        w.settle(|_| false);
    }
    let mut seen = vec![];
    for _ in 0..4 {
        seen.push(w.read(unit * UNIT, UNIT, |_| false)[0]);
    }
    assert!(seen.iter().all(|&b| b == 0x77), "the acknowledged write read back as {seen:02x?} after the restart");
}

#[test]
fn a_stop_before_the_last_copy_caught_up_keeps_the_write() {
    stop_before_the_last_copy_caught_up(false);
    stop_before_the_last_copy_caught_up(true);
}

/// A mirror of three copies after a crash, as above; this time member 1's copy of chunk 0
/// from member 0 has been read and is still being written to member 1 when member 0
/// fails. Member 1 becomes the source: member 2 must not copy chunk 0 from it before that
/// write has landed, or it ends with what member 1 held before.
#[test]
fn a_new_source_is_read_only_once_the_copy_to_it_has_landed() {
    let spec = spec(Layout::Mirror, Placement::Near, 3, 3);
    let mut d = disks(&spec, true);
    d[0][MB as usize..(MB + 4096) as usize].fill(0xAA);
    d[1][MB as usize..(MB + 4096) as usize].fill(0x11);
    d[2][MB as usize..(MB + 4096) as usize].fill(0x11);
    let mut w = start(&spec, d);
    let to_1 = |p: &(OpId, usize, MemberCmd, Data)| p.1 == 1 && matches!((&p.2, &p.3), (MemberCmd::Write { offset, .. }, Data::Copy(_)) if *offset == MB);
    w.settle(to_1);
    w.tick(1000);
    w.settle(to_1);
    let held = w.pending.iter().find(|p| to_1(p)).map(|p| p.0).expect("the copy to member 1 is held");
    assert_eq!(w.disks[2][MB as usize], 0xAA, "member 2 got chunk 0 from member 0");
    w.c.member_lost(0, "disk died", w.now);
    w.pump();
    w.pending.retain(|p| p.1 != 0);
    for _ in 0..20 {
        w.tick(100);
        w.settle(|p| p.0 == held || p.1 == 0);
        w.pending.retain(|p| p.1 != 0);
    }
    w.settle(|p| p.1 == 0);
    for _ in 0..20 {
        w.tick(100);
        w.settle(|p| p.1 == 0);
        w.pending.retain(|p| p.1 != 0);
    }
    let (a, b) = (w.disks[1][MB as usize], w.disks[2][MB as usize]);
    assert_eq!(a, b, "members 1 and 2 differ after the reconcile");
}
