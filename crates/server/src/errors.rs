//! The one place where operating-system errors become NBD error codes, and where a remote
//! export's errors become operating-system ones (storage outcomes carry an errno).

use sluice_proto::Errno;

/// Maps a Linux errno (positive) to the error a client sees.
pub fn errno_from_os(code: i32) -> Errno {
    match code {
        libc::EPERM | libc::EACCES | libc::EROFS => Errno::Perm,
        libc::ENOSPC | libc::EDQUOT | libc::EFBIG => Errno::NoSpc,
        libc::EINVAL => Errno::Inval,
        libc::ENOMEM => Errno::NoMem,
        libc::EOVERFLOW => Errno::Overflow,
        libc::EOPNOTSUPP => Errno::NotSup,
        libc::ESHUTDOWN => Errno::Shutdown,
        _ => Errno::Io,
    }
}

/// The errno (positive) a remote export's failure is reported as. The remote server's own
/// NBD error passes through unchanged (NBD errors have Linux's numbers); everything about
/// reaching it (a dead connection, a broken protocol, a timeout) is EIO.
pub fn os_from_remote(e: &sluice_client::Error) -> i32 {
    use sluice_client::Error;
    match e {
        Error::Server { errno, .. } => Errno::from_code(*errno).map_or(libc::EIO, |e| e.code() as i32),
        Error::ReadOnly => libc::EROFS,
        Error::Unsupported(_) => libc::EOPNOTSUPP,
        Error::OutOfRange { .. } | Error::Unaligned { .. } => libc::EINVAL,
        _ => libc::EIO,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_and_file_size_errors_are_out_of_space() {
        assert_eq!(errno_from_os(libc::EDQUOT), Errno::NoSpc);
        assert_eq!(errno_from_os(libc::EFBIG), Errno::NoSpc);
        assert_eq!(errno_from_os(libc::EROFS), Errno::Perm);
        assert_eq!(errno_from_os(libc::EBADF), Errno::Io);
    }

    #[test]
    fn remote_errors_keep_the_remote_servers_errno() {
        use sluice_client::Error;
        for errno in [Errno::Perm, Errno::Io, Errno::NoMem, Errno::Inval, Errno::NoSpc, Errno::Overflow, Errno::NotSup, Errno::Shutdown] {
            let e = Error::Server { errno: errno.code(), message: None };
            assert_eq!(errno_from_os(os_from_remote(&e)), errno);
        }
        assert_eq!(os_from_remote(&Error::Closed), libc::EIO);
        assert_eq!(os_from_remote(&Error::Unsupported("TRIM")), libc::EOPNOTSUPP);
        assert_eq!(errno_from_os(os_from_remote(&Error::ReadOnly)), Errno::Perm);
    }
}
