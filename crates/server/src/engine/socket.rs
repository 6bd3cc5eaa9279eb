//! What the kernel can say about a connected socket that io_uring does not, and the
//! listening sockets a service manager passes down.

use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering};

/// Bytes written to a stream socket that its peer has not taken yet (TCP: not yet
/// acknowledged; Unix: not yet read), by SIOCOUTQ; None when the kernel cannot tell.
pub fn unacked_bytes(fd: BorrowedFd<'_>) -> Option<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int through the pointer, which refers to a
    // live local of this frame for the whole call; the descriptor is borrowed, so open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut queued as *mut libc::c_int) };
    (rc == 0 && queued >= 0).then_some(queued as usize)
}

/// The listening sockets the service manager passed to this process (socket activation:
/// `LISTEN_PID` names this process, `LISTEN_FDS` counts descriptors from 3 on, and
/// `LISTEN_FDNAMES` may name them), each with its name ("" when unnamed). They are taken
/// once: later calls return none, so no descriptor gets two owners.
pub fn inherited_listen_fds() -> std::io::Result<Vec<(OwnedFd, String)>> {
    static TAKEN: AtomicBool = AtomicBool::new(false);
    if TAKEN.swap(true, Ordering::SeqCst) {
        return Ok(Vec::new());
    }
    let fds = sd_notify::listen_fds_with_names()?;
    Ok(fds
        .map(|(raw, name)| {
            // SAFETY: by the socket activation protocol, descriptors 3..3+LISTEN_FDS are open
            // and handed to this process (LISTEN_PID is ours, which sd_notify checked);
            // nothing else in sluice opens or uses them, and TAKEN makes this the only
            // place that wraps them, once, so each OwnedFd is their one owner.
            (unsafe { OwnedFd::from_raw_fd(raw) }, name)
        })
        .collect())
}
