//! The operations the core asks for, carried out on the backing and the members. Each
//! returns the core's `Outcome` (a read's bytes, or why it failed). Both are the pool's
//! `Member` (the library's `Client`, which this module never names, so that the client and
//! the cache do not import each other).

use crate::error::Error;
use crate::pool::member::Member;
use sluice_cache::{BackingCmd, Failure, MemberCmd, Outcome};
use sluice_proto::Errno;

pub(super) async fn backing<M: Member>(c: &M, cmd: BackingCmd) -> Outcome {
    let done = |r: Result<(), Error>| r.map(|()| Vec::new());
    let r = match cmd {
        BackingCmd::Read { offset, len } => c.read(offset, len as usize).await,
        BackingCmd::Write { offset, data, fua } => done(c.write(offset, &data, fua).await),
        BackingCmd::Zero { offset, len, fua, may_trim } => done(c.write_zeroes(offset, len, fua, may_trim).await),
        BackingCmd::Trim { offset, len, fua } => done(c.trim(offset, len, fua).await),
        BackingCmd::Flush => done(c.flush().await),
    };
    // The core says "backing" in its messages.
    r.map_err(failure)
}

pub(super) async fn member<M: Member>(c: &M, cmd: MemberCmd) -> Outcome {
    let r = match cmd {
        MemberCmd::Read { offset, len } => c.read(offset, len as usize).await,
        // No FUA: a member's memory is never the only copy of anything.
        MemberCmd::Write { offset, data } => c.write(offset, &data, false).await.map(|()| Vec::new()),
        // A dropped slot is trimmed so the member frees its memory; one that cannot trim
        // keeps the bytes, which the slot's next fill overwrites.
        MemberCmd::Trim { offset, len } if c.export().can_trim() => c.trim(offset, len, false).await.map(|()| Vec::new()),
        MemberCmd::Trim { .. } => Ok(Vec::new()),
    };
    r.map_err(failure)
}

/// The failure a client of the cached volume sees for the backing's `e`: the backing
/// server's own errno (ENOSPC stays ENOSPC; one the spec does not name is EINVAL, as it
/// says), or what the request's fault was; anything else (a lost connection, a broken
/// reply) is EIO.
pub(super) fn failure(e: Error) -> Failure {
    let errno = match &e {
        Error::Server { errno, .. } => Errno::from_code(*errno).unwrap_or(Errno::Io),
        Error::ReadOnly => Errno::Perm,
        Error::Unsupported(_) => Errno::NotSup,
        Error::OutOfRange { .. } | Error::Unaligned { .. } => Errno::Inval,
        _ => Errno::Io,
    };
    Failure { errno, message: e.to_string() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_backings_errno_is_kept_and_the_rest_is_eio() {
        let full = failure(Error::Server { errno: Errno::NoSpc.code(), message: Some("disk full".into()) });
        assert_eq!(full.errno, Errno::NoSpc);
        assert!(full.message.contains("disk full"), "{}", full.message);
        // The spec has a client treat an errno it does not know as EINVAL.
        assert_eq!(failure(Error::Server { errno: 9999, message: None }).errno, Errno::Inval);
        assert_eq!(failure(Error::ReadOnly).errno, Errno::Perm);
        assert_eq!(failure(Error::Closed).errno, Errno::Io);
        // An error of the system's is EIO, whatever its errno.
        let io = |code| Error::Io(std::sync::Arc::new(std::io::Error::from_raw_os_error(code)));
        assert_eq!(failure(io(libc::ENOMEM)).errno, Errno::Io);
    }
}
