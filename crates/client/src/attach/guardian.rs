//! The guardian of an attached device: it hears the driver's link-dead notices (and, as a
//! backstop, looks at the sockets itself once a second), reconnects with backoff, checks
//! that the server it reached serves the same disk, and hands the kernel the new sockets.
//! It stops when told to (detaching the device) or when the device goes away.

use super::device::{Nbd, Watch};
use super::sockets::{backend, open_sockets, AttachOptions, Identity};
use crate::error::Error;
use crate::limits::{ATTACH_BACKOFF_FIRST_MS, ATTACH_BACKOFF_MAX_MS, ATTACH_CHECK_INTERVAL_MS};
use rustix::event::{poll, PollFd, PollFlags, Timespec};
use std::future::Future;
use std::os::fd::OwnedFd;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;


/// What the guardian tells its caller (to log, and to show in `attach --list`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// The link died; reconnection starts.
    LinkDead,
    /// A try failed; `why` says how. The next comes after a backoff.
    Retrying { attempt: u32, why: String },
    /// A server answered but does not serve the attached disk: no socket of it goes to the
    /// kernel.
    Refused { why: String },
    /// The device has live sockets again.
    Reconnected { after: Duration, connections: usize },
    /// The device was disconnected (by the guardian when told to stop, or by someone else).
    Detached,
}

/// Guards device `index`, connected to the sockets `watched` are duplicates of (in the
/// kernel's order), until `stop` resolves (then the device is disconnected) or the device is
/// gone.
pub async fn guard(
    mut nbd: Nbd,
    index: u32,
    options: &AttachOptions,
    first: &Identity,
    mut watched: Vec<OwnedFd>,
    stop: impl Future<Output = ()>,
    mut on: impl FnMut(Event),
) -> Result<(), Error> {
    // Without notices the once-a-second check still finds dead sockets, later.
    let mut notices = notices(&nbd, index).unwrap_or_else(|e| {
        log::warn!("{e}; relying on the guardian's own checks");
        mpsc::unbounded_channel().1
    });
    let mut check = tokio::time::interval(Duration::from_millis(ATTACH_CHECK_INTERVAL_MS));
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return detach(&mut nbd, index, &mut on),
            Some(()) = notices.recv() => {}
            _ = check.tick() => {}
        }
        // A device someone else disconnected must not be revived.
        match nbd.connected(index) {
            Ok(Some(true)) => {}
            Ok(_) => {
                on(Event::Detached);
                return Ok(());
            }
            Err(e) => {
                log::warn!("{e}");
                continue;
            }
        }
        // Only the sockets the kernel gave up on are replaced: it takes a new socket only
        // for a dead slot. (A notice comes just before the kernel shuts the socket down;
        // the next check finds it.)
        let dead = hung_up(&watched);
        if dead.is_empty() {
            continue;
        }
        on(Event::LinkDead);
        let reconnect = reconnect(&mut nbd, index, options, first, &watched, &mut on);
        tokio::select! {
            () = &mut stop => return detach(&mut nbd, index, &mut on),
            (dead, fresh) = reconnect => {
                for (slot, fd) in dead.into_iter().zip(fresh) {
                    watched[slot] = fd;
                }
            }
        }
        // Notices about the sockets just replaced say nothing about the new ones.
        while notices.try_recv().is_ok() {}
    }
}

fn detach(nbd: &mut Nbd, index: u32, on: &mut impl FnMut(Event)) -> Result<(), Error> {
    let r = nbd.disconnect(index);
    on(Event::Detached);
    r
}

/// Failures in a row after which the notice socket is given up.
const NOTICE_FAILURES_MAX: u32 = 100;

/// Link-dead notices for device `index`, heard on a thread of their own (the socket
/// blocks); the thread ends with the process.
fn notices(nbd: &Nbd, index: u32) -> Result<mpsc::UnboundedReceiver<()>, Error> {
    let watch: Watch = nbd.watch()?;
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::Builder::new()
        .name("nbd-notices".into())
        .spawn(move || {
            let mut failures = 0;
            loop {
                match watch.next() {
                    Ok(dead) => {
                        failures = 0;
                        if dead.contains(&index) && tx.send(()).is_err() {
                            return;
                        }
                    }
                    // ENOBUFS (notices came faster than they were read) is passing; a
                    // socket that keeps failing is not.
                    Err(e) if failures < NOTICE_FAILURES_MAX => {
                        failures += 1;
                        log::debug!("{e}");
                    }
                    Err(e) => {
                        log::warn!("{e}; relying on the guardian's own checks");
                        return;
                    }
                }
            }
        })
        .map_err(Error::io)?;
    Ok(rx)
}

/// The positions of the sockets that were shut down or closed by their peer: the kernel
/// shuts a socket down when it declares it dead.
fn hung_up(fds: &[OwnedFd]) -> Vec<usize> {
    let mut polled: Vec<PollFd<'_>> = fds.iter().map(|fd| PollFd::new(fd, PollFlags::RDHUP)).collect();
    let zero = Timespec { tv_sec: 0, tv_nsec: 0 };
    if poll(&mut polled, Some(&zero)).is_err() {
        return Vec::new();
    }
    let gone = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR;
    polled.iter().enumerate().filter(|(_, p)| p.revents().intersects(gone)).map(|(i, _)| i).collect()
}

/// Tries until the kernel has a new socket (or as many as the server now allows) for each
/// of `watched` that died, to the same disk; returns the dead ones' positions and the new
/// sockets, to watch. Never gives up by itself: after the
/// dead-connection timeout the kernel fails I/O, and a server that comes back later still
/// revives the device.
async fn reconnect(
    nbd: &mut Nbd,
    index: u32,
    options: &AttachOptions,
    first: &Identity,
    watched: &[OwnedFd],
    on: &mut impl FnMut(Event),
) -> (Vec<usize>, Vec<OwnedFd>) {
    let started = Instant::now();
    let mut delay = Duration::from_millis(ATTACH_BACKOFF_FIRST_MS);
    for attempt in 1.. {
        // Counted again each time: a server that dies closes its connections one by one,
        // and the first notice can come before the last of them is gone.
        let dead = hung_up(watched);
        match try_once(nbd, index, options, first, dead.len().max(1)).await {
            Ok(fds) => {
                on(Event::Reconnected { after: started.elapsed(), connections: fds.len() });
                return (dead, fds);
            }
            Err(Failure::Refused(why)) => on(Event::Refused { why }),
            Err(Failure::Other(e)) => on(Event::Retrying { attempt, why: e.to_string() }),
        }
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(Duration::from_millis(ATTACH_BACKOFF_MAX_MS));
    }
    unreachable!("the attempts never run out")
}

enum Failure {
    Refused(String),
    Other(Error),
}

async fn try_once(nbd: &mut Nbd, index: u32, options: &AttachOptions, first: &Identity, dead: usize) -> Result<Vec<OwnedFd>, Failure> {
    let sockets = open_sockets(&options.uri, dead).await.map_err(Failure::Other)?;
    if let Some(why) = first.differs(&sockets.identity) {
        return Err(Failure::Refused(why));
    }
    nbd.reconfigure(index, &backend(options), &sockets.fds).map_err(Failure::Other)?;
    Ok(sockets.fds)
}
