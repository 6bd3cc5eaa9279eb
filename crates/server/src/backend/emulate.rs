//! What a backend lacks, emulated in one place (as nbdkit's backend layer does): one NBD
//! command (other than READ, which has its own pipeline) becomes a short sequence of storage
//! operations. Short writes continue where they stopped; WRITE_ZEROES without a native
//! zeroing primitive writes zeros (or fails at once under FAST_ZERO); FUA without native
//! support, and after a trim or zero, becomes a flush; a trim the storage refuses is
//! accepted, as trimming is advisory. Sans-IO: it yields operations and takes outcomes.

use std::borrow::Cow;

use sluice_proto::{Command, Errno};

use super::interface::{Caps, StorageOp};
use crate::engine::{Buf, Held, Pool};
use crate::errors::errno_from_os;
use crate::limits::{CACHE_PIECE_MAX_BYTES, ZERO_FILL_CHUNK_BYTES};

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
    /// Bytes written so far (a write, or zero-fill), or cached (pieces of a CACHE).
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
        let empty = match self.command {
            Command::Write { range, .. } | Command::Trim { range, .. } | Command::Cache { range } => range.length == 0,
            Command::WriteZeroes { range, .. } => range.length == 0,
            _ => false,
        };
        if empty {
            // Nothing to do, and nothing slow to refuse under FAST_ZERO; the kernel would
            // call a zero-length fallocate invalid.
            return Step::Done;
        }
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
            (Stage::Main, Command::Cache { range }) => {
                self.done += Self::cache_piece(range, self.done) as usize;
                if (self.done as u64) < range.length {
                    return self.next(pool);
                }
                Step::Done
            }
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
            (Stage::Main, Command::Write { range, fua }) => {
                let Some(buf) = self.buf.take() else { return self.lost_buffer() };
                let len = range.length as usize - self.done;
                let offset = range.offset + self.done as u64;
                // Unaligned writes go through the page cache, which the kernel keeps coherent
                // with O_DIRECT; a read-modify-write here would race with other writers.
                let direct = self.direct_align.is_some_and(|a| (offset as usize | len | self.done).is_multiple_of(a));
                StorageOp::Write { offset, buf, at: self.done, len, fua: fua && self.caps.fua, direct }
            }
            (Stage::Main, Command::Trim { range, .. }) => StorageOp::Trim { offset: range.offset, len: range.length },
            (Stage::Main, Command::WriteZeroes { range, may_trim, fast, .. }) => {
                StorageOp::Zero { offset: range.offset, len: range.length, may_trim, fast }
            }
            (Stage::ZeroFill, Command::WriteZeroes { range, fua, .. }) => {
                let len = (range.length as usize - self.done).min(ZERO_FILL_CHUNK_BYTES);
                let mut buf = self.buf.take().unwrap_or_else(|| pool.get(ZERO_FILL_CHUNK_BYTES));
                buf.set_len(len);
                buf.as_mut_slice().fill(0);
                let offset = range.offset + self.done as u64;
                StorageOp::Write { offset, buf, at: 0, len, fua: fua && self.caps.fua, direct: false }
            }
            (Stage::Main, Command::Cache { range }) => {
                StorageOp::Cache { offset: range.offset + self.done as u64, len: Self::cache_piece(range, self.done) }
            }
            (stage, command) => unreachable!("no storage operation for {command:?} in {stage:?}"),
        };
        Step::Submit(op)
    }

    /// The piece of a CACHE after `done` bytes: what is left, at most CACHE_PIECE_MAX_BYTES.
    fn cache_piece(range: sluice_proto::Range, done: usize) -> u64 {
        (range.length - done as u64).min(CACHE_PIECE_MAX_BYTES)
    }

    /// A backend kept a write's buffer: a bug in the backend, reported as an I/O error.
    fn lost_buffer(&self) -> Step {
        debug_assert!(false, "a backend did not return a write's buffer");
        Step::Fail(Failure::new(Errno::Io, "internal error: write buffer lost", None))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::Range;

    fn pool() -> Pool {
        Pool::new(4 << 20, std::time::Duration::from_secs(5), Default::default())
    }

    fn caps(zero: bool, trim: bool, fua: bool) -> Caps {
        Caps { zero, trim, fua, ..Caps::default() }
    }

    fn zeroes(len: u32, fua: bool, may_trim: bool, fast: bool) -> Command {
        Command::WriteZeroes { range: Range { offset: 4096, length: len as u64 }, fua, may_trim, fast }
    }

    /// Runs a command to its end, answering each operation with `answer`.
    fn drive(exec: &mut Exec, pool: &mut Pool, mut answer: impl FnMut(&StorageOp) -> i32) -> (Vec<String>, Step) {
        let mut seen = Vec::new();
        let mut step = exec.start(pool);
        while let Step::Submit(op) = step {
            let result = answer(&op);
            let (name, held) = match op {
                StorageOp::Write { buf, len, .. } => (format!("write {len}"), Held::Buf(buf)),
                StorageOp::Flush => ("flush".into(), Held::Nothing),
                StorageOp::Zero { .. } => ("zero".into(), Held::Nothing),
                StorageOp::Trim { len, .. } => (format!("trim {len}"), Held::Nothing),
                StorageOp::Cache { offset, len } => (format!("cache {offset}+{len}"), Held::Nothing),
                _ => ("other".into(), Held::Nothing),
            };
            seen.push(name);
            step = exec.complete(pool, result, held);
        }
        (seen, step)
    }

    fn len_of(op: &StorageOp) -> i32 {
        match op {
            StorageOp::Write { len, .. } => *len as i32,
            _ => 0,
        }
    }

    #[test]
    fn zeroing_without_a_primitive_writes_zeros_in_chunks_then_flushes_for_fua() {
        let mut pool = pool();
        let len = ZERO_FILL_CHUNK_BYTES as u32 * 2 + 4096;
        let mut exec = Exec::new(zeroes(len, true, false, false), None, caps(false, true, false), None);
        let (seen, step) = drive(&mut exec, &mut pool, len_of);
        assert_eq!(seen, ["write 1048576", "write 1048576", "write 4096", "flush"]);
        assert!(matches!(step, Step::Done));
    }

    #[test]
    fn fast_zero_fails_at_once_where_zeroing_means_writing() {
        let mut pool = pool();
        let mut exec = Exec::new(zeroes(8192, false, false, true), None, caps(false, false, true), None);
        let (seen, step) = drive(&mut exec, &mut pool, len_of);
        assert!(seen.is_empty());
        assert!(matches!(step, Step::Fail(Failure { errno: Errno::NotSup, .. })));
    }

    #[test]
    fn zeroing_nothing_succeeds_even_under_fast_zero() {
        let mut pool = pool();
        let mut exec = Exec::new(zeroes(0, false, false, true), None, caps(false, false, true), None);
        let (seen, step) = drive(&mut exec, &mut pool, len_of);
        assert!(seen.is_empty());
        assert!(matches!(step, Step::Done));
    }

    #[test]
    fn a_refused_zero_range_falls_back_to_writing_unless_fast() {
        let mut pool = pool();
        let mut exec = Exec::new(zeroes(8192, false, false, false), None, caps(true, false, true), None);
        let (seen, step) = drive(&mut exec, &mut pool, |op| if matches!(op, StorageOp::Zero { .. }) { -libc::EOPNOTSUPP } else { len_of(op) });
        assert_eq!(seen, ["zero", "write 8192"]);
        assert!(matches!(step, Step::Done));
        let mut exec = Exec::new(zeroes(8192, false, false, true), None, caps(true, false, true), None);
        let (_, step) = drive(&mut exec, &mut pool, |_| -libc::EOPNOTSUPP);
        assert!(matches!(step, Step::Fail(Failure { errno: Errno::NotSup, .. })));
    }

    #[test]
    fn a_cache_past_32_bits_goes_to_storage_in_pieces_and_a_trim_whole() {
        let mut pool = pool();
        let range = Range { offset: 4096, length: 2 * CACHE_PIECE_MAX_BYTES + 512 };
        let mut exec = Exec::new(Command::Cache { range }, None, caps(true, true, true), None);
        let (seen, step) = drive(&mut exec, &mut pool, |_| 0);
        let (one, two) = (CACHE_PIECE_MAX_BYTES, 4096 + CACHE_PIECE_MAX_BYTES);
        assert_eq!(seen, [format!("cache 4096+{one}"), format!("cache {two}+{one}"), format!("cache {}+512", two + one)]);
        assert!(matches!(step, Step::Done));
        let trim = Command::Trim { range: Range { offset: 0, length: 6 << 30 }, fua: false };
        let mut exec = Exec::new(trim, None, caps(true, true, true), None);
        assert_eq!(drive(&mut exec, &mut pool, |_| 0).0, [format!("trim {}", 6u64 << 30)], "fallocate takes 64 bits");
    }

    #[test]
    fn a_refused_trim_is_accepted_and_fua_still_flushes() {
        let mut pool = pool();
        let trim = Command::Trim { range: Range { offset: 0, length: 4096 }, fua: true };
        let mut exec = Exec::new(trim, None, caps(true, true, true), None);
        let (seen, step) = drive(&mut exec, &mut pool, |op| if matches!(op, StorageOp::Trim { .. }) { -libc::EOPNOTSUPP } else { 0 });
        assert_eq!(seen, ["trim 4096", "flush"]);
        assert!(matches!(step, Step::Done));
    }

    #[test]
    fn short_writes_continue_and_errors_name_where_the_write_stopped() {
        let mut pool = pool();
        let write = Command::Write { range: Range { offset: 1 << 20, length: 10_000 }, fua: true };
        let buf = pool.get(10_000);
        let mut exec = Exec::new(write, Some(buf), caps(true, true, false), None);
        let mut calls = 0;
        let (seen, step) = drive(&mut exec, &mut pool, |op| {
            calls += 1;
            match (calls, op) {
                (1, StorageOp::Write { fua, .. }) => {
                    assert!(!fua, "FUA is emulated by a flush when the backend has none");
                    3000
                }
                (2, StorageOp::Write { .. }) => -libc::EIO,
                _ => 0,
            }
        });
        assert_eq!(seen, ["write 10000", "write 7000"]);
        match step {
            Step::Fail(f) => assert_eq!((f.errno, f.offset), (Errno::Io, Some((1 << 20) + 3000))),
            _ => panic!("a failed write must fail the command"),
        }
    }

    #[test]
    fn direct_writes_only_when_aligned() {
        let mut pool = pool();
        for (offset, length, direct) in [(4096, 8192, true), (4096, 100, false), (10, 4096, false)] {
            let write = Command::Write { range: Range { offset, length }, fua: false };
            let mut exec = Exec::new(write, Some(pool.get(length as usize)), caps(true, true, true), Some(4096));
            match exec.start(&mut pool) {
                Step::Submit(StorageOp::Write { direct: d, .. }) => assert_eq!(d, direct, "{offset}+{length}"),
                _ => panic!("a write starts with a write"),
            }
        }
    }
}
