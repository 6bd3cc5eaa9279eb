//! A minimal stderr logger: level, thread, message. When stderr is the systemd journal
//! (`JOURNAL_STREAM` names its device and inode), each line starts with its sd-daemon
//! priority (`<3>` error .. `<7>` debug) instead of the level's name, and the journal
//! adds the time and the program itself.

use std::sync::OnceLock;

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Stderr {
    /// Whether stderr is the journal; decided once, at the first line.
    journal: OnceLock<bool>,
}

impl Log for Stderr {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let line = if *self.journal.get_or_init(stderr_is_journal) {
            format!("<{}>{}", priority(r.level()), r.args())
        } else {
            format!("sluice: {}: {}", name(r.level()), r.args())
        };
        // Never panic on a closed stderr (a pipe whose reader left): logging is best effort.
        use std::io::Write;
        let _ = writeln!(std::io::stderr().lock(), "{line}");
    }

    fn flush(&self) {}
}

fn name(level: Level) -> &'static str {
    match level {
        Level::Error => "error",
        Level::Warn => "warning",
        Level::Info => "info",
        Level::Debug => "debug",
        Level::Trace => "trace",
    }
}

/// sd-daemon(3) priorities: 3 error, 4 warning, 6 info, 7 debug (trace too).
fn priority(level: Level) -> u8 {
    match level {
        Level::Error => 3,
        Level::Warn => 4,
        Level::Info => 6,
        Level::Debug | Level::Trace => 7,
    }
}

/// systemd sets `JOURNAL_STREAM=DEV:INODE` for a service whose stderr is the journal; a
/// child whose stderr was redirected inherits the variable, so the descriptor is checked.
fn stderr_is_journal() -> bool {
    let Some(value) = std::env::var_os("JOURNAL_STREAM") else { return false };
    let Ok(stat) = rustix::fs::fstat(rustix::stdio::stderr()) else { return false };
    journal_stream_is(&value.to_string_lossy(), stat.st_dev, stat.st_ino)
}

fn journal_stream_is(value: &str, dev: u64, ino: u64) -> bool {
    let parsed = value.split_once(':').and_then(|(d, i)| Some((d.parse::<u64>().ok()?, i.parse::<u64>().ok()?)));
    parsed == Some((dev, ino))
}

pub fn init(level: LevelFilter) {
    static LOGGER: Stderr = Stderr { journal: OnceLock::new() };
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn journal_stream_must_name_stderrs_device_and_inode() {
        assert!(journal_stream_is("64769:123456", 64769, 123456));
        assert!(!journal_stream_is("64769:123457", 64769, 123456));
        assert!(!journal_stream_is("64769", 64769, 123456));
        assert!(!journal_stream_is("x:1", 0, 1));
    }

    #[test]
    fn priorities_follow_sd_daemon() {
        let all = [Level::Error, Level::Warn, Level::Info, Level::Debug, Level::Trace];
        assert_eq!(all.map(priority), [3, 4, 6, 7, 7]);
    }
}
