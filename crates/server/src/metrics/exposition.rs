//! The recorder's atomics as Prometheus metric families, through prometheus-client. Each
//! family reads the atomics only when a scrape encodes it: prometheus-client's own counter,
//! histogram and label-keyed family types would put a map lookup or a lock on every request.

use std::fmt;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::Arc;

use prometheus_client::encoding::{EncodeMetric, MetricEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::{Metric, Registry};

use super::{ExportMetrics, Histogram, Op, OpMetrics};
use super::{PHASE_BUCKETS_FINITE_COUNT, PHASE_BUCKET_SMALLEST_NS, PHASE_LABELS};

const NS_PER_SECOND: f64 = 1e9;

/// Every family, in the order a scrape shows them. The registry ends each help text with a
/// full stop, and names a counter's family without the `_total` its samples carry, as
/// OpenMetrics wants; so the samples keep the names they always had.
pub(super) fn registry(exports: &Arc<[ExportMetrics]>) -> Registry {
    let mut r = Registry::default();
    let help = "Time each request spent in each phase";
    r.register("sluice_request_phase_seconds", help, phase_histograms(exports));
    r.register("sluice_requests", "Requests finished", per_op_counter(exports, |m| &m.requests));
    let help = "Requests finished with an error reply";
    r.register("sluice_request_errors", help, per_op_counter(exports, |m| &m.errors));
    r.register("sluice_request_bytes", "Payload bytes read or written", per_op_counter(exports, |m| &m.bytes));
    let help = "Requests received and not yet finished";
    r.register("sluice_requests_inflight", help, per_export_gauge(exports, |e| &e.inflight));
    r.register("sluice_connections", "Connections open now", per_export_gauge(exports, |e| &e.connections));
    // Without `_total` its family has the gauge's name. OpenMetrics forbids that and strict
    // parsers refuse it, but Prometheus stores both; a new name would break the queries
    // that use `sluice_connections_total`.
    r.register("sluice_connections", "Connections opened", per_export_counter(exports, |e| &e.connections_total));
    r
}

/// A family whose series `write` encodes, export by export, from the atomics.
struct Family<F> {
    exports: Arc<[ExportMetrics]>,
    kind: MetricType,
    write: F,
}

impl<F> Family<F>
where
    F: Fn(&ExportMetrics, &mut MetricEncoder) -> fmt::Result + Send + Sync + 'static,
{
    fn new(exports: &Arc<[ExportMetrics]>, kind: MetricType, write: F) -> Family<F> {
        Family { exports: Arc::clone(exports), kind, write }
    }
}

impl<F> EncodeMetric for Family<F>
where
    F: Fn(&ExportMetrics, &mut MetricEncoder) -> fmt::Result,
{
    fn encode(&self, mut encoder: MetricEncoder) -> fmt::Result {
        self.exports.iter().try_for_each(|e| (self.write)(e, &mut encoder))
    }

    fn metric_type(&self) -> MetricType {
        self.kind
    }
}

impl<F> fmt::Debug for Family<F> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Family").field("kind", &self.kind).finish_non_exhaustive()
    }
}

fn phase_histograms(exports: &Arc<[ExportMetrics]>) -> impl Metric {
    Family::new(exports, MetricType::Histogram, |e, encoder| {
        for op in Op::ALL {
            for (histogram, phase) in e.ops[op as usize].phases.iter().zip(PHASE_LABELS) {
                let labels = [("export", e.name.as_str()), ("op", op.label()), ("phase", phase)];
                encode_histogram(histogram, encoder.encode_family(&labels)?)?;
            }
        }
        Ok(())
    })
}

/// The count and the `+Inf` bucket come from the same reads as the other buckets, so they
/// agree within a scrape even while workers keep recording.
fn encode_histogram(h: &Histogram, mut encoder: MetricEncoder) -> fmt::Result {
    let mut buckets = [(0.0, 0); PHASE_BUCKETS_FINITE_COUNT + 1];
    for (k, (slot, bucket)) in buckets.iter_mut().zip(&h.buckets).enumerate() {
        *slot = (bucket_bound_seconds(k), bucket.load(Ordering::Relaxed));
    }
    let count = buckets.iter().map(|&(_, n)| n).sum();
    // Exact up to 2^53 ns (104 days in one phase, summed); past that, off by parts in 10^16.
    let sum = h.sum_ns.load(Ordering::Relaxed) as f64 / NS_PER_SECOND;
    encoder.encode_histogram::<NoLabelSet>(sum, count, &buckets, None)
}

/// The `le` of bucket k: 1 µs · 2^k, and infinity for the last. Dividing two integers
/// exact in f64 gives the double nearest the decimal bound, as parsing its text would.
fn bucket_bound_seconds(k: usize) -> f64 {
    if k < PHASE_BUCKETS_FINITE_COUNT {
        (PHASE_BUCKET_SMALLEST_NS << k) as f64 / NS_PER_SECOND
    } else {
        f64::INFINITY
    }
}

/// A counter with one series per export and command.
fn per_op_counter(exports: &Arc<[ExportMetrics]>, counter: fn(&OpMetrics) -> &AtomicU64) -> impl Metric {
    Family::new(exports, MetricType::Counter, move |e, encoder| {
        for op in Op::ALL {
            let value = counter(&e.ops[op as usize]).load(Ordering::Relaxed);
            let labels = [("export", e.name.as_str()), ("op", op.label())];
            encoder.encode_family(&labels)?.encode_counter::<NoLabelSet, _, u64>(&value, None)?;
        }
        Ok(())
    })
}

fn per_export_counter(exports: &Arc<[ExportMetrics]>, counter: fn(&ExportMetrics) -> &AtomicU64) -> impl Metric {
    Family::new(exports, MetricType::Counter, move |e, encoder| {
        let value = counter(e).load(Ordering::Relaxed);
        encoder.encode_family(&[("export", e.name.as_str())])?.encode_counter::<NoLabelSet, _, u64>(&value, None)
    })
}

fn per_export_gauge(exports: &Arc<[ExportMetrics]>, gauge: fn(&ExportMetrics) -> &AtomicI64) -> impl Metric {
    Family::new(exports, MetricType::Gauge, move |e, encoder| {
        let value = gauge(e).load(Ordering::Relaxed);
        encoder.encode_family(&[("export", e.name.as_str())])?.encode_gauge(&value)
    })
}

#[cfg(test)]
mod tests {
    use super::super::{Metrics, Phases};
    use super::*;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    fn rendered(m: &Metrics) -> String {
        let mut out = String::new();
        m.render(&mut out);
        out
    }

    /// One sample line: its name, its labels (values left escaped) and its value.
    struct Sample<'a> {
        name: &'a str,
        labels: Vec<(&'a str, &'a str)>,
        value: f64,
    }

    impl Sample<'_> {
        fn label(&self, key: &str) -> Option<&str> {
            self.labels.iter().find(|(k, _)| *k == key).map(|&(_, v)| v)
        }

        /// Its labels but `le`, in a fixed order: which histogram a bucket belongs to.
        fn series_labels(&self) -> Vec<(&str, &str)> {
            let mut labels: Vec<_> = self.labels.iter().copied().filter(|(k, _)| *k != "le").collect();
            labels.sort();
            labels
        }
    }

    /// Every sample, in order. Good for the label values these tests use (no `,` or space).
    fn samples(text: &str) -> Vec<Sample<'_>> {
        text.lines()
            .filter(|line| !line.starts_with('#'))
            .map(|line| {
                let (series, value) = line.rsplit_once(' ').unwrap();
                let (name, labels) = match series.split_once('{') {
                    Some((name, labels)) => (name, labels.strip_suffix('}').unwrap()),
                    None => (series, ""),
                };
                let labels = labels
                    .split(',')
                    .filter(|pair| !pair.is_empty())
                    .map(|pair| pair.split_once('=').map(|(k, v)| (k, v.trim_matches('"'))).unwrap())
                    .collect();
                Sample { name, labels, value: value.parse().unwrap() }
            })
            .collect()
    }

    /// The value of the sample with this name and exactly these labels, in any order.
    fn value(text: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
        let mut wanted = labels.to_vec();
        wanted.sort();
        samples(text).into_iter().find_map(|s| {
            let mut have = s.labels.clone();
            have.sort();
            (s.name == name && have == wanted).then_some(s.value)
        })
    }

    /// HELP and TYPE of every family, in order. A counter's family drops `_total`.
    const FAMILIES: [(&str, &str, &str); 7] = [
        ("sluice_request_phase_seconds", "histogram", "Time each request spent in each phase."),
        ("sluice_requests", "counter", "Requests finished."),
        ("sluice_request_errors", "counter", "Requests finished with an error reply."),
        ("sluice_request_bytes", "counter", "Payload bytes read or written."),
        ("sluice_requests_inflight", "gauge", "Requests received and not yet finished."),
        ("sluice_connections", "gauge", "Connections open now."),
        ("sluice_connections", "counter", "Connections opened."),
    ];

    /// The sample names scrapers and dashboards know; these must never change.
    const SAMPLE_NAMES: [&str; 9] = [
        "sluice_request_phase_seconds_bucket",
        "sluice_request_phase_seconds_sum",
        "sluice_request_phase_seconds_count",
        "sluice_requests_total",
        "sluice_request_errors_total",
        "sluice_request_bytes_total",
        "sluice_requests_inflight",
        "sluice_connections",
        "sluice_connections_total",
    ];

    #[test]
    fn render_has_each_family_once_and_escapes_export_names() {
        let m = Metrics::new(&names(&["", "a\"b\\c\nd", "plain"]));
        let text = rendered(&m);
        let headers: Vec<_> = text.lines().filter(|l| l.starts_with("# HELP ") || l.starts_with("# TYPE ")).collect();
        let expected: Vec<_> = FAMILIES
            .iter()
            .flat_map(|(name, kind, help)| [format!("# HELP {name} {help}"), format!("# TYPE {name} {kind}")])
            .collect();
        assert_eq!(headers, expected);
        assert!(text.ends_with("\n# EOF\n"), "OpenMetrics ends with # EOF");
        for line in text.lines() {
            assert!(line.starts_with("# ") || line.starts_with("sluice_"), "stray line {line:?}");
        }
        assert!(text.contains(r#"sluice_connections{export="a\"b\\c\nd"} 0"#));
        assert!(text.contains(r#"sluice_requests_total{export="",op="block_status"} 0"#));
        assert!(text.contains(r#"sluice_request_phase_seconds_count{export="plain",op="trim",phase="queue"} 0"#));
        // Each family's series directly follow its TYPE line, as the format requires.
        let mut current = ("", "");
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("# TYPE ") {
                current = rest.split_once(' ').unwrap();
            } else if !line.starts_with('#') {
                let series = line.split(['{', ' ']).next().unwrap();
                assert!(SAMPLE_NAMES.contains(&series), "{series} is not a known sample name");
                let suffixes: &[&str] = match current.1 {
                    "histogram" => &["_bucket", "_sum", "_count"],
                    "counter" => &["_total"],
                    _ => &[""],
                };
                let family = suffixes.iter().find_map(|s| series.strip_suffix(s));
                assert_eq!(family, Some(current.0), "{line} outside {current:?}");
            }
        }
    }

    #[test]
    fn bucket_bounds_are_the_powers_of_two_microseconds_prometheus_clients_write() {
        let written = ["1e-06", "2e-06", "1.6e-05", "6.4e-05", "0.000128", "0.001024", "1.048576", "16.777216"];
        let ks = [0, 1, 4, 6, 7, 10, 20, 24];
        for (k, text) in ks.into_iter().zip(written) {
            assert_eq!(bucket_bound_seconds(k), text.parse::<f64>().unwrap(), "bucket {k}");
        }
        assert_eq!(bucket_bound_seconds(PHASE_BUCKETS_FINITE_COUNT), f64::INFINITY);
        // And a scrape shows exactly those bounds, ascending, with +Inf last.
        let text = rendered(&Metrics::new(&names(&["x"])));
        let first = samples(&text).into_iter().find(|s| s.name == "sluice_request_phase_seconds_bucket").unwrap();
        let series = first.series_labels();
        let bounds: Vec<f64> = samples(&text)
            .iter()
            .filter(|s| s.name == first.name && s.series_labels() == series)
            .map(|s| s.label("le").unwrap().parse().unwrap())
            .collect();
        let expected: Vec<f64> = (0..=PHASE_BUCKETS_FINITE_COUNT).map(bucket_bound_seconds).collect();
        assert_eq!(bounds, expected);
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
        let text = rendered(&m);

        let read = [("export", "disk"), ("op", "read")];
        assert_eq!(value(&text, "sluice_requests_total", &read), Some(2.0));
        assert_eq!(value(&text, "sluice_request_errors_total", &read), Some(1.0));
        assert_eq!(value(&text, "sluice_request_bytes_total", &read), Some(8192.0));
        assert_eq!(value(&text, "sluice_requests_total", &[("export", "disk"), ("op", "flush")]), Some(1.0));
        assert_eq!(value(&text, "sluice_requests_total", &[("export", ""), ("op", "read")]), Some(0.0));

        let phase_value = |name: &str, phase: &str, le: Option<f64>| {
            let found = samples(&text).into_iter().find(|s| {
                s.name == name
                    && s.series_labels() == [("export", "disk"), ("op", "read"), ("phase", phase)]
                    && s.label("le").map(|le| le.parse::<f64>().unwrap()) == le
            });
            found.map(|s| s.value).unwrap_or_else(|| panic!("no {name} for {phase} at {le:?}"))
        };
        let bucket = |phase: &str, le: f64| phase_value("sluice_request_phase_seconds_bucket", phase, Some(le));
        assert_eq!(bucket("receive", 2e-6), 0.0);
        assert_eq!(bucket("receive", 4e-6), 2.0);
        assert_eq!(bucket("receive", 8e-6), 2.0);
        assert_eq!(bucket("queue", 1e-6), 0.0);
        assert_eq!(bucket("queue", 2e-6), 2.0);
        assert_eq!(bucket("storage", 1e-6), 2.0);
        assert_eq!(bucket("send", 4e-6), 0.0);
        assert_eq!(bucket("send", 8e-6), 2.0);
        assert_eq!(bucket("total", 16.777216), 0.0);
        assert_eq!(bucket("total", f64::INFINITY), 2.0);
        let sum = |phase: &str| phase_value("sluice_request_phase_seconds_sum", phase, None);
        assert_eq!(sum("receive"), 0.000006);
        assert_eq!(sum("total"), 40.0);
        for phase in PHASE_LABELS {
            assert_eq!(phase_value("sluice_request_phase_seconds_count", phase, None), 2.0, "{phase}");
        }
        assert_histograms_are_whole(&text, 2);
    }

    /// Every histogram: bounds and counts rise, +Inf is last and equals _count, _sum is there.
    fn assert_histograms_are_whole(text: &str, exports: usize) {
        let all = samples(text);
        let of = |suffix: &str| format!("sluice_request_phase_seconds_{suffix}");
        let mut seen = Vec::new();
        for s in all.iter().filter(|s| s.name == of("bucket")) {
            let series = s.series_labels();
            if seen.contains(&series) {
                continue;
            }
            let buckets = all.iter().filter(|b| b.name == s.name && b.series_labels() == series);
            let mut previous = (0.0f64, 0.0f64);
            for b in buckets {
                let le: f64 = b.label("le").unwrap().parse().unwrap();
                assert!(le > previous.0 && b.value >= previous.1, "{series:?} at {le}");
                previous = (le, b.value);
            }
            assert_eq!(previous.0, f64::INFINITY, "{series:?} ends with +Inf");
            let count = all.iter().find(|c| c.name == of("count") && c.series_labels() == series).unwrap();
            assert_eq!(count.value, previous.1, "{series:?}");
            assert!(all.iter().any(|c| c.name == of("sum") && c.series_labels() == series), "{series:?}");
            seen.push(series);
        }
        assert_eq!(seen.len(), exports * Op::ALL.len() * PHASE_LABELS.len());
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
        let a = [("export", "a")];
        assert_eq!(value(&text, "sluice_connections", &a), Some(1.0));
        assert_eq!(value(&text, "sluice_connections_total", &a), Some(2.0));
        assert_eq!(value(&text, "sluice_requests_inflight", &a), Some(2.0));
    }
}
