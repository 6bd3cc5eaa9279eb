//! The vocabulary of a sweep's results, which bench.rs (the sweep, the table and the CSV),
//! bench_point.rs (the measuring) and bench_plot.rs (the drawing) all speak: the operations
//! and patterns measured, what one point measured, and how sizes print.

use clap::ValueEnum;

/// An operation a sweep measures (`--ops`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Op {
    Read,
    Write,
}

impl Op {
    pub fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
        }
    }
}

/// Where a sweep's requests fall (`--patterns`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Pattern {
    /// Sequential: consecutive requests, wrapping at the end of the region.
    #[value(alias = "sequential")]
    Seq,
    /// Random: offsets aligned to the request size, uniformly over the region.
    #[value(alias = "random")]
    Rand,
}

impl Pattern {
    pub fn name(self) -> &'static str {
        match self {
            Pattern::Seq => "seq",
            Pattern::Rand => "rand",
        }
    }

    pub fn title(self) -> &'static str {
        match self {
            Pattern::Seq => "sequential",
            Pattern::Rand => "random",
        }
    }
}

/// What was measured: requests that completed inside the measured window.
#[derive(Clone, Debug)]
pub struct PointResult {
    pub op: Op,
    pub pattern: Pattern,
    pub size: u64,
    pub depth: u32,
    pub connections: usize,
    pub seconds: f64,
    pub ios: u64,
    pub bytes: u64,
    pub lat_mean_us: f64,
    pub lat_p50_us: f64,
    pub lat_p99_us: f64,
    pub lat_max_us: f64,
}

impl PointResult {
    /// Megabytes (10^6 bytes) per second.
    pub fn mb_per_s(&self) -> f64 {
        self.bytes as f64 / self.seconds / 1e6
    }

    pub fn iops(&self) -> f64 {
        self.ios as f64 / self.seconds
    }
}

/// `4K`, `1M`, `3G`, or plain bytes when no binary unit divides the size.
pub fn human_size(bytes: u64) -> String {
    const UNITS: [(u64, &str); 4] = [(1 << 40, "T"), (1 << 30, "G"), (1 << 20, "M"), (1 << 10, "K")];
    for (unit, suffix) in UNITS {
        if bytes >= unit && bytes.is_multiple_of(unit) {
            return format!("{}{suffix}", bytes / unit);
        }
    }
    bytes.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_print_with_binary_units() {
        assert_eq!(human_size(4096), "4K");
        assert_eq!(human_size(4 << 20), "4M");
        assert_eq!(human_size(1536), "1536");
        assert_eq!(human_size(3 << 30), "3G");
    }
}
