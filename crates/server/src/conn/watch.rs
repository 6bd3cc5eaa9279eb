//! Slow requests: a request held at the backend past `slow-request-ms` is logged once when
//! the worker's look finds it, and once more when its slot is released, with how long it
//! took and how it ended. A stuck disk, a silent Ceph OSD or a stalled remote then shows in
//! the log and in `/metrics` while it lasts, not only in the latency histograms afterwards.

use std::fmt;
use std::time::{Duration, Instant};

use sluice_proto::Command;

use super::state::Slot;
use super::Conn;
use crate::metrics::Look;

impl Conn {
    /// Looks at every request at the backend: counts those held past the threshold, logs
    /// the ones that just crossed it, and finds the oldest. The worker calls it now and
    /// then while storage operations are in flight (`Limits::slow_watch_interval`).
    pub fn watch(&mut self, now: Instant) -> Look {
        let threshold = (self.limits.slow_request_ms > 0).then(|| Duration::from_millis(self.limits.slow_request_ms));
        let mut look = Look::default();
        for index in 0..self.slots.len() {
            let Some(s) = self.slots[index].as_mut() else { continue };
            let Some(since) = s.times.storage_start.filter(|_| s.ops > 0) else { continue };
            look.add(Look { slow: 0, oldest: Some(since) });
            let age = now.saturating_duration_since(since);
            if threshold.is_some_and(|t| age >= t) {
                look.slow += 1;
                if !s.slow {
                    s.slow = true;
                    log::warn!(
                        "slow request: export {:?}, {}, at the backend for {:.1} s (client {})",
                        self.export.name,
                        Described(&s.request.command),
                        age.as_secs_f64(),
                        self.peer
                    );
                }
            }
        }
        look
    }

    /// Says how a request that was logged as slow ended, when its slot is released.
    pub(super) fn slow_request_ended(&self, s: &Slot, now: Instant) {
        let took = s.times.storage_start.map_or(Duration::ZERO, |t| now.saturating_duration_since(t));
        let how = if self.is_broken() {
            "its client had gone"
        } else if s.failed {
            "answered with an error"
        } else {
            "answered"
        };
        log::warn!(
            "slow request ended: export {:?}, {}, after {:.1} s: {how} (client {})",
            self.export.name,
            Described(&s.request.command),
            took.as_secs_f64(),
            self.peer
        );
    }

    /// The export's index in the metrics, which the worker's looks are posted under.
    pub fn metrics_export(&self) -> usize {
        self.metrics_export
    }
}

/// A command as the log names it: "READ offset 0 length 4096".
struct Described<'a>(&'a Command);

impl fmt::Display for Described<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (name, range) = match self.0 {
            Command::Read { range, .. } => ("READ", Some(range)),
            Command::Write { range, .. } => ("WRITE", Some(range)),
            Command::Flush => ("FLUSH", None),
            Command::Trim { range, .. } => ("TRIM", Some(range)),
            Command::Cache { range } => ("CACHE", Some(range)),
            Command::WriteZeroes { range, .. } => ("WRITE_ZEROES", Some(range)),
            Command::BlockStatus { range, .. } => ("BLOCK_STATUS", Some(range)),
            Command::Disconnect => ("DISC", None),
        };
        match range {
            Some(r) => write!(f, "{name} offset {} length {}", r.offset, r.length),
            None => f.write_str(name),
        }
    }
}
