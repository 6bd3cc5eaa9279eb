//! What a test leaves behind when the test runner stops it for taking too long: nextest
//! sends SIGTERM to a test past its `slow-timeout` (.config/nextest.toml), and this prints
//! the logs and state that the test's helpers registered (sluice's log, a Ceph cluster's
//! health) before the process exits, so a hang reads like any other failure.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, Once};

type Report = Box<dyn Fn() -> String + Send>;

static REPORTS: Mutex<Vec<(u64, String, Report)>> = Mutex::new(Vec::new());

/// Registered while it lives; dropped, its report is forgotten.
pub struct Registered(u64);

/// Registers `report` (named `what`) to be printed if the test is stopped.
pub fn on_timeout(what: &str, report: impl Fn() -> String + Send + 'static) -> Registered {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    static HANDLER: Once = Once::new();
    HANDLER.call_once(install);
    let id = NEXT.fetch_add(1, Ordering::Relaxed);
    lock().push((id, what.to_owned(), Box::new(report)));
    Registered(id)
}

impl Drop for Registered {
    fn drop(&mut self) {
        lock().retain(|(id, _, _)| *id != self.0);
    }
}

fn lock() -> std::sync::MutexGuard<'static, Vec<(u64, String, Report)>> {
    REPORTS.lock().unwrap_or_else(|e| e.into_inner())
}

fn install() {
    let mut signals = match signal_hook::iterator::Signals::new([libc::SIGTERM]) {
        Ok(s) => s,
        Err(e) => return eprintln!("cannot watch for SIGTERM ({e}); a timed-out test will print no logs"),
    };
    std::thread::spawn(move || {
        if signals.forever().next().is_some() {
            eprintln!("\n==== stopped by SIGTERM (the test runner's timeout?); what the test registered:");
            // A report that blocks must not keep the process alive: the runner's SIGKILL
            // follows after its grace period either way.
            for (_, what, report) in lock().iter() {
                eprintln!("==== {what}:\n{}", report());
            }
            std::process::exit(124);
        }
    });
}
