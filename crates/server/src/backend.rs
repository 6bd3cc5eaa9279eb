//! Backends: where an export's bytes live. Each states what it can do; the connection
//! code drives file descriptors through the engine and emulates what a backend lacks.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use sluice_proto::limits::EXTENTS_PER_REPLY_MAX;
use sluice_proto::reply::Extent;
use sluice_proto::wire::{STATE_HOLE, STATE_ZERO};

/// What a backend can do natively.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Caps {
    /// Punching holes frees space and reads back as zeros.
    pub trim: bool,
    /// A zeroing primitive (fallocate ZERO_RANGE) that is faster than writing zeros.
    pub zero: bool,
    /// Allocation is visible through SEEK_DATA/SEEK_HOLE.
    pub extents: bool,
    pub rotational: bool,
}

pub trait Backend: Send + Sync {
    /// "file", "block", "memory" or "null", for logs and `info`.
    fn kind(&self) -> &'static str;
    fn size(&self) -> u64;
    fn caps(&self) -> Caps;
    /// The descriptor the engine reads and writes; None for backends without storage.
    fn fd(&self) -> Option<RawFd>;
    /// The same descriptor, for system calls made directly.
    fn file(&self) -> Option<BorrowedFd<'_>> {
        None
    }
    /// A second descriptor on the same data opened with O_DIRECT, when the export asked for
    /// one and the filesystem allows it.
    fn direct_fd(&self) -> Option<RawFd> {
        None
    }
    /// Offset and length alignment O_DIRECT needs on `direct_fd` (a power of two).
    fn direct_align(&self) -> usize {
        DIRECT_ALIGN_DEFAULT_BYTES
    }
    /// Appends base:allocation extents covering a prefix of [offset, offset + len).
    fn extents(&self, offset: u64, len: u32, one: bool, out: &mut Vec<Extent>) -> io::Result<()>;
}

/// O_DIRECT alignment assumed when the kernel cannot say (statx DIOALIGN is Linux 6.1+):
/// the page size, which every device accepts and which our buffers already have.
pub const DIRECT_ALIGN_DEFAULT_BYTES: usize = 4096;

/// A regular file, a block device, or a memfd: anything the kernel reads and writes by offset.
pub struct FdBackend {
    kind: &'static str,
    fd: OwnedFd,
    direct: Option<(OwnedFd, usize)>,
    size: u64,
    caps: Caps,
}

impl FdBackend {
    pub fn open(path: &Path, read_only: bool) -> io::Result<FdBackend> {
        let file = OpenOptions::new().read(true).write(!read_only).open(path)?;
        let meta = file.metadata()?;
        let block = meta.file_type().is_block_device();
        if !block && !meta.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file or block device"));
        }
        let kind = if block { "block" } else { "file" };
        let rotational = block && rotational(&meta);
        // Block devices cannot report holes; regular files and tmpfs can.
        let caps = Caps { trim: true, zero: true, extents: !block, rotational };
        FdBackend::from_file(kind, file, caps)
    }

    /// A sparse RAM export: a memfd on tmpfs, whose holes read as zeros without using memory.
    pub fn memory(size: u64) -> io::Result<FdBackend> {
        let fd = rustix::fs::memfd_create("sluice-memory", rustix::fs::MemfdFlags::CLOEXEC)?;
        rustix::fs::ftruncate(&fd, size)?;
        // tmpfs punches holes but has no ZERO_RANGE; punching is how it zeroes.
        let caps = Caps { trim: true, zero: false, extents: true, rotational: false };
        FdBackend::from_file("memory", File::from(fd), caps)
    }

    fn from_file(kind: &'static str, mut file: File, caps: Caps) -> io::Result<FdBackend> {
        // Seeking to the end gives the size of files and block devices alike.
        let size = file.seek(SeekFrom::End(0))?;
        Ok(FdBackend { kind, fd: file.into(), direct: None, size, caps })
    }

    /// Opens the same file again with O_DIRECT for the direct data paths. The kernel keeps
    /// the two descriptors coherent: direct I/O writes back and invalidates cached pages of
    /// the range first.
    pub fn open_direct(&mut self, path: &Path, read_only: bool) -> io::Result<()> {
        use std::os::unix::fs::OpenOptionsExt;
        if self.kind == "memory" {
            return Err(io::Error::new(io::ErrorKind::Unsupported, "a RAM export has no storage below its page cache"));
        }
        let file = OpenOptions::new().read(true).write(!read_only).custom_flags(libc::O_DIRECT).open(path)?;
        let align = direct_align(&file).unwrap_or(DIRECT_ALIGN_DEFAULT_BYTES);
        if align > DIRECT_ALIGN_DEFAULT_BYTES {
            // Buffers are page aligned; a device that wants more is served by the page cache.
            return Err(io::Error::new(io::ErrorKind::Unsupported, format!("O_DIRECT here needs {align}-byte alignment")));
        }
        self.direct = Some((file.into(), align));
        Ok(())
    }
}

/// The larger of the memory and offset alignments the kernel reports for O_DIRECT.
fn direct_align(file: &File) -> Option<usize> {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    let st = statx(file, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN).ok()?;
    if st.stx_mask & StatxFlags::DIOALIGN.bits() == 0 || st.stx_dio_offset_align == 0 {
        return None;
    }
    let align = st.stx_dio_offset_align.max(st.stx_dio_mem_align) as usize;
    align.is_power_of_two().then_some(align)
}

fn rotational(meta: &std::fs::Metadata) -> bool {
    use std::os::unix::fs::MetadataExt;
    let rdev = meta.rdev();
    let (major, minor) = (libc::major(rdev), libc::minor(rdev));
    let path = format!("/sys/dev/block/{major}:{minor}/queue/rotational");
    let parent = format!("/sys/dev/block/{major}:{minor}/../queue/rotational");
    [path, parent].iter().find_map(|p| std::fs::read_to_string(p).ok()).is_some_and(|s| s.trim() == "1")
}

impl Backend for FdBackend {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        self.caps
    }
    fn fd(&self) -> Option<RawFd> {
        Some(self.fd.as_raw_fd())
    }
    fn file(&self) -> Option<BorrowedFd<'_>> {
        Some(self.fd.as_fd())
    }
    fn direct_fd(&self) -> Option<RawFd> {
        self.direct.as_ref().map(|(fd, _)| fd.as_raw_fd())
    }
    fn direct_align(&self) -> usize {
        self.direct.as_ref().map_or(DIRECT_ALIGN_DEFAULT_BYTES, |&(_, a)| a)
    }

    fn extents(&self, offset: u64, len: u32, one: bool, out: &mut Vec<Extent>) -> io::Result<()> {
        if !self.caps.extents {
            out.push(Extent { length: len, flags: 0 });
            return Ok(());
        }
        let end = offset + len as u64;
        let mut pos = offset;
        while pos < end && out.len() < EXTENTS_PER_REPLY_MAX {
            let data = match rustix::fs::seek(self.fd.as_fd(), rustix::fs::SeekFrom::Data(pos)) {
                Ok(d) => d.min(end),
                Err(rustix::io::Errno::NXIO) => end,
                Err(e) if out.is_empty() => {
                    // A filesystem that cannot tell: everything is data, which is always true.
                    log::debug!("SEEK_DATA failed ({e}); reporting data");
                    out.push(Extent { length: len, flags: 0 });
                    return Ok(());
                }
                Err(_) => break,
            };
            let (next, flags) = if data > pos {
                (data, STATE_HOLE | STATE_ZERO)
            } else {
                let hole = rustix::fs::seek(self.fd.as_fd(), rustix::fs::SeekFrom::Hole(pos))?;
                (hole.clamp(pos + 1, end), 0)
            };
            out.push(Extent { length: (next - pos) as u32, flags });
            pos = next;
            if one {
                break;
            }
        }
        Ok(())
    }
}

/// Reads return zeros and writes vanish: the protocol and network ceiling.
pub struct NullBackend {
    size: u64,
}

impl NullBackend {
    pub fn new(size: u64) -> NullBackend {
        NullBackend { size }
    }
}

impl Backend for NullBackend {
    fn kind(&self) -> &'static str {
        "null"
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        Caps { trim: true, zero: true, extents: false, rotational: false }
    }
    fn fd(&self) -> Option<RawFd> {
        None
    }
    fn extents(&self, _offset: u64, len: u32, _one: bool, out: &mut Vec<Extent>) -> io::Result<()> {
        // Honest about content (all zeros) but claims no holes: nothing is allocated or not.
        out.push(Extent { length: len, flags: STATE_ZERO });
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memory_backend_reports_written_regions_as_data() {
        let b = FdBackend::memory(1 << 20).unwrap();
        let fd = b.fd.as_fd();
        rustix::io::pwrite(fd, &[7u8; 4096], 65536).unwrap();
        let mut out = Vec::new();
        b.extents(0, 1 << 20, false, &mut out).unwrap();
        let total: u64 = out.iter().map(|e| e.length as u64).sum();
        assert_eq!(total, 1 << 20);
        assert_eq!(out[0], Extent { length: 65536, flags: STATE_HOLE | STATE_ZERO });
        assert_eq!(out[1].flags, 0);
        assert!(out[1].length >= 4096);
        let mut one = Vec::new();
        b.extents(0, 1 << 20, true, &mut one).unwrap();
        assert_eq!(one.len(), 1);
    }
}
