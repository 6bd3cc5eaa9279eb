//! Per-request phase timings and counters, shared by every worker thread, and the HTTP
//! endpoint that shows them to Prometheus. Workers only add to relaxed atomics laid out in
//! `Metrics::new`; all formatting happens in `render`, on the scraper's thread.

use std::collections::HashMap;
use std::fmt::{self, Write as _};
use std::io;
use std::net::{SocketAddr, TcpListener};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::{self, JoinHandle};
use std::time::Duration;

/// Upper bound of the smallest histogram bucket. Finer steps would measure the clock, not
/// the request.
const PHASE_BUCKET_SMALLEST_NS: u64 = 1_000;

/// Finite buckets, each bound twice the one before: 1 µs up to 2^24 µs ≈ 16.8 s. A phase
/// longer than that is a stall, and the `+Inf` bucket is enough to show it.
const PHASE_BUCKETS_FINITE_COUNT: usize = 25;

/// Wait before starting a new accept thread after tiny_http's stopped on an error. Such
/// errors (out of file descriptors, say) last a while; retrying faster would only fill the log.
const ACCEPT_RETRY_DELAY_MS: u64 = 1_000;

/// What Prometheus expects for text exposition format 0.0.4.
const EXPOSITION_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// `PHASE_BUCKET_SMALLEST_NS << k` must not overflow a u64 for any bucket (1 µs < 2^10 ns).
const _: () = assert!(PHASE_BUCKETS_FINITE_COUNT < 64 - 10);

/// What a request did, for labels.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Op {
    Read,
    Write,
    Flush,
    Trim,
    WriteZeroes,
    Cache,
    BlockStatus,
}

impl Op {
    /// In declaration order, so `op as usize` indexes it.
    pub const ALL: [Op; 7] = [Op::Read, Op::Write, Op::Flush, Op::Trim, Op::WriteZeroes, Op::Cache, Op::BlockStatus];

    pub fn label(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Flush => "flush",
            Op::Trim => "trim",
            Op::WriteZeroes => "write_zeroes",
            Op::Cache => "cache",
            Op::BlockStatus => "block_status",
        }
    }
}

/// Phases of one request, in nanoseconds:
/// - receive = header decoded -> payload fully received (0 when no payload)
/// - storage = storage I/O submitted -> last storage completion (0 when none)
/// - queue   = reply queued -> reply handed to the socket send
/// - send    = handed to send -> send completed
/// - total   = header decoded -> slot released
#[derive(Clone, Copy, Debug, Default)]
pub struct Phases {
    pub receive_ns: u64,
    pub storage_ns: u64,
    pub queue_ns: u64,
    pub send_ns: u64,
    pub total_ns: u64,
}

/// The `phase` label of each field of `Phases`, in the order `Phases::values` gives them.
const PHASE_LABELS: [&str; 5] = ["receive", "storage", "queue", "send", "total"];

impl Phases {
    fn values(&self) -> [u64; PHASE_LABELS.len()] {
        [self.receive_ns, self.storage_ns, self.queue_ns, self.send_ns, self.total_ns]
    }
}

/// One latency distribution. Buckets are kept apart, not cumulative, so an observation
/// costs one increment; `render` adds them up.
#[derive(Default)]
struct Histogram {
    /// The last one counts values above every finite bound.
    buckets: [AtomicU64; PHASE_BUCKETS_FINITE_COUNT + 1],
    sum_ns: AtomicU64,
}

impl Histogram {
    fn observe(&self, ns: u64) {
        self.buckets[bucket_index(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Bucket k holds values above bound k-1 and at most bound k = 1 µs · 2^k. That is the
/// values whose microseconds, rounded up, are at most 2^k, so k = ceil(log2(µs)), which the
/// leading zeros of µs - 1 give without looking at each bound.
fn bucket_index(ns: u64) -> usize {
    let us = ns.div_ceil(PHASE_BUCKET_SMALLEST_NS);
    let k = (u64::BITS - us.saturating_sub(1).leading_zeros()) as usize;
    k.min(PHASE_BUCKETS_FINITE_COUNT)
}

#[derive(Default)]
struct OpMetrics {
    phases: [Histogram; PHASE_LABELS.len()],
    requests: AtomicU64,
    errors: AtomicU64,
    bytes: AtomicU64,
}

struct ExportMetrics {
    /// The export's name escaped once here, so `render` never re-escapes it.
    label: String,
    ops: [OpMetrics; Op::ALL.len()],
    inflight: AtomicI64,
    connections: AtomicI64,
    connections_total: AtomicU64,
}

/// Counters and phase histograms for every export; `Send + Sync`, shared through an `Arc`.
pub struct Metrics {
    exports: Vec<ExportMetrics>,
    index: HashMap<String, usize>,
    /// `le` values of the finite buckets, formatted once.
    bucket_bounds: Vec<String>,
}

impl Metrics {
    /// Lays out every counter the server will touch. A name given twice gets one set of
    /// counters: two would render duplicate series, which Prometheus rejects.
    pub fn new(export_names: &[String]) -> Arc<Metrics> {
        let mut index = HashMap::new();
        let mut exports = Vec::new();
        for name in export_names {
            if index.contains_key(name) {
                continue;
            }
            index.insert(name.clone(), exports.len());
            exports.push(ExportMetrics {
                label: escape_label_value(name),
                ops: Default::default(),
                inflight: AtomicI64::new(0),
                connections: AtomicI64::new(0),
                connections_total: AtomicU64::new(0),
            });
        }
        let bucket_bounds =
            (0..PHASE_BUCKETS_FINITE_COUNT).map(|k| seconds_text(PHASE_BUCKET_SMALLEST_NS << k)).collect();
        Arc::new(Metrics { exports, index, bucket_bounds })
    }

    /// Index used by the hot-path calls; None for an unknown name.
    pub fn export_index(&self, name: &str) -> Option<usize> {
        self.index.get(name).copied()
    }

    /// One finished request. `bytes` = payload bytes read or written (0 otherwise).
    /// `export` must come from `export_index`; any other value is a bug and panics.
    pub fn record(&self, export: usize, op: Op, phases: &Phases, bytes: u64, ok: bool) {
        let m = &self.exports[export].ops[op as usize];
        for (histogram, ns) in m.phases.iter().zip(phases.values()) {
            histogram.observe(ns);
        }
        m.requests.fetch_add(1, Ordering::Relaxed);
        // Skipped when zero: even an add of nothing takes the cache line from other workers.
        if !ok {
            m.errors.fetch_add(1, Ordering::Relaxed);
        }
        if bytes != 0 {
            m.bytes.fetch_add(bytes, Ordering::Relaxed);
        }
    }

    /// Inflight gauge +1.
    pub fn request_started(&self, export: usize) {
        self.exports[export].inflight.fetch_add(1, Ordering::Relaxed);
    }

    /// Inflight gauge -1.
    pub fn request_finished(&self, export: usize) {
        self.exports[export].inflight.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn connection_opened(&self, export: usize) {
        let e = &self.exports[export];
        e.connections.fetch_add(1, Ordering::Relaxed);
        e.connections_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self, export: usize) {
        self.exports[export].connections.fetch_sub(1, Ordering::Relaxed);
    }

    /// Appends everything in Prometheus text exposition format (version 0.0.4). Every
    /// series is present from the start, zero or not, so rates never see one appear.
    pub fn render(&self, out: &mut String) {
        // Writing to a String cannot fail.
        let _ = self.write_text(out);
    }

    fn write_text(&self, out: &mut String) -> fmt::Result {
        let name = "sluice_request_phase_seconds";
        family_header(out, name, "histogram", "Time each request spent in each phase.")?;
        for e in &self.exports {
            for op in Op::ALL {
                let m = &e.ops[op as usize];
                for (h, phase) in m.phases.iter().zip(PHASE_LABELS) {
                    let labels = format!("export=\"{}\",op=\"{}\",phase=\"{phase}\"", e.label, op.label());
                    // Count and +Inf come from the same reads as the buckets, so they agree
                    // within a scrape even while workers keep recording.
                    let mut cumulative = 0u64;
                    for (bucket, le) in h.buckets.iter().zip(&self.bucket_bounds) {
                        cumulative += bucket.load(Ordering::Relaxed);
                        writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}")?;
                    }
                    cumulative += h.buckets[PHASE_BUCKETS_FINITE_COUNT].load(Ordering::Relaxed);
                    writeln!(out, "{name}_bucket{{{labels},le=\"+Inf\"}} {cumulative}")?;
                    let sum_ns = h.sum_ns.load(Ordering::Relaxed);
                    writeln!(out, "{name}_sum{{{labels}}} {}", seconds_fixed_text(sum_ns))?;
                    writeln!(out, "{name}_count{{{labels}}} {cumulative}")?;
                }
            }
        }

        self.write_per_op(out, "sluice_requests_total", "Requests finished.", |m| &m.requests)?;
        self.write_per_op(out, "sluice_request_errors_total", "Requests finished with an error reply.", |m| &m.errors)?;
        self.write_per_op(out, "sluice_request_bytes_total", "Payload bytes read or written.", |m| &m.bytes)?;

        let help = "Requests received and not yet finished.";
        self.write_per_export(out, "sluice_requests_inflight", "gauge", help, |e| e.inflight.load(Ordering::Relaxed))?;
        let help = "Connections open now.";
        self.write_per_export(out, "sluice_connections", "gauge", help, |e| e.connections.load(Ordering::Relaxed))?;
        self.write_per_export(out, "sluice_connections_total", "counter", "Connections opened.", |e| {
            // A u64 count reaching 2^63 would take centuries of connections.
            e.connections_total.load(Ordering::Relaxed) as i64
        })?;
        Ok(())
    }

    /// A counter family with one series per export and command.
    fn write_per_op(
        &self,
        out: &mut String,
        name: &str,
        help: &str,
        counter: impl Fn(&OpMetrics) -> &AtomicU64,
    ) -> fmt::Result {
        family_header(out, name, "counter", help)?;
        for e in &self.exports {
            for op in Op::ALL {
                let value = counter(&e.ops[op as usize]).load(Ordering::Relaxed);
                writeln!(out, "{name}{{export=\"{}\",op=\"{}\"}} {value}", e.label, op.label())?;
            }
        }
        Ok(())
    }

    /// A family with one series per export.
    fn write_per_export(
        &self,
        out: &mut String,
        name: &str,
        kind: &str,
        help: &str,
        value: impl Fn(&ExportMetrics) -> i64,
    ) -> fmt::Result {
        family_header(out, name, kind, help)?;
        for e in &self.exports {
            writeln!(out, "{name}{{export=\"{}\"}} {}", e.label, value(e))?;
        }
        Ok(())
    }
}

fn family_header(out: &mut String, name: &str, kind: &str, help: &str) -> fmt::Result {
    writeln!(out, "# HELP {name} {help}")?;
    writeln!(out, "# TYPE {name} {kind}")
}

/// Export names come from users; the format allows anything in a label value once
/// backslash, double quote and newline are escaped.
fn escape_label_value(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

/// Nanoseconds as seconds the way Prometheus' own clients write `le` (Go's shortest `%g`):
/// exponent form below 1e-4, so 1 µs is "1e-06" and 128 µs is "0.000128". Works on the
/// decimal digits, so it is exact where going through f64 might not be.
fn seconds_text(ns: u64) -> String {
    if ns == 0 {
        return "0".to_string();
    }
    let mut digits = ns.to_string();
    // The value is digits · 10^exp10.
    let mut exp10 = -9i32;
    while digits.ends_with('0') {
        digits.pop();
        exp10 += 1;
    }
    let len = digits.len() as i32;
    // The power of ten of the leading digit.
    let leading = len - 1 + exp10;
    if !(-4..21).contains(&leading) {
        let (first, rest) = digits.split_at(1);
        let point = if rest.is_empty() { "" } else { "." };
        let sign = if leading < 0 { '-' } else { '+' };
        format!("{first}{point}{rest}e{sign}{:02}", leading.abs())
    } else if exp10 >= 0 {
        format!("{digits}{}", "0".repeat(exp10 as usize))
    } else if len + exp10 > 0 {
        let (whole, fraction) = digits.split_at((len + exp10) as usize);
        format!("{whole}.{fraction}")
    } else {
        format!("0.{}{digits}", "0".repeat(-(len + exp10) as usize))
    }
}

/// Nanoseconds as seconds with all nine decimals, exact for any sum.
fn seconds_fixed_text(ns: u64) -> String {
    format!("{}.{:09}", ns / 1_000_000_000, ns % 1_000_000_000)
}

/// The running `/metrics` endpoint. Dropping it, or `stop()`, closes the socket and joins
/// the thread.
pub struct MetricsServer {
    addr: SocketAddr,
    shared: Arc<Shared>,
    thread: Option<JoinHandle<()>>,
}

struct Shared {
    stopping: AtomicBool,
    /// The tiny_http server the thread receives from; replaced when its accept thread dies.
    current: Mutex<Arc<tiny_http::Server>>,
}

/// Serves GET /metrics (text/plain; version=0.0.4) on `addr` from a background thread;
/// other paths get 404, other methods 405. Binds here, so a bad address is an error at
/// start-up.
///
/// Meant for a trusted scraper: tiny_http gives each client connection a thread and puts no
/// timeout on it, and a client that stops reading a reply stalls this endpoint (and `stop`).
pub fn serve_http(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    let shared = Arc::new(Shared { stopping: AtomicBool::new(false), current: Mutex::new(start_http(&listener)?) });
    let thread = thread::Builder::new().name("sluice-metrics".to_string()).spawn({
        let shared = shared.clone();
        move || serve_loop(&listener, &shared, &metrics)
    })?;
    Ok(MetricsServer { addr, shared, thread: Some(thread) })
}

impl MetricsServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stop(self) {
        // Drop does the work, so a handle that is merely dropped stops too.
        drop(self);
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.shared.stopping.store(true, Ordering::SeqCst);
        lock(&self.shared.current).unblock();
        if let Some(thread) = self.thread.take() {
            // Wakes it if it is waiting to retry accepting.
            thread.thread().unpark();
            // A panic there has already been reported; stopping should not add another.
            let _ = thread.join();
        }
    }
}

/// A mutex only swapped under, so a poisoned one still holds a usable server.
fn lock(current: &Mutex<Arc<tiny_http::Server>>) -> MutexGuard<'_, Arc<tiny_http::Server>> {
    current.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn start_http(listener: &TcpListener) -> io::Result<Arc<tiny_http::Server>> {
    let server = tiny_http::Server::from_listener(listener.try_clone()?, None).map_err(io::Error::other)?;
    Ok(Arc::new(server))
}

fn serve_loop(listener: &TcpListener, shared: &Shared, metrics: &Metrics) {
    let mut server = lock(&shared.current).clone();
    loop {
        // recv fails either because stop() unblocked it or because tiny_http's accept
        // thread hit an error and ended.
        match server.recv() {
            Ok(request) => answer(request, metrics),
            Err(_) if shared.stopping.load(Ordering::SeqCst) => return,
            Err(e) => {
                log::warn!("metrics endpoint: accepting failed: {e}; retrying");
                server = loop {
                    thread::park_timeout(Duration::from_millis(ACCEPT_RETRY_DELAY_MS));
                    if shared.stopping.load(Ordering::SeqCst) {
                        return;
                    }
                    match start_http(listener) {
                        Ok(server) => break server,
                        Err(e) => log::warn!("metrics endpoint: restarting failed: {e}; retrying"),
                    }
                };
                *lock(&shared.current) = server.clone();
                // stop() may have unblocked the old server just before the swap.
                if shared.stopping.load(Ordering::SeqCst) {
                    return;
                }
            }
        }
    }
}

fn answer(request: tiny_http::Request, metrics: &Metrics) {
    let path = request.url().split('?').next().unwrap_or_default();
    let response = if path != "/metrics" {
        tiny_http::Response::from_string("not found\n").with_status_code(404)
    } else if !matches!(request.method(), tiny_http::Method::Get | tiny_http::Method::Head) {
        tiny_http::Response::from_string("method not allowed\n")
            .with_status_code(405)
            .with_header(header("Allow", "GET, HEAD"))
    } else {
        let mut body = String::new();
        metrics.render(&mut body);
        // A known length instead of chunks, so the simplest client can read it.
        tiny_http::Response::from_string(body)
            .with_header(header("Content-Type", EXPOSITION_CONTENT_TYPE))
            .with_chunked_threshold(usize::MAX)
    };
    // A scraper that has gone away is its own problem; the next one is served as usual.
    let _ = request.respond(response);
}

fn header(name: &str, value: &str) -> tiny_http::Header {
    tiny_http::Header::from_bytes(name, value).expect("constant headers are valid ASCII")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};
    use std::net::TcpStream;
    use std::sync::mpsc;
    use std::time::Instant;

    fn names(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
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

    const FAMILIES: [(&str, &str); 7] = [
        ("sluice_request_phase_seconds", "histogram"),
        ("sluice_requests_total", "counter"),
        ("sluice_request_errors_total", "counter"),
        ("sluice_request_bytes_total", "counter"),
        ("sluice_requests_inflight", "gauge"),
        ("sluice_connections", "gauge"),
        ("sluice_connections_total", "counter"),
    ];

    #[test]
    fn op_all_is_in_declaration_order() {
        for (i, op) in Op::ALL.iter().enumerate() {
            assert_eq!(*op as usize, i);
        }
        let labels: Vec<_> = Op::ALL.iter().map(|op| op.label()).collect();
        assert_eq!(labels, ["read", "write", "flush", "trim", "write_zeroes", "cache", "block_status"]);
    }

    #[test]
    fn bucket_index_rounds_up_to_the_next_power_of_two_microseconds() {
        assert_eq!(bucket_index(0), 0);
        assert_eq!(bucket_index(1_000), 0);
        assert_eq!(bucket_index(1_001), 1);
        assert_eq!(bucket_index(2_000), 1);
        assert_eq!(bucket_index(2_001), 2);
        assert_eq!(bucket_index(3_000), 2);
        assert_eq!(bucket_index(4_000), 2);
        assert_eq!(bucket_index(1_000 << 24), 24);
        assert_eq!(bucket_index((1_000 << 24) + 1), PHASE_BUCKETS_FINITE_COUNT);
        assert_eq!(bucket_index(u64::MAX), PHASE_BUCKETS_FINITE_COUNT);
        // Against the definition, for every bound and its neighbours.
        for k in 0..PHASE_BUCKETS_FINITE_COUNT {
            let bound = PHASE_BUCKET_SMALLEST_NS << k;
            for ns in [bound - 1, bound, bound + 1] {
                let expected = (0..PHASE_BUCKETS_FINITE_COUNT)
                    .find(|&j| ns <= PHASE_BUCKET_SMALLEST_NS << j)
                    .unwrap_or(PHASE_BUCKETS_FINITE_COUNT);
                assert_eq!(bucket_index(ns), expected, "{ns} ns");
            }
        }
    }

    #[test]
    fn seconds_text_matches_prometheus_clients() {
        assert_eq!(seconds_text(1_000), "1e-06");
        assert_eq!(seconds_text(2_000), "2e-06");
        assert_eq!(seconds_text(16_000), "1.6e-05");
        assert_eq!(seconds_text(64_000), "6.4e-05");
        assert_eq!(seconds_text(128_000), "0.000128");
        assert_eq!(seconds_text(1_024_000), "0.001024");
        assert_eq!(seconds_text(1_048_576_000), "1.048576");
        assert_eq!(seconds_text(16_777_216_000), "16.777216");
        assert_eq!(seconds_text(1_000_000_000), "1");
        assert_eq!(seconds_text(250_000_000_000), "250");
        assert_eq!(seconds_text(1), "1e-09");
        assert_eq!(seconds_text(u64::MAX), "18446744073.709551615");
        assert_eq!(seconds_fixed_text(6_000), "0.000006000");
        assert_eq!(seconds_fixed_text(12_500_000_001), "12.500000001");
    }

    #[test]
    fn render_has_each_family_once_and_escapes_export_names() {
        let m = Metrics::new(&names(&["", "a\"b\\c\nd", "plain"]));
        let text = rendered(&m);
        for (name, kind) in FAMILIES {
            let help = format!("# HELP {name} ");
            let type_line = format!("# TYPE {name} {kind}");
            assert_eq!(text.lines().filter(|l| l.starts_with(&help)).count(), 1, "{name}");
            assert_eq!(text.lines().filter(|l| *l == type_line).count(), 1, "{name}");
        }
        for line in text.lines() {
            assert!(line.starts_with("# ") || line.starts_with("sluice_"), "stray line {line:?}");
        }
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
    fn duplicate_names_share_one_set_of_series() {
        let m = Metrics::new(&names(&["x", "y", "x"]));
        assert_eq!(m.export_index("x"), Some(0));
        assert_eq!(m.export_index("y"), Some(1));
        assert_eq!(m.export_index("z"), None);
        assert_eq!(rendered(&m).matches("sluice_connections{export=\"x\"}").count(), 1);
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

        let series = |name: &str, extra: &str| format!("{name}{{export=\"disk\",op=\"read\"{extra}}}");
        assert_eq!(value(&text, &series("sluice_requests_total", "")), Some(2.0));
        assert_eq!(value(&text, &series("sluice_request_errors_total", "")), Some(1.0));
        assert_eq!(value(&text, &series("sluice_request_bytes_total", "")), Some(8192.0));
        assert_eq!(value(&text, r#"sluice_requests_total{export="disk",op="flush"}"#), Some(1.0));
        assert_eq!(value(&text, r#"sluice_requests_total{export="",op="read"}"#), Some(0.0));

        let bucket = |phase: &str, le: &str| {
            let labels = format!(",phase=\"{phase}\",le=\"{le}\"");
            value(&text, &series("sluice_request_phase_seconds_bucket", &labels)).unwrap()
        };
        assert_eq!(bucket("receive", "2e-06"), 0.0);
        assert_eq!(bucket("receive", "4e-06"), 2.0);
        assert_eq!(bucket("receive", "8e-06"), 2.0);
        assert_eq!(bucket("queue", "1e-06"), 0.0);
        assert_eq!(bucket("queue", "2e-06"), 2.0);
        assert_eq!(bucket("storage", "1e-06"), 2.0);
        assert_eq!(bucket("send", "4e-06"), 0.0);
        assert_eq!(bucket("send", "8e-06"), 2.0);
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

        // Every histogram: bounds and counts rise, +Inf is last and equals _count.
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
            assert!(sum_line.contains("_sum{"), "{sum_line}");
            let count_line = lines.next().unwrap();
            let count: f64 =
                count_line.strip_prefix(&labels.replace("_bucket{", "_count{")).unwrap()[2..].parse().unwrap();
            assert_eq!(count, previous.1, "{count_line}");
            seen += 1;
        }
        assert_eq!(seen, 2 * Op::ALL.len() * PHASE_LABELS.len());
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

    /// One request over a fresh connection; returns the status code and the whole response.
    fn get(addr: SocketAddr, request_line: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(stream, "{request_line}\r\nHost: test\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, response)
    }

    /// Runs `stop` on another thread so a stop that hangs fails the test instead of hanging it.
    fn returns_promptly(stop: impl FnOnce() + Send + 'static) {
        let (done, finished) = mpsc::channel();
        thread::spawn(move || {
            stop();
            let _ = done.send(());
        });
        finished.recv_timeout(Duration::from_secs(2)).expect("stopping took over 2 s");
    }

    #[test]
    fn http_serves_metrics_and_refuses_the_rest() {
        let metrics = Metrics::new(&names(&["web"]));
        metrics.record(0, Op::Write, &Phases::default(), 512, true);
        let server = serve_http("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);

        let (status, response) = get(addr, "GET /metrics HTTP/1.1");
        assert_eq!(status, 200, "{response}");
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        assert!(head.to_ascii_lowercase().contains("content-type: text/plain; version=0.0.4"), "{head}");
        assert!(body.contains("sluice_request_bytes_total{export=\"web\",op=\"write\"} 512\n"));
        assert!(body.ends_with('\n'));

        assert_eq!(get(addr, "GET /metrics?x=1 HTTP/1.1").0, 200);
        assert_eq!(get(addr, "GET /other HTTP/1.1").0, 404);
        assert_eq!(get(addr, "POST /metrics HTTP/1.1").0, 405);

        // A client speaking nonsense must not take the endpoint down.
        let mut junk = TcpStream::connect(addr).unwrap();
        junk.write_all(b"\x00\xff not http at all\r\n\r\n").unwrap();
        drop(junk);
        assert_eq!(get(addr, "GET /metrics HTTP/1.0").0, 200);

        returns_promptly(move || server.stop());
        // The socket goes away with it (tiny_http's accept thread lets go just after).
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(addr).is_ok() {
            assert!(Instant::now() < deadline, "still listening on {addr} after stop");
            thread::sleep(Duration::from_millis(10));
        }
    }

    #[test]
    fn http_bind_errors_come_back_at_start_up() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let err = serve_http(taken.local_addr().unwrap(), Metrics::new(&[])).err().unwrap();
        assert_eq!(err.kind(), io::ErrorKind::AddrInUse);
    }

    #[test]
    fn dropping_the_handle_stops_the_server() {
        let server = serve_http("127.0.0.1:0".parse().unwrap(), Metrics::new(&[])).unwrap();
        let addr = server.local_addr();
        returns_promptly(move || drop(server));
        let deadline = Instant::now() + Duration::from_secs(5);
        while TcpStream::connect(addr).is_ok() {
            assert!(Instant::now() < deadline, "still listening on {addr} after drop");
            thread::sleep(Duration::from_millis(10));
        }
    }
}
