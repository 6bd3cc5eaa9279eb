//! What the kernel can say about a connected socket that io_uring does not.

use std::os::fd::{AsRawFd, BorrowedFd};

/// Bytes written to a stream socket that its peer has not taken yet (TCP: not yet
/// acknowledged; Unix: not yet read), by SIOCOUTQ; None when the kernel cannot tell.
pub fn unacked_bytes(fd: BorrowedFd<'_>) -> Option<usize> {
    let mut queued: libc::c_int = 0;
    // SAFETY: SIOCOUTQ (TIOCOUTQ) writes one int through the pointer, which refers to a
    // live local of this frame for the whole call; the descriptor is borrowed, so open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCOUTQ, &mut queued as *mut libc::c_int) };
    (rc == 0 && queued >= 0).then_some(queued as usize)
}
