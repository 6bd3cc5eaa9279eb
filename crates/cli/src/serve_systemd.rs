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

/// How often the housekeeping thread looks for retired exports to close while there are
/// some; with none, it does not look.
const HOUSEKEEPING_INTERVAL_MS: u64 = 1_000;
/// Least time between two status lines: a burst of connections is one update, not one per
/// connection.
const STATUS_COALESCE_MS: u64 = 500;
/// Export names shown in the status line; more are counted.
const STATUS_NAMES_MAX: usize = 8;

pub struct Notifier {
    /// NOTIFY_SOCKET is set (and not empty): a service manager listens.
    enabled: bool,
    watchdog: Option<Duration>,
    /// A failed send is logged once: a manager that went away will not come back.
    warned: AtomicBool,
}

impl Notifier {
    pub fn from_env() -> Notifier {
        let enabled = std::env::var_os("NOTIFY_SOCKET").is_some_and(|s| !s.is_empty());
        // A zero interval is no watchdog (libsystemd reads it so), not a ping loop.
        let watchdog = sd_notify::watchdog_enabled().filter(|w| !w.is_zero());
        Notifier { enabled, watchdog, warned: AtomicBool::new(false) }
    }

    /// Whether a service manager listens.
    pub fn enabled(&self) -> bool {
        self.enabled
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
        if !self.enabled {
            return;
        }
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
/// closes exports a reload removed once their last connection leaves. It sleeps until one
/// of those has something to do: a server at rest, without a watchdog, is never woken.
/// Dropping it stops it.
pub struct Housekeeping {
    poke: mpsc::Sender<Poke>,
    thread: Option<JoinHandle<()>>,
}

/// What wakes the housekeeping thread.
pub enum Poke {
    /// Something changed (a connection, a reload): look.
    Look,
    /// The server stopped. Senders live in other threads too, so the end is said, not
    /// inferred from the channel closing.
    Stop,
}

impl Housekeeping {
    pub fn spawn(running: Arc<Running>, notifier: Arc<Notifier>) -> Housekeeping {
        let (poke, poked) = mpsc::channel();
        if notifier.enabled() {
            // The status line counts clients: a change is worth a look (coalesced below).
            let tell = poke.clone();
            running.watch_connections(Box::new(move || {
                let _ = tell.send(Poke::Look);
            }));
        }
        let thread = std::thread::Builder::new()
            .name("sluice-housekeeping".into())
            .spawn(move || housekeep(&running, &notifier, &poked))
            .map_err(|e| log::warn!("cannot start the housekeeping thread: {e}"))
            .ok();
        Housekeeping { poke, thread }
    }

    /// For whoever changes what is served (a reload): send `Poke::Look` after.
    pub fn poker(&self) -> mpsc::Sender<Poke> {
        self.poke.clone()
    }
}

impl Drop for Housekeeping {
    fn drop(&mut self) {
        let _ = self.poke.send(Poke::Stop);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn housekeep(running: &Running, notifier: &Notifier, poked: &mpsc::Receiver<Poke>) {
    let ping_every = notifier.watchdog.map(|w| w / 2);
    let mut last_ping = Instant::now();
    let mut last_status = String::new();
    // When the status line is next due: a change is shown at most this often.
    let mut status_due: Option<Instant> = None;
    loop {
        let now = Instant::now();
        let deadlines = [
            ping_every.map(|p| last_ping + p),
            running.has_retired().then(|| now + Duration::from_millis(HOUSEKEEPING_INTERVAL_MS)),
            status_due,
        ];
        let woke = match deadlines.into_iter().flatten().min() {
            Some(at) => poked.recv_timeout(at.saturating_duration_since(now)),
            None => poked.recv().map_err(|_| mpsc::RecvTimeoutError::Disconnected),
        };
        match woke {
            Err(mpsc::RecvTimeoutError::Disconnected) | Ok(Poke::Stop) => return,
            Ok(Poke::Look) => {
                status_due.get_or_insert(Instant::now() + Duration::from_millis(STATUS_COALESCE_MS));
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
        }
        running.release_retired();
        if status_due.is_some_and(|t| t <= Instant::now()) {
            status_due = None;
            let status = status_line(running);
            if status != last_status {
                notifier.send(&[NotifyState::Status(&status)]);
                last_status = status;
            }
        }
        if ping_every.is_some_and(|p| last_ping.elapsed() >= p) {
            if running.healthy() {
                notifier.send(&[NotifyState::Watchdog]);
            }
            last_ping = Instant::now();
        }
    }
}
