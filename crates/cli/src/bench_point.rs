//! One point of the sweep: `depth` workers on the shared client, each with one request in
//! flight at a time and one buffer it reuses, for the warm-up and then the measured time.
//! Each worker keeps its own latency histogram; they are merged at the end, so the hot loop
//! shares nothing but the sequential cursor.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use sluice_client::Client;

use crate::bench_result::{Op, Pattern, PointResult};

/// What to measure.
#[derive(Clone, Debug)]
pub struct Point {
    pub op: Op,
    pub pattern: Pattern,
    pub size: u64,
    pub depth: u32,
    /// The region requests fall in: `offset .. offset + span`.
    pub offset: u64,
    pub span: u64,
    pub runtime: Duration,
    pub warmup: Duration,
    pub seed: u64,
}

/// State the workers of one point share.
struct Shared {
    /// Next request slot of the sequential pattern, counted from the start of the region.
    cursor: AtomicU64,
    /// Requests completed inside the measured window, by all workers.
    completed: AtomicU64,
    /// Set by the first worker that fails, so the others stop too.
    failed: AtomicBool,
    /// What failed first: later failures are often its consequences (a closed connection).
    first_error: Mutex<Option<String>>,
}

#[derive(Clone, Copy)]
struct Window {
    measure_from: Instant,
    stop_at: Instant,
}

struct WorkerResult {
    latency: Histogram,
    last_completion: Option<Instant>,
}

/// Runs one point. `Ok(None)` when `interrupted` was set while it ran; `Err` names the
/// first request that failed.
pub async fn run(client: &Client, point: &Point, interrupted: &Arc<AtomicBool>) -> Result<Option<PointResult>, String> {
    debug_assert!(point.size > 0 && point.size <= point.span);
    let shared = Arc::new(Shared {
        cursor: AtomicU64::new(0),
        completed: AtomicU64::new(0),
        failed: AtomicBool::new(false),
        first_error: Mutex::new(None),
    });
    let start = Instant::now();
    let measure_from = start + point.warmup;
    let window = Window { measure_from, stop_at: measure_from + point.runtime };
    let workers: Vec<_> = (0..point.depth)
        .map(|i| {
            let (client, point, shared, window, interrupted) = (client.clone(), point.clone(), shared.clone(), window, interrupted.clone());
            tokio::spawn(async move { worker(client, point, i, shared, window, interrupted).await })
        })
        .collect();

    let mut latency = Histogram::new();
    let mut last_completion = window.stop_at;
    let mut error = None;
    for w in workers {
        match w.await {
            Ok(Some(r)) => {
                latency.merge(&r.latency);
                if let Some(t) = r.last_completion {
                    last_completion = last_completion.max(t);
                }
            }
            Ok(None) => {}
            Err(e) => {
                error.get_or_insert(format!("a worker failed: {e}"));
            }
        }
    }
    if let Some(m) = shared.first_error.lock().unwrap().take().or(error) {
        return Err(m);
    }
    if interrupted.load(Ordering::Relaxed) {
        return Ok(None);
    }
    let us = |ns: f64| ns / 1000.0;
    Ok(Some(PointResult {
        op: point.op,
        pattern: point.pattern,
        size: point.size,
        depth: point.depth,
        connections: client.connections(),
        // Normally exactly the runtime; longer only when no request finished within it.
        seconds: (last_completion - window.measure_from).as_secs_f64(),
        ios: latency.count(),
        bytes: latency.count() * point.size,
        lat_mean_us: us(latency.mean_ns()),
        lat_p50_us: us(latency.quantile_ns(0.50) as f64),
        lat_p99_us: us(latency.quantile_ns(0.99) as f64),
        lat_max_us: us(latency.max_ns() as f64),
    }))
}

/// Issues requests one after another until the window closes. A request counts when it
/// completes inside the window; if none has by the end, the window stretches to the first
/// completion, so a very slow point still gives one sample instead of nothing. `None`
/// after a failed request, which is then in `shared.first_error`.
async fn worker(
    client: Client,
    point: Point,
    index: u32,
    shared: Arc<Shared>,
    window: Window,
    interrupted: Arc<AtomicBool>,
) -> Option<WorkerResult> {
    let slots = point.span / point.size;
    let mut rng = Rng::new(point.seed ^ (u64::from(index) + 1).wrapping_mul(0xbf58_476d_1ce4_e5b9));
    let mut buf = vec![0u8; point.size as usize];
    if point.op == Op::Write {
        // Not zeros and not compressible: a server may treat either specially.
        fill_pattern(&mut buf, &mut rng);
    }
    let mut latency = Histogram::new();
    let mut last_completion = None;
    loop {
        if shared.failed.load(Ordering::Relaxed) || interrupted.load(Ordering::Relaxed) {
            break;
        }
        let issued = Instant::now();
        if issued >= window.stop_at && shared.completed.load(Ordering::Relaxed) > 0 {
            break;
        }
        let slot = match point.pattern {
            Pattern::Seq => shared.cursor.fetch_add(1, Ordering::Relaxed) % slots,
            Pattern::Rand => rng.next() % slots,
        };
        let offset = point.offset + slot * point.size;
        let result = match point.op {
            Op::Read => client.read_owned(offset, std::mem::take(&mut buf)).await.map(|b| buf = b),
            Op::Write => client.write(offset, &buf, false).await,
        };
        let done = Instant::now();
        if let Err(e) = result {
            shared
                .first_error
                .lock()
                .unwrap()
                .get_or_insert_with(|| format!("{} of {} bytes at offset {offset}: {e}", point.op.name(), point.size));
            shared.failed.store(true, Ordering::Relaxed);
            return None;
        }
        if done >= window.measure_from && (done <= window.stop_at || shared.completed.load(Ordering::Relaxed) == 0) {
            latency.record((done - issued).as_nanos().min(u64::MAX as u128) as u64);
            shared.completed.fetch_add(1, Ordering::Relaxed);
            last_completion = Some(done);
        }
    }
    Some(WorkerResult { latency, last_completion })
}

fn fill_pattern(buf: &mut [u8], rng: &mut Rng) {
    for chunk in buf.chunks_mut(8) {
        let bytes = rng.next().to_le_bytes();
        for (d, s) in chunk.iter_mut().zip(bytes) {
            *d = if s == 0 { 0xa5 } else { s };
        }
    }
}

/// xorshift64*: fast, and the same seed gives the same offsets.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        // splitmix64 once, so nearby seeds give unrelated streams; never zero.
        let mut z = seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        Rng((z ^ (z >> 31)) | 1)
    }

    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// Log-linear latency histogram in nanoseconds: values below 16 exactly, above that 16
/// buckets per power of two, so a reported quantile is within 1/32 (about 3 %) of the true
/// one. Fixed size, no allocation per sample.
pub struct Histogram {
    buckets: Vec<u64>,
    count: u64,
    sum_ns: u128,
    max_ns: u64,
}

/// Sub-buckets per power of two, as a power of two.
const SUB_BITS: u32 = 4;
const SUB: u64 = 1 << SUB_BITS;
const BUCKETS: usize = (SUB + (64 - SUB_BITS as u64) * SUB) as usize;

impl Histogram {
    pub fn new() -> Histogram {
        Histogram { buckets: vec![0; BUCKETS], count: 0, sum_ns: 0, max_ns: 0 }
    }

    fn index(ns: u64) -> usize {
        if ns < SUB {
            return ns as usize;
        }
        let msb = 63 - ns.leading_zeros();
        let shift = msb - SUB_BITS;
        let sub = (ns >> shift) - SUB;
        (SUB + u64::from(shift) * SUB + sub) as usize
    }

    /// The middle of bucket `i`.
    fn value(i: usize) -> u64 {
        let i = i as u64;
        if i < SUB {
            return i;
        }
        let shift = (i - SUB) / SUB;
        let sub = (i - SUB) % SUB;
        let low = (SUB + sub) << shift;
        low + (1u64 << shift) / 2
    }

    pub fn record(&mut self, ns: u64) {
        self.buckets[Self::index(ns)] += 1;
        self.count += 1;
        self.sum_ns += u128::from(ns);
        self.max_ns = self.max_ns.max(ns);
    }

    pub fn merge(&mut self, other: &Histogram) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
        self.max_ns = self.max_ns.max(other.max_ns);
    }

    pub fn count(&self) -> u64 {
        self.count
    }

    pub fn mean_ns(&self) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        self.sum_ns as f64 / self.count as f64
    }

    pub fn max_ns(&self) -> u64 {
        self.max_ns
    }

    /// The value below which a fraction `q` of the samples lie (0 when empty), never more
    /// than the largest sample.
    pub fn quantile_ns(&self, q: f64) -> u64 {
        if self.count == 0 {
            return 0;
        }
        let rank = ((q * self.count as f64).ceil() as u64).clamp(1, self.count);
        let mut seen = 0;
        for (i, &n) in self.buckets.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return Self::value(i).min(self.max_ns);
            }
        }
        unreachable!("the buckets hold count samples")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_value_lands_in_a_bucket_whose_middle_is_close() {
        for ns in (0..20_000u64).chain([1 << 20, 123_456_789, u64::MAX / 3, u64::MAX]) {
            let i = Histogram::index(ns);
            assert!(i < BUCKETS, "{ns} -> {i}");
            let v = Histogram::value(i);
            let err = v.abs_diff(ns) as f64;
            assert!(err <= (ns as f64 / 32.0).max(0.0) + 0.5, "{ns} -> bucket {i} value {v}");
        }
    }

    #[test]
    fn quantiles_of_a_uniform_run() {
        let mut h = Histogram::new();
        for ns in 1..=10_000u64 {
            h.record(ns * 1000);
        }
        let p50 = h.quantile_ns(0.5) as f64;
        let p99 = h.quantile_ns(0.99) as f64;
        assert!((p50 / 5_000_000.0 - 1.0).abs() < 0.04, "{p50}");
        assert!((p99 / 9_900_000.0 - 1.0).abs() < 0.04, "{p99}");
        assert_eq!(h.max_ns(), 10_000_000);
        assert!((h.mean_ns() - 5_000_500.0).abs() < 1.0);
        assert!(h.quantile_ns(1.0) <= h.max_ns());
    }

    #[test]
    fn merged_histograms_count_both() {
        let (mut a, mut b) = (Histogram::new(), Histogram::new());
        a.record(10);
        b.record(1_000_000);
        a.merge(&b);
        assert_eq!(a.count(), 2);
        assert_eq!(a.quantile_ns(0.5), 10);
        assert_eq!(Histogram::new().quantile_ns(0.5), 0);
    }

    #[test]
    fn write_pattern_has_no_zero_bytes() {
        let mut buf = vec![0u8; 4099];
        fill_pattern(&mut buf, &mut Rng::new(7));
        assert!(buf.iter().all(|&b| b != 0));
    }
}
