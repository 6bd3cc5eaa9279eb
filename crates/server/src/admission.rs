//! Admission: how many connections the server takes, and how many payload bytes a worker's
//! connections may hold at once. Both are owned above the connection (the acceptor, the
//! worker) so that one client can never raise its own allowance.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use crate::engine::ConnId;

/// The connections open now (handshaking or transmitting), and whoever wants to hear when
/// that number changes (a service manager's status line).
#[derive(Default)]
pub struct Connections {
    open: AtomicUsize,
    watcher: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

impl Connections {
    pub fn open(&self) -> usize {
        self.open.load(Ordering::Relaxed)
    }

    /// Calls `watcher` after every change from now on (once set, it stays).
    pub fn watch(&self, watcher: Box<dyn Fn() + Send + Sync>) {
        let _ = self.watcher.set(watcher);
    }

    fn changed(&self) {
        if let Some(w) = self.watcher.get() {
            w();
        }
    }
}

/// One unit of the server-wide connection budget, returned on drop.
pub struct Permit(Arc<Connections>);

impl Permit {
    /// A permit if fewer than `max` are out.
    pub fn try_take(count: &Arc<Connections>, max: usize) -> Option<Permit> {
        count.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).ok()?;
        count.changed();
        Some(Permit(Arc::clone(count)))
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.0.open.fetch_sub(1, Ordering::AcqRel);
        self.0.changed();
    }
}

/// Payload bytes held by all of a worker's connections, against a cap, and the connections
/// waiting for some to come back. A connection's own budget keeps one client from taking it
/// all; this one bounds the worker's memory whatever the number of clients.
pub struct Budget {
    used_bytes: usize,
    max_bytes: usize,
    waiters: VecDeque<ConnId>,
}

impl Budget {
    pub fn new(max_bytes: usize) -> Budget {
        Budget { used_bytes: 0, max_bytes, waiters: VecDeque::new() }
    }

    pub fn is_full(&self) -> bool {
        self.used_bytes >= self.max_bytes
    }

    #[cfg(any(test, feature = "sim"))]
    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    /// Counts bytes a request holds. A request is admitted while the budget is not full,
    /// so `used_bytes` may pass `max_bytes` by less than one request.
    pub fn take(&mut self, bytes: usize) {
        self.used_bytes += bytes;
    }

    pub fn give(&mut self, bytes: usize) {
        debug_assert!(bytes <= self.used_bytes, "a budget is given back only what was taken");
        self.used_bytes -= bytes;
    }

    /// Queues a connection to be resumed when bytes come back.
    pub fn wait(&mut self, conn: ConnId) {
        if !self.waiters.contains(&conn) {
            self.waiters.push_back(conn);
        }
    }

    /// The next connection to resume, oldest first, while there is room.
    pub fn next_waiter(&mut self) -> Option<ConnId> {
        if self.is_full() {
            return None;
        }
        self.waiters.pop_front()
    }

    /// Forgets a connection that closed while waiting.
    pub fn forget(&mut self, conn: ConnId) {
        self.waiters.retain(|&c| c != conn);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn permits_stop_at_the_maximum_and_come_back_on_drop() {
        let count = Arc::new(Connections::default());
        let changes = Arc::new(AtomicUsize::new(0));
        let seen = Arc::clone(&changes);
        count.watch(Box::new(move || {
            seen.fetch_add(1, Ordering::Relaxed);
        }));
        let a = Permit::try_take(&count, 2).unwrap();
        let _b = Permit::try_take(&count, 2).unwrap();
        assert!(Permit::try_take(&count, 2).is_none());
        assert_eq!(count.open(), 2);
        drop(a);
        assert_eq!(count.open(), 1);
        assert!(Permit::try_take(&count, 2).is_some());
        // Two taken, one given back, one taken and given back; the refusal changed nothing.
        assert_eq!(changes.load(Ordering::Relaxed), 5);
    }

    #[test]
    fn waiters_resume_in_order_only_when_there_is_room() {
        let mut b = Budget::new(100);
        b.take(100);
        b.wait(ConnId(3));
        b.wait(ConnId(1));
        b.wait(ConnId(3));
        assert_eq!(b.next_waiter(), None, "full: nobody resumes");
        b.give(50);
        assert_eq!(b.next_waiter(), Some(ConnId(3)));
        assert_eq!(b.next_waiter(), Some(ConnId(1)));
        assert_eq!(b.next_waiter(), None);
    }
}
