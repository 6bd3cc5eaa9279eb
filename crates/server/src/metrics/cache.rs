//! The state of cached volumes (`cache:FILE`) that the server serves, as Prometheus
//! families: hits and misses, the bytes each served, prefetch used and wasted, fills,
//! evictions, slots that failed their check, and each member's state and slots.
//! Read from the cache's task at scrape time.

use prometheus::proto::{MetricFamily, MetricType};

use sluice_client::cache::Status;

use super::pool::Family;

/// Asks a cached volume for its state now (`None` once it is gone).
pub type CacheProbe = Box<dyn Fn() -> Option<Status> + Send + Sync>;

/// A served cached volume: the export's name and how to read its state.
pub struct CacheSource {
    pub export: String,
    pub probe: CacheProbe,
}

/// The volume-wide counters: name, help, and which counter.
type Counted = (&'static str, &'static str, fn(&sluice_client::cache::Counters) -> u64);

const COUNTERS: [Counted; 14] = [
    ("sluice_cache_hits_total", "Blocks a read found in a member's RAM and verified.", |c| c.hits),
    ("sluice_cache_misses_total", "Blocks a read went to the backing for (not cached, or failed the check).", |c| c.misses),
    ("sluice_cache_hit_bytes_total", "Bytes of client reads served from the members.", |c| c.hit_bytes),
    ("sluice_cache_miss_bytes_total", "Bytes of client reads served from the backing.", |c| c.miss_bytes),
    ("sluice_cache_hit_read_bytes_total", "Bytes hits read from the members: the pages the reads needed, whole.", |c| c.hit_read_bytes),
    ("sluice_cache_fills_total", "Blocks written to a member slot and made readable.", |c| c.fills),
    ("sluice_cache_prefetched_used_bytes_total", "Bytes brought in by prefetch or NBD_CMD_CACHE that a read then used.", |c| c.prefetched_used_bytes),
    ("sluice_cache_prefetched_wasted_bytes_total", "Bytes brought in by prefetch or NBD_CMD_CACHE that left the cache unread.", |c| c.prefetched_wasted_bytes),
    ("sluice_cache_fills_overtaken_total", "Fills dropped because a write to their block started while they were in flight.", |c| c.fills_overtaken),
    ("sluice_cache_evictions_total", "Blocks pushed out of their slot to make room.", |c| c.evictions),
    ("sluice_cache_verify_failures_total", "Slots read back that failed their check (dropped pages, a restarted member), read from the backing instead.", |c| c.verify_failures),
    ("sluice_cache_member_trims_total", "Slots dropped without reuse (invalidated, or written by an overtaken fill) that their member was asked to trim.", |c| c.member_trims),
    ("sluice_cache_member_failures_total", "Times a member was marked down (a failed operation or a timeout).", |c| c.member_failures),
    ("sluice_cache_failed_writes_total", "Writes the backing failed; the blocks they touched are read from the backing from then on.", |c| c.failed_writes),
];

/// The families for every cached volume that answers; none when none is served.
pub fn families(caches: &[CacheSource]) -> Vec<MetricFamily> {
    let statuses: Vec<(&str, Status)> = caches.iter().filter_map(|c| (c.probe)().map(|s| (c.export.as_str(), s))).collect();
    if statuses.is_empty() {
        return Vec::new();
    }
    let mut counted: Vec<Family> = COUNTERS.iter().map(|(name, help, _)| Family::new(name, help, MetricType::COUNTER)).collect();
    let mut up = Family::new("sluice_cache_member_up", "1 while a member lends its RAM to the cache, 0 while it is down (and retried with backoff).", MetricType::GAUGE);
    let mut slots = Family::new("sluice_cache_member_slots", "Slots a member lends (its size over the slot size); 0 while down.", MetricType::GAUGE);
    let mut used = Family::new("sluice_cache_member_slots_used", "A member's slots that hold a block.", MetricType::GAUGE);
    let mut block = Family::new("sluice_cache_block_bytes", "The cache block.", MetricType::GAUGE);
    for (export, s) in &statuses {
        for (family, (_, _, value)) in counted.iter_mut().zip(COUNTERS.iter()) {
            family.counter(&[("export", export)], value(&s.counters));
        }
        block.gauge(&[("export", export)], s.block_bytes);
        for (i, m) in s.members.iter().enumerate() {
            let index = i.to_string();
            let labels = [("export", *export), ("member", index.as_str()), ("uri", m.uri.as_str())];
            up.gauge(&labels, m.up as u64);
            slots.gauge(&labels, m.slots);
            used.gauge(&labels, m.used);
        }
    }
    // A family with no series is left out: the encoder refuses one, and would stop the
    // whole exposition there.
    counted.into_iter().chain([up, slots, used, block]).map(|f| f.0).filter(|f| !f.get_metric().is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_client::cache::{Counters, MemberStatus};

    fn sample(members: Vec<MemberStatus>) -> Status {
        let counters = Counters { hits: 7, misses: 3, hit_bytes: 7 << 16, hit_read_bytes: 7 << 17, verify_failures: 2, ..Counters::default() };
        Status { block_bytes: 65536, counters, members }
    }

    fn render(caches: &[CacheSource]) -> String {
        let mut out = String::new();
        prometheus::TextEncoder::new().encode_utf8(&families(caches), &mut out).expect("every family has series");
        out
    }

    #[test]
    fn a_cache_shows_its_counters_and_members() {
        let members = vec![
            MemberStatus { uri: "nbd://a/ram".into(), up: true, failures: 0, slots: 100, used: 9 },
            MemberStatus { uri: "nbd://b/ram".into(), up: false, failures: 3, slots: 0, used: 0 },
        ];
        let caches = vec![CacheSource { export: "vol".into(), probe: Box::new(move || Some(sample(members.clone()))) }];
        let out = render(&caches);
        for line in [
            r#"sluice_cache_hits_total{export="vol"} 7"#,
            r#"sluice_cache_misses_total{export="vol"} 3"#,
            r#"sluice_cache_hit_bytes_total{export="vol"} 458752"#,
            r#"sluice_cache_hit_read_bytes_total{export="vol"} 917504"#,
            r#"sluice_cache_verify_failures_total{export="vol"} 2"#,
            r#"sluice_cache_evictions_total{export="vol"} 0"#,
            r#"sluice_cache_member_up{export="vol",member="0",uri="nbd://a/ram"} 1"#,
            r#"sluice_cache_member_up{export="vol",member="1",uri="nbd://b/ram"} 0"#,
            r#"sluice_cache_member_slots_used{export="vol",member="0",uri="nbd://a/ram"} 9"#,
            r#"sluice_cache_block_bytes{export="vol"} 65536"#,
        ] {
            assert!(out.contains(line), "{line} missing from\n{out}");
        }
    }

    /// A cache without members has no member series: those families are left out, and
    /// the ones after them still come.
    #[test]
    fn no_members_no_member_families() {
        let caches = vec![CacheSource { export: "vol".into(), probe: Box::new(|| Some(sample(Vec::new()))) }];
        let out = render(&caches);
        assert!(!out.contains("sluice_cache_member_up") && out.contains(r#"sluice_cache_block_bytes{export="vol"} 65536"#), "{out}");
    }

    #[test]
    fn no_cache_no_families() {
        let gone = vec![CacheSource { export: "vol".into(), probe: Box::new(|| None) }];
        assert!(families(&gone).is_empty() && families(&[]).is_empty());
    }
}
