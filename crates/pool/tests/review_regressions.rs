//! Regression tests for resync bugs a review found, driven through the coordinator's public
//! API with hand-picked completion orders: a region skipped after its source failed under
//! pacing, and a duplicate copy lock that made `advance` loop forever.

use sluice_pool::coordinator::format;
use sluice_pool::*;
use std::collections::BTreeSet;

const MB: u64 = 1 << 20;

fn spec(copies: usize, rate: u64) -> PoolSpec {
    PoolSpec {
        layout: Layout::Mirror,
        placement: sluice_pool::Placement::Near,
        stripe_unit: u64::MAX,
        copies,
        members: (0..copies).map(|i| format!("m{i}")).collect(),
        member_timeout_ms: 3_600_000,
        resync_rate_bytes_per_s: rate,
        spares: Vec::new(),
        spare_after_ms: 60_000,
        scrub_interval_ms: None,
    }
}

struct D {
    c: Coordinator,
    pending: Vec<(OpId, usize, MemberCmd, Data)>,
    writes_to: Vec<(usize, u64, u64)>,
    now: u64,
}

impl D {
    fn pump(&mut self) {
        let mut n = 0;
        while let Some(a) = self.c.poll() {
            n += 1;
            assert!(n < 100000, "runaway actions");
            if let Action::Member { op, member, cmd, data } = a {
                if let MemberCmd::Write { offset, len, .. } = cmd { if offset >= 1 << 20 { self.writes_to.push((member, offset - MB, len)); } }
                self.pending.push((op, member, cmd, data));
            }
        }
    }
    /// Completes every pending op except those `keep` says to keep.
    fn auto(&mut self, keep: impl Fn(&(OpId, usize, MemberCmd, Data)) -> bool) {
        loop {
            self.pump();
            let i = self.pending.iter().position(|p| !keep(p));
            let Some(i) = i else { break };
            let (op, _m, cmd, data) = self.pending.remove(i);
            let out = match (cmd, data) { (MemberCmd::Read { .. }, Data::Meta) => OpOutcome::Data(vec![0; 4096]), _ => OpOutcome::Done };
            self.c.handle(op, out, self.now);
        }
    }
    fn tick(&mut self, t: u64) { self.now = t; self.c.tick(t); self.pump(); }
}

fn setup(copies: usize, rate: u64) -> (D, Vec<Found>) {
    let sz = MB + 16 * MB;
    let blank: Vec<Found> = (0..copies).map(|_| Found { size: sz, meta: vec![0; MB as usize], read_only: false }).collect();
    let fm = format(&spec(copies, rate), &blank, [5; 16], false).unwrap();
    let mut found = blank.clone();
    for i in 0..copies - 1 { found[i].meta[..fm[i].len()].copy_from_slice(&fm[i]); }
    let c = Coordinator::assemble(&spec(copies, rate), found.iter().cloned().map(Some).collect(), Session { id: 9, pid: 1, host: "h".into() }, false, 0).unwrap();
    let mut d = D { c, pending: vec![], writes_to: vec![], now: 0 };
    d.pump();
    (d, found)
}

fn is_copy_read_at(p: &(OpId, usize, MemberCmd, Data), off: u64) -> bool {
    matches!(p, (_, _, MemberCmd::Read { offset, .. }, Data::Copy(_)) if *offset == MB + off)
}
fn is_copy_write_at(p: &(OpId, usize, MemberCmd, Data), off: u64) -> bool {
    matches!(p, (_, _, MemberCmd::Write { offset, .. }, Data::Copy(_)) if *offset == MB + off)
}

#[test]
fn skip_after_source_failure_under_pace() {
    let (mut d, found) = setup(2, MB); // 1 MiB/s
    d.auto(|_| false);
    for t in [1000, 2000] { d.tick(t); d.auto(|_| false); }
    d.tick(3000); // chunk 3 (region 0) read issued
    d.auto(|p| is_copy_read_at(p, 3 * MB));
    d.tick(4000); // chunk 4 (region 1) read issued
    d.auto(|p| is_copy_read_at(p, 3 * MB) || is_copy_write_at(p, 4 * MB));
    let i = d.pending.iter().position(|p| is_copy_read_at(p, 3 * MB)).unwrap();
    let (op, ..) = d.pending.remove(i);
    d.c.handle(op, OpOutcome::Failed("boom".into()), d.now);
    d.pump();
    let i = d.pending.iter().position(|p| is_copy_write_at(p, 4 * MB)).unwrap();
    let (op, ..) = d.pending.remove(i);
    d.c.handle(op, OpOutcome::Done, d.now);
    d.pump();
    d.pending.retain(|p| p.1 != 0);
    d.c.member_back(0, found[0].clone(), 4500);
    d.pump();
    for k in 0..100 { d.tick(5000 + k * 1000); d.auto(|_| false); }
    let got: BTreeSet<u64> = d.writes_to.iter().filter(|w| w.0 == 1).map(|w| w.1 / MB).collect();
    assert!(d.c.status().members.iter().all(|m| m.state == MemberState::InSync), "{:?}", d.c.status().members);
    assert_eq!(got, (0..16).collect::<BTreeSet<u64>>(), "every chunk must reach the rebuilt member");
}

#[test]
fn a_rewound_chunk_still_being_copied_is_not_locked_twice() {
    // Run where a hang cannot stall the test run: a second thread, and a deadline.
    let (done, finished) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        dup_lock_three_way();
        let _ = done.send(());
    });
    finished.recv_timeout(std::time::Duration::from_secs(60)).expect("the coordinator did not return from handle()");
}

fn dup_lock_three_way() {
    let (mut d, _found) = setup(3, 64 * MB);
    let copyread = |p: &(OpId, usize, MemberCmd, Data)| matches!(p, (_, _, MemberCmd::Read{..}, Data::Copy(_)));
    d.auto(copyread);
    d.tick(100);
    d.auto(|p| copyread(p) && !is_copy_read_at(p, 0));
    let i = d.pending.iter().position(|p| is_copy_read_at(p, 2 * MB)).unwrap();
    let (op, ..) = d.pending.remove(i);
    d.c.handle(op, OpOutcome::Done, d.now);
    d.pump();
    let i = d.pending.iter().position(|p| is_copy_read_at(p, MB)).unwrap();
    let (op, ..) = d.pending.remove(i);
    // The source fails chunk 1 while chunk 2's copy is being written.
    d.c.handle(op, OpOutcome::Failed("boom".into()), d.now);
    d.pump();
}
