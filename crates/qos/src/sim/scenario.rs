//! The statistical checks, one scenario a seed, its numbers drawn from the seed: two
//! flooding classes share a contended storage by weight (cost within ±10% of w1:w2); a
//! reserved class keeps at least 95% of its reservation while a class of far greater
//! weight floods; a flooding limited class runs within ±5% of its limit.

use std::collections::BTreeMap;

use super::gen::{self, chance, range, Arrival, Sizes, Workload};
use super::storage::Storage;
use super::{Rng, World, SEC};
use crate::class::{Class, Limits};
use crate::request::{Applies, Dim};

/// Simulated seconds of a scenario, and the first of them left out of its measures (the
/// caps' and limits' bursts are spent by then).
const RUN_NS: u64 = 12 * SEC;
const WARM_NS: u64 = 3 * SEC;

/// Contention: a queue depth at the storage, or server-wide caps below what it can do.
fn contention(rng: &mut Rng, storage: &Storage) -> Limits {
    let depth = range(rng, 1, 16) as u32;
    if chance(rng, 50) {
        return Limits { storage_inflight: Some(depth), ..Limits::default() };
    }
    // Caps the storage can always meet: a request takes 1/iops plus bytes/bps of its time,
    // so shares of the two that add up to under 1 keep it from being the bottleneck.
    // Under 75% in all, so the device's queue stays short and a flooding client always has
    // requests held at the scheduler (beyond that, the device's queue holds them).
    let ops_share = range(rng, 20, 50);
    let bytes_share = (75 - ops_share) * range(rng, 50, 100) / 100;
    Limits {
        storage_iops: Some(storage.iops * ops_share / 100),
        storage_bps: Some(storage.bps * bytes_share / 100),
        storage_inflight: chance(rng, 30).then_some(depth),
    }
}

/// Requests of `bytes` a second the node can start, storage and caps together.
fn capacity_ops(storage: &Storage, limits: &Limits, bytes: u64) -> u64 {
    let caps = [limits.storage_iops, limits.storage_bps.map(|b| b / bytes.max(1))];
    caps.into_iter().flatten().fold(storage.ops_per_sec(bytes), u64::min)
}

fn flood(rng: &mut Rng, sizes: Sizes, limits: &Limits) -> Workload {
    // A flood must keep requests held at the scheduler, or there is nothing to share: past
    // a queue depth, a few more than the depth do; under rate caps alone, started requests
    // wait in the device's queue instead, and the budget must cover that queue too.
    let depth = match limits.storage_inflight {
        Some(d) => 2 * d + range(rng, 16, 64) as u32,
        None => range(rng, 256, 384) as u32,
    };
    Workload { arrival: Arrival::Flood, sizes, depth, reads_in_10: rng.below(11), writes_in_10: rng.below(11) }
}

fn world(seed: u64, classes: BTreeMap<String, Class>, limits: Limits, storage: Storage) -> World {
    let mut w = World::new(seed, classes, limits, storage, RUN_NS);
    w.meter.from = WARM_NS;
    w.meter.until = RUN_NS;
    w
}

fn per_sec(units: u64) -> f64 {
    units as f64 * SEC as f64 / (RUN_NS - WARM_NS) as f64
}

pub fn run(seed: u64) -> Result<String, String> {
    let mut rng = Rng::seeded(seed ^ 0x5ca1_ab1e);
    let storage = Storage::new(range(&mut rng, 1000, 8000), range(&mut rng, 100 << 20, 1 << 30));
    let limits = contention(&mut rng, &storage);
    let line = match seed % 3 {
        0 => shares(seed, &mut rng, storage, limits),
        1 => reservation(seed, &mut rng, storage, limits),
        _ => limited(seed, &mut rng, storage, limits),
    };
    line.map_err(|e| format!("seed {seed}: {e}"))
}

fn shares(seed: u64, rng: &mut Rng, storage: Storage, limits: Limits) -> Result<String, String> {
    let wa = range(rng, 10, 500) as u32;
    let wb = range(rng, (wa / 8).max(1) as u64, (wa * 8) as u64) as u32;
    let mut classes = BTreeMap::new();
    classes.insert("a".to_string(), Class { weight: wa, ..Class::default() });
    classes.insert("b".to_string(), Class { weight: wb, ..Class::default() });
    let noise = chance(rng, 50);
    if noise {
        let iops = (capacity_ops(&storage, &limits, 4096) / 20).max(1);
        classes.insert("n".to_string(), Class { iops: Some(iops), ..Class::default() });
    }
    let (sa, sb) = (gen::sizes(rng), gen::sizes(rng));
    let (fa, fb) = (flood(rng, sa, &limits), flood(rng, sb, &limits));
    let mut w = world(seed, classes, limits, storage);
    w.add_client("a", 1, fa);
    w.add_client("b", 2, fb);
    if noise {
        w.add_client("n", 3, Workload { arrival: Arrival::Trickle { gap_ns: 200_000 }, ..fa });
    }
    w.run()?;
    let (ga, gb) = (w.meter.get("a").cost as f64, w.meter.get("b").cost as f64);
    let ratio = (ga / gb) / (wa as f64 / wb as f64);
    let line = format!("seed {seed} shares: weights {wa}:{wb}, sizes {sa:?}/{sb:?}, {limits:?}: cost ratio {ratio:.3} of the weights'");
    if (ratio - 1.0).abs() > 0.10 {
        return Err(line);
    }
    Ok(line)
}

fn reservation(seed: u64, rng: &mut Rng, storage: Storage, limits: Limits) -> Result<String, String> {
    let (sizes, bytes) = if chance(rng, 50) { (Sizes::Small, 4096) } else { (Sizes::Large, 1 << 20) };
    let share = range(rng, 10, 50);
    let ops = capacity_ops(&storage, &limits, bytes) * share / 100;
    let dim = if chance(rng, 50) { Dim::Ops } else { Dim::Bytes };
    let r = if dim == Dim::Ops { ops.max(1) } else { (ops * bytes).max(1) };
    let mut reserved = Class { weight: range(rng, 1, 100) as u32, ..Class::default() };
    match dim {
        Dim::Ops => reserved.reservation_iops = Some(r),
        Dim::Bytes => reserved.reservation_bps = Some(r),
    }
    let mut classes = BTreeMap::new();
    classes.insert("r".to_string(), reserved);
    classes.insert("f".to_string(), Class { weight: range(rng, 1000, 10_000) as u32, ..Class::default() });
    let other = gen::sizes(rng);
    let (fr, ff) = (flood(rng, sizes, &limits), flood(rng, other, &limits));
    let mut w = world(seed, classes, limits, storage);
    w.add_client("r", 1, fr);
    w.add_client("f", 2, ff);
    w.run()?;
    let got = per_sec(w.meter.get("r").units(dim, Applies::All));
    let line = format!("seed {seed} reservation: {r} {dim:?}/s ({share}% of capacity), {sizes:?}, {limits:?}: got {:.3} of it", got / r as f64);
    if got < 0.95 * r as f64 {
        return Err(line);
    }
    Ok(line)
}

fn limited(seed: u64, rng: &mut Rng, storage: Storage, limits: Limits) -> Result<String, String> {
    let (sizes, bytes) = if chance(rng, 50) { (Sizes::Small, 4096) } else { (Sizes::Large, 1 << 20) };
    let capacity = capacity_ops(&storage, &limits, bytes);
    // At least 20 requests a second where the storage allows, so that one request is not
    // a large part of what the run measures; at most a fifth of the capacity, so that with
    // as few as half its requests counted the class needs at most 40% of the storage, and
    // its half share by weight (against the flood) lets it reach the limit.
    let ops = (capacity * range(rng, 5, 20) / 100).max(20).min(capacity / 5);
    // Far more weight than the flood beside it: the class must be able to reach its limit
    // whatever its requests cost against the flood's (the weights share cost, and cost counts
    // bytes at 64 KiB an operation where the storage's own ratio is not given).
    let mut class = Class { burst_ns: range(rng, 1, 20) * SEC / 10, weight: range(rng, 500, 1000) as u32, ..Class::default() };
    let (dim, applies, _) = class.limits()[rng.below(6) as usize];
    let rate = if dim == Dim::Ops { ops.max(1) } else { (ops * bytes).max(1) };
    // A bucket that holds less than a request or two loses what it earns while the class's
    // next counted request waits behind another (a read behind the cap, before a limited
    // write): a limit is reached only with room for two of its requests.
    class.burst_ns = class.burst_ns.max(2 * dim.units(bytes) * SEC / rate);
    match (dim, applies) {
        (Dim::Ops, Applies::All) => class.iops = Some(rate),
        (Dim::Bytes, Applies::All) => class.bps = Some(rate),
        (Dim::Ops, Applies::Reads) => class.read_iops = Some(rate),
        (Dim::Ops, Applies::Writes) => class.write_iops = Some(rate),
        (Dim::Bytes, Applies::Reads) => class.read_bps = Some(rate),
        (Dim::Bytes, Applies::Writes) => class.write_bps = Some(rate),
    }
    let mut work = flood(rng, sizes, &limits);
    // At least half the class's requests are of the kind its limit counts.
    match applies {
        Applies::All => {}
        Applies::Reads => work.reads_in_10 = range(rng, 5, 10),
        Applies::Writes => (work.reads_in_10, work.writes_in_10) = (range(rng, 0, 3), 10),
    }
    let burst_ns = class.burst_ns;
    let mut classes = BTreeMap::new();
    classes.insert("l".to_string(), class);
    classes.insert("f".to_string(), Class { weight: range(rng, 1, 10) as u32, ..Class::default() });
    let other = gen::sizes(rng);
    let ff = flood(rng, other, &limits);
    let mut w = world(seed, classes, limits, storage);
    // The whole run: the bucket starts full and a class that cannot spend its burst at once
    // (its share of the storage is less) spends it over several seconds.
    w.meter.from = 0;
    w.add_client("l", 1, work);
    w.add_client("f", 2, ff);
    w.run()?;
    let got = w.meter.get("l").units(dim, applies) as f64;
    let allowed = rate as f64 * (RUN_NS + burst_ns) as f64 / SEC as f64;
    let line = format!(
        "seed {seed} limit: {rate} {dim:?}/s of {applies:?}, burst {burst_ns} ns, {sizes:?}, {limits:?}: ran at {:.3} of it",
        got / allowed
    );
    if (got / allowed - 1.0).abs() > 0.05 {
        return Err(line);
    }
    Ok(line)
}
