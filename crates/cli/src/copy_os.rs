//! The system calls `sluice copy` needs that std does not wrap: finding data and holes in a
//! file (lseek SEEK_DATA / SEEK_HOLE) and punching holes (fallocate), through rustix's
//! safe wrappers.

use rustix::fs::{FallocateFlags, SeekFrom};
use std::fs::File;
use std::io;

/// Where the first data at or after `offset` starts, or None when only a hole follows
/// up to the end of the file (ENXIO). The file position moves; the copy uses pread.
pub fn seek_data(f: &File, offset: u64) -> io::Result<Option<u64>> {
    match rustix::fs::seek(f, SeekFrom::Data(offset)) {
        Ok(at) => Ok(Some(at)),
        Err(rustix::io::Errno::NXIO) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Where the hole at or after `offset` starts (the end of the file counts as a hole).
pub fn seek_hole(f: &File, offset: u64) -> io::Result<u64> {
    Ok(rustix::fs::seek(f, SeekFrom::Hole(offset))?)
}

/// Deallocates the range without changing the file's size; afterwards it reads as zeros.
/// On a block device the kernel zeroes the range (or fails with EOPNOTSUPP if the device
/// cannot guarantee zeros).
pub fn punch_hole(f: &File, offset: u64, len: u64) -> io::Result<()> {
    let mode = FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE;
    Ok(rustix::fs::fallocate(f, mode, offset, len)?)
}

/// Whether a punch_hole error means "not possible here" (file system or device without
/// support, or a range the device cannot punch), so writing zeros is the way instead.
pub fn punch_unsupported(e: &io::Error) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::EOPNOTSUPP | libc::ENOSYS | libc::EINVAL)
    )
}
