//! Simulated storage: one queue served in order, each request taking the time of one
//! operation plus the time of its bytes at the device's capacity.

use std::collections::VecDeque;

use crate::limits::NANOS_PER_SEC;
use crate::request::{Id, Nanos};

pub struct Storage {
    pub iops: u64,
    pub bps: u64,
    queue: VecDeque<(Id, Nanos)>,
    busy_until: Nanos,
}

impl Storage {
    pub fn new(iops: u64, bps: u64) -> Storage {
        Storage { iops, bps, queue: VecDeque::new(), busy_until: 0 }
    }

    pub fn service_ns(&self, bytes: u64) -> u64 {
        NANOS_PER_SEC / self.iops + (bytes as u128 * NANOS_PER_SEC as u128 / self.bps as u128) as u64
    }

    pub fn start(&mut self, now: Nanos, id: Id, bytes: u64) {
        let begin = self.busy_until.max(now);
        self.busy_until = begin + self.service_ns(bytes);
        self.queue.push_back((id, self.busy_until));
    }

    pub fn next_done(&self) -> Option<Nanos> {
        self.queue.front().map(|&(_, at)| at)
    }

    /// The next request done by `now`, if any.
    pub fn complete(&mut self, now: Nanos) -> Option<Id> {
        match self.queue.front() {
            Some(&(id, at)) if at <= now => {
                self.queue.pop_front();
                Some(id)
            }
            _ => None,
        }
    }

    pub fn is_idle(&self) -> bool {
        self.queue.is_empty()
    }

    /// Requests of `bytes` each per second the device takes.
    pub fn ops_per_sec(&self, bytes: u64) -> u64 {
        NANOS_PER_SEC / self.service_ns(bytes)
    }
}
