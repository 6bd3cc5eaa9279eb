//! The workers' buffer pools as Prometheus families: the registered memory mapped now,
//! and how often the pools grew, gave memory back, or had to use the heap.

use std::sync::atomic::Ordering;

use prometheus::proto::{MetricFamily, MetricType};

use super::pool::Family;
use crate::engine::BufferStats;

pub fn families(stats: &BufferStats) -> Vec<MetricFamily> {
    let read = |n: &std::sync::atomic::AtomicU64| n.load(Ordering::Relaxed);
    let rows = [
        ("sluice_buffer_pool_bytes", "I/O buffer memory the workers have mapped (and registered) now.", MetricType::GAUGE, read(&stats.mapped_bytes)),
        ("sluice_buffer_pool_grows_total", "Slabs the workers' buffer pools mapped as load grew.", MetricType::COUNTER, read(&stats.grows)),
        ("sluice_buffer_pool_releases_total", "Slabs given back after their quiet period.", MetricType::COUNTER, read(&stats.releases)),
        ("sluice_buffer_heap_fallbacks_total", "Buffers taken from the heap because a pool was at its budget.", MetricType::COUNTER, read(&stats.heap_fallbacks)),
    ];
    rows.into_iter()
        .map(|(name, help, kind, value)| {
            let mut family = Family::new(name, help, kind);
            match kind {
                MetricType::GAUGE => family.gauge(&[], value),
                _ => family.counter(&[], value),
            }
            family.0
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_figure_is_one_unlabelled_series() {
        let stats = BufferStats::default();
        stats.mapped_bytes.store(4 << 20, Ordering::Relaxed);
        stats.grows.store(3, Ordering::Relaxed);
        stats.releases.store(2, Ordering::Relaxed);
        let mut out = String::new();
        prometheus::TextEncoder::new().encode_utf8(&families(&stats), &mut out).unwrap();
        for line in ["sluice_buffer_pool_bytes 4194304", "sluice_buffer_pool_grows_total 3", "sluice_buffer_pool_releases_total 2", "sluice_buffer_heap_fallbacks_total 0", "# TYPE sluice_buffer_pool_bytes gauge"] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }
}
