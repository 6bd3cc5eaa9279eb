//! `sluice info cache:FILE`: the cached volume's counters and members, as `/metrics`
//! shows them for a served one.

use indicatif::HumanBytes;
use serde_json::{json, Value};
use sluice_client::cache::Status;

/// How long `info` waits for members that have not answered yet: they connect in the
/// background, within a round trip on a working network; one that takes longer is shown
/// down (with no failure yet), as it is.
pub const MEMBERS_WAIT_MS: u64 = 2_000;

pub fn print(s: &Status) {
    let c = &s.counters;
    println!("cache block:        {} ({})", s.block_bytes, HumanBytes(s.block_bytes));
    // This process opened the volume for itself: a server's own figures are elsewhere.
    println!("counters:           this command's own, from zero (a served volume's: its server's /metrics)");
    println!("hits:               {} blocks, {} ({:.1}% of blocks read)", c.hits, HumanBytes(c.hit_bytes), c.hit_percent());
    println!("misses:             {} blocks, {}", c.misses, HumanBytes(c.miss_bytes));
    println!("prefetched:         {} used, {} wasted", HumanBytes(c.prefetched_used_bytes), HumanBytes(c.prefetched_wasted_bytes));
    println!("fills:              {} ({} overtaken by writes), {} evictions", c.fills, c.fills_overtaken, c.evictions);
    println!("verify failures:    {}", c.verify_failures);
    println!("member failures:    {}", c.member_failures);
    println!("member trims:       {}", c.member_trims);
    println!("failed writes:      {} (their blocks are not cached again)", c.failed_writes);
    for (i, m) in s.members.iter().enumerate() {
        let state = match (m.up, m.failures) {
            (true, _) => format!("up, {} of {} slots used", m.used, m.slots),
            (false, 0) => "down (not connected yet)".to_string(),
            (false, f) => format!("down ({f} failures in a row; retried with backoff)"),
        };
        println!("member {i}:           {} {state}", m.uri);
    }
}

pub fn json(s: &Status) -> Value {
    let c = &s.counters;
    let members: Vec<Value> =
        s.members.iter().map(|m| json!({"uri": m.uri, "up": m.up, "failures": m.failures, "slots": m.slots, "slots_used": m.used})).collect();
    json!({
        "block_bytes": s.block_bytes,
        "hits": c.hits,
        "misses": c.misses,
        "hit_bytes": c.hit_bytes,
        "miss_bytes": c.miss_bytes,
        "fills": c.fills,
        "fills_overtaken": c.fills_overtaken,
        "prefetched_used_bytes": c.prefetched_used_bytes,
        "prefetched_wasted_bytes": c.prefetched_wasted_bytes,
        "evictions": c.evictions,
        "verify_failures": c.verify_failures,
        "member_failures": c.member_failures,
        "member_trims": c.member_trims,
        "failed_writes": c.failed_writes,
        "members": members,
    })
}
