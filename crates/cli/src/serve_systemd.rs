//! Telling a service manager how the server is doing, through sd_notify when
//! `NOTIFY_SOCKET` is set: READY=1 once connections are accepted, a STATUS= line with the
//! exports and the clients, RELOADING=1 around a reload, STOPPING=1 at the stop, and
//! WATCHDOG=1 at half the interval `WATCHDOG_USEC` asks for. Without `NOTIFY_SOCKET`,
//! sending is a no-op. The housekeeping thread also releases exports a reload removed.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use sd_notify::NotifyState;
use sluice_server::Running;

/// How often the housekeeping thread looks at the server when no watchdog asks for more.
const HOUSEKEEPING_INTERVAL_MS: u64 = 1_000;
/// Export names shown in the status line; more are counted.
const STATUS_NAMES_MAX: usize = 8;

pub struct Notifier {
    watchdog: Option<Duration>,
    /// A failed send is logged once: a manager that went away will not come back.
    warned: AtomicBool,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        Notifier { watchdog: sd_notify::watchdog_enabled(), warned: AtomicBool::new(false) }
    }

    /// READY=1 with the status: at the start, and at the end of a reload.
    pub fn ready(&self, running: &Running) {
        self.send(&[NotifyState::Ready, NotifyState::Status(&status_line(running))]);
    }

    /// RELOADING=1 and the monotonic time, which newer systemd wants with it.
    pub fn reloading(&self) {
        match NotifyState::monotonic_usec_now() {
            Ok(now) => self.send(&[NotifyState::Reloading, now]),
            Err(_) => self.send(&[NotifyState::Reloading]),
        }
    }

    pub fn stopping(&self) {
        self.send(&[NotifyState::Stopping, NotifyState::Status("stopping: finishing in-flight requests")]);
    }

    fn send(&self, states: &[NotifyState]) {
        if let Err(e) = sd_notify::notify(states) {
            if !self.warned.swap(true, Ordering::Relaxed) {
                log::warn!("cannot notify the service manager: {e}");
            }
        }
    }
}

/// "serving 2 exports (a, b) to 3 clients"
pub fn status_line(running: &Running) -> String {
    let exports = running.exports();
    let mut names: Vec<String> = exports.iter().take(STATUS_NAMES_MAX).map(|e| format!("{:?}", e.name)).collect();
    if exports.len() > STATUS_NAMES_MAX {
        names.push(format!("{} more", exports.len() - STATUS_NAMES_MAX));
    }
    let clients = running.connections();
    let plural = |n: usize, word: &str| if n == 1 { format!("1 {word}") } else { format!("{n} {word}s") };
    format!("serving {} ({}) to {}", plural(exports.len(), "export"), names.join(", "), plural(clients, "client"))
}

/// The thread that keeps the status current, pings the watchdog while the workers run, and
/// closes exports a reload removed once their last connection leaves. Dropping it stops it.
pub struct Housekeeping {
    stop: Option<mpsc::Sender<()>>,
    thread: Option<JoinHandle<()>>,
}

impl Housekeeping {
    pub fn spawn(running: Arc<Running>, notifier: Arc<Notifier>) -> Housekeeping {
        let (stop, stopped) = mpsc::channel();
        let thread = std::thread::Builder::new()
            .name("sluice-housekeeping".into())
            .spawn(move || housekeep(&running, &notifier, &stopped))
            .map_err(|e| log::warn!("cannot start the housekeeping thread: {e}"))
            .ok();
        Housekeeping { stop: Some(stop), thread }
    }
}

impl Drop for Housekeeping {
    fn drop(&mut self) {
        drop(self.stop.take());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn housekeep(running: &Running, notifier: &Notifier, stopped: &mpsc::Receiver<()>) {
    let ping_every = notifier.watchdog.map(|w| w / 2);
    let tick = ping_every.map_or(Duration::from_millis(HOUSEKEEPING_INTERVAL_MS), |p| p.min(Duration::from_millis(HOUSEKEEPING_INTERVAL_MS)));
    let mut last_status = String::new();
    let mut last_ping = Instant::now();
    while let Err(mpsc::RecvTimeoutError::Timeout) = stopped.recv_timeout(tick) {
        running.release_retired();
        let status = status_line(running);
        if status != last_status {
            notifier.send(&[NotifyState::Status(&status)]);
            last_status = status;
        }
        if ping_every.is_some_and(|p| last_ping.elapsed() >= p) && running.healthy() {
            notifier.send(&[NotifyState::Watchdog]);
            last_ping = Instant::now();
        }
    }
}
