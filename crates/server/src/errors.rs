//! The one place where operating-system errors become NBD error codes.

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
}
