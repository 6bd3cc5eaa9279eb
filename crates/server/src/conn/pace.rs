//! Pacing of pipelined reads (`--chunk auto`): running estimates of how fast this
//! connection's storage reads and its socket takes reply bytes, and the rule that turns
//! them into a chunk size and a window (chunk reads of one request at the storage at once).
//!
//! The network rate is not how fast sends complete: a send completes once the socket
//! buffer has the bytes, and a buffer of a few MiB swallows a whole reply at memory speed.
//! While the socket holds bytes its peer has not taken (the driver reports this backlog at
//! each send completion), the rate is what the peer took between completions.
//!
//! A read cut into chunks of `c` bytes runs as a two-stage pipeline, storage then network.
//! It takes about `S / slow + c / fast + (S / c) * cost`: the whole read at the slower
//! stage's rate, plus the first chunk through the faster stage (the pipeline's fill, or
//! its drain), plus a fixed cost per chunk. The chunk that minimises this, `sqrt(S * cost *
//! fast)`, makes the fill as long as all the per-chunk costs together. Warm data (the page
//! cache, reads that complete at once) has a huge `fast` and gets one chunk; a cold disk
//! beside a network of about its speed gets many small ones.
//!
//! The estimates are per connection: the network rate belongs to one client's path, the
//! storage rate as this connection's reads see it (other clients' load included), and
//! nothing is shared between worker threads. Time arrives as an argument, as everywhere in
//! the core.

use std::time::{Duration, Instant};

use crate::limits::{
    CHUNK_AUTO_MIN_BYTES, CHUNK_WINDOW_COUNT, RATE_ASSUMED_BYTES_PER_SEC, RATE_HALF_LIFE_BYTES, RATE_SAMPLE_MIN_BYTES,
};

/// A running rate: bytes and busy time, each an exponentially decayed sum, so old samples
/// fade by bytes moved since, not by count. Their ratio is the rate over the recent busy
/// time. Transfers too small to show a rate (a reply header, a 4 KiB read: their time is
/// the operation's latency) are left out.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct Rate {
    bytes: f64,
    nanos: f64,
}

impl Rate {
    pub(super) fn add(&mut self, bytes: usize, took: Duration) {
        if bytes < RATE_SAMPLE_MIN_BYTES {
            return;
        }
        let keep = 0.5f64.powf(bytes as f64 / RATE_HALF_LIFE_BYTES as f64);
        self.bytes = self.bytes * keep + bytes as f64;
        // A completion seen within the same microsecond still took some time.
        self.nanos = self.nanos * keep + (took.as_nanos() as f64).max(1_000.0);
    }

    /// Bytes per second, once something was measured.
    pub(super) fn bytes_per_sec(&self) -> Option<f64> {
        (self.nanos > 0.0).then(|| self.bytes * 1e9 / self.nanos)
    }
}

/// How one read is cut: chunk bytes (before alignment and the other limits of the plan)
/// and chunk reads at the storage at once.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Cut {
    pub(super) chunk: usize,
    pub(super) window: usize,
}

#[derive(Debug, Default)]
pub(super) struct Pace {
    storage: Rate,
    network: Rate,
    /// The last chunk read completion: reads served back to back are timed from the one
    /// before, not from their own submission, so a window's reads are not counted twice.
    storage_last: Option<Instant>,
    /// Bytes the socket held that the peer had not taken, as the driver saw them when the
    /// send being handled completed (None: it cannot tell, as over TLS).
    backlog: Option<usize>,
    /// Bytes handed to the socket so far.
    written: u64,
    /// While the socket stays backlogged: when, and how many of `written` the peer had
    /// taken, at the start of the interval being measured.
    taken_mark: Option<(Instant, u64)>,
}

impl Pace {
    /// A chunk read submitted at `started` came back with `bytes` at `now`.
    pub(super) fn storage_done(&mut self, started: Instant, now: Instant, bytes: usize) {
        let from = self.storage_last.map_or(started, |last| last.max(started));
        self.storage.add(bytes, now.saturating_duration_since(from));
        self.storage_last = Some(now);
    }

    /// Whether the socket's backlog matters to the completion of a send that moved `sent`
    /// bytes: it does for a sample big enough to count, and while a backlogged interval is
    /// being measured. Asking costs the driver a system call, so small replies do not.
    pub(super) fn wants_backlog(&self, sent: i32) -> bool {
        sent >= RATE_SAMPLE_MIN_BYTES as i32 || self.taken_mark.is_some()
    }

    /// The socket's backlog at the completion `network_done` is about to be told of.
    pub(super) fn socket_backlog(&mut self, unacked: Option<usize>) {
        self.backlog = unacked;
    }

    /// A send (or splice to the socket) handed out at `started` moved `bytes` by `now`.
    /// A send completes once the socket has the bytes, which is the link's rate only if
    /// the socket is full. So while a backlog remains, the rate is what the peer took
    /// (acknowledged, or read) between completions; when the socket has drained, the send's
    /// own time is all there is (the peer keeps up). Sends go one at a time.
    pub(super) fn network_done(&mut self, started: Instant, now: Instant, bytes: usize) {
        self.written += bytes as u64;
        match self.backlog.take() {
            Some(unacked) if unacked > 0 => {
                let taken = self.written.saturating_sub(unacked as u64);
                match self.taken_mark {
                    Some((since, from)) if taken.saturating_sub(from) >= RATE_SAMPLE_MIN_BYTES as u64 => {
                        self.network.add((taken - from) as usize, now.saturating_duration_since(since));
                        self.taken_mark = Some((now, taken));
                    }
                    Some(_) => {}
                    None => self.taken_mark = Some((now, taken)),
                }
            }
            _ => {
                self.taken_mark = None;
                self.network.add(bytes, now.saturating_duration_since(started));
            }
        }
    }

    pub(super) fn storage_rate(&self) -> Option<f64> {
        self.storage.bytes_per_sec()
    }

    pub(super) fn network_rate(&self) -> Option<f64> {
        self.network.bytes_per_sec()
    }

    /// The cut of a read of `span` bytes, each chunk costing `cost_ns` beyond its transfer.
    pub(super) fn cut(&self, span: usize, cost_ns: u64) -> Cut {
        let fast = match (self.storage_rate(), self.network_rate()) {
            (None, None) => RATE_ASSUMED_BYTES_PER_SEC,
            (a, b) => a.unwrap_or(0.0).max(b.unwrap_or(0.0)),
        };
        let best = (span as f64 * cost_ns as f64 * 1e-9 * fast).sqrt();
        if best >= span as f64 {
            return Cut { chunk: span, window: 1 };
        }
        // Whole buffer-pool blocks (powers of two), the nearest to the best size.
        let chunk = (best.log2().round().exp2() as usize).max(CHUNK_AUTO_MIN_BYTES);
        if chunk >= span {
            return Cut { chunk: span, window: 1 };
        }
        Cut { chunk, window: CHUNK_WINDOW_COUNT }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::limits::{CHUNK_COST_NS, REMOTE_CHUNK_COST_NS};

    const MIB: usize = 1 << 20;

    /// A pace that saw `storage` and `network` bytes per second, many times over.
    fn trained(storage: f64, network: f64) -> Pace {
        let mut p = Pace::default();
        let mut t = Instant::now();
        for _ in 0..64 {
            let read = Duration::from_secs_f64(MIB as f64 / storage);
            p.storage_done(t, t + read, MIB);
            t += read;
            p.network_done(t, t + Duration::from_secs_f64(MIB as f64 / network), MIB);
        }
        p
    }

    #[test]
    fn rates_follow_what_was_measured() {
        let p = trained(500e6, 2e9);
        let near = |a: Option<f64>, b: f64| a.is_some_and(|a| (a / b - 1.0).abs() < 0.01);
        assert!(near(p.storage_rate(), 500e6), "{:?}", p.storage_rate());
        assert!(near(p.network_rate(), 2e9), "{:?}", p.network_rate());
    }

    #[test]
    fn reads_completing_together_count_once() {
        // Two chunk reads submitted together, served in 2 ms together: 1 GB/s, not 2.
        let mut p = Pace::default();
        let t = Instant::now();
        let done = t + Duration::from_millis(2);
        p.storage_done(t, done, MIB);
        p.storage_done(t, done, MIB);
        let r = p.storage_rate().unwrap();
        assert!((r / (2.0 * MIB as f64 / 2e-3) - 1.0).abs() < 0.1, "{r}");
    }

    #[test]
    fn a_backlogged_socket_is_measured_by_what_its_peer_takes() {
        // Sends complete at once into a large socket buffer while a 300 MB/s link drains
        // it: the rate is the link's, not the copy's.
        let mut p = Pace::default();
        let (t0, chunk) = (Instant::now(), 512 * 1024);
        let mut written = 0.0;
        for k in 1..=32u32 {
            let now = t0 + Duration::from_micros(1750) * k;
            written += chunk as f64;
            let taken = (now - t0).as_secs_f64() * 300e6;
            p.socket_backlog(Some((written - taken).max(1.0) as usize));
            p.network_done(now - Duration::from_micros(20), now, chunk);
        }
        let r = p.network_rate().unwrap();
        assert!((r / 300e6 - 1.0).abs() < 0.05, "{r}");
        // Once the socket drains at each completion, sends are timed by themselves again.
        for k in 0..64u32 {
            let now = t0 + Duration::from_secs(1) + Duration::from_millis(1) * k;
            p.socket_backlog(Some(0));
            p.network_done(now - Duration::from_micros(500), now, 1 << 20);
        }
        let r = p.network_rate().unwrap();
        assert!(r > 1.5e9, "{r}");
    }

    #[test]
    fn the_backlog_is_asked_for_only_where_it_is_used() {
        let mut p = Pace::default();
        let t = Instant::now();
        assert!(!p.wants_backlog(4096), "a small reply costs no system call");
        assert!(p.wants_backlog(RATE_SAMPLE_MIN_BYTES as i32));
        // A backlogged interval has started: every completion counts toward it.
        p.socket_backlog(Some(1 << 20));
        p.network_done(t, t + Duration::from_micros(100), 1 << 20);
        assert!(p.wants_backlog(16));
    }

    #[test]
    fn small_transfers_do_not_move_the_rates() {
        let mut p = trained(500e6, 2e9);
        let (storage, network) = (p.storage_rate(), p.network_rate());
        let t = Instant::now();
        for _ in 0..100 {
            p.network_done(t, t + Duration::from_micros(20), 16);
            p.storage_done(t, t + Duration::from_micros(100), 4096);
        }
        assert_eq!((p.storage_rate(), p.network_rate()), (storage, network));
    }

    #[test]
    fn warm_data_is_split_little_or_not_at_all() {
        // The page cache at 20 GB/s: the fill is short, two chunks at most.
        assert!(trained(20e9, 2e9).cut(4 * MIB, CHUNK_COST_NS).chunk >= 2 * MIB);
        // Reads that complete at once (1 µs a MiB): one chunk.
        assert_eq!(trained(1e12, 2e9).cut(4 * MIB, CHUNK_COST_NS), Cut { chunk: 4 * MIB, window: 1 });
    }

    #[test]
    fn a_cold_disk_as_fast_as_the_network_gets_small_chunks_through_a_window() {
        let p = trained(1.8e9, 1.8e9);
        let cut = p.cut(4 * MIB, CHUNK_COST_NS);
        assert!(cut.chunk < 4 * MIB && cut.chunk >= CHUNK_AUTO_MIN_BYTES, "{cut:?}");
        assert!(cut.chunk.is_power_of_two());
        assert_eq!(cut.window, CHUNK_WINDOW_COUNT);
        // A slower pair of stages gets smaller chunks still: the fill costs more.
        assert!(trained(300e6, 300e6).cut(4 * MIB, CHUNK_COST_NS).chunk <= cut.chunk);
    }

    #[test]
    fn a_costlier_chunk_makes_chunks_larger() {
        // Both stages at 2 GB/s: a local device's chunk cost cuts a 1 MiB read in four, a
        // remote request's in two.
        let p = trained(2e9, 2e9);
        assert_eq!(p.cut(MIB, CHUNK_COST_NS).chunk, MIB / 4);
        assert_eq!(p.cut(MIB, REMOTE_CHUNK_COST_NS).chunk, MIB / 2);
        // Four times the cost, twice the chunk (the square root rule).
        let cold = trained(300e6, 300e6);
        assert_eq!(cold.cut(4 * MIB, 4 * CHUNK_COST_NS).chunk, 2 * cold.cut(4 * MIB, CHUNK_COST_NS).chunk);
    }

    #[test]
    fn small_reads_are_not_split_below_the_floor() {
        let p = trained(100e6, 100e6);
        assert_eq!(p.cut(CHUNK_AUTO_MIN_BYTES, CHUNK_COST_NS), Cut { chunk: CHUNK_AUTO_MIN_BYTES, window: 1 });
        assert_eq!(p.cut(4096, CHUNK_COST_NS), Cut { chunk: 4096, window: 1 });
        assert_eq!(p.cut(CHUNK_AUTO_MIN_BYTES + 4096, CHUNK_COST_NS).chunk, CHUNK_AUTO_MIN_BYTES);
    }

    #[test]
    fn before_any_measurement_reads_are_split_as_for_an_assumed_rate() {
        let cut = Pace::default().cut(4 * MIB, CHUNK_COST_NS);
        assert!(cut.chunk < 4 * MIB, "{cut:?}");
    }
}
