//! What a backend lacks, emulated in one place (as nbdkit's backend layer does): one NBD
//! command (other than READ, which has its own pipeline) becomes a short sequence of storage
//! operations. Short writes continue where they stopped; WRITE_ZEROES without a native
//! zeroing primitive writes zeros (or fails at once under FAST_ZERO); FUA without native
//! support, and after a trim or zero, becomes a flush; a trim the storage refuses is
//! accepted, as trimming is advisory. Sans-IO: it yields operations and takes outcomes.

use std::borrow::Cow;

use sluice_proto::{Command, Errno};

use super::{Caps, StorageOp};
use crate::engine::{Buf, Held, Pool};
use crate::errors::errno_from_os;
use crate::limits::ZERO_FILL_CHUNK_BYTES;

/// Why a command failed, as the client will be told.
#[derive(Debug)]
pub struct Failure {
    pub errno: Errno,
    pub message: Cow<'static, str>,
    /// Where a write stopped, for the error chunk of structured replies.
    pub offset: Option<u64>,
}

impl Failure {
    pub fn new(errno: Errno, message: &'static str, offset: Option<u64>) -> Failure {
        Failure { errno, message: Cow::Borrowed(message), offset }
    }

    /// From a storage error (a positive errno).
    pub fn os(code: i32, offset: Option<u64>) -> Failure {
        let message = Cow::Owned(std::io::Error::from_raw_os_error(code).to_string());
        Failure { errno: errno_from_os(code), message, offset }
    }
}

/// What to do next for a command.
pub enum Step {
    /// Submit this operation, then hand its outcome to `complete`.
    Submit(StorageOp),
    Done,
    Fail(Failure),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    /// The operation the command asked for.
    Main,
    /// WRITE_ZEROES carried out by writing zeros.
    ZeroFill,
    /// The flush that makes a FUA request durable.
    Sync,
}

/// One command on its way through a backend.
pub struct Exec {
    command: Command,
    stage: Stage,
    /// Bytes written so far (a write, or zero-fill).
    done: usize,
    /// The write's payload, or the zero-fill buffer.
    buf: Option<Buf>,
    caps: Caps,
    /// The O_DIRECT alignment when the export's data path uses it.
    direct_align: Option<usize>,
}

impl Exec {
    /// `buf` is a write's payload.
    pub fn new(command: Command, buf: Option<Buf>, caps: Caps, direct_align: Option<usize>) -> Exec {
        debug_assert!(!matches!(command, Command::Read { .. } | Command::BlockStatus { .. } | Command::Disconnect));
        Exec { command, stage: Stage::Main, done: 0, buf, caps, direct_align }
    }

    /// The first step of the command.
    pub fn start(&mut self, pool: &mut Pool) -> Step {
        if let Command::WriteZeroes { fast, may_trim, .. } = self.command {
            if !(self.caps.zero || (may_trim && self.caps.trim)) {
                if fast {
                    return Step::Fail(Failure::new(Errno::NotSup, "zeroing here means writing zeros", None));
                }
                self.stage = Stage::ZeroFill;
            }
        }
        self.next(pool)
    }

    /// Takes the outcome of the operation last submitted.
    pub fn complete(&mut self, pool: &mut Pool, result: i32, held: Held) -> Step {
        if let Held::Buf(buf) = held {
            self.buf = Some(buf);
        }
        if result < 0 {
            return self.failed(pool, -result);
        }
        let n = result as usize;
        match (self.stage, self.command) {
            (Stage::Main, Command::Write { range, fua }) => {
                if n == 0 {
                    // The file shrank under us, or the device returned nothing.
                    let at = range.offset + self.done as u64;
                    return Step::Fail(Failure::new(Errno::Io, "unexpected end of file", Some(at)));
                }
                self.done += n;
                if self.done < range.length as usize {
                    return self.next(pool);
                }
                self.sync_if(fua && !self.caps.fua, pool)
            }
            (Stage::ZeroFill, Command::WriteZeroes { range, fua, .. }) => {
                if n == 0 {
                    return Step::Fail(Failure::new(Errno::Io, "zero-fill wrote nothing", None));
                }
                self.done += n;
                if self.done < range.length as usize {
                    return self.next(pool);
                }
                // Each zero-fill write was already durable when FUA asked for it and could.
                self.sync_if(fua && !self.caps.fua, pool)
            }
            (Stage::Main, Command::Trim { fua, .. } | Command::WriteZeroes { fua, .. }) => self.sync_if(fua, pool),
            _ => Step::Done,
        }
    }

    fn failed(&mut self, pool: &mut Pool, code: i32) -> Step {
        let unsupported = code == libc::EOPNOTSUPP || code == libc::EINVAL;
        match (self.stage, self.command) {
            // Trimming is advisory; storage that cannot punch simply keeps the data.
            (Stage::Main, Command::Trim { fua, .. }) if unsupported => self.sync_if(fua, pool),
            (Stage::Main, Command::WriteZeroes { fast, .. }) if unsupported => {
                if fast {
                    return Step::Fail(Failure::new(Errno::NotSup, "no fast zeroing here", None));
                }
                self.stage = Stage::ZeroFill;
                self.next(pool)
            }
            (_, Command::Write { range, .. }) => Step::Fail(Failure::os(code, Some(range.offset + self.done as u64))),
            _ => Step::Fail(Failure::os(code, None)),
        }
    }

    fn sync_if(&mut self, sync: bool, pool: &mut Pool) -> Step {
        if !sync {
            return Step::Done;
        }
        self.stage = Stage::Sync;
        self.next(pool)
    }

    /// The operation for the current stage.
    fn next(&mut self, pool: &mut Pool) -> Step {
        let op = match (self.stage, self.command) {
            (Stage::Sync, _) | (Stage::Main, Command::Flush) => StorageOp::Flush,
            (_, Command::Read { range, .. } | Command::Write { range, .. } | Command::Trim { range, .. })
            | (_, Command::WriteZeroes { range, .. } | Command::Cache { range })
                if range.length == 0 =>
            {
                // Nothing to do; the kernel would call a zero-length fallocate invalid.
                return Step::Done;
            }
            (Stage::Main, Command::Write { range, fua }) => {
                let Some(buf) = self.buf.take() else { return self.lost_buffer() };
                let len = range.length as usize - self.done;
                let offset = range.offset + self.done as u64;
                // Unaligned writes go through the page cache, which the kernel keeps coherent
                // with O_DIRECT; a read-modify-write here would race with other writers.
                let direct = self.direct_align.is_some_and(|a| (offset as usize | len | self.done).is_multiple_of(a));
                StorageOp::Write { offset, buf, at: self.done, len, fua: fua && self.caps.fua, direct }
            }
            (Stage::Main, Command::Trim { range, .. }) => StorageOp::Trim { offset: range.offset, len: range.length as u64 },
            (Stage::Main, Command::WriteZeroes { range, may_trim, .. }) => {
                StorageOp::Zero { offset: range.offset, len: range.length as u64, may_trim }
            }
            (Stage::ZeroFill, Command::WriteZeroes { range, fua, .. }) => {
                let len = (range.length as usize - self.done).min(ZERO_FILL_CHUNK_BYTES);
                let mut buf = self.buf.take().unwrap_or_else(|| pool.get(ZERO_FILL_CHUNK_BYTES));
                buf.set_len(len);
                buf.as_mut_slice().fill(0);
                let offset = range.offset + self.done as u64;
                StorageOp::Write { offset, buf, at: 0, len, fua: fua && self.caps.fua, direct: false }
            }
            (Stage::Main, Command::Cache { range }) => StorageOp::Cache { offset: range.offset, len: range.length as u64 },
            (stage, command) => unreachable!("no storage operation for {command:?} in {stage:?}"),
        };
        Step::Submit(op)
    }

    /// A backend kept a write's buffer: a bug in the backend, reported as an I/O error.
    fn lost_buffer(&self) -> Step {
        debug_assert!(false, "a backend did not return a write's buffer");
        Step::Fail(Failure::new(Errno::Io, "internal error: write buffer lost", None))
    }
}
