//! Elastic RAM exports as Prometheus families: what each holds, what it gave back, and the
//! node's memory as the watcher last read it. Read at scrape time; none without an elastic
//! export.

use prometheus::proto::{MetricFamily, MetricType};

use super::pool::Family;

/// One elastic export now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ElasticSample {
    pub export: String,
    pub held_bytes: u64,
    pub given_back_bytes: u64,
    pub give_backs: u64,
}

/// The elastic exports, and the watcher's last reading (None before its first, or where
/// the kernel does not say).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ElasticState {
    pub exports: Vec<ElasticSample>,
    pub available_bytes: Option<u64>,
    pub pressure_some_avg10: Option<f64>,
}

pub fn elastic_families(state: &ElasticState) -> Vec<MetricFamily> {
    if state.exports.is_empty() {
        return Vec::new();
    }
    let mut held = Family::new("sluice_elastic_held_bytes", "Memory an elastic RAM export holds now (allocated pages).", MetricType::GAUGE);
    let mut given = Family::new("sluice_elastic_given_back_bytes_total", "Bytes of data an elastic RAM export gave back to the node (they read as zeros since).", MetricType::COUNTER);
    let mut events = Family::new("sluice_elastic_give_backs_total", "Times an elastic RAM export gave memory back.", MetricType::COUNTER);
    for s in &state.exports {
        let labels = [("export", s.export.as_str())];
        held.gauge(&labels, s.held_bytes);
        given.counter(&labels, s.given_back_bytes);
        events.counter(&labels, s.give_backs);
    }
    let mut available = Family::new("sluice_elastic_memory_available_bytes", "MemAvailable as the elastic watcher last read it.", MetricType::GAUGE);
    if let Some(a) = state.available_bytes {
        available.gauge(&[], a);
    }
    let mut pressure = Family::new("sluice_elastic_memory_pressure_some_avg10", "PSI memory \"some avg10\" (percent) as the elastic watcher last read it.", MetricType::GAUGE);
    if let Some(p) = state.pressure_some_avg10 {
        pressure.gauge_f64(&[], p);
    }
    [held, given, events, available, pressure].into_iter().map(|f| f.0).filter(|f| !f.get_metric().is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_elastic_export_gets_its_series() {
        let state = ElasticState {
            exports: vec![ElasticSample { export: "ram".into(), held_bytes: 4096, given_back_bytes: 8192, give_backs: 2 }],
            available_bytes: Some(1 << 30),
            pressure_some_avg10: None,
        };
        let mut out = String::new();
        prometheus::TextEncoder::new().encode_utf8(&elastic_families(&state), &mut out).unwrap();
        for line in [
            "sluice_elastic_held_bytes{export=\"ram\"} 4096",
            "sluice_elastic_given_back_bytes_total{export=\"ram\"} 8192",
            "sluice_elastic_give_backs_total{export=\"ram\"} 2",
            "sluice_elastic_memory_available_bytes 1073741824",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        assert!(!out.contains("pressure"), "{out}");
    }

    #[test]
    fn no_elastic_export_no_families() {
        assert!(elastic_families(&ElasticState { available_bytes: Some(1), ..ElasticState::default() }).is_empty());
    }
}
