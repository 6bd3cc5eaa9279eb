//! RAM exports: a sparse memfd on tmpfs, whose holes read as zeros without using memory.
//! It is a file to the kernel, so the file backend serves it; only what tmpfs can do differs.

use std::fs::File;
use std::io;

use super::{Caps, FileBackend};

pub fn memory(size: u64) -> io::Result<FileBackend> {
    let fd = rustix::fs::memfd_create("sluice-memory", rustix::fs::MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, size)?;
    // tmpfs punches holes but has no ZERO_RANGE; punching is how it zeroes. Nothing below
    // the page cache needs syncing, so FUA costs nothing.
    let caps = Caps { trim: true, zero: false, fua: true, extents: true, splice: true, ..Caps::default() };
    FileBackend::from_file("memory", File::from(fd), caps)
}
