//! Reading the node's memory: MemTotal and MemAvailable from /proc/meminfo, and PSI's memory
//! "some avg10" from /proc/pressure/memory where the kernel has PSI.
//!
//! For tests only: `SLUICE_ELASTIC_MEMINFO` and `SLUICE_ELASTIC_PRESSURE` name files read
//! instead (same formats). Tests cannot make real memory pressure on demand; with these
//! they write the reading they want and watch the server answer it. An unreadable file is
//! a missing reading, as on a kernel without PSI.

use std::path::PathBuf;

use super::policy::Reading;

/// Names a file read instead of /proc/meminfo. For tests.
pub const MEMINFO_PATH_ENV: &str = "SLUICE_ELASTIC_MEMINFO";
/// Names a file read instead of /proc/pressure/memory. For tests.
pub const PRESSURE_PATH_ENV: &str = "SLUICE_ELASTIC_PRESSURE";

/// Where the readings come from.
#[derive(Clone, Debug)]
pub struct Sources {
    meminfo: PathBuf,
    pressure: PathBuf,
}

impl Sources {
    /// The kernel's files, or the test files the environment names.
    pub fn from_env() -> Sources {
        let path = |var: &str, default: &str| std::env::var_os(var).map_or_else(|| PathBuf::from(default), PathBuf::from);
        let sources = Sources { meminfo: path(MEMINFO_PATH_ENV, "/proc/meminfo"), pressure: path(PRESSURE_PATH_ENV, "/proc/pressure/memory") };
        if std::env::var_os(MEMINFO_PATH_ENV).is_some() || std::env::var_os(PRESSURE_PATH_ENV).is_some() {
            log::warn!("elastic memory: reading {} and {} (set for testing)", sources.meminfo.display(), sources.pressure.display());
        }
        sources
    }

    pub fn read(&self) -> Reading {
        let (total_bytes, available_bytes) = std::fs::read_to_string(&self.meminfo).map_or((None, None), |t| parse_meminfo(&t));
        let pressure_some_avg10 = std::fs::read_to_string(&self.pressure).ok().and_then(|t| parse_pressure(&t));
        Reading { total_bytes, available_bytes, pressure_some_avg10 }
    }
}

/// MemTotal and MemAvailable, in bytes (the file says kB, meaning KiB).
pub fn parse_meminfo(text: &str) -> (Option<u64>, Option<u64>) {
    let field = |name: &str| {
        text.lines().find_map(|line| {
            let rest = line.strip_prefix(name)?.strip_prefix(':')?;
            let kib: u64 = rest.trim().strip_suffix("kB")?.trim().parse().ok()?;
            kib.checked_mul(1024)
        })
    };
    (field("MemTotal"), field("MemAvailable"))
}

/// "avg10" of the "some" line: `some avg10=1.23 avg60=... avg300=... total=...`.
pub fn parse_pressure(text: &str) -> Option<f64> {
    let some = text.lines().find_map(|l| l.strip_prefix("some "))?;
    let value = some.split_whitespace().find_map(|kv| kv.strip_prefix("avg10="))?;
    value.parse::<f64>().ok().filter(|v| v.is_finite() && *v >= 0.0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn meminfo_gives_total_and_available() {
        let text = "MemTotal:       16318412 kB\nMemFree:         1016908 kB\nMemAvailable:    9875236 kB\nBuffers: 1 kB\n";
        assert_eq!(parse_meminfo(text), (Some(16318412 * 1024), Some(9875236 * 1024)));
        let old_kernel = "MemTotal: 1024 kB\nMemFree: 512 kB\n";
        assert_eq!(parse_meminfo(old_kernel), (Some(1024 * 1024), None));
        assert_eq!(parse_meminfo("MemAvailable: lots kB\n"), (None, None));
        assert_eq!(parse_meminfo("MemAvailableX: 5 kB\n"), (None, None));
    }

    #[test]
    fn pressure_gives_some_avg10() {
        let text = "some avg10=12.50 avg60=3.00 avg300=0.50 total=123456\nfull avg10=40.00 avg60=0.00 avg300=0.00 total=1\n";
        assert_eq!(parse_pressure(text), Some(12.5));
        assert_eq!(parse_pressure("full avg10=1.00 avg60=0 avg300=0 total=0\n"), None);
        assert_eq!(parse_pressure("some avg10=nan avg60=0\n"), None);
        assert_eq!(parse_pressure(""), None);
    }

    #[test]
    fn an_unreadable_file_is_a_missing_reading() {
        let none = Sources { meminfo: "/nonexistent/meminfo".into(), pressure: "/nonexistent/pressure".into() };
        assert_eq!(none.read(), Reading::default());
    }
}
