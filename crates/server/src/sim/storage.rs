//! The simulated storage: every export offset holds `pattern(offset)`. Operations are
//! checked when the core hands them out and carried out with random short transfers and
//! errors when the simulation completes them.

use rustix::fs::OFlags;
use sluice_proto::reply::Extent;

use super::client::pattern;
use sluice_proto::rng::Rng;
use crate::backend::{Outcome, StorageOp};
use crate::engine::{Held, Pipe};

/// What the core may never ask of storage: ranges past the end, unaligned direct I/O, a
/// write whose payload is neither the client's bytes nor zeros.
pub fn check_op(op: &StorageOp, size: u64, align: Option<usize>) -> Result<(), String> {
    let (offset, len, direct) = match op {
        StorageOp::Read { offset, len, direct, .. } => (*offset, *len as u64, *direct),
        StorageOp::Write { offset, len, direct, buf, at, .. } => {
            let data = &buf.as_slice()[*at..*at + *len];
            let zeros = data.iter().all(|&b| b == 0);
            if !zeros && data.iter().enumerate().any(|(i, &b)| b != pattern(offset + i as u64)) {
                return Err(format!("a write at {offset} carries bytes the client did not send"));
            }
            (*offset, *len as u64, *direct)
        }
        StorageOp::Trim { offset, len } | StorageOp::Zero { offset, len, .. } | StorageOp::Cache { offset, len } => {
            (*offset, *len, false)
        }
        StorageOp::Extents { offset, len, .. } => (*offset, *len, false),
        StorageOp::Flush => return Ok(()),
    };
    if offset.checked_add(len).is_none_or(|end| end > size) {
        return Err(format!("storage asked for {len} bytes at {offset}, past the end"));
    }
    if direct {
        let a = align.ok_or("a direct operation on an export without O_DIRECT")? as u64;
        if offset % a != 0 || len % a != 0 {
            return Err(format!("unaligned direct operation: {len} bytes at {offset}"));
        }
    }
    Ok(())
}

/// Carries out an operation; the flag says a read failed (which may cut a reply short).
pub fn carry_out(op: StorageOp, rng: &mut Rng) -> Result<(Outcome, bool), String> {
    let fail = rng.below(40) == 0;
    let outcome = match op {
        StorageOp::Read { offset, len, into, at, direct } => {
            if fail {
                return Ok((Outcome { result: -libc::EIO, held: into }, true));
            }
            let n = short(rng, len, direct);
            let data: Vec<u8> = (0..n as u64).map(|i| pattern(offset + i)).collect();
            let held = match into {
                Held::Buf(mut buf) => {
                    buf.as_mut_slice()[at..at + n].copy_from_slice(&data);
                    Held::Buf(buf)
                }
                Held::Pipe(pipe) => {
                    fill_pipe(&pipe, &data)?;
                    Held::Pipe(pipe)
                }
                Held::Nothing | Held::Extents(_) => return Err("a read with nowhere to put its data".into()),
            };
            Outcome { result: n as i32, held }
        }
        StorageOp::Write { buf, len, direct, .. } => {
            let result = if fail { -libc::ENOSPC } else { short(rng, len, direct) as i32 };
            Outcome { result, held: Held::Buf(buf) }
        }
        StorageOp::Trim { .. } | StorageOp::Zero { .. } if rng.below(6) == 0 => {
            Outcome { result: -libc::EOPNOTSUPP, held: Held::Nothing }
        }
        StorageOp::Extents { len, mut out, .. } => {
            let first = 1 + rng.below(len);
            out.push(Extent { length: first, flags: 0 });
            if first < len && rng.below(2) == 0 {
                out.push(Extent { length: len - first, flags: 3 });
            }
            Outcome { result: 0, held: Held::Extents(out) }
        }
        _ => Outcome { result: if fail { -libc::EIO } else { 0 }, held: Held::Nothing },
    };
    Ok((outcome, false))
}

/// Bytes a transfer of `len` moves: all, or (one time in five) fewer; direct transfers
/// stop only at block boundaries.
fn short(rng: &mut Rng, len: usize, direct: bool) -> usize {
    if len < 2 || rng.below(5) != 0 {
        return len;
    }
    let n = 1 + rng.below(len as u64 - 1) as usize;
    if direct {
        let n = n / 4096 * 4096;
        return if n == 0 { len } else { n };
    }
    n
}

fn nonblocking(fd: std::os::fd::BorrowedFd<'_>) -> Result<(), String> {
    rustix::fs::fcntl_setfl(fd, OFlags::NONBLOCK).map_err(|e| format!("fcntl: {e}"))
}

fn fill_pipe(pipe: &Pipe, data: &[u8]) -> Result<(), String> {
    nonblocking(pipe.write_end())?;
    let mut at = 0;
    while at < data.len() {
        match rustix::io::write(pipe.write_end(), &data[at..]) {
            Ok(n) => at += n,
            Err(e) => return Err(format!("a chunk does not fit its pipe ({e}) after {at} of {} bytes", data.len())),
        }
    }
    Ok(())
}

/// Takes up to `want` bytes out of a pipe, as a splice to the socket would.
pub fn drain_pipe(pipe: &Pipe, want: usize) -> Result<Vec<u8>, String> {
    nonblocking(pipe.read_end())?;
    let mut bytes = vec![0u8; want];
    match rustix::io::read(pipe.read_end(), &mut bytes) {
        Ok(0) => Err("a splice from an empty pipe".into()),
        Ok(n) => {
            bytes.truncate(n);
            Ok(bytes)
        }
        Err(e) => Err(format!("a splice from a pipe with nothing in it ({e})")),
    }
}
