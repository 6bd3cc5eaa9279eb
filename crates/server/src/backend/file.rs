//! Files and block devices: anything the kernel reads and writes by offset. Reads and
//! writes go through the worker's ring; small writes into cached pages and reads of cached
//! pages into a pipe are done at once, which costs less than io_uring's worker threads.

use std::fs::{File, OpenOptions};
use std::io::{self, Seek, SeekFrom};
use std::os::fd::{AsFd, AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::FileTypeExt;
use std::path::Path;

use sluice_proto::reply::Extent;
use sluice_proto::wire::{STATE_HOLE, STATE_ZERO};

use super::interface::{Backend, Caps, Outcome, StorageOp};
use crate::engine::{fully_cached, splice_now, Held, Ring, StorageId};
use crate::limits::{DIRECT_ALIGN_DEFAULT_BYTES, EXTENTS_PER_REPLY_MAX, INLINE_WRITE_MAX_BYTES, PAGE_BYTES};

/// A regular file, a block device, or a memfd.
pub struct FileBackend {
    kind: &'static str,
    fd: OwnedFd,
    direct: Option<(OwnedFd, usize)>,
    size: u64,
    caps: Caps,
}

impl FileBackend {
    pub fn open(path: &Path, read_only: bool) -> io::Result<FileBackend> {
        let file = OpenOptions::new().read(true).write(!read_only).open(path)?;
        let meta = file.metadata()?;
        let block = meta.file_type().is_block_device();
        if !block && !meta.is_file() {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a regular file or block device"));
        }
        let kind = if block { "block" } else { "file" };
        let rotational = block && rotational(&meta);
        // Block devices cannot report holes; regular files and tmpfs can.
        let caps = Caps { trim: true, zero: true, fua: true, extents: !block, rotational, splice: true, ..Caps::default() };
        FileBackend::from_file(kind, file, caps)
    }

    pub(super) fn from_file(kind: &'static str, mut file: File, caps: Caps) -> io::Result<FileBackend> {
        // Seeking to the end gives the size of files and block devices alike.
        let size = file.seek(SeekFrom::End(0))?;
        Ok(FileBackend { kind, fd: file.into(), direct: None, size, caps })
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

impl FileBackend {
    /// The descriptor for an operation: the O_DIRECT one when asked for and present.
    fn fd_for(&self, direct: bool) -> RawFd {
        match &self.direct {
            Some((fd, _)) if direct => fd.as_raw_fd(),
            _ => self.fd.as_raw_fd(),
        }
    }

    /// Moves cached file pages into the pipe now; None when they are not all cached or the
    /// splice would have to wait.
    fn splice_cached(&self, offset: u64, len: usize, pipe: &crate::engine::Pipe) -> Option<usize> {
        if fully_cached(self.fd.as_fd(), offset, len) != Some(true) {
            return None;
        }
        splice_now(self.fd.as_fd(), offset, pipe, len).ok().filter(|&n| n > 0)
    }

    /// Whether a buffered write is better done by this thread: small, and either whole
    /// pages or pages already cached, so no read from the disk comes first.
    fn write_inline(&self, offset: u64, len: usize) -> bool {
        len <= INLINE_WRITE_MAX_BYTES
            && ((offset as usize | len).is_multiple_of(PAGE_BYTES) || fully_cached(self.fd.as_fd(), offset, len) == Some(true))
    }

    /// Writes at once, bypassing the ring (tests set up contents with it).
    #[cfg(test)]
    pub(super) fn write_at_once(&self, data: &[u8], offset: u64) -> io::Result<usize> {
        Ok(rustix::io::pwrite(self.fd.as_fd(), data, offset)?)
    }

    pub(super) fn extents(&self, offset: u64, len: u64, one: bool, out: &mut Vec<Extent>) -> io::Result<()> {
        if !self.caps.extents {
            out.push(Extent { length: len, flags: 0 });
            return Ok(());
        }
        let end = offset + len;
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
            out.push(Extent { length: next - pos, flags });
            pos = next;
            if one {
                break;
            }
        }
        Ok(())
    }
}

impl Backend for FileBackend {
    fn kind(&self) -> &'static str {
        self.kind
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps { direct_align: self.direct.as_ref().map(|&(_, a)| a), ..self.caps }
    }

    fn start(&self, op: StorageOp, id: StorageId, ring: &mut Ring) -> Option<Outcome> {
        const KEEP: i32 = libc::FALLOC_FL_KEEP_SIZE;
        match op {
            StorageOp::Read { offset, len, into: Held::Pipe(pipe), direct, .. } => {
                let cached = if direct { None } else { self.splice_cached(offset, len, &pipe) };
                if let Some(n) = cached {
                    return Some(Outcome { result: n as i32, held: Held::Pipe(pipe) });
                }
                ring.splice_in(self.fd_for(direct), offset, pipe, len, id);
            }
            StorageOp::Read { offset, len, into: Held::Buf(buf), at, direct } => {
                ring.read_at(self.fd_for(direct), buf, at, len, offset, id)
            }
            StorageOp::Read { into, .. } => return Some(Outcome { result: -libc::EINVAL, held: into }),
            StorageOp::Write { offset, buf, at, len, fua, direct } => {
                // Only exports without an O_DIRECT path: there, small writes stay off the
                // worker thread whatever their alignment.
                if !fua && self.direct.is_none() && self.write_inline(offset, len) {
                    let written = rustix::io::pwrite(self.fd.as_fd(), &buf.as_slice()[at..at + len], offset);
                    return Some(Outcome::of(written.map_err(io::Error::from), Held::Buf(buf)));
                }
                ring.write_at(self.fd_for(direct), buf, at, len, offset, fua, id)
            }
            StorageOp::Flush => ring.fdatasync(self.fd.as_raw_fd(), id),
            StorageOp::Trim { offset, len } => {
                ring.fallocate(self.fd.as_raw_fd(), libc::FALLOC_FL_PUNCH_HOLE | KEEP, offset, len, id)
            }
            StorageOp::Zero { offset, len, may_trim, .. } => {
                let mode = if may_trim && self.caps.trim { libc::FALLOC_FL_PUNCH_HOLE } else { libc::FALLOC_FL_ZERO_RANGE };
                ring.fallocate(self.fd.as_raw_fd(), mode | KEEP, offset, len, id)
            }
            StorageOp::Cache { offset, len } => ring.fadvise_willneed(self.fd.as_raw_fd(), offset, len, id),
            StorageOp::Extents { offset, len, one, mut out } => {
                let found = self.extents(offset, len, one, &mut out);
                return Some(Outcome::of(found.map(|()| 0), Held::Extents(out)));
            }
        }
        None
    }
}
