//! The server-wide caps on what all classes together ask of the node's storage: rate
//! buckets (`storage-iops`, `storage-bps`) and the number of requests at the storage at once
//! (`storage-inflight`).

use crate::bucket::Bucket;
use crate::class::Limits;
use crate::limits::STORAGE_BURST_NS;
use crate::request::Nanos;

#[derive(Debug)]
pub struct Node {
    iops: Option<Bucket>,
    bps: Option<Bucket>,
    depth: Option<u32>,
    /// Requests started and not yet finished.
    pub inflight: u32,
}

impl Node {
    pub fn new(limits: &Limits, now: Nanos) -> Node {
        let mut node = Node { iops: None, bps: None, depth: None, inflight: 0 };
        node.reconfigure(limits, now);
        node
    }

    pub fn reconfigure(&mut self, limits: &Limits, now: Nanos) {
        self.iops = bucket(self.iops.take(), limits.storage_iops, now);
        self.bps = bucket(self.bps.take(), limits.storage_bps, now);
        self.depth = limits.storage_inflight;
    }

    /// Whether the storage may take one more request (its queue depth).
    pub fn room(&self) -> bool {
        self.depth.is_none_or(|d| self.inflight < d)
    }

    /// Whether the rate caps are full (or absent): any one request would fit them.
    #[cfg(test)]
    pub fn rested(&self, now: Nanos) -> bool {
        [&self.iops, &self.bps].into_iter().flatten().all(|b| b.is_full(now))
    }

    pub fn allows(&self, now: Nanos, bytes: u64) -> bool {
        self.iops.as_ref().is_none_or(|b| b.fits(now, 1)) && self.bps.as_ref().is_none_or(|b| b.fits(now, bytes))
    }

    pub fn allowed_at(&self, now: Nanos, bytes: u64) -> Nanos {
        let ops = self.iops.as_ref().map_or(now, |b| b.fit_at(now, 1));
        ops.max(self.bps.as_ref().map_or(now, |b| b.fit_at(now, bytes)))
    }

    pub fn take(&mut self, now: Nanos, bytes: u64) {
        if let Some(b) = self.iops.as_mut() {
            b.take(now, 1);
        }
        if let Some(b) = self.bps.as_mut() {
            b.take(now, bytes);
        }
        self.inflight += 1;
    }
}

fn bucket(old: Option<Bucket>, rate: Option<u64>, now: Nanos) -> Option<Bucket> {
    let rate = rate?;
    Some(match old {
        Some(mut b) => {
            b.reconfigure(now, rate, STORAGE_BURST_NS);
            b
        }
        None => Bucket::new(rate, STORAGE_BURST_NS, now),
    })
}
