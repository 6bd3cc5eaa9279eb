//! The QoS scheduler per class, as Prometheus families: requests held now and the tightest
//! limit's tokens (read from the scheduler at scrape time), requests and bytes started
//! (whose `rate()` is the class's current rate), and how long requests were held.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use prometheus::proto::{self, MetricFamily, MetricType};

use super::exposition::histogram;
use super::pool::Family;
use super::recorder::Histogram;

/// What the scheduler says of one class now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct QosSample {
    pub class: String,
    pub held: u64,
    /// Whole tokens in its tightest limit, the lowest over its instances (None: no limit).
    pub tokens: Option<i64>,
}

/// Counters of one class, added to by the workers.
#[derive(Default)]
pub struct QosClassRecorder {
    started: AtomicU64,
    started_bytes: AtomicU64,
    held: Histogram,
}

impl QosClassRecorder {
    /// A request went to the storage; `released` for one that was held first.
    pub fn started(&self, bytes: u64) {
        self.started.fetch_add(1, Ordering::Relaxed);
        self.started_bytes.fetch_add(bytes, Ordering::Relaxed);
    }

    pub fn released(&self, held_ns: u64, bytes: u64) {
        self.held.observe(held_ns);
        self.started(bytes);
    }
}

/// Every class's counters, made when a connection of the class first attaches.
#[derive(Default)]
pub struct QosRecorder {
    classes: Mutex<BTreeMap<String, Arc<QosClassRecorder>>>,
}

impl QosRecorder {
    pub fn class(&self, name: &str) -> Arc<QosClassRecorder> {
        let mut classes = self.classes.lock().unwrap_or_else(|e| e.into_inner());
        Arc::clone(classes.entry(name.to_owned()).or_default())
    }
}

/// The families, from the recorder and what the scheduler says now (`samples`); those
/// without series (no class seen yet) are left out, as the encoder would stop at them.
pub fn qos_families(recorder: &QosRecorder, samples: &[QosSample]) -> Vec<MetricFamily> {
    let mut held = Family::new("sluice_qos_held_requests", "Requests the QoS scheduler holds now, before the storage.", MetricType::GAUGE);
    let mut tokens = Family::new("sluice_qos_tokens", "Whole tokens left in the class's tightest limit (lowest over its clients); negative: in debt.", MetricType::GAUGE);
    for s in samples {
        held.gauge(&[("class", &s.class)], s.held);
        if let Some(t) = s.tokens {
            tokens.gauge_f64(&[("class", &s.class)], t as f64);
        }
    }
    let mut started = Family::new("sluice_qos_started_requests_total", "Requests the class sent to the storage; rate() is its current rate.", MetricType::COUNTER);
    let mut bytes = Family::new("sluice_qos_started_bytes_total", "Payload bytes of those requests.", MetricType::COUNTER);
    let mut times = Family::new("sluice_qos_held_seconds", "How long held requests waited in the scheduler.", MetricType::HISTOGRAM);
    for (name, c) in recorder.classes.lock().unwrap_or_else(|e| e.into_inner()).iter() {
        started.counter(&[("class", name)], c.started.load(Ordering::Relaxed));
        bytes.counter(&[("class", name)], c.started_bytes.load(Ordering::Relaxed));
        let mut pair = proto::LabelPair::default();
        pair.set_name("class".into());
        pair.set_value(name.clone());
        let mut metric = proto::Metric::from_label(vec![pair]);
        metric.set_histogram(histogram(&c.held));
        times.0.mut_metric().push(metric);
    }
    [held, tokens, started, bytes, times].into_iter().map(|f| f.0).filter(|f| !f.get_metric().is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(r: &QosRecorder) -> String {
        let mut out = String::new();
        let samples = [QosSample { class: "gold".into(), held: 2, tokens: Some(-1) }, QosSample { class: "default".into(), held: 0, tokens: None }];
        prometheus::TextEncoder::new().encode_utf8(&qos_families(r, &samples), &mut out).unwrap();
        out
    }

    #[test]
    fn nothing_configured_gives_no_family() {
        assert!(qos_families(&QosRecorder::default(), &[]).is_empty());
    }

    #[test]
    fn each_class_gets_its_series() {
        let r = QosRecorder::default();
        r.class("gold").released(3_000, 4096);
        r.class("gold").started(512);
        let out = render(&r);
        for line in [
            "sluice_qos_held_requests{class=\"gold\"} 2",
            "sluice_qos_held_requests{class=\"default\"} 0",
            "sluice_qos_tokens{class=\"gold\"} -1",
            "sluice_qos_started_requests_total{class=\"gold\"} 2",
            "sluice_qos_started_bytes_total{class=\"gold\"} 4608",
            "sluice_qos_held_seconds_count{class=\"gold\"} 1",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
        assert!(!out.contains("sluice_qos_tokens{class=\"default\"}"));
    }
}
