//! When to give lent memory back, and how much: sans-IO. The watcher passes in the time and
//! what it read of the node's memory; the policy answers "give back now, because ..." or
//! "not now", and `step_bytes` says how much of one export a give-back takes.
//!
//! The node is short when MemAvailable is below the low mark (the larger of 5 % of MemTotal
//! and 256 MiB) or PSI's memory "some avg10" is above 10 %. Once short, it stays short until
//! MemAvailable is 25 % above the mark and "some avg10" is below 5 % (hysteresis), so that
//! giving back does not stop and start at every small allocation. Give-backs are at least
//! 2 s apart (pacing), so that the kernel and the jobs answer one before the next is taken.
//! A reading that is missing (no PSI in this kernel, a /proc file that cannot be read) is
//! left out; with none at all, nothing is ever given back.

use std::fmt;

use crate::limits::{
    ELASTIC_AVAILABLE_LOW_MIN_BYTES, ELASTIC_AVAILABLE_LOW_PERCENT, ELASTIC_CHUNK_BYTES, ELASTIC_HYSTERESIS_PERCENT,
    ELASTIC_PRESSURE_HIGH_PERCENT, ELASTIC_PRESSURE_LOW_PERCENT, ELASTIC_STEP_FRACTION_DIVISOR, ELASTIC_STEP_INTERVAL_MS,
};

/// What the watcher read of the node's memory; None for what it could not read.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Reading {
    /// MemTotal from /proc/meminfo.
    pub total_bytes: Option<u64>,
    /// MemAvailable from /proc/meminfo: what can be had without swapping.
    pub available_bytes: Option<u64>,
    /// "some avg10" from /proc/pressure/memory, in percent.
    pub pressure_some_avg10: Option<f64>,
}

/// Why memory is given back, for the log.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Cause {
    /// MemAvailable is below `mark_bytes` (the low mark, or above it while recovering).
    Available { available_bytes: u64, mark_bytes: u64 },
    /// PSI memory "some avg10" is above `mark` percent.
    Pressure { some_avg10: f64, mark: f64 },
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Available { available_bytes, mark_bytes } => {
                write!(f, "MemAvailable {} MiB is below {} MiB", available_bytes >> 20, mark_bytes >> 20)
            }
            Cause::Pressure { some_avg10, mark } => write!(f, "memory pressure some avg10={some_avg10:.2} is above {mark:.2}"),
        }
    }
}

/// The low mark of MemAvailable for a node of `total_bytes` (unknown: the smallest mark).
pub fn low_mark_bytes(total_bytes: Option<u64>) -> u64 {
    let share = total_bytes.map_or(0, |t| t / 100 * ELASTIC_AVAILABLE_LOW_PERCENT);
    share.max(ELASTIC_AVAILABLE_LOW_MIN_BYTES)
}

/// The node-wide decision; one for the whole server, whatever the number of exports.
#[derive(Debug, Default)]
pub struct Policy {
    /// Giving back now: the marks to stop at are the recovering ones.
    short: bool,
    /// When the last give-back was allowed, in the watcher's milliseconds.
    last_step_ms: Option<u64>,
}

impl Policy {
    /// Whether to give memory back at `now_ms` (milliseconds on any monotonic clock that
    /// the caller keeps using), given `reading`; and why.
    pub fn tick(&mut self, now_ms: u64, reading: &Reading) -> Option<Cause> {
        let cause = self.cause(reading);
        self.short = cause.is_some();
        let cause = cause?;
        if self.last_step_ms.is_some_and(|last| now_ms.saturating_sub(last) < ELASTIC_STEP_INTERVAL_MS) {
            return None;
        }
        self.last_step_ms = Some(now_ms);
        Some(cause)
    }

    /// Whether the node is short of memory, with the marks of the state it is in.
    fn cause(&self, reading: &Reading) -> Option<Cause> {
        if let Some(available_bytes) = reading.available_bytes {
            let low = low_mark_bytes(reading.total_bytes);
            let mark_bytes = if self.short { low + low / 100 * ELASTIC_HYSTERESIS_PERCENT } else { low };
            if available_bytes < mark_bytes {
                return Some(Cause::Available { available_bytes, mark_bytes });
            }
        }
        let some_avg10 = reading.pressure_some_avg10?;
        let mark = if self.short { ELASTIC_PRESSURE_LOW_PERCENT } else { ELASTIC_PRESSURE_HIGH_PERCENT };
        (some_avg10 > mark).then_some(Cause::Pressure { some_avg10, mark })
    }
}

/// How many bytes one give-back takes from an export that holds `held_bytes` and keeps at
/// least `floor_bytes`: an eighth of what it holds, in whole chunks, at least one chunk,
/// never more than it holds above the floor (rounded down to chunks). 0: nothing to give.
pub fn step_bytes(held_bytes: u64, floor_bytes: u64) -> u64 {
    let spare = held_bytes.saturating_sub(floor_bytes);
    let spare_chunks = spare / ELASTIC_CHUNK_BYTES * ELASTIC_CHUNK_BYTES;
    let step = (held_bytes / ELASTIC_STEP_FRACTION_DIVISOR).next_multiple_of(ELASTIC_CHUNK_BYTES).max(ELASTIC_CHUNK_BYTES);
    // A last piece under a chunk goes too when there is no floor: the export can empty.
    if floor_bytes == 0 && spare < ELASTIC_CHUNK_BYTES {
        return spare;
    }
    step.min(spare_chunks)
}

#[cfg(test)]
mod tests {
    use super::*;

    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;

    fn avail(total: u64, available: u64) -> Reading {
        Reading { total_bytes: Some(total), available_bytes: Some(available), pressure_some_avg10: None }
    }

    #[test]
    fn the_low_mark_is_five_percent_or_256_mib() {
        assert_eq!(low_mark_bytes(Some(64 * GIB)), 64 * GIB / 100 * 5);
        assert_eq!(low_mark_bytes(Some(GIB)), 256 * MIB);
        assert_eq!(low_mark_bytes(None), 256 * MIB);
    }

    #[test]
    fn plenty_of_memory_gives_nothing_back() {
        let mut p = Policy::default();
        assert_eq!(p.tick(0, &avail(16 * GIB, 8 * GIB)), None);
        let calm = Reading { pressure_some_avg10: Some(0.5), ..avail(16 * GIB, 8 * GIB) };
        assert_eq!(p.tick(1_000, &calm), None);
    }

    #[test]
    fn a_squeeze_gives_back_paced() {
        let mut p = Policy::default();
        let short = avail(16 * GIB, 100 * MIB);
        let mark_bytes = low_mark_bytes(Some(16 * GIB));
        assert_eq!(p.tick(10_000, &short), Some(Cause::Available { available_bytes: 100 * MIB, mark_bytes }));
        assert_eq!(p.tick(11_000, &short), None, "a step interval has not passed");
        assert_eq!(p.tick(11_999, &short), None);
        assert!(p.tick(12_000, &short).is_some(), "paced, not stopped");
        assert!(p.tick(14_500, &short).is_some());
    }

    #[test]
    fn hysteresis_keeps_giving_until_well_above_the_mark() {
        let mut p = Policy::default();
        let low = low_mark_bytes(Some(16 * GIB));
        assert!(p.tick(0, &avail(16 * GIB, low - 1)).is_some());
        // Just above the low mark: still short, at the recovering mark.
        let recovering = low + low / 100 * ELASTIC_HYSTERESIS_PERCENT;
        let c = p.tick(2_000, &avail(16 * GIB, low + MIB));
        assert_eq!(c, Some(Cause::Available { available_bytes: low + MIB, mark_bytes: recovering }));
        assert_eq!(p.tick(4_000, &avail(16 * GIB, recovering)), None, "recovered");
        // Recovered: between the marks is no longer short.
        assert_eq!(p.tick(6_000, &avail(16 * GIB, low + MIB)), None);
        assert!(p.tick(8_000, &avail(16 * GIB, low - MIB)).is_some());
    }

    #[test]
    fn pressure_alone_squeezes_with_its_own_hysteresis() {
        let mut p = Policy::default();
        let psi = |v: f64| Reading { pressure_some_avg10: Some(v), ..avail(16 * GIB, 8 * GIB) };
        assert_eq!(p.tick(0, &psi(9.0)), None);
        assert_eq!(p.tick(2_000, &psi(12.5)), Some(Cause::Pressure { some_avg10: 12.5, mark: ELASTIC_PRESSURE_HIGH_PERCENT }));
        assert!(p.tick(4_000, &psi(7.0)).is_some(), "still above the recovering mark");
        assert_eq!(p.tick(6_000, &psi(4.0)), None);
        assert_eq!(p.tick(8_000, &psi(7.0)), None, "recovered: 7 % is under the mark to start");
    }

    #[test]
    fn missing_readings_are_left_out() {
        let mut p = Policy::default();
        assert_eq!(p.tick(0, &Reading::default()), None, "nothing read: nothing given back");
        let psi_only = Reading { pressure_some_avg10: Some(50.0), ..Reading::default() };
        assert!(p.tick(2_000, &psi_only).is_some());
        let mut q = Policy::default();
        let no_total = Reading { available_bytes: Some(100 * MIB), ..Reading::default() };
        assert_eq!(q.tick(0, &no_total), Some(Cause::Available { available_bytes: 100 * MIB, mark_bytes: 256 * MIB }));
        let no_psi = Reading { pressure_some_avg10: None, ..avail(16 * GIB, 8 * GIB) };
        assert_eq!(Policy::default().tick(0, &no_psi), None);
    }

    #[test]
    fn steps_are_an_eighth_in_whole_chunks_above_the_floor() {
        let chunk = ELASTIC_CHUNK_BYTES;
        assert_eq!(step_bytes(0, 0), 0, "nothing held, nothing to give");
        assert_eq!(step_bytes(64 * MIB, 0), 8 * MIB);
        assert_eq!(step_bytes(65 * MIB, 0), 10 * MIB, "rounded up to whole chunks");
        assert_eq!(step_bytes(4 * MIB, 0), chunk, "at least a chunk");
        assert_eq!(step_bytes(4096, 0), 4096, "the last pages go when there is no floor");
        assert_eq!(step_bytes(64 * MIB, 60 * MIB), 4 * MIB, "never below the floor");
        assert_eq!(step_bytes(64 * MIB, 63 * MIB), 0, "less than a chunk above the floor stays");
        assert_eq!(step_bytes(8 * MIB, 16 * MIB), 0, "below the floor already");
    }
}
