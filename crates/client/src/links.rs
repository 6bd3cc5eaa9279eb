//! A client's connections taken together: each request goes to the least loaded one that
//! is up, waits while they are being re-established, and is sent again when a drop cut it
//! off. A flush is never sent again: a flush cut off, or writes that a drop may have lost
//! before they were flushed, are reported to the caller instead.

use crate::connection::{Connection, Outcome};
use crate::error::Error;
use crate::export::Export;
use crate::limits::REQUEST_ATTEMPTS_MAX;
use crate::options::Options;
use crate::reconnect::{self, Link, Status};
use crate::uri::Uri;
use sluice_proto::wire::*;
use std::io::IoSlice;
use std::sync::Arc;
use tokio::sync::watch;
use tokio::task::JoinHandle;

pub(crate) struct Links {
    links: Vec<Arc<Link>>,
    /// Bumped whenever any link changes status.
    changed: Arc<watch::Sender<()>>,
    /// One per link when reconnecting is on; none when it is off.
    supervisors: Vec<JoinHandle<()>>,
}

impl Drop for Links {
    fn drop(&mut self) {
        for s in &self.supervisors {
            s.abort();
        }
    }
}

impl Links {
    /// Takes over a client's open connections, all to `export`; with `options.reconnect`,
    /// each gets a supervisor that re-establishes it when it drops.
    pub(crate) fn new(connections: Vec<Connection>, uri: &Uri, options: &Options, export: &Export) -> Links {
        let changed = Arc::new(watch::Sender::new(()));
        let links: Vec<_> = connections.into_iter().map(|c| Arc::new(Link::new(c, changed.clone()))).collect();
        let supervisors = match options.reconnect {
            Some(_) => {
                let supervise = |l: &Arc<Link>| reconnect::supervise(l.clone(), uri.clone(), options.clone(), export.clone());
                links.iter().map(|l| tokio::spawn(supervise(l))).collect()
            }
            None => Vec::new(),
        };
        Links { links, changed, supervisors }
    }

    pub(crate) fn len(&self) -> usize {
        self.links.len()
    }

    fn reconnecting(&self) -> bool {
        !self.supervisors.is_empty()
    }

    /// The connection with the fewest requests in flight, waiting while none is up and
    /// some are being re-established.
    async fn pick(&self) -> Result<(&Link, Arc<Connection>), Error> {
        let mut changed: Option<watch::Receiver<()>> = None;
        loop {
            let mut best: Option<(usize, &Link, Arc<Connection>)> = None;
            let (mut coming_back, mut gone) = (false, None);
            for link in &self.links {
                match link.status() {
                    Status::Up(conn) => match conn.load() {
                        Some(n) if best.as_ref().is_none_or(|b| n < b.0) => best = Some((n, link, conn)),
                        Some(_) => {}
                        // Failed, and its supervisor is about to see.
                        None => coming_back = true,
                    },
                    Status::Reconnecting => coming_back = true,
                    Status::Gone(e) => {
                        gone.get_or_insert(e);
                    }
                }
            }
            if let Some((_, link, conn)) = best {
                return Ok((link, conn));
            }
            if !(coming_back && self.reconnecting()) {
                return Err(gone.unwrap_or(Error::Closed));
            }
            match &mut changed {
                // Look once more before waiting, so that no change is missed.
                None => changed = Some(self.changed.subscribe()),
                // `self` holds the sender, so this only returns on a change.
                Some(changed) => {
                    let _ = changed.changed().await;
                }
            }
        }
    }

    /// Sends one request and waits for its reply, as `Connection::call`. With reconnecting
    /// on, a request the connection's drop cut off is sent again once a connection is up;
    /// NBD orders nothing among requests in flight, so that is as safe as the first send.
    pub(crate) async fn call(&self, cmd: u16, flags: u16, offset: u64, len: u64, payload: &[IoSlice<'_>], mut bufs: Vec<Vec<u8>>) -> Result<Outcome, Error> {
        let mut attempts = 0;
        loop {
            let (link, conn) = self.pick().await?;
            let failed = match conn.call(cmd, flags, offset, len, payload, bufs).await {
                Ok(outcome) => return Ok(outcome),
                Err(failed) => failed,
            };
            if !self.reconnecting() || !reconnect::dropped(&failed.error) {
                return Err(failed.error);
            }
            if cmd == CMD_FLUSH {
                return Err(self.flush_lost(link, &conn).await);
            }
            attempts += 1;
            if attempts >= REQUEST_ATTEMPTS_MAX {
                let why = format!("the connection dropped {attempts} times with this request in flight (last: {})", failed.error);
                return Err(Error::Disconnected { why });
            }
            log::debug!("resending a request (command {cmd}) cut off by a drop: {}", failed.error);
            bufs = failed.bufs;
            // What the failed attempt wrote into them is overwritten by the next, which must
            // cover the whole range to succeed.
            debug_assert!(cmd != CMD_READ || bufs.iter().map(|b| b.len() as u64).sum::<u64>() == len);
        }
    }

    /// Flushes on one connection. Fails with `DurabilityLost` when a connection dropped
    /// with writes no flush had covered, before this flush was answered; the flush is sent
    /// all the same, so the writes made since are durable when the caller writes the lost
    /// ones again.
    pub(crate) async fn flush(&self) -> Result<(), Error> {
        // What each connection had acknowledged before the flush went out: what it covers.
        let covered: Vec<_> = match self.reconnecting() {
            true => self.links.iter().filter_map(|l| l.current_acked().map(|(c, n)| (l, c, n))).collect(),
            false => Vec::new(),
        };
        self.call(CMD_FLUSH, 0, 0, 0, &[], Vec::new()).await?;
        for (link, conn, acked) in covered {
            link.flushed(&conn, acked);
        }
        match self.take_durability_lost() {
            true => Err(Error::DurabilityLost),
            false => Ok(()),
        }
    }

    /// The error for a flush that `conn`'s drop cut off: whether the server made anything
    /// durable is unknown, so it is not sent again. It also reports any unflushed writes
    /// lost, once the supervisor has noted them.
    async fn flush_lost(&self, link: &Link, conn: &Arc<Connection>) -> Error {
        link.left(conn).await;
        if let Status::Gone(e @ Error::Closed) = link.status() {
            // Disconnected by the caller: nothing was lost to a drop.
            return e;
        }
        self.take_durability_lost();
        Error::DurabilityLost
    }

    /// Whether any link lost unflushed writes; asks (and so clears) every one.
    fn take_durability_lost(&self) -> bool {
        let mut lost = false;
        for link in &self.links {
            lost |= link.take_durability_lost();
        }
        lost
    }

    /// Sends NBD_CMD_DISC on every connection and stops reconnecting. Requests in flight
    /// may still complete; new ones fail with `Error::Closed`.
    pub(crate) async fn disconnect(&self) {
        for s in &self.supervisors {
            s.abort();
        }
        for link in &self.links {
            if let Some(conn) = link.give_up(Error::Closed) {
                conn.disconnect().await;
            }
        }
    }
}
