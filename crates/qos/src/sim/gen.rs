//! Random configurations and workloads for the simulation.

use std::collections::BTreeMap;

use sluice_proto::rng::Rng;
use crate::class::{Class, Limits};
use crate::limits::NANOS_PER_SEC;
use crate::request::{Nanos, Op};

/// A number from `lo` to `hi`, both included.
pub fn range(rng: &mut Rng, lo: u64, hi: u64) -> u64 {
    lo + rng.below(hi - lo + 1)
}

pub fn chance(rng: &mut Rng, percent: u64) -> bool {
    rng.below(100) < percent
}

/// When a client sends requests.
#[derive(Clone, Copy, Debug)]
pub enum Arrival {
    /// Always keeps its queue depth of requests outstanding.
    Flood,
    /// One request every `gap_ns` on average (exponential gaps, roughly).
    Trickle { gap_ns: u64 },
    /// Floods for `on_ns`, then is quiet for `off_ns`.
    Bursts { on_ns: u64, off_ns: u64 },
}

/// Request sizes a client sends.
#[derive(Clone, Copy, Debug)]
pub enum Sizes {
    Small,
    Large,
    /// 4 KiB, and 1 MiB one time in `large_in`.
    Mix { large_in: u64 },
    /// Any multiple of 4 KiB up to 1 MiB.
    Any,
}

#[derive(Clone, Copy, Debug)]
pub struct Workload {
    pub arrival: Arrival,
    pub sizes: Sizes,
    /// Requests the client may have outstanding (held or at the storage): its budget.
    pub depth: u32,
    /// Reads in 10 requests; of the rest, writes in 10.
    pub reads_in_10: u64,
    pub writes_in_10: u64,
}

pub fn workload(rng: &mut Rng) -> Workload {
    let arrival = match rng.below(3) {
        0 => Arrival::Flood,
        1 => Arrival::Trickle { gap_ns: range(rng, 100, 20_000) * 1000 },
        _ => Arrival::Bursts { on_ns: range(rng, 10, 1000) * 1_000_000, off_ns: range(rng, 10, 2000) * 1_000_000 },
    };
    Workload { arrival, sizes: sizes(rng), depth: range(rng, 1, 64) as u32, reads_in_10: rng.below(11), writes_in_10: rng.below(11) }
}

pub fn sizes(rng: &mut Rng) -> Sizes {
    match rng.below(4) {
        0 => Sizes::Small,
        1 => Sizes::Large,
        2 => Sizes::Mix { large_in: range(rng, 2, 50) },
        _ => Sizes::Any,
    }
}

pub fn size(rng: &mut Rng, sizes: Sizes) -> u64 {
    match sizes {
        Sizes::Small => 4096,
        Sizes::Large => 1 << 20,
        Sizes::Mix { large_in } if rng.below(large_in) == 0 => 1 << 20,
        Sizes::Mix { .. } => 4096,
        Sizes::Any => range(rng, 1, 256) * 4096,
    }
}

pub fn op(rng: &mut Rng, w: &Workload) -> Op {
    if rng.below(10) < w.reads_in_10 {
        Op::Read
    } else if rng.below(10) < w.writes_in_10 {
        Op::Write
    } else {
        Op::Other
    }
}

/// A gap before the next arrival with mean `mean_ns`: exponential, from a uniform draw.
pub fn gap(rng: &mut Rng, mean_ns: Nanos) -> Nanos {
    let u = (rng.below(1 << 20) + 1) as f64 / (1u64 << 20) as f64;
    ((-u.ln()) * mean_ns as f64) as Nanos + 1
}

/// A random valid class: each limit now and then, reservations below their limits.
pub fn class(rng: &mut Rng) -> Class {
    let mut c = Class::default();
    let maybe = |rng: &mut Rng, lo: u64, hi: u64| chance(rng, 25).then(|| range(rng, lo, hi));
    c.iops = maybe(rng, 50, 5000);
    c.bps = maybe(rng, 1 << 20, 400 << 20);
    c.read_iops = maybe(rng, 50, 5000);
    c.write_iops = maybe(rng, 50, 5000);
    c.read_bps = maybe(rng, 1 << 20, 400 << 20);
    c.write_bps = maybe(rng, 1 << 20, 400 << 20);
    c.burst_ns = range(rng, 1, 30) * NANOS_PER_SEC / 10;
    if chance(rng, 30) {
        c.reservation_iops = Some(range(rng, 10, c.iops.unwrap_or(2000)));
    }
    if chance(rng, 20) {
        c.reservation_bps = Some(range(rng, 1 << 16, c.bps.unwrap_or(100 << 20)));
    }
    c.weight = range(rng, 1, 1000) as u32;
    c.shared = chance(rng, 50);
    c
}

pub fn classes(rng: &mut Rng) -> BTreeMap<String, Class> {
    (0..range(rng, 1, 4)).map(|i| (format!("c{i}"), class(rng))).collect()
}

/// Server-wide caps, each now and then.
pub fn limits(rng: &mut Rng) -> Limits {
    Limits {
        storage_iops: chance(rng, 40).then(|| range(rng, 200, 8000)),
        storage_bps: chance(rng, 40).then(|| range(rng, 16 << 20, 800 << 20)),
        storage_inflight: chance(rng, 50).then(|| range(rng, 1, 32) as u32),
    }
}
