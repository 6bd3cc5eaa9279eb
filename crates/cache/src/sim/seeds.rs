//! The simulation's seeds, run by `cargo test -p sluice-cache`: `SLUICE_CACHE_SIM_SEEDS=N`
//! runs more, `SLUICE_CACHE_SIM_SEED=N` runs one.

use super::{Knobs, World};
use crate::counters::Counters;

fn seeds(default: u64) -> Vec<u64> {
    let env = |name: &str| std::env::var(name).ok().and_then(|s| s.parse::<u64>().ok());
    match (env("SLUICE_CACHE_SIM_SEED"), env("SLUICE_CACHE_SIM_SEEDS")) {
        (Some(one), _) => vec![one],
        (None, n) => (0..n.unwrap_or(default)).collect(),
    }
}

fn knobs(seed: u64) -> Knobs {
    Knobs {
        steps: 4000,
        depth: 1 + (seed % 8) as usize,
        faults: seed % 4 != 3,
        write_percent: [5, 20, 40][(seed % 3) as usize],
        sequential_percent: 30,
        ample: false,
        force_prefetch: false,
        break_stale_rule: false,
        break_failed_write_rule: false,
        break_verify: false,
        break_generation: false,
        break_identity: false,
        break_pages: false,
        only_torn_hits: false,
    }
}

fn add(total: &mut Counters, c: Counters) {
    total.hits += c.hits;
    total.misses += c.misses;
    total.hit_bytes += c.hit_bytes;
    total.miss_bytes += c.miss_bytes;
    total.hit_reads += c.hit_reads;
    total.hit_read_bytes += c.hit_read_bytes;
    total.fills += c.fills;
    total.prefetched_used_bytes += c.prefetched_used_bytes;
    total.prefetched_wasted_bytes += c.prefetched_wasted_bytes;
    total.evictions += c.evictions;
    total.fills_overtaken += c.fills_overtaken;
    total.verify_failures += c.verify_failures;
    total.member_trims += c.member_trims;
    total.member_failures += c.member_failures;
    total.failed_writes += c.failed_writes;
}

#[test]
fn random_runs_never_read_stale_data() {
    let (mut faulty, mut calm) = (Counters::default(), Counters::default());
    for seed in seeds(150) {
        let mut w = World::new(seed, knobs(seed));
        match w.run() {
            Ok(c) if w.knobs.faults => add(&mut faulty, c),
            Ok(c) => add(&mut calm, c),
            Err(e) => panic!("{}", w.failure(seed, &e)),
        }
    }
    for (name, c) in [("with faults", faulty), ("without faults", calm)] {
        eprintln!("cache sim {name}: hit rate {:.1}% ({} hits, {} misses), {c:?}", c.hit_percent(), c.hits, c.misses);
    }
    assert!(faulty.failed_writes > 0 && calm.failed_writes == 0, "failed writes: {} with faults, {} without", faulty.failed_writes, calm.failed_writes);
}

/// Runs seeds with a rule broken (by `broken`) until one fails: the model must catch it.
fn caught(what: &str, broken: impl Fn(Knobs) -> Knobs) {
    let found = (0..300).find_map(|seed| {
        let mut w = World::new(seed, broken(knobs(seed)));
        w.run().err().map(|e| (seed, e))
    });
    let (seed, e) = found.unwrap_or_else(|| panic!("{what}: went unnoticed in 300 seeds"));
    eprintln!("{what}: caught at seed {seed}: {}", e.lines().next().unwrap_or(""));
}

#[test]
fn breaking_the_stale_fill_rule_is_caught() {
    caught("fills ignore writes under them", |k| Knobs { break_stale_rule: true, ..k });
}

#[test]
fn filling_the_blocks_of_a_failed_write_is_caught() {
    caught("a failed write's blocks filled again", |k| Knobs { break_failed_write_rule: true, ..k });
}

#[test]
fn skipping_the_slot_check_is_caught() {
    caught("slots taken unchecked", |k| Knobs { break_verify: true, ..k });
}

/// A hit's check seeded with the wrong generation or volume refuses the pages its own
/// fill wrote: every hit fails, which a run without faults reports. (Seeding it with none
/// at all, on both sides, would go unnoticed and do no harm: the sums it checks against
/// are the gateway's, of the entry's fill, so only that fill's bytes match; see `slot`.)
#[test]
fn a_wrong_generation_in_the_seed_is_caught() {
    caught("the hit's seed with another generation", |k| Knobs { break_generation: true, ..k });
}

#[test]
fn a_wrong_volume_identity_in_the_seed_is_caught() {
    caught("the hit's seed with another volume", |k| Knobs { break_identity: true, ..k });
}

#[test]
fn skipping_the_page_check_is_caught() {
    caught("a hit's pages past the first not checked", |k| Knobs { break_pages: true, ..k });
}

/// The fault alone: one page of a slot zeroed or replaced by another fill's while a hit
/// reads it, with only the hit's first page checked.
#[test]
fn a_page_changed_under_a_hit_is_caught() {
    caught("a page changed under a hit, pages past the first not checked", |k| Knobs { break_pages: true, only_torn_hits: true, ..k });
}

/// With the page check, the same fault is a miss: the page's check fails and the backing
/// serves the read.
#[test]
fn a_page_changed_under_a_hit_is_a_miss() {
    let mut total = Counters::default();
    for seed in seeds(100) {
        let mut w = World::new(seed, Knobs { only_torn_hits: true, faults: true, ..knobs(seed) });
        add(&mut total, w.run().unwrap_or_else(|e| panic!("{}", w.failure(seed, &e))));
    }
    eprintln!("cache sim, pages changed under a hit: {total:?}");
    assert!(total.verify_failures > 0, "the fault never hit a slot read");
}

/// A hit is one member read of the pages it covers, whole, and nothing else: on warm
/// random reads (up to three blocks long), one read per hit, whole pages, and no more than
/// the partial pages at a read's two edges beyond what it served.
#[test]
fn a_hit_is_one_member_read_of_its_pages() {
    let mut c = Counters::default();
    for seed in 0..10 {
        let k = Knobs { faults: false, write_percent: 0, ample: true, sequential_percent: 0, ..knobs(seed) };
        let mut w = World::new(seed, k);
        add(&mut c, w.run().unwrap_or_else(|e| panic!("{}", w.failure(seed, &e))));
    }
    let page = crate::limits::PAGE_BYTES;
    eprintln!("cache sim, warm random reads: {} bytes read per hit serving {}", c.hit_read_bytes / c.hits, c.hit_bytes / c.hits);
    assert!(c.hits > 0 && c.hit_reads == c.hits, "one member read per hit: {c:?}");
    assert!(c.hit_read_bytes.is_multiple_of(page), "whole pages: {c:?}");
    assert!(c.hit_bytes <= c.hit_read_bytes && c.hit_read_bytes < c.hit_bytes + 2 * page * c.hits, "the pages it serves: {c:?}");
}

/// Hit rates in calm conditions, as a sanity figure: warm random reads over a working set
/// the members hold whole, and cold sequential streams with prefetch.
#[test]
fn calm_runs_hit_and_prefetch() {
    let (mut warm, mut streams) = (Counters::default(), Counters::default());
    for seed in 0..20 {
        let base = Knobs { faults: false, write_percent: 0, ample: true, ..knobs(seed) };
        let mut w = World::new(seed, Knobs { sequential_percent: 0, ..base });
        add(&mut warm, w.run().unwrap_or_else(|e| panic!("{}", w.failure(seed, &e))));
        let mut w = World::new(seed, Knobs { sequential_percent: 100, steps: 300, force_prefetch: true, ..base });
        add(&mut streams, w.run().unwrap_or_else(|e| panic!("{}", w.failure(seed, &e))));
    }
    eprintln!("cache sim, warm random reads: hit rate {:.1}%, {warm:?}", warm.hit_percent());
    eprintln!("cache sim, sequential streams: hit rate {:.1}%, {streams:?}", streams.hit_percent());
    assert!(warm.hit_percent() > 80.0, "a working set the members hold whole should mostly hit");
    assert!(streams.prefetched_used_bytes > 0, "sequential streams should use what prefetch read");
}
