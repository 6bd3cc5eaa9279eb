//! A minimal stderr logger: level, thread, message. Enough for a server run by systemd or
//! by hand; no dependency needed.

use log::{Level, LevelFilter, Log, Metadata, Record};

struct Stderr;

impl Log for Stderr {
    fn enabled(&self, m: &Metadata) -> bool {
        m.level() <= log::max_level()
    }

    fn log(&self, r: &Record) {
        if !self.enabled(r.metadata()) {
            return;
        }
        let level = match r.level() {
            Level::Error => "error",
            Level::Warn => "warning",
            Level::Info => "info",
            Level::Debug => "debug",
            Level::Trace => "trace",
        };
        // Never panic on a closed stderr (a pipe whose reader left): logging is best effort.
        use std::io::Write;
        let _ = writeln!(std::io::stderr().lock(), "sluice: {level}: {}", r.args());
    }

    fn flush(&self) {}
}

pub fn init(level: LevelFilter) {
    static LOGGER: Stderr = Stderr;
    let _ = log::set_logger(&LOGGER);
    log::set_max_level(level);
}
