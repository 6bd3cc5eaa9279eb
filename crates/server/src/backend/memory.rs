//! RAM exports: a sparse memfd on tmpfs, whose holes read as zeros without using memory.
//! It is a file to the kernel, so the file backend serves it; only what tmpfs can do differs.

use std::fs::File;
use std::io;

use super::file::FileBackend;
use super::interface::Caps;

pub fn memory(size: u64) -> io::Result<FileBackend> {
    let fd = rustix::fs::memfd_create("sluice-memory", rustix::fs::MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, size)?;
    // tmpfs punches holes but has no ZERO_RANGE; punching is how it zeroes. Nothing below
    // the page cache needs syncing, so FUA costs nothing.
    let caps = Caps { trim: true, zero: false, fua: true, extents: true, splice: true, ..Caps::default() };
    FileBackend::from_file("memory", File::from(fd), caps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::reply::Extent;
    use sluice_proto::wire::{STATE_HOLE, STATE_ZERO};

    #[test]
    fn memory_backend_reports_written_regions_as_data() {
        let b = memory(1 << 20).unwrap();
        b.write_at_once(&[7u8; 4096], 65536).unwrap();
        let mut out = Vec::new();
        b.extents(0, 1 << 20, false, &mut out).unwrap();
        let total: u64 = out.iter().map(|e| e.length).sum();
        assert_eq!(total, 1 << 20);
        assert_eq!(out[0], Extent { length: 65536, flags: STATE_HOLE | STATE_ZERO });
        assert_eq!(out[1].flags, 0);
        assert!(out[1].length >= 4096);
        let mut one = Vec::new();
        b.extents(0, 1 << 20, true, &mut one).unwrap();
        assert_eq!(one.len(), 1);
    }
}
