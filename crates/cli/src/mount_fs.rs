//! The FUSE side of `sluice mount`: a filesystem whose root inode is one regular file, the
//! export. fuser calls these methods on its session thread; every method that talks to the
//! server spawns a task on the tokio runtime and replies from there (fuser's replies are
//! `Send`), so the session thread goes straight back to reading the next request and the
//! kernel can keep many requests in flight.

use fuser::{
    Errno, FileAttr, FileHandle, FileType, Filesystem, FopenFlags, INodeNo, InitFlags, KernelConfig, LockOwner, OpenAccMode, OpenFlags, ReplyAttr, ReplyData,
    ReplyEmpty, ReplyLseek, ReplyOpen, ReplyWrite, Request, TimeOrNow, WriteFlags,
};
use sluice_client::{Client, Error};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

/// Largest read or write the kernel is asked to send. The kernel caps requests at
/// `fs.fuse.max_pages_limit` pages (256 by default, so 1 MiB), whatever we ask for.
pub const REQUEST_MAX_BYTES: u32 = 1 << 20;

/// Readahead the kernel may do on the file in one go.
pub const READAHEAD_MAX_BYTES: u32 = 1 << 20;

/// Background requests (readahead, asynchronous direct I/O) the kernel keeps outstanding at
/// most; the kernel's default of 12 leaves the network idle between replies.
pub const BACKGROUND_REQUESTS_MAX: u16 = 64;

/// Request buffers kept for reuse: enough for the requests usually in flight, and a bound
/// (with `REQUEST_MAX_BYTES`) on what the pool holds.
const POOL_BUFFERS_MAX: usize = 32;

/// How long the kernel may cache the file's attributes: none of them changes while mounted.
const ATTR_TTL: Duration = Duration::from_secs(3600);

/// How the file is presented.
pub struct Settings {
    /// Writes are allowed (the export is writable and `--read-only` was not given).
    pub writable: bool,
    /// Open the file with FOPEN_DIRECT_IO: no page cache for it, requests go to the server
    /// with the caller's sizes, and writes may run in parallel.
    pub direct_io: bool,
    /// Owner shown for the file (that of the file mounted over).
    pub uid: u32,
    pub gid: u32,
}

/// The export as a FUSE filesystem of one file.
pub struct ExportFile {
    shared: Arc<Shared>,
    runtime: tokio::runtime::Handle,
}

/// What the request tasks share.
struct Shared {
    client: Client,
    attr: FileAttr,
    writable: bool,
    direct_io: bool,
    /// A write or zero completed since the last flush: `close` then flushes.
    dirty: AtomicBool,
    /// A connection-level failure was reported already (reported once, not per request).
    reported: AtomicBool,
    pool: Mutex<Vec<Vec<u8>>>,
}

impl ExportFile {
    pub fn new(client: Client, runtime: tokio::runtime::Handle, settings: &Settings) -> ExportFile {
        let export = client.export();
        let now = SystemTime::now();
        let attr = FileAttr {
            ino: INodeNo::ROOT,
            size: export.size,
            blocks: export.size.div_ceil(512),
            atime: now,
            mtime: now,
            ctime: now,
            crtime: now,
            kind: FileType::RegularFile,
            perm: if settings.writable { 0o644 } else { 0o444 },
            nlink: 1,
            uid: settings.uid,
            gid: settings.gid,
            rdev: 0,
            blksize: export.block_preferred.clamp(512, REQUEST_MAX_BYTES),
            flags: 0,
        };
        let shared = Shared {
            client,
            attr,
            writable: settings.writable,
            direct_io: settings.direct_io,
            dirty: AtomicBool::new(false),
            reported: AtomicBool::new(false),
            pool: Mutex::new(Vec::new()),
        };
        ExportFile { shared: Arc::new(shared), runtime }
    }

    /// Clips a range to the export: the length that lies inside it (0 at or past the end).
    fn inside(&self, offset: u64, len: u64) -> u64 {
        self.shared.attr.size.saturating_sub(offset).min(len)
    }

    /// Sends NBD_CMD_FLUSH and answers the kernel when it is done. The caller has cleared
    /// `dirty`; a failed flush sets it again so the next close retries.
    fn flush_then_reply(&self, what: &'static str, reply: ReplyEmpty) {
        let shared = self.shared.clone();
        self.runtime.spawn(async move {
            match shared.client.flush().await {
                Ok(()) => reply.ok(),
                Err(e) => {
                    shared.dirty.store(true, Ordering::Release);
                    reply.error(shared.errno(what, &e));
                }
            }
        });
    }
}

impl Shared {
    /// A buffer of `len` bytes from the pool. Its contents are stale: callers overwrite them.
    fn buffer(&self, len: usize) -> Vec<u8> {
        let mut buf = self.pool.lock().unwrap().pop().unwrap_or_default();
        // Exact, so a buffer never grows past the largest request and back into the pool.
        buf.reserve_exact(len.saturating_sub(buf.len()));
        // Growing zero-fills the new part; shrinking is free.
        buf.resize(len, 0);
        buf
    }

    fn give_back(&self, buf: Vec<u8>) {
        let mut pool = self.pool.lock().unwrap();
        if pool.len() < POOL_BUFFERS_MAX && buf.capacity() <= REQUEST_MAX_BYTES as usize {
            pool.push(buf);
        }
    }

    /// The errno a failed request returns to the kernel. A lost connection or a broken
    /// server is also said once on stderr, since every request fails the same way after it.
    fn errno(&self, what: &str, e: &Error) -> Errno {
        let errno = errno_for(e);
        match e {
            Error::Server { .. } | Error::ReadOnly | Error::Unsupported(_) | Error::OutOfRange { .. } | Error::Unaligned { .. } => {
                log::debug!("{what}: {e}");
            }
            _ => {
                if !self.reported.swap(true, Ordering::Relaxed) {
                    eprintln!("sluice mount: {what} failed: {e}; requests now fail with I/O errors");
                }
            }
        }
        errno
    }
}

/// One place maps client errors to errnos: the server's own errno when it sent one (NBD
/// numbers them as Linux does), EROFS and EOPNOTSUPP for what the export refuses, EIO for
/// a connection that failed or a server that broke the protocol.
pub fn errno_for(e: &Error) -> Errno {
    use sluice_proto::Errno as Nbd;
    match e {
        Error::Server { errno, .. } => match Nbd::from_code(*errno) {
            Some(Nbd::Perm) => Errno::EPERM,
            Some(Nbd::NoMem) => Errno::ENOMEM,
            Some(Nbd::Inval) => Errno::EINVAL,
            Some(Nbd::NoSpc) => Errno::ENOSPC,
            Some(Nbd::Overflow) => Errno::EOVERFLOW,
            Some(Nbd::NotSup) => Errno::EOPNOTSUPP,
            Some(Nbd::Shutdown) => Errno::ESHUTDOWN,
            Some(Nbd::Io) | None => Errno::EIO,
        },
        Error::ReadOnly => Errno::EROFS,
        Error::Unsupported(_) => Errno::EOPNOTSUPP,
        Error::OutOfRange { .. } => Errno::ENOSPC,
        // The export's minimum block size, which a write here did not keep to.
        Error::Unaligned { .. } => Errno::EINVAL,
        _ => Errno::EIO,
    }
}

impl Filesystem for ExportFile {
    fn init(&mut self, _req: &Request, config: &mut KernelConfig) -> std::io::Result<()> {
        // Each setter refuses a value out of range and names the nearest one that works.
        if let Err(nearest) = config.set_max_write(REQUEST_MAX_BYTES) {
            let _ = config.set_max_write(nearest);
        }
        if let Err(nearest) = config.set_max_readahead(READAHEAD_MAX_BYTES) {
            let _ = config.set_max_readahead(nearest);
        }
        let _ = config.set_max_background(BACKGROUND_REQUESTS_MAX);
        if self.shared.direct_io {
            // Optional: asynchronous direct I/O lets the loop driver and aio keep several
            // requests in flight; mmap of a direct-I/O file needs the second flag.
            let _ = config.add_capabilities(InitFlags::FUSE_ASYNC_DIO);
            let _ = config.add_capabilities(InitFlags::FUSE_DIRECT_IO_ALLOW_MMAP);
        }
        Ok(())
    }

    fn getattr(&self, _req: &Request, ino: INodeNo, _fh: Option<FileHandle>, reply: ReplyAttr) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        reply.attr(&ATTR_TTL, &self.shared.attr);
    }

    /// The file's size is the export's, and it has no mode or owner of its own to change.
    /// Times are accepted and ignored, so `touch` works.
    fn setattr(
        &self,
        _req: &Request,
        ino: INodeNo,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
        size: Option<u64>,
        _atime: Option<TimeOrNow>,
        _mtime: Option<TimeOrNow>,
        _ctime: Option<SystemTime>,
        _fh: Option<FileHandle>,
        _crtime: Option<SystemTime>,
        _chgtime: Option<SystemTime>,
        _bkuptime: Option<SystemTime>,
        _flags: Option<fuser::BsdFileFlags>,
        reply: ReplyAttr,
    ) {
        if ino != INodeNo::ROOT {
            return reply.error(Errno::ENOENT);
        }
        if mode.is_some() || uid.is_some() || gid.is_some() {
            return reply.error(Errno::EPERM);
        }
        if size.is_some_and(|s| s != self.shared.attr.size) {
            return reply.error(Errno::EINVAL);
        }
        reply.attr(&ATTR_TTL, &self.shared.attr);
    }

    fn open(&self, _req: &Request, _ino: INodeNo, flags: OpenFlags, reply: ReplyOpen) {
        if flags.acc_mode() != OpenAccMode::O_RDONLY && !self.shared.writable {
            return reply.error(Errno::EROFS);
        }
        let fopen = if self.shared.direct_io { FopenFlags::FOPEN_DIRECT_IO | FopenFlags::FOPEN_PARALLEL_DIRECT_WRITES } else { FopenFlags::empty() };
        reply.opened(FileHandle(0), fopen);
    }

    fn read(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        size: u32,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyData,
    ) {
        let len = self.inside(offset, size as u64) as usize;
        if len == 0 {
            return reply.data(&[]);
        }
        let shared = self.shared.clone();
        self.runtime.spawn(async move {
            let buf = shared.buffer(len);
            match shared.client.read_owned(offset, buf).await {
                Ok(buf) => {
                    reply.data(&buf);
                    shared.give_back(buf);
                }
                Err(e) => reply.error(shared.errno("read", &e)),
            }
        });
    }

    /// Writes past the end fail with ENOSPC, as on a block device; a write crossing the end
    /// is cut short there.
    fn write(
        &self,
        _req: &Request,
        _ino: INodeNo,
        _fh: FileHandle,
        offset: u64,
        data: &[u8],
        _write_flags: WriteFlags,
        _flags: OpenFlags,
        _lock_owner: Option<LockOwner>,
        reply: ReplyWrite,
    ) {
        if !self.shared.writable {
            return reply.error(Errno::EROFS);
        }
        if data.is_empty() {
            return reply.written(0);
        }
        let len = self.inside(offset, data.len() as u64) as usize;
        if len == 0 {
            return reply.error(Errno::ENOSPC);
        }
        // The data lives in fuser's receive buffer, which the next request reuses: copy it
        // into a pooled buffer the task owns.
        let mut buf = self.shared.buffer(len);
        buf.copy_from_slice(&data[..len]);
        let shared = self.shared.clone();
        self.runtime.spawn(async move {
            match shared.client.write(offset, &buf, false).await {
                Ok(()) => {
                    shared.dirty.store(true, Ordering::Release);
                    reply.written(len as u32);
                }
                Err(e) => reply.error(shared.errno("write", &e)),
            }
            shared.give_back(buf);
        });
    }

    /// Called on every close. Flushes only when something was written since the last flush:
    /// closing a file opened to read should not cost a round trip.
    fn flush(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _lock_owner: LockOwner, reply: ReplyEmpty) {
        if !self.shared.dirty.swap(false, Ordering::AcqRel) {
            return reply.ok();
        }
        self.flush_then_reply("flush", reply);
    }

    /// Always sends NBD_CMD_FLUSH (when writable): skipping it because another fsync's flush
    /// is already on its way would answer before that flush has finished.
    fn fsync(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, _datasync: bool, reply: ReplyEmpty) {
        if !self.shared.writable {
            return reply.ok();
        }
        self.shared.dirty.store(false, Ordering::Release);
        self.flush_then_reply("fsync", reply);
    }

    /// PUNCH_HOLE and ZERO_RANGE become NBD_CMD_WRITE_ZEROES, letting the server punch a
    /// hole for the first. A punched hole must read back as zeros, which NBD_CMD_TRIM does
    /// not promise, so an export without WRITE_ZEROES gets EOPNOTSUPP rather than a TRIM.
    /// SEEK_DATA and SEEK_HOLE from the export's allocation map (base:allocation), so `cp
    /// --sparse`, `qemu-img convert` and the like skip the holes of a sparse export. The
    /// kernel handles the other whence values itself. Without base:allocation everything
    /// is data, as on a file system without hole support.
    fn lseek(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, offset: i64, whence: i32, reply: ReplyLseek) {
        let want_hole = match whence {
            libc::SEEK_DATA => false,
            libc::SEEK_HOLE => true,
            _ => return reply.error(Errno::EINVAL),
        };
        let size = self.shared.attr.size;
        let Ok(offset) = u64::try_from(offset) else { return reply.error(Errno::EINVAL) };
        if offset >= size {
            return reply.error(Errno::ENXIO);
        }
        let shared = self.shared.clone();
        self.runtime.spawn(async move {
            match seek_extent(&shared.client, offset, want_hole).await {
                Ok(Some(at)) => reply.offset(at as i64),
                // The end of the file is a hole; past the last data there is no more data.
                Ok(None) if want_hole => reply.offset(size as i64),
                Ok(None) => reply.error(Errno::ENXIO),
                Err(e) => reply.error(shared.errno("lseek", &e)),
            }
        });
    }

    fn fallocate(&self, _req: &Request, _ino: INodeNo, _fh: FileHandle, offset: u64, length: u64, mode: i32, reply: ReplyEmpty) {
        let may_trim = match mode & !libc::FALLOC_FL_KEEP_SIZE {
            libc::FALLOC_FL_PUNCH_HOLE => true,
            libc::FALLOC_FL_ZERO_RANGE => false,
            _ => return reply.error(Errno::EOPNOTSUPP),
        };
        if !self.shared.writable {
            return reply.error(Errno::EROFS);
        }
        if !self.shared.client.export().can_zero() {
            return reply.error(Errno::EOPNOTSUPP);
        }
        let end = offset.saturating_add(length);
        if end > self.shared.attr.size && mode & libc::FALLOC_FL_KEEP_SIZE == 0 {
            // The file would have to grow; the export cannot.
            return reply.error(Errno::ENOSPC);
        }
        let len = self.inside(offset, length);
        if len == 0 {
            return reply.ok();
        }
        let shared = self.shared.clone();
        self.runtime.spawn(async move {
            match shared.client.write_zeroes(offset, len, false, may_trim, false).await {
                Ok(()) => {
                    shared.dirty.store(true, Ordering::Release);
                    reply.ok();
                }
                Err(e) => reply.error(shared.errno("fallocate", &e)),
            }
        });
    }
}

/// Where the first extent at or after `offset` whose hole state is `want_hole` begins, from
/// the export's block status; None when there is none before the end.
async fn seek_extent(client: &Client, offset: u64, want_hole: bool) -> Result<Option<u64>, Error> {
    let size = client.size();
    let mut at = offset;
    while at < size {
        let extents = client.block_status(at, size - at).await?;
        for e in &extents {
            if e.hole == want_hole {
                return Ok(Some(e.offset.max(offset)));
            }
        }
        // block_status always describes at least one byte, so this moves forward.
        at = extents.last().map_or(size, |e| e.offset + e.length);
    }
    Ok(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn server_errnos_keep_their_meaning() {
        let server = |errno| Error::Server { errno, message: None };
        assert_eq!(errno_for(&server(28)), Errno::ENOSPC);
        assert_eq!(errno_for(&server(1)), Errno::EPERM);
        assert_eq!(errno_for(&server(95)), Errno::EOPNOTSUPP);
        assert_eq!(errno_for(&server(5)), Errno::EIO);
        // Unknown values mean EINVAL, as the spec asks of clients.
        assert_eq!(errno_for(&server(1234)), Errno::EINVAL);
        assert_eq!(errno_for(&Error::ReadOnly), Errno::EROFS);
        assert_eq!(errno_for(&Error::Closed), Errno::EIO);
        assert_eq!(errno_for(&Error::Unsupported("WRITE_ZEROES")), Errno::EOPNOTSUPP);
    }
}
