//! The recorder: per-request phase timings and counters, shared by every worker thread.
//! Workers only add to relaxed atomics laid out in `Metrics::new`.

use std::collections::HashMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use super::cache::CacheSource;
use super::pool::PoolSource;
use super::watch::{Board, Boards};
use crate::engine::BufferStats;
use crate::limits::METRICS_EXPORTS_ADDED_MAX;

/// Upper bound of the smallest histogram bucket. Finer steps would measure the clock, not
/// the request.
pub(super) const PHASE_BUCKET_SMALLEST_NS: u64 = 1_000;

/// Finite buckets, each bound twice the one before: 1 µs up to 2^24 µs ≈ 16.8 s. A phase
/// longer than that is a stall, and the `+Inf` bucket is enough to show it.
pub(super) const PHASE_BUCKETS_FINITE_COUNT: usize = 25;

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
pub(super) const PHASE_LABELS: [&str; 5] = ["receive", "storage", "queue", "send", "total"];

impl Phases {
    pub(super) fn values(&self) -> [u64; PHASE_LABELS.len()] {
        [self.receive_ns, self.storage_ns, self.queue_ns, self.send_ns, self.total_ns]
    }
}

/// One latency distribution. Buckets are kept apart, not cumulative, so an observation
/// costs one increment; the exposition adds them up.
#[derive(Default)]
pub(super) struct Histogram {
    /// The last one counts values above every finite bound.
    pub(super) buckets: [AtomicU64; PHASE_BUCKETS_FINITE_COUNT + 1],
    pub(super) sum_ns: AtomicU64,
}

impl Histogram {
    pub(super) fn observe(&self, ns: u64) {
        self.buckets[bucket_index(ns)].fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }
}

/// Bucket k holds values above bound k-1 and at most bound k = 1 µs · 2^k. That is the
/// values whose microseconds, rounded up, are at most 2^k, so k = ceil(log2(µs)), which the
/// leading zeros of µs - 1 give without looking at each bound.
pub(super) fn bucket_index(ns: u64) -> usize {
    let us = ns.div_ceil(PHASE_BUCKET_SMALLEST_NS);
    let k = (u64::BITS - us.saturating_sub(1).leading_zeros()) as usize;
    k.min(PHASE_BUCKETS_FINITE_COUNT)
}

#[derive(Default)]
pub(super) struct OpMetrics {
    pub(super) phases: [Histogram; PHASE_LABELS.len()],
    pub(super) requests: AtomicU64,
    pub(super) errors: AtomicU64,
    pub(super) bytes: AtomicU64,
    /// Requests that carried FUA: the client's durability barriers, which a kernel client
    /// sends for O_DSYNC writes and filesystem journal commits.
    pub(super) fua: AtomicU64,
}

pub(super) struct ExportMetrics {
    pub(super) name: String,
    pub(super) ops: [OpMetrics; Op::ALL.len()],
    pub(super) inflight: AtomicI64,
    pub(super) connections: AtomicI64,
    pub(super) connections_total: AtomicU64,
}

/// Counters and phase histograms for every export; `Send + Sync`, shared through an `Arc`.
/// The table has room for exports that a reload adds; a slot, once given to a name, keeps
/// it (an export removed and added again counts on where it left off).
pub struct Metrics {
    exports: Box<[OnceLock<Box<ExportMetrics>>]>,
    index: Mutex<HashMap<String, usize>>,
    /// Pools among the exports, read at scrape time; replaced when a reload changes them.
    pub(super) pools: Mutex<Vec<PoolSource>>,
    /// Cached volumes among the exports, read at scrape time; replaced like the pools. A
    /// scrape takes the list and asks each without the lock held (each may take up to
    /// `REMOTE_STATUS_TIMEOUT_MS`), so a reload never waits for it.
    pub(super) caches: Mutex<Arc<Vec<CacheSource>>>,
    /// What the workers' buffer pools did; each worker's pool adds to it.
    pub buffers: Arc<BufferStats>,
    /// What each worker last saw of requests held at a backend.
    pub(super) boards: Boards,
    /// Connections turned away, by reason.
    pub refused: super::Refusals,
    /// The QoS scheduler's families, built at each scrape (`set_qos`).
    pub(super) qos: OnceLock<Families>,
    /// The elastic RAM exports' families, built at each scrape (`set_elastic`).
    pub(super) elastic: OnceLock<Families>,
}

/// Builds metric families at scrape time.
pub type Families = Box<dyn Fn() -> Vec<prometheus::proto::MetricFamily> + Send + Sync>;

impl Metrics {
    /// Lays out every counter the server will touch. A name given twice gets one set of
    /// counters: two would render duplicate series, which Prometheus rejects.
    pub fn new(export_names: &[String]) -> Arc<Metrics> {
        Metrics::with_pools(export_names, Vec::new())
    }

    /// `new`, and the state of the pools served, shown at every scrape.
    pub fn with_pools(export_names: &[String], pools: Vec<PoolSource>) -> Arc<Metrics> {
        let capacity = export_names.len() + METRICS_EXPORTS_ADDED_MAX;
        let metrics = Metrics {
            exports: (0..capacity).map(|_| OnceLock::new()).collect(),
            index: Mutex::default(),
            pools: Mutex::new(pools),
            caches: Mutex::default(),
            buffers: Arc::default(),
            boards: Boards::new(capacity),
            refused: Default::default(),
            qos: OnceLock::new(),
            elastic: OnceLock::new(),
        };
        for name in export_names {
            metrics.add_export(name).expect("room for the first exports");
        }
        Arc::new(metrics)
    }

    /// Counters for an export that a reload adds (or the ones it had, for a name seen
    /// before); None when the table is full, which only a restart makes room in.
    pub fn add_export(&self, name: &str) -> Option<usize> {
        let mut index = self.index.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(&i) = index.get(name) {
            return Some(i);
        }
        let i = index.len();
        let slot = self.exports.get(i)?;
        let _ = slot.set(Box::new(ExportMetrics {
            name: name.to_owned(),
            ops: Default::default(),
            inflight: AtomicI64::new(0),
            connections: AtomicI64::new(0),
            connections_total: AtomicU64::new(0),
        }));
        index.insert(name.to_owned(), i);
        Some(i)
    }

    /// Every export's counters, in the order the names came.
    pub(super) fn exports(&self) -> Vec<&ExportMetrics> {
        self.exports.iter().map_while(|slot| slot.get().map(|b| &**b)).collect()
    }

    /// Shows what `families` builds at every scrape (the QoS scheduler's classes); the
    /// first one set stays.
    pub fn set_qos(&self, families: Families) {
        let _ = self.qos.set(families);
    }

    /// Shows what `families` builds at every scrape (the elastic RAM exports); the first
    /// one set stays.
    pub fn set_elastic(&self, families: Families) {
        let _ = self.elastic.set(families);
    }

    /// Replaces the pools shown at each scrape (a reload added or removed some).
    pub fn set_pools(&self, pools: Vec<PoolSource>) {
        *self.pools.lock().unwrap_or_else(|e| e.into_inner()) = pools;
    }

    /// Replaces the cached volumes shown at each scrape.
    pub fn set_caches(&self, caches: Vec<CacheSource>) {
        *self.caches.lock().unwrap_or_else(|e| e.into_inner()) = Arc::new(caches);
    }

    fn export(&self, export: usize) -> &ExportMetrics {
        self.exports[export].get().expect("an index from export_index")
    }

    /// A worker's board for what it sees of requests held at a backend.
    pub fn board(&self) -> Arc<Board> {
        self.boards.board()
    }

    /// Index used by the hot-path calls; None for an unknown name.
    pub fn export_index(&self, name: &str) -> Option<usize> {
        self.index.lock().unwrap_or_else(|e| e.into_inner()).get(name).copied()
    }

    /// One finished request. `bytes` = payload bytes read or written (0 otherwise).
    /// `export` must come from `export_index`; any other value is a bug and panics.
    pub fn record(&self, export: usize, op: Op, phases: &Phases, bytes: u64, ok: bool) {
        let m = &self.export(export).ops[op as usize];
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

    /// One finished request carried FUA (counted beside `record`, which counts it too).
    pub fn record_fua(&self, export: usize, op: Op) {
        self.export(export).ops[op as usize].fua.fetch_add(1, Ordering::Relaxed);
    }

    /// Inflight gauge +1.
    pub fn request_started(&self, export: usize) {
        self.export(export).inflight.fetch_add(1, Ordering::Relaxed);
    }

    /// Inflight gauge -1.
    pub fn request_finished(&self, export: usize) {
        self.export(export).inflight.fetch_sub(1, Ordering::Relaxed);
    }

    pub fn connection_opened(&self, export: usize) {
        let e = self.export(export);
        e.connections.fetch_add(1, Ordering::Relaxed);
        e.connections_total.fetch_add(1, Ordering::Relaxed);
    }

    pub fn connection_closed(&self, export: usize) {
        self.export(export).connections.fetch_sub(1, Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
    fn duplicate_names_share_one_set_of_series() {
        let m = Metrics::new(&["x".to_string(), "y".to_string(), "x".to_string()]);
        assert_eq!(m.export_index("x"), Some(0));
        assert_eq!(m.export_index("y"), Some(1));
        assert_eq!(m.export_index("z"), None);
        let mut text = String::new();
        m.render(&mut text);
        assert_eq!(text.matches("sluice_connections{export=\"x\"}").count(), 1);
    }
}
