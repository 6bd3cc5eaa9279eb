//! Re-establishing a connection that drops. Each of a client's connections is a `Link`
//! whose current `Connection` a supervisor task replaces, with backoff, when it drops; the
//! new one must negotiate the same export. The link also keeps the notes that tell a later
//! flush whether writes were lost with the connection that dropped.

use crate::connection::Connection;
use crate::error::Error;
use crate::export::Export;
use crate::handshake;
use crate::options::{Options, Reconnect};
use crate::uri::Uri;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Where a link stands.
#[derive(Clone)]
pub(crate) enum Status {
    /// Connected. The connection may have failed a moment ago, before the supervisor saw.
    Up(Arc<Connection>),
    /// Dropped, and being re-established.
    Reconnecting,
    /// Given up for good: every request gets this error.
    Gone(Error),
}

struct State {
    status: Status,
    /// `writes_acked` of the current connection when the last flush that succeeded on
    /// any connection was sent: the writes that flush covered.
    flushed: u64,
    /// A connection dropped with writes acknowledged that no flush covered; the next flush
    /// reports it.
    durability_lost: bool,
}

/// One of a client's connections, over however many times it is re-established.
pub(crate) struct Link {
    state: Mutex<State>,
    /// Bumped on every status change of any of the client's links, so that a request can
    /// wait for whichever comes back first.
    changed: Arc<watch::Sender<()>>,
}

impl Link {
    pub(crate) fn new(conn: Connection, changed: Arc<watch::Sender<()>>) -> Link {
        let state = State { status: Status::Up(Arc::new(conn)), flushed: 0, durability_lost: false };
        Link { state: Mutex::new(state), changed }
    }

    pub(crate) fn status(&self) -> Status {
        self.state.lock().unwrap().status.clone()
    }

    fn current(&self) -> Option<Arc<Connection>> {
        match &self.state.lock().unwrap().status {
            Status::Up(conn) => Some(conn.clone()),
            _ => None,
        }
    }

    /// The current connection, and the unforced writes it has acknowledged so far.
    pub(crate) fn current_acked(&self) -> Option<(Arc<Connection>, u64)> {
        let conn = self.current()?;
        let acked = conn.writes_acked();
        Some((conn, acked))
    }

    /// Notes that `old`, which has ended, dropped: whether it took unflushed writes with
    /// it, and that the link is now reconnecting. False when the link was given up.
    fn dropped(&self, old: &Connection) -> bool {
        let mut st = self.state.lock().unwrap();
        if matches!(st.status, Status::Gone(_)) {
            return false;
        }
        if old.writes_acked() > st.flushed {
            st.durability_lost = true;
        }
        st.flushed = 0;
        st.status = Status::Reconnecting;
        drop(st);
        self.changed.send_replace(());
        true
    }

    /// Puts a re-established connection in service. False when the link was given up
    /// meanwhile (the connection is then dropped, which closes it).
    fn up(&self, conn: Connection) -> bool {
        let mut st = self.state.lock().unwrap();
        if matches!(st.status, Status::Gone(_)) {
            return false;
        }
        st.status = Status::Up(Arc::new(conn));
        drop(st);
        self.changed.send_replace(());
        true
    }

    /// Gives the link up with `why`, which every later request gets. Returns the
    /// connection that was current, if any.
    pub(crate) fn give_up(&self, why: Error) -> Option<Arc<Connection>> {
        let old = std::mem::replace(&mut self.state.lock().unwrap().status, Status::Gone(why));
        self.changed.send_replace(());
        match old {
            Status::Up(conn) => Some(conn),
            _ => None,
        }
    }

    /// Notes a flush that succeeded: it covered the writes `conn` had acknowledged when it
    /// was sent (`acked`), if `conn` is still this link's connection.
    pub(crate) fn flushed(&self, conn: &Arc<Connection>, acked: u64) {
        let mut st = self.state.lock().unwrap();
        if matches!(&st.status, Status::Up(c) if Arc::ptr_eq(c, conn)) {
            st.flushed = st.flushed.max(acked);
        }
    }

    /// Whether a drop lost unflushed writes since this was last asked.
    pub(crate) fn take_durability_lost(&self) -> bool {
        std::mem::take(&mut self.state.lock().unwrap().durability_lost)
    }

    /// Returns once `conn` is no longer this link's connection, so that its drop has been
    /// noted.
    pub(crate) async fn left(&self, conn: &Arc<Connection>) {
        loop {
            let mut changed = self.changed.subscribe();
            if !matches!(&self.state.lock().unwrap().status, Status::Up(c) if Arc::ptr_eq(c, conn)) {
                return;
            }
            // The sender lives in `self`, so this only returns on a change.
            let _ = changed.changed().await;
        }
    }
}

/// Whether a connection that failed with `e` dropped, so that it may be re-established
/// and its requests sent again: an I/O error, the connection closed, or the server
/// shutting down. A server that broke the protocol is not trusted again.
pub(crate) fn dropped(e: &Error) -> bool {
    match e {
        Error::Io(_) | Error::Closed => true,
        Error::Server { errno, .. } => *errno == sluice_proto::Errno::Shutdown.code(),
        _ => false,
    }
}

/// A link's supervisor: waits for its connection to end and re-establishes it, until the
/// link is given up. Runs as a task for as long as the client lives.
pub(crate) async fn supervise(link: Arc<Link>, uri: Uri, options: Options, export: Export) {
    let Some(policy) = options.reconnect.clone() else { return };
    let mut delay = policy.initial_delay;
    while let Some(conn) = link.current() {
        let up_since = Instant::now();
        conn.ended().await;
        let why = conn.failure().unwrap_or(Error::Closed);
        if !dropped(&why) {
            link.give_up(why);
            return;
        }
        if !link.dropped(&conn) {
            return;
        }
        drop(conn);
        log::warn!("lost the connection to {uri} ({why}); reconnecting");
        // A connection that dropped soon after it came back keeps the backoff growing.
        if up_since.elapsed() >= policy.max_delay {
            delay = policy.initial_delay;
        }
        match reestablish(&uri, &options, &policy, &export, &mut delay, why).await {
            Ok(conn) => {
                log::info!("reconnected to {uri}");
                if !link.up(conn) {
                    return;
                }
            }
            Err(e) => {
                log::warn!("{e}");
                link.give_up(e);
                return;
            }
        }
    }
}

/// Attempts to connect until one succeeds or `give_up_after` has passed, waiting `delay`
/// (which grows) before each. A connection to a different export is refused at once.
async fn reestablish(uri: &Uri, options: &Options, policy: &Reconnect, export: &Export, delay: &mut Duration, mut last: Error) -> Result<Connection, Error> {
    let deadline = Instant::now() + policy.give_up_after;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            let why = format!("gave up reconnecting to {uri} after {:?} (last: {last})", policy.give_up_after);
            return Err(Error::Disconnected { why });
        }
        tokio::time::sleep((*delay).min(left)).await;
        *delay = policy.next_delay(*delay);
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            continue;
        }
        match handshake::open(uri, options, options.connect_timeout.min(left)).await {
            Ok((now, conn)) => {
                return match export.change(&now) {
                    None => Ok(conn),
                    Some(what) => Err(Error::Disconnected { why: format!("reconnected to {uri}, but the export changed: {what}") }),
                };
            }
            Err(e) => {
                log::debug!("reconnecting to {uri}: {e}");
                last = e;
            }
        }
    }
}
