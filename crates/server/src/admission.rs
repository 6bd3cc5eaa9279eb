//! Admission: how many connections the server takes, and how many payload bytes a worker's
//! connections may hold at once. Both are owned above the connection (the acceptor, the
//! worker) so that one client can never raise its own allowance.

use std::collections::{HashMap, VecDeque};
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, OnceLock};

use crate::engine::ConnId;

/// The connections open now (handshaking or transmitting), in all and per client, and
/// whoever wants to hear when that number changes (a service manager's status line).
#[derive(Default)]
pub struct Connections {
    open: AtomicUsize,
    per_client: Mutex<HashMap<ClientKey, usize>>,
    watcher: OnceLock<Box<dyn Fn() + Send + Sync>>,
}

/// Who a connection counts against for `connections-per-client`: its address, or a Unix
/// socket peer's uid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ClientKey {
    Addr(IpAddr),
    Uid(u32),
}

/// Why no permit was given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The server's `connections` are all taken.
    Full,
    /// This client holds `connections-per-client` already.
    ClientFull,
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

/// One unit of the server-wide connection budget, and of its client's, returned on drop.
pub struct Permit(Arc<Connections>, Option<ClientKey>);

impl Permit {
    /// A permit if fewer than `max` are out.
    #[cfg(test)]
    pub fn try_take(count: &Arc<Connections>, max: usize) -> Option<Permit> {
        Permit::take(count, max, None, usize::MAX).ok()
    }

    /// A permit if fewer than `max` are out in all and fewer than `per_client_max` are
    /// held by `client`.
    pub fn take(count: &Arc<Connections>, max: usize, client: Option<ClientKey>, per_client_max: usize) -> Result<Permit, Refusal> {
        if let Some(key) = client {
            let mut held = count.per_client.lock().unwrap_or_else(|e| e.into_inner());
            let n = held.entry(key).or_default();
            if *n >= per_client_max {
                return Err(Refusal::ClientFull);
            }
            *n += 1;
        }
        // From here the permit exists, so its drop gives back the client's count too.
        let permit = Permit(Arc::clone(count), client);
        if count.open.fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| (n < max).then_some(n + 1)).is_err() {
            permit.forget_client();
            std::mem::forget(permit);
            return Err(Refusal::Full);
        }
        count.changed();
        Ok(permit)
    }

    fn forget_client(&self) {
        let Some(key) = self.1 else { return };
        let mut held = self.0.per_client.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = held.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                held.remove(&key);
            }
        }
    }
}

impl Drop for Permit {
    fn drop(&mut self) {
        self.forget_client();
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
    fn one_client_cannot_take_every_slot() {
        let count = Arc::new(Connections::default());
        let (ka, kb) = (ClientKey::Addr("192.0.2.1".parse().unwrap()), ClientKey::Uid(1000));
        let (a, b) = (Some(ka), Some(kb));
        let a1 = Permit::take(&count, 3, a, 2).unwrap();
        let a2 = Permit::take(&count, 3, a, 2).unwrap();
        assert_eq!(Permit::take(&count, 3, a, 2).err(), Some(Refusal::ClientFull));
        let _b1 = Permit::take(&count, 3, b, 2).unwrap();
        assert_eq!(Permit::take(&count, 3, b, 2).err(), Some(Refusal::Full), "the server is full first");
        assert_eq!(count.open(), 3);
        // The refusal for a full server gave the client's count back: b has one, not two.
        drop(a1);
        let _b2 = Permit::take(&count, 3, b, 2).unwrap();
        assert_eq!(Permit::take(&count, 4, b, 2).err(), Some(Refusal::ClientFull));
        let a3 = Permit::take(&count, 4, a, 2).expect("a gave one back");
        drop((a2, a3));
        let held = count.per_client.lock().unwrap();
        assert!(!held.contains_key(&ka) && held[&kb] == 2, "a's count went to zero and its entry with it: {held:?}");
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
