//! Requests held at a backend: how many are slow now, and how old the oldest is, per
//! export. Each worker looks at its own requests now and then (`worker.rs`) and posts what
//! it saw on a board of its own; a scrape adds the boards up. Nothing here is on the
//! per-request path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use prometheus::proto::{MetricFamily, MetricType};

use super::pool::Family;

/// What one worker saw of one export's requests at its last look.
#[derive(Default)]
struct Seen {
    slow: AtomicU64,
    /// When the oldest request at the backend got there, in nanoseconds after the boards'
    /// epoch plus one; 0 when none was.
    oldest: AtomicU64,
}

/// One worker's last look, export by export (in the recorder's export order).
pub struct Board {
    epoch: Instant,
    exports: Vec<Seen>,
}

/// What a look found for one export (or one connection).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Look {
    pub slow: u64,
    /// When the oldest request now at the backend was handed to it.
    pub oldest: Option<Instant>,
}

impl Look {
    /// Adds another look's findings to this one.
    pub fn add(&mut self, other: Look) {
        self.slow += other.slow;
        self.oldest = match (self.oldest, other.oldest) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
    }
}

impl Board {
    /// Posts a look at every export; `looks` is indexed like the recorder's exports.
    pub fn post(&self, looks: &[Look]) {
        debug_assert_eq!(looks.len(), self.exports.len());
        for (seen, look) in self.exports.iter().zip(looks) {
            seen.slow.store(look.slow, Ordering::Relaxed);
            let at = look.oldest.map_or(0, |t| t.saturating_duration_since(self.epoch).as_nanos() as u64 + 1);
            seen.oldest.store(at, Ordering::Relaxed);
        }
    }

    pub fn exports(&self) -> usize {
        self.exports.len()
    }
}

/// Every worker's board.
pub(super) struct Boards {
    epoch: Instant,
    exports: usize,
    boards: Mutex<Vec<Arc<Board>>>,
}

impl Boards {
    pub(super) fn new(exports: usize) -> Boards {
        Boards { epoch: Instant::now(), exports, boards: Mutex::default() }
    }

    /// A new worker's board, all zero.
    pub(super) fn board(&self) -> Arc<Board> {
        let board = Arc::new(Board { epoch: self.epoch, exports: (0..self.exports).map(|_| Seen::default()).collect() });
        self.boards.lock().unwrap_or_else(|e| e.into_inner()).push(Arc::clone(&board));
        board
    }

    /// Per export: slow requests on every worker, and the age in seconds of the oldest
    /// request at the backend (0 when none is).
    fn totals(&self, now: Instant) -> Vec<(u64, f64)> {
        let mut out = vec![(0u64, 0f64); self.exports];
        let boards = self.boards.lock().unwrap_or_else(|e| e.into_inner());
        let now_ns = now.saturating_duration_since(self.epoch).as_nanos() as u64 + 1;
        for board in boards.iter() {
            for (total, seen) in out.iter_mut().zip(&board.exports) {
                total.0 += seen.slow.load(Ordering::Relaxed);
                let at = seen.oldest.load(Ordering::Relaxed);
                if at != 0 {
                    total.1 = total.1.max(now_ns.saturating_sub(at) as f64 / 1e9);
                }
            }
        }
        out
    }
}

/// The two gauges, for the exports named in `names` (the recorder's order).
pub(super) fn families(boards: &Boards, names: &[&str]) -> Vec<MetricFamily> {
    if names.is_empty() {
        return Vec::new();
    }
    let mut slow = Family::new(
        "sluice_requests_slow",
        "Requests at the backend for longer than slow-request-ms now.",
        MetricType::GAUGE,
    );
    let mut oldest = Family::new(
        "sluice_request_oldest_seconds",
        "Age of the oldest request now at the backend, 0 when none is; looked at every second or sooner.",
        MetricType::GAUGE,
    );
    for (export, (count, age)) in names.iter().zip(boards.totals(Instant::now())) {
        slow.gauge(&[("export", export)], count);
        oldest.gauge_f64(&[("export", export)], age);
    }
    vec![slow.0, oldest.0]
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn totals_add_slow_requests_and_take_the_oldest_over_workers() {
        let boards = Boards::new(2);
        let (a, b) = (boards.board(), boards.board());
        let t0 = boards.epoch + Duration::from_secs(10);
        a.post(&[Look { slow: 1, oldest: Some(t0) }, Look::default()]);
        b.post(&[Look { slow: 2, oldest: Some(t0 + Duration::from_secs(3)) }, Look::default()]);
        let totals = boards.totals(t0 + Duration::from_secs(7));
        assert_eq!(totals[0].0, 3);
        assert!((totals[0].1 - 7.0).abs() < 1e-6, "{totals:?}");
        assert_eq!(totals[1], (0, 0.0));
        // A later look that finds nothing clears the worker's part.
        a.post(&[Look::default(), Look::default()]);
        let totals = boards.totals(t0 + Duration::from_secs(7));
        assert_eq!(totals[0].0, 2);
        assert!((totals[0].1 - 4.0).abs() < 1e-6, "{totals:?}");
    }

    #[test]
    fn a_look_adds_slow_counts_and_keeps_the_earliest_start() {
        let t = Instant::now();
        let mut look = Look::default();
        look.add(Look::default());
        assert_eq!(look, Look::default());
        look.add(Look { slow: 1, oldest: Some(t + Duration::from_secs(2)) });
        look.add(Look { slow: 2, oldest: Some(t) });
        look.add(Look::default());
        assert_eq!(look, Look { slow: 3, oldest: Some(t) });
    }
}
