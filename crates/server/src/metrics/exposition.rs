//! The recorder's atomics as Prometheus metric families, through the `prometheus` crate.
//! `Metrics` is a `Collector`: `collect` reads the atomics into `proto::MetricFamily`
//! values when a scrape asks, and the crate's `TextEncoder` writes them in the Prometheus
//! text format 0.0.4. The crate's own counter, histogram and label-keyed vector types would
//! put a hash lookup, a float compare-and-swap loop or a lock on every request.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

use std::sync::{Arc, OnceLock};

use prometheus::core::{Collector, Desc};
use prometheus::proto::{self, MetricFamily, MetricType};
use prometheus::TextEncoder;

use super::recorder::{ExportMetrics, Histogram, Metrics, Op, OpMetrics};
use super::recorder::{PHASE_BUCKETS_FINITE_COUNT, PHASE_BUCKET_SMALLEST_NS, PHASE_LABELS};

const NS_PER_SECOND: f64 = 1e9;

/// Where a family's samples come from, which also fixes its type and labels.
#[derive(Clone, Copy)]
enum Source {
    /// One histogram per export, command and phase.
    PhaseHistograms,
    /// A counter per export and command.
    PerOpCounter(fn(&OpMetrics) -> &AtomicU64),
    PerExportCounter(fn(&ExportMetrics) -> &AtomicU64),
    PerExportGauge(fn(&ExportMetrics) -> &AtomicI64),
}

impl Source {
    fn kind(self) -> MetricType {
        match self {
            Source::PhaseHistograms => MetricType::HISTOGRAM,
            Source::PerOpCounter(_) | Source::PerExportCounter(_) => MetricType::COUNTER,
            Source::PerExportGauge(_) => MetricType::GAUGE,
        }
    }

    /// The labels of each series, in the order they are written; a bucket adds `le`.
    fn label_names(self) -> &'static [&'static str] {
        match self {
            Source::PhaseHistograms => &["export", "op", "phase"],
            Source::PerOpCounter(_) => &["export", "op"],
            Source::PerExportCounter(_) | Source::PerExportGauge(_) => &["export"],
        }
    }
}

struct Family {
    name: &'static str,
    help: &'static str,
    source: Source,
}

/// Every family, in the order a scrape shows them. Counter names keep their `_total`: the
/// 0.0.4 text format names a family exactly as its samples.
const FAMILIES: [Family; 8] = [
    Family {
        name: "sluice_request_phase_seconds",
        help: "Time each request spent in each phase.",
        source: Source::PhaseHistograms,
    },
    Family { name: "sluice_requests_total", help: "Requests finished.", source: Source::PerOpCounter(|m| &m.requests) },
    Family {
        name: "sluice_request_errors_total",
        help: "Requests finished with an error reply.",
        source: Source::PerOpCounter(|m| &m.errors),
    },
    Family {
        name: "sluice_request_bytes_total",
        help: "Payload bytes read or written.",
        source: Source::PerOpCounter(|m| &m.bytes),
    },
    Family {
        name: "sluice_requests_fua_total",
        help: "Requests finished that carried FUA (forced unit access).",
        source: Source::PerOpCounter(|m| &m.fua),
    },
    Family {
        name: "sluice_requests_inflight",
        help: "Requests received and not yet finished.",
        source: Source::PerExportGauge(|e| &e.inflight),
    },
    Family {
        name: "sluice_connections",
        help: "Connections open now.",
        source: Source::PerExportGauge(|e| &e.connections),
    },
    Family {
        name: "sluice_connections_total",
        help: "Connections opened.",
        source: Source::PerExportCounter(|e| &e.connections_total),
    },
];

/// The descriptors `Collector::desc` hands out, one per family in `FAMILIES`, built once.
fn descs() -> &'static [Desc] {
    static DESCS: OnceLock<Vec<Desc>> = OnceLock::new();
    DESCS.get_or_init(|| FAMILIES
        .iter()
        .map(|f| {
            let labels = f.source.label_names().iter().map(|l| l.to_string()).collect();
            Desc::new(f.name.to_string(), f.help.to_string(), labels, HashMap::new())
                .expect("the families' names, help texts and labels are valid")
        })
        .collect())
}

impl Metrics {
    /// Appends everything in Prometheus text exposition format (version 0.0.4). Every series
    /// is present from the start, zero or not, so rates never see one appear.
    pub fn render(&self, out: &mut String) {
        let written = TextEncoder::new().encode_utf8(&self.collect(), out);
        // The encoder refuses only a family without a name or without series, and `collect`
        // gives neither; writing to a String cannot fail.
        debug_assert!(written.is_ok(), "{written:?}");
    }
}

impl Collector for Metrics {
    fn desc(&self) -> Vec<&Desc> {
        descs().iter().collect()
    }

    /// Leaves out a family without series (no exports), which the encoder would refuse.
    /// Pools' families follow; they are built from the pools' state at each scrape, so
    /// `desc` does not list them (no registry is used).
    fn collect(&self) -> Vec<MetricFamily> {
        let exports = self.exports();
        let mut out: Vec<MetricFamily> = FAMILIES
            .iter()
            .map(|family| family.collect(&exports))
            .filter(|family| !family.get_metric().is_empty())
            .collect();
        let names: Vec<&str> = exports.iter().map(|e| e.name.as_str()).collect();
        out.extend(super::watch::families(&self.boards, &names));
        out.extend(super::pool::families(&self.pools.lock().unwrap_or_else(|e| e.into_inner())));
        let caches = Arc::clone(&self.caches.lock().unwrap_or_else(|e| e.into_inner()));
        out.extend(super::cache::families(&caches));
        out.extend(super::buffers::families(&self.buffers));
        out.extend(super::refused::families(&self.refused));
        out.extend(self.qos.get().map(|families| families()).unwrap_or_default());
        out.extend(self.elastic.get().map(|families| families()).unwrap_or_default());
        // The encoder stops at a family without series: whatever a source yields, leave
        // those out rather than lose every family after it.
        out.retain(|family| !family.get_metric().is_empty());
        out
    }
}

impl Family {
    fn collect(&self, exports: &[&ExportMetrics]) -> MetricFamily {
        let mut series = Vec::new();
        let names = self.source.label_names();
        for e in exports {
            match self.source {
                Source::PhaseHistograms => {
                    for op in Op::ALL {
                        for (h, phase) in e.ops[op as usize].phases.iter().zip(PHASE_LABELS) {
                            let mut metric = proto::Metric::from_label(labels(names, [&e.name, op.label(), phase]));
                            metric.set_histogram(histogram(h));
                            series.push(metric);
                        }
                    }
                }
                Source::PerOpCounter(counter) => {
                    for op in Op::ALL {
                        let value = counter(&e.ops[op as usize]).load(Ordering::Relaxed);
                        series.push(counter_metric(labels(names, [&e.name, op.label()]), value));
                    }
                }
                Source::PerExportCounter(counter) => {
                    let value = counter(e).load(Ordering::Relaxed);
                    series.push(counter_metric(labels(names, [&e.name]), value));
                }
                Source::PerExportGauge(gauge) => {
                    let mut value = proto::Gauge::default();
                    value.set_value(gauge(e).load(Ordering::Relaxed) as f64);
                    let mut metric = proto::Metric::from_label(labels(names, [&e.name]));
                    metric.set_gauge(value);
                    series.push(metric);
                }
            }
        }
        let mut family = MetricFamily::default();
        family.set_name(self.name.to_string());
        family.set_help(self.help.to_string());
        family.set_field_type(self.source.kind());
        family.set_metric(series);
        family
    }
}

/// Label pairs from names and values given in the same order. The encoder escapes values.
fn labels<const N: usize>(names: &[&str], values: [&str; N]) -> Vec<proto::LabelPair> {
    debug_assert_eq!(names.len(), N);
    names
        .iter()
        .zip(values)
        .map(|(name, value)| {
            let mut pair = proto::LabelPair::default();
            pair.set_name(name.to_string());
            pair.set_value(value.to_string());
            pair
        })
        .collect()
}

/// Samples are f64 in this format, as in Prometheus itself: a count past 2^53 is rounded.
fn counter_metric(labels: Vec<proto::LabelPair>, value: u64) -> proto::Metric {
    let mut counter = proto::Counter::default();
    counter.set_value(value as f64);
    let mut metric = proto::Metric::from_label(labels);
    metric.set_counter(counter);
    metric
}

/// Finite buckets only: the encoder writes the `+Inf` bucket from the count, which comes
/// from the same reads as the other buckets, so they agree within a scrape even while
/// workers keep recording.
pub(super) fn histogram(h: &Histogram) -> proto::Histogram {
    let mut cumulative = 0u64;
    let buckets = h.buckets[..PHASE_BUCKETS_FINITE_COUNT]
        .iter()
        .enumerate()
        .map(|(k, bucket)| {
            cumulative += bucket.load(Ordering::Relaxed);
            let mut b = proto::Bucket::default();
            b.set_upper_bound(bucket_bound_seconds(k));
            b.set_cumulative_count(cumulative);
            b
        })
        .collect();
    cumulative += h.buckets[PHASE_BUCKETS_FINITE_COUNT].load(Ordering::Relaxed);
    let mut out = proto::Histogram::default();
    out.set_bucket(buckets);
    out.set_sample_count(cumulative);
    // Exact up to 2^53 ns (104 days in one phase, summed); past that, off by parts in 10^16.
    out.set_sample_sum(h.sum_ns.load(Ordering::Relaxed) as f64 / NS_PER_SECOND);
    out
}

/// The `le` of finite bucket k: 1 µs · 2^k. Dividing two integers exact in f64 gives the
/// double nearest the decimal bound, which the encoder writes back as that decimal.
fn bucket_bound_seconds(k: usize) -> f64 {
    (PHASE_BUCKET_SMALLEST_NS << k) as f64 / NS_PER_SECOND
}

#[cfg(test)]
mod tests {
    use super::super::Phases;
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    /// A scrape waiting on a slow cache (up to its 1 s limit) holds up no reload: the
    /// sources are read without the lock held.
    #[test]
    fn a_slow_cache_does_not_hold_up_a_reload() {
        use std::sync::mpsc;
        use std::time::Duration;
        let metrics = Metrics::new(&[]);
        let (started, probing) = mpsc::channel::<()>();
        let (release, released) = mpsc::channel::<()>();
        let released = std::sync::Mutex::new(released);
        let probe: super::super::cache::CacheProbe = Box::new(move || {
            let _ = started.send(());
            let _ = released.lock().unwrap().recv_timeout(Duration::from_secs(30));
            None
        });
        metrics.set_caches(vec![super::super::cache::CacheSource { export: "vol".into(), probe }]);
        let scraper = std::sync::Arc::clone(&metrics);
        let scrape = std::thread::spawn(move || scraper.render(&mut String::new()));
        probing.recv_timeout(Duration::from_secs(10)).expect("the scrape asks the cache");
        let (done, reloaded) = mpsc::channel::<()>();
        let reloader = std::sync::Arc::clone(&metrics);
        let reload = std::thread::spawn(move || {
            reloader.set_caches(Vec::new());
            let _ = done.send(());
        });
        let waited = reloaded.recv_timeout(Duration::from_secs(5));
        let _ = release.send(());
        scrape.join().unwrap();
        reload.join().unwrap();
        assert!(waited.is_ok(), "the reload waited for the scrape's slow cache");
    }

    fn rendered(m: &Metrics) -> String {
        let mut out = String::new();
        m.render(&mut out);
        out
    }

    /// The value of the series written exactly as `series`, if present.
    fn value(text: &str, series: &str) -> Option<f64> {
        text.lines().find_map(|line| line.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
    }

    /// HELP and TYPE lines of every family, in order, as sluice has always written them.
    const HEADERS: [(&str, &str, &str); 8] = [
        ("sluice_request_phase_seconds", "histogram", "Time each request spent in each phase."),
        ("sluice_requests_total", "counter", "Requests finished."),
        ("sluice_request_errors_total", "counter", "Requests finished with an error reply."),
        ("sluice_request_bytes_total", "counter", "Payload bytes read or written."),
        ("sluice_requests_fua_total", "counter", "Requests finished that carried FUA (forced unit access)."),
        ("sluice_requests_inflight", "gauge", "Requests received and not yet finished."),
        ("sluice_connections", "gauge", "Connections open now."),
        ("sluice_connections_total", "counter", "Connections opened."),
    ];

    #[test]
    fn render_has_each_family_once_and_escapes_export_names() {
        let m = Metrics::new(&names(&["", "a\"b\\c\nd", "plain"]));
        let text = rendered(&m);
        // The buffer pools' and refusals' families follow, built at scrape time
        // (metrics/buffers.rs, metrics/refused.rs).
        let headers: Vec<_> = text
            .lines()
            .filter(|l| l.starts_with('#') && !l.contains(" sluice_buffer_") && !l.contains(" sluice_connections_refused_total "))
            .filter(|l| !l.contains(" sluice_requests_slow ") && !l.contains(" sluice_request_oldest_seconds "))
            .collect();
        let expected: Vec<_> = HEADERS
            .iter()
            .flat_map(|(name, kind, help)| [format!("# HELP {name} {help}"), format!("# TYPE {name} {kind}")])
            .collect();
        assert_eq!(headers, expected);
        for line in text.lines() {
            assert!(line.starts_with("# ") || line.starts_with("sluice_"), "stray line {line:?}");
        }
        assert!(text.ends_with("\"} 0\n"), "no trailer after the last sample");
        assert!(text.contains(r#"sluice_connections{export="a\"b\\c\nd"} 0"#));
        assert!(text.contains(r#"sluice_requests_total{export="",op="block_status"} 0"#));
        assert!(text.contains(r#"sluice_request_phase_seconds_count{export="plain",op="trim",phase="queue"} 0"#));
        // Each family's series directly follow its TYPE line, as the format requires.
        let mut current = "";
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split(' ').next().unwrap();
            } else if !line.starts_with('#') {
                let series = line.split(['{', ' ']).next().unwrap();
                let family = series.trim_end_matches("_bucket").trim_end_matches("_sum").trim_end_matches("_count");
                assert!(series == current || family == current, "{line} outside {current}");
            }
        }
    }

    #[test]
    fn no_exports_render_only_the_server_wide_families() {
        let text = rendered(&Metrics::new(&[]));
        let series: Vec<&str> = text.lines().filter(|l| !l.starts_with('#')).collect();
        assert_eq!(series.len(), 8, "{text}");
        let server_wide = |l: &&str| l.starts_with("sluice_buffer_") || l.starts_with("sluice_connections_refused_total{");
        assert!(series.iter().all(server_wide), "{text}");
    }

    #[test]
    fn descriptors_match_the_families() {
        let m = Metrics::new(&names(&["x"]));
        let described: Vec<_> = m.desc().iter().map(|d| (d.fq_name.clone(), d.help.clone())).collect();
        let collected: Vec<_> = m.collect().iter().map(|f| (f.name().to_string(), f.help().to_string())).collect();
        // Families built at scrape time (buffer pools, pools) come after the described ones.
        assert_eq!(described[..], collected[..FAMILIES.len()]);
        let mut ids: Vec<_> = m.desc().iter().map(|d| d.id).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), FAMILIES.len(), "a registry would refuse two descriptors with one name");
    }

    #[test]
    fn bucket_bounds_are_the_powers_of_two_microseconds() {
        let m = Metrics::new(&names(&["x"]));
        let text = rendered(&m);
        let prefix = r#"sluice_request_phase_seconds_bucket{export="x",op="read",phase="receive",le=""#;
        let written: Vec<_> =
            text.lines().filter_map(|l| l.strip_prefix(prefix)?.split_once('"')).map(|(le, _)| le).collect();
        let mut expected: Vec<String> = (0..PHASE_BUCKETS_FINITE_COUNT)
            .map(|k| {
                let ns = PHASE_BUCKET_SMALLEST_NS << k;
                let fraction = format!("{:09}", ns % 1_000_000_000);
                let fraction = fraction.trim_end_matches('0');
                let point = if fraction.is_empty() { "" } else { "." };
                format!("{}{point}{fraction}", ns / 1_000_000_000)
            })
            .collect();
        expected.push("+Inf".to_string());
        assert_eq!(written, expected);
        assert_eq!(written[0], "0.000001");
        assert_eq!(written[24], "16.777216");
    }

    #[test]
    fn record_moves_counters_and_the_right_buckets() {
        let m = Metrics::new(&names(&["", "disk"]));
        let disk = m.export_index("disk").unwrap();
        let phases =
            Phases { receive_ns: 3_000, storage_ns: 0, queue_ns: 2_000, send_ns: 5_000, total_ns: 20_000_000_000 };
        m.record(disk, Op::Read, &phases, 4096, true);
        m.record(disk, Op::Read, &phases, 4096, false);
        m.record(disk, Op::Flush, &Phases::default(), 0, true);
        m.record(disk, Op::Write, &Phases::default(), 512, true);
        m.record_fua(disk, Op::Write);
        let text = rendered(&m);

        let series = |name: &str, extra: &str| format!("{name}{{export=\"disk\",op=\"read\"{extra}}}");
        assert_eq!(value(&text, &series("sluice_requests_total", "")), Some(2.0));
        assert_eq!(value(&text, &series("sluice_request_errors_total", "")), Some(1.0));
        assert_eq!(value(&text, &series("sluice_request_bytes_total", "")), Some(8192.0));
        let bytes = format!("{} 8192\n", series("sluice_request_bytes_total", ""));
        assert!(text.contains(&bytes), "integers are written without a fraction");
        assert_eq!(value(&text, r#"sluice_requests_total{export="disk",op="flush"}"#), Some(1.0));
        assert_eq!(value(&text, r#"sluice_requests_fua_total{export="disk",op="write"}"#), Some(1.0));
        assert_eq!(value(&text, r#"sluice_requests_fua_total{export="disk",op="read"}"#), Some(0.0));
        assert_eq!(value(&text, r#"sluice_requests_total{export="",op="read"}"#), Some(0.0));

        let bucket = |phase: &str, le: &str| {
            let labels = format!(",phase=\"{phase}\",le=\"{le}\"");
            value(&text, &series("sluice_request_phase_seconds_bucket", &labels)).unwrap()
        };
        assert_eq!(bucket("receive", "0.000002"), 0.0);
        assert_eq!(bucket("receive", "0.000004"), 2.0);
        assert_eq!(bucket("receive", "0.000008"), 2.0);
        assert_eq!(bucket("queue", "0.000001"), 0.0);
        assert_eq!(bucket("queue", "0.000002"), 2.0);
        assert_eq!(bucket("storage", "0.000001"), 2.0);
        assert_eq!(bucket("send", "0.000004"), 0.0);
        assert_eq!(bucket("send", "0.000008"), 2.0);
        assert_eq!(bucket("total", "16.777216"), 0.0);
        assert_eq!(bucket("total", "+Inf"), 2.0);
        let sum = |phase: &str| {
            value(&text, &series("sluice_request_phase_seconds_sum", &format!(",phase=\"{phase}\""))).unwrap()
        };
        assert_eq!(sum("receive"), 0.000006);
        assert_eq!(sum("total"), 40.0);
        for phase in PHASE_LABELS {
            let count = series("sluice_request_phase_seconds_count", &format!(",phase=\"{phase}\""));
            assert_eq!(value(&text, &count), Some(2.0), "{phase}");
        }
        assert_histograms_are_whole(&text, 2);
    }

    /// Every histogram: bounds and counts rise, +Inf is last, then _sum, then _count equal
    /// to the +Inf bucket.
    fn assert_histograms_are_whole(text: &str, exports: usize) {
        let mut seen = 0;
        let mut lines = text.lines().peekable();
        while let Some(line) = lines.next() {
            if !line.starts_with("sluice_request_phase_seconds_bucket") {
                continue;
            }
            let (labels, _) = line.split_once(",le=").unwrap();
            let mut previous = (0.0f64, 0.0f64);
            let mut line = line;
            loop {
                let (le, count) = line.split_once(",le=\"").unwrap().1.split_once("\"} ").unwrap();
                let le: f64 = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap() };
                let count: f64 = count.parse().unwrap();
                assert!(le > previous.0 && count >= previous.1, "{line}");
                previous = (le, count);
                if le.is_infinite() {
                    break;
                }
                line = lines.next().unwrap();
                assert!(line.starts_with(labels), "{line}");
            }
            let sum_line = lines.next().unwrap();
            assert!(sum_line.starts_with(&labels.replace("_bucket{", "_sum{")), "{sum_line}");
            let count_line = lines.next().unwrap();
            let count: f64 =
                count_line.strip_prefix(&labels.replace("_bucket{", "_count{")).unwrap()[2..].parse().unwrap();
            assert_eq!(count, previous.1, "{count_line}");
            seen += 1;
        }
        assert_eq!(seen, exports * Op::ALL.len() * PHASE_LABELS.len());
    }

    #[test]
    fn gauges_follow_starts_and_finishes() {
        let m = Metrics::new(&names(&["a"]));
        m.connection_opened(0);
        m.connection_opened(0);
        m.connection_closed(0);
        m.request_started(0);
        m.request_started(0);
        m.request_started(0);
        m.request_finished(0);
        let text = rendered(&m);
        assert_eq!(value(&text, r#"sluice_connections{export="a"}"#), Some(1.0));
        assert_eq!(value(&text, r#"sluice_connections_total{export="a"}"#), Some(2.0));
        assert_eq!(value(&text, r#"sluice_requests_inflight{export="a"}"#), Some(2.0));
    }
}
