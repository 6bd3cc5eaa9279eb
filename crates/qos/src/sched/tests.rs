//! The scheduler with explicit time: limits, bursts, shares, reservations, idle classes,
//! and classes changed or removed while requests wait.

use std::collections::BTreeMap;

use super::{ConfigError, Scheduler};
use crate::class::{Class, Limits};
use crate::limits::{LINGERING_INSTANCES_MAX, NANOS_PER_SEC};
use crate::request::{Nanos, Op, Verdict};

const S: Nanos = NANOS_PER_SEC;
const MS: Nanos = S / 1000;

fn classes(text: &str) -> BTreeMap<String, Class> {
    toml::from_str(text).expect("classes parse")
}

fn sched(text: &str, limits: Limits) -> Scheduler {
    Scheduler::new(classes(text), limits, 0).expect("valid")
}

fn drain(s: &mut Scheduler, now: Nanos) -> Vec<u64> {
    std::iter::from_fn(|| s.poll(now)).collect()
}

#[test]
fn uncontended_requests_start_at_once() {
    let mut s = sched("[a]\n[b]\niops = 1000000", Limits::default());
    let a = s.attach("a", 1, 0).unwrap();
    let b = s.attach("b", 1, 0).unwrap();
    for id in 0..1000 {
        assert_eq!(s.submit(id, if id % 2 == 0 { a } else { b }, id, Op::Read, 1 << 20), Verdict::Start);
    }
    assert_eq!((s.held(), s.inflight(), s.next_wake(0)), (0, 1000, None));
    assert_eq!(s.attach("c", 1, 0), Err(ConfigError::UnknownClass("c".into())));
}

#[test]
fn a_limit_holds_requests_and_says_when_to_wake() {
    let mut s = sched("[a]\niops = 10", Limits::default());
    let a = s.attach("a", 1, 0).unwrap();
    for id in 0..10 {
        assert_eq!(s.submit(0, a, id, Op::Read, 4096), Verdict::Start, "the burst");
    }
    assert_eq!(s.submit(0, a, 10, Op::Read, 4096), Verdict::Held);
    assert_eq!(s.submit(0, a, 11, Op::Write, 4096), Verdict::Held);
    assert_eq!(s.next_wake(0), Some(100 * MS));
    assert_eq!(s.poll(100 * MS - 1), None);
    assert_eq!(s.poll(100 * MS), Some(10), "FIFO within a class");
    assert_eq!(s.next_wake(100 * MS), Some(200 * MS));
    assert_eq!(drain(&mut s, 200 * MS), vec![11]);
    assert_eq!(s.next_wake(200 * MS), None);
}

#[test]
fn burst_is_seconds_of_the_limit() {
    let mut s = sched("[a]\niops = 100\nburst = 0.5", Limits::default());
    let a = s.attach("a", 1, 0).unwrap();
    let started = (0..100).filter(|&id| s.submit(0, a, id, Op::Read, 0) == Verdict::Start).count();
    assert_eq!(started, 50);
    // After a quiet spell the bucket holds half a second again, no more.
    assert_eq!(drain(&mut s, 10 * S).len(), 50);
}

#[test]
fn bytes_are_counted_and_a_large_request_leaves_a_debt() {
    let mut s = sched("[a]\nbps = \"1M\"", Limits::default());
    let a = s.attach("a", 1, 0).unwrap();
    assert_eq!(s.submit(0, a, 1, Op::Write, 2 << 20), Verdict::Start, "a full bucket takes any one request");
    assert_eq!(s.submit(0, a, 2, Op::Write, 4096), Verdict::Held);
    // 1 MiB of debt is paid at 1 MiB/s, then 4 KiB more.
    assert_eq!(s.next_wake(0), Some(S + S * 4096 / (1 << 20)));
}

#[test]
fn read_and_write_limits_count_their_own_kind() {
    let mut s = sched("[a]\nread-iops = 1\nwrite-bps = \"1K\"", Limits::default());
    let a = s.attach("a", 1, 0).unwrap();
    assert_eq!(s.submit(0, a, 1, Op::Read, 1 << 20), Verdict::Start);
    assert_eq!(s.submit(0, a, 2, Op::Other, 1 << 20), Verdict::Start);
    assert_eq!(s.submit(0, a, 3, Op::Write, 1024), Verdict::Start);
    assert_eq!(s.submit(0, a, 4, Op::Read, 0), Verdict::Held);
    assert_eq!(s.submit(0, a, 5, Op::Write, 0), Verdict::Held, "FIFO: behind the held read");
    assert_eq!(drain(&mut s, S), vec![4, 5]);
}

/// Submits `per` requests of each class (in class order) against a storage that takes
/// one at a time and finishes each before the next poll; returns how many of each started
/// among the first `first`, the one that started at submission included.
fn contend(s: &mut Scheduler, handles: &[super::Handle], per: u64, bytes: u64, first: usize) -> Vec<usize> {
    let mut counts = vec![0; handles.len()];
    let mut id = 0;
    for (c, &h) in handles.iter().enumerate() {
        for _ in 0..per {
            if s.submit(0, h, id, Op::Read, bytes) == Verdict::Start {
                counts[c] += 1;
            }
            id += 1;
        }
    }
    let mut now = 0;
    while counts.iter().sum::<usize>() < first {
        s.finished();
        now = s.next_wake(now).unwrap_or(now).max(now);
        let got = s.poll(now).expect("something may start") / per;
        counts[got as usize] += 1;
        now += MS;
    }
    counts
}

#[test]
fn contended_classes_share_by_weight() {
    let mut s = sched("[a]\nweight = 100\n[b]\nweight = 300", Limits { storage_inflight: Some(1), ..Limits::default() });
    let h = [s.attach("a", 1, 0).unwrap(), s.attach("b", 1, 0).unwrap()];
    let counts = contend(&mut s, &h, 1000, 4096, 400);
    assert!(counts[0].abs_diff(100) <= 1 && counts[1].abs_diff(300) <= 1, "{counts:?}");
}

#[test]
fn a_large_request_costs_more_than_a_small_one() {
    // Same weights; a asks 1 MiB requests, b 4 KiB: the cost (one op plus bytes in 64 KiB
    // operations) is 17 against about 1.06, so b starts about 16 times as many.
    let mut s = sched("[a]\n[b]", Limits { storage_inflight: Some(1), ..Limits::default() });
    let (a, b) = (s.attach("a", 1, 0).unwrap(), s.attach("b", 1, 0).unwrap());
    for id in 0..3000 {
        s.submit(0, if id < 1000 { a } else { b }, id, Op::Read, if id < 1000 { 1 << 20 } else { 4096 });
    }
    // The first started at submission.
    let (mut big, mut small) = (1, 0);
    for _ in 1..1700 {
        s.finished();
        if s.poll(0).unwrap() < 1000 { big += 1 } else { small += 1 }
    }
    assert!((99..=101).contains(&big) && small == 1700 - big, "{big} large, {small} small");
}

#[test]
fn a_reservation_is_served_first_while_behind() {
    let limits = Limits { storage_iops: Some(1000), storage_inflight: Some(4), ..Limits::default() };
    let mut s = sched("[r]\nreservation-iops = 300\nweight = 1\n[f]\nweight = 10000", limits);
    let h = [s.attach("r", 1, 0).unwrap(), s.attach("f", 1, 0).unwrap()];
    let (mut id, mut reserved) = (0, 0);
    for &h in &h {
        for _ in 0..20_000 {
            if s.submit(0, h, id, Op::Read, 4096) == Verdict::Start {
                reserved += (id < 20_000) as u64;
            }
            id += 1;
        }
    }
    for _ in 0..s.inflight() {
        s.finished();
    }
    let mut got = Vec::new();
    run_until(&mut s, &mut 0, 10 * S, &mut got);
    reserved += got.iter().filter(|&&id| id < 20_000).count() as u64;
    // 300 a second, and the first requests that started on submission (all the reserved
    // class's, up to the storage's queue depth).
    assert!((3000..=3010).contains(&reserved), "reserved class got {reserved} in 10 s");
}

/// Polls at every wake until `until`, the storage finishing whatever started at once.
fn run_until(s: &mut Scheduler, now: &mut Nanos, until: Nanos, got: &mut Vec<u64>) {
    while *now < until {
        got.extend(std::iter::from_fn(|| s.poll(*now)));
        (0..s.inflight()).for_each(|_| s.finished());
        *now = s.next_wake(*now).expect("work is held");
    }
}

#[test]
fn an_idle_reserved_class_is_owed_nothing_for_its_idleness() {
    let limits = Limits { storage_iops: Some(1000), ..Limits::default() };
    let mut s = sched("[r]\nreservation-iops = 100\nweight = 1\n[f]\nweight = 1000", limits);
    let (r, f) = (s.attach("r", 1, 0).unwrap(), s.attach("f", 1, 0).unwrap());
    for id in 0..20_000 {
        s.submit(0, f, id, Op::Read, 0);
    }
    let mut now = 0;
    run_until(&mut s, &mut now, 10 * S, &mut Vec::new());
    for id in 100_000..101_000 {
        s.submit(now, r, id, Op::Read, 0);
    }
    let mut got = Vec::new();
    run_until(&mut s, &mut now, 11 * S, &mut got);
    let reserved = got.iter().filter(|&&id| id >= 100_000).count();
    assert!((100..=103).contains(&reserved), "10 s idle bought {reserved} in the next second");
}

#[test]
fn an_idle_class_banks_nothing() {
    let mut s = sched("[a]\n[b]", Limits { storage_inflight: Some(1), ..Limits::default() });
    let (a, b) = (s.attach("a", 1, 0).unwrap(), s.attach("b", 1, 0).unwrap());
    // b runs alone for a while...
    for id in 0..500 {
        s.submit(0, b, id, Op::Read, 4096);
        s.poll(0);
        s.finished();
    }
    // ...then both contend: a gets half from now on, not all until it has caught up.
    let counts = contend(&mut s, &[a, b], 1000, 4096, 200);
    assert!(counts[0].abs_diff(100) <= 1, "{counts:?}");
}

#[test]
fn a_limited_class_does_not_bank_share_while_held_by_its_limit() {
    let mut s = sched("[a]\niops = 10\n[b]", Limits { storage_inflight: Some(1), ..Limits::default() });
    let (a, b) = (s.attach("a", 1, 0).unwrap(), s.attach("b", 1, 0).unwrap());
    for id in 0..100 {
        s.submit(0, a, id, Op::Read, 0);
        s.submit(0, b, 1000 + id, Op::Read, 0);
    }
    // One per poll: the storage takes one at a time (the first started at submission).
    s.finished();
    let mut order = Vec::new();
    for now in [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 10 * S, 10 * S, 10 * S, 10 * S] {
        order.extend(s.poll(now));
        s.finished();
    }
    let a_late = order[order.len() - 4..].iter().filter(|&&id| id < 1000).count();
    assert_eq!(a_late, 2, "after 10 s held, a alternates with b rather than taking the storage: {order:?}");
}

#[test]
fn reconfigure_keeps_held_requests_and_a_removed_class_runs_unlimited() {
    let mut s = sched("[a]\niops = 1\nburst = 1", Limits::default());
    let a = s.attach("a", 1, 0).unwrap();
    assert_eq!(s.submit(0, a, 0, Op::Read, 0), Verdict::Start);
    for id in 1..6 {
        assert_eq!(s.submit(0, a, id, Op::Read, 0), Verdict::Held);
    }
    assert_eq!(s.poll(0), None);
    let bad = classes("[a]\nweight = 0");
    assert!(matches!(s.reconfigure(0, bad, Limits::default()), Err(ConfigError::Class { .. })));
    assert_eq!(s.poll(0), None, "a refused configuration changes nothing");
    s.reconfigure(0, classes("[a]\niops = 2"), Limits::default()).unwrap();
    assert_eq!(s.next_wake(0), Some(S / 2), "the new rate repays the debt");
    s.reconfigure(0, BTreeMap::new(), Limits::default()).unwrap();
    assert_eq!(drain(&mut s, 0), vec![1, 2, 3, 4, 5]);
    assert_eq!(s.attach("a", 2, 0).map(|_| ()), Err(ConfigError::UnknownClass("a".into())));
}

#[test]
fn removed_requests_never_start() {
    let mut s = sched("[a]\niops = 1", Limits::default());
    let a = s.attach("a", 1, 0).unwrap();
    s.submit(0, a, 0, Op::Read, 0);
    s.submit(0, a, 1, Op::Read, 0);
    s.submit(0, a, 2, Op::Read, 0);
    assert!(s.remove(a, 1, 0));
    assert!(!s.remove(a, 1, 0) && !s.remove(a, 0, 0), "not held: started, or gone");
    assert_eq!(drain(&mut s, S), vec![2]);
    s.detach(a, S);
    assert_eq!(s.stats(S).len(), 1, "kept while its bucket is not full");
    let again = s.attach("a", 1, S).unwrap();
    assert_eq!(s.submit(S, again, 3, Op::Read, 0), Verdict::Held, "reconnecting does not reset a limit");
    assert!(s.remove(again, 3, S));
    s.detach(again, S);
    s.attach("a", 2, 5 * S).unwrap();
    assert_eq!(s.stats(5 * S).len(), 1, "the rested instance is gone; client 2's is there");
}

#[test]
fn remove_all_drops_a_closing_connections_requests_in_one_pass() {
    let mut s = sched("[sh]\niops = 1\nshared = true", Limits::default());
    let (one, two) = (s.attach("sh", 1, 0).unwrap(), s.attach("sh", 2, 0).unwrap());
    s.submit(0, one, 0, Op::Read, 0);
    for id in 1..10 {
        s.submit(0, if id % 2 == 0 { one } else { two }, id, Op::Read, 0);
    }
    assert_eq!(s.remove_all(two, 0, |id| id % 2 == 1), 5);
    assert_eq!(s.held(), 4);
    assert_eq!(s.remove_all(one, 0, |id| id % 2 == 0), 4);
    assert_eq!((s.held(), s.poll(10 * S), s.remove_all(one, 0, |_| true)), (0, None, 0));
}

#[test]
fn instances_kept_for_their_debts_are_bounded() {
    let mut s = sched("[a]\niops = 1\nburst = 3600", Limits::default());
    for client in 0..(LINGERING_INSTANCES_MAX as u64 + 100) {
        let h = s.attach("a", client, 0).unwrap();
        assert_eq!(s.submit(0, h, client, Op::Read, 0), Verdict::Start);
        s.detach(h, 0);
    }
    assert_eq!(s.stats(0).len(), LINGERING_INSTANCES_MAX);
}

#[test]
fn a_shared_class_has_one_bucket_and_others_one_per_client() {
    let mut s = sched("[sh]\niops = 2\nshared = true\n[own]\niops = 2", Limits::default());
    let (s1, s2) = (s.attach("sh", 1, 0).unwrap(), s.attach("sh", 2, 0).unwrap());
    let (o1, o2) = (s.attach("own", 1, 0).unwrap(), s.attach("own", 2, 0).unwrap());
    assert_eq!(s1, s2);
    assert_ne!(o1, o2);
    let verdicts: Vec<Verdict> = [s1, s2, s1, o1, o1, o2, o2].iter().enumerate().map(|(id, &h)| s.submit(0, h, id as u64, Op::Read, 0)).collect();
    assert_eq!(verdicts[..3], [Verdict::Start, Verdict::Start, Verdict::Held]);
    let mut others = drain(&mut s, 0);
    others.sort();
    assert_eq!(others, vec![3, 4, 5, 6], "the other class's instances are under their limits");
    let stats = s.stats(0);
    assert_eq!(stats.len(), 3);
    assert!(stats.iter().any(|st| st.class == "sh" && st.client.is_none() && st.held == 1 && st.tokens == Some(0)));
}

#[test]
fn server_wide_caps_hold_every_class_together() {
    let limits = Limits { storage_iops: Some(100), storage_bps: Some(1 << 20), ..Limits::default() };
    let mut s = sched("[a]\n[b]", limits);
    let (a, b) = (s.attach("a", 1, 0).unwrap(), s.attach("b", 1, 0).unwrap());
    let started = (0..200).filter(|&id| s.submit(0, if id % 2 == 0 { a } else { b }, id, Op::Read, 0) == Verdict::Start).count();
    assert_eq!(started, 100, "a second of storage-iops at once");
    assert_eq!(s.next_wake(0), Some(10 * MS));
    assert_eq!(drain(&mut s, S).len(), 100);
    // Bytes: 1 MiB a second, for all classes together.
    let (mut now, mut got) = (S, Vec::new());
    for id in 1000..1020 {
        s.submit(now, if id % 2 == 0 { a } else { b }, id, Op::Write, 256 << 10);
    }
    run_until(&mut s, &mut now, 3 * S, &mut got);
    // 1 MiB at once, then 1 MiB a second: four at 1 s, one every 250 ms up to 3 s.
    assert_eq!(got.len(), 11, "{got:?}");
    assert_eq!(s.held(), 9);
}

#[test]
fn a_class_held_by_its_own_limit_leaves_the_others_uncontended() {
    let mut s = sched("[slow]\niops = 1\n[fast]", Limits::default());
    let (slow, fast) = (s.attach("slow", 1, 0).unwrap(), s.attach("fast", 1, 0).unwrap());
    s.submit(0, slow, 0, Op::Read, 0);
    s.submit(0, slow, 1, Op::Read, 0);
    assert_eq!(s.poll(0), None, "slow waits for its limit until 1 s");
    assert_eq!(s.submit(MS, fast, 2, Op::Read, 0), Verdict::Start);
    assert_eq!(s.submit(S - 1, fast, 3, Op::Read, 0), Verdict::Start);
    assert_eq!(s.submit(S, fast, 4, Op::Read, 0), Verdict::Held, "from 1 s slow may go: fast waits its turn");
    assert_eq!(drain(&mut s, S).len(), 2);
}

#[test]
fn a_request_held_behind_another_class_starts_at_the_next_poll() {
    let mut s = sched("[slow]\niops = 1\n[fast]", Limits::default());
    let (slow, fast) = (s.attach("slow", 1, 0).unwrap(), s.attach("fast", 1, 0).unwrap());
    s.submit(0, slow, 0, Op::Read, 0);
    assert_eq!(s.submit(0, slow, 1, Op::Read, 0), Verdict::Held);
    // Something is held, so the uncontended path is off; the caller polls after a `Held`.
    assert_eq!(s.submit(0, fast, 2, Op::Read, 0), Verdict::Held);
    assert_eq!(drain(&mut s, 0), vec![2]);
}
