//! The simulation's judges of rates: a window check that no limit is exceeded over any
//! window beyond its burst allowance, and meters of what each class got.

use std::collections::BTreeMap;

use crate::class::{Class, Limits};
use crate::limits::{NANOS_PER_SEC, STORAGE_BURST_NS};
use crate::request::{Applies, Dim, Nanos, Op};

const SCALE: i128 = NANOS_PER_SEC as i128;

/// One limit, watched: over every window [t1, t2] between starts, what started must be at
/// most `rate * (t2 - t1)` plus the allowance: the burst, or the largest single request
/// when that is bigger (it may start on a full bucket). Kept in one pass: the smallest
/// `consumed_before - rate * t` over the starts so far is the worst window start.
pub struct Watch {
    name: String,
    dim: Dim,
    applies: Applies,
    rate: u64,
    cap: i128,
    largest: i128,
    consumed: i128,
    worst_base: i128,
}

impl Watch {
    fn new(name: String, dim: Dim, applies: Applies, rate: u64, burst_ns: u64) -> Watch {
        let cap = rate as i128 * burst_ns as i128;
        Watch { name, dim, applies, rate, cap, largest: 0, consumed: 0, worst_base: i128::MAX }
    }

    pub fn start(&mut self, now: Nanos, op: Op, bytes: u64) -> Result<(), String> {
        if !self.applies.covers(op) {
            return Ok(());
        }
        let earned = self.rate as i128 * now as i128;
        self.worst_base = self.worst_base.min(self.consumed - earned);
        let units = self.dim.units(bytes) as i128 * SCALE;
        self.consumed += units;
        self.largest = self.largest.max(units);
        let over = self.consumed - earned - self.worst_base - self.cap.max(self.largest);
        if over > 0 {
            return Err(format!("{} exceeded by {:.6} units at {now} ns", self.name, over as f64 / SCALE as f64));
        }
        Ok(())
    }
}

pub fn class_watches(name: &str, class: &Class) -> Vec<Watch> {
    let named = |(dim, applies, rate): (Dim, Applies, Option<u64>)| {
        rate.map(|r| Watch::new(format!("qos.{name} {dim:?}/{applies:?} {r}/s"), dim, applies, r, class.burst_ns))
    };
    class.limits().into_iter().filter_map(named).collect()
}

pub fn node_watches(limits: &Limits) -> Vec<Watch> {
    let mut out = Vec::new();
    if let Some(r) = limits.storage_iops {
        out.push(Watch::new(format!("storage-iops {r}"), Dim::Ops, Applies::All, r, STORAGE_BURST_NS));
    }
    if let Some(r) = limits.storage_bps {
        out.push(Watch::new(format!("storage-bps {r}"), Dim::Bytes, Applies::All, r, STORAGE_BURST_NS));
    }
    out
}

/// What one class got from `from` on: cost, and operations and bytes for all requests,
/// reads and writes.
#[derive(Clone, Copy, Debug, Default)]
pub struct Got {
    pub cost: u64,
    ops: [u64; 3],
    bytes: [u64; 3],
}

impl Got {
    /// What a limit of this kind counted.
    pub fn units(&self, dim: Dim, applies: Applies) -> u64 {
        let at = match applies {
            Applies::All => 0,
            Applies::Reads => 1,
            Applies::Writes => 2,
        };
        match dim {
            Dim::Ops => self.ops[at],
            Dim::Bytes => self.bytes[at],
        }
    }
}

/// Counts what starts in `from..until`.
pub struct Meter {
    pub from: Nanos,
    pub until: Nanos,
    pub by_class: BTreeMap<String, Got>,
}

impl Meter {
    pub fn count(&mut self, now: Nanos, class: &str, op: Op, bytes: u64, cost: u64) {
        if !(self.from..self.until).contains(&now) {
            return;
        }
        let got = self.by_class.entry(class.to_string()).or_default();
        got.cost += cost;
        for (i, applies) in [Applies::All, Applies::Reads, Applies::Writes].into_iter().enumerate() {
            if applies.covers(op) {
                got.ops[i] += 1;
                got.bytes[i] += bytes;
            }
        }
    }

    pub fn get(&self, class: &str) -> Got {
        self.by_class.get(class).copied().unwrap_or_default()
    }
}
