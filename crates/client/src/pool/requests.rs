//! Volume requests between the caller and the coordinator: an NBD command becomes a pool
//! `Command`, a write's bytes are gathered once so that every copy can send them, read
//! pieces land in the caller's buffers, and the coordinator's verdict becomes the reply.

use crate::connection::Outcome;
use crate::error::Error;
use crate::carry::Answered;
use sluice_pool::{Command, Failure};
use sluice_proto::wire::*;
use std::io::IoSlice;
use std::sync::Arc;
use tokio::sync::oneshot;

/// A volume request the coordinator is working on.
pub(crate) struct Request {
    /// A write's bytes, shared by the member writes that send them.
    pub(crate) write: Option<Arc<Vec<u8>>>,
    /// A read's destination.
    pub(crate) read: ReadInto,
    pub(crate) done: Answer,
}

/// What a request's read bytes, or its failure, go to.
pub(crate) enum Answer {
    /// A caller awaiting it.
    Channel(oneshot::Sender<Result<Vec<Vec<u8>>, Failure>>),
    /// A caller that is not a task (a server's worker), called on whatever thread finishes
    /// the request.
    Call(Answered),
}

impl Answer {
    pub(crate) fn send(self, result: Result<Vec<Vec<u8>>, Failure>) {
        match self {
            // The caller may have given up waiting; nothing to tell then.
            Answer::Channel(tx) => {
                let _ = tx.send(result);
            }
            Answer::Call(call) => call(result.map_err(|f| Error::Server { errno: f.errno.code(), message: Some(f.message) })),
        }
    }
}

/// The pool command for an NBD request that `Client` already checked (range, alignment,
/// read-only, flags the export advertises).
pub(crate) fn command(cmd: u16, flags: u16, offset: u64, len: u32) -> Result<Command, Error> {
    let (len, fua) = (len as u64, flags & CMD_FLAG_FUA != 0);
    match cmd {
        CMD_READ => Ok(Command::Read { offset, len }),
        CMD_WRITE => Ok(Command::Write { offset, len, fua }),
        CMD_WRITE_ZEROES => Ok(Command::Zero { offset, len, fua, may_trim: flags & CMD_FLAG_NO_HOLE == 0 }),
        CMD_TRIM => Ok(Command::Trim { offset, len, fua }),
        CMD_FLUSH => Ok(Command::Flush),
        // The pool advertises neither CACHE nor base:allocation, so Client never sends them.
        CMD_CACHE => Err(Error::Unsupported("CACHE")),
        _ => Err(Error::Unsupported("BLOCK_STATUS")),
    }
}

/// A write's bytes in one buffer: member writes outlive the caller's borrowed slices.
pub(crate) fn gather(payload: &[IoSlice<'_>]) -> Vec<u8> {
    let mut out = Vec::with_capacity(payload.iter().map(|s| s.len()).sum());
    for s in payload {
        out.extend_from_slice(s);
    }
    out
}

/// Where a read's pieces go.
pub(crate) enum ReadInto {
    /// The caller's buffers, in order: each piece is copied into them (or replaces the
    /// only one, when it is the whole of it).
    Bufs(Vec<Vec<u8>>),
    /// No buffers of the caller's: the members' own buffers are kept as they come, each
    /// with its offset in the request, and handed back in order. No piece is copied.
    Pieces { len: u64, got: Vec<(u64, Vec<u8>)> },
}

impl ReadInto {
    pub(crate) fn land(&mut self, at: u64, data: Vec<u8>) {
        match self {
            ReadInto::Bufs(bufs) => land(bufs, at, data),
            ReadInto::Pieces { got, .. } => got.push((at, data)),
        }
    }

    /// The read's bytes, in order. Pieces that do not tile the request exactly (a piece
    /// read twice, from two copies, both answering) are laid into one buffer instead, in
    /// the order they came, as `Bufs` would have them.
    pub(crate) fn finish(self) -> Vec<Vec<u8>> {
        let (len, mut got) = match self {
            ReadInto::Bufs(bufs) => return bufs,
            ReadInto::Pieces { len, got } => (len, got),
        };
        let mut sorted: Vec<(u64, u64)> = got.iter().map(|(at, d)| (*at, d.len() as u64)).collect();
        sorted.sort_unstable();
        let mut end = 0;
        let tiles = sorted.iter().all(|&(at, n)| {
            let next = at == end;
            end = at + n;
            next
        }) && end == len;
        if tiles {
            got.sort_unstable_by_key(|(at, _)| *at);
            return got.into_iter().map(|(_, d)| d).collect();
        }
        let mut one = vec![vec![0u8; len as usize]];
        for (at, d) in got {
            land(&mut one, at, d);
        }
        one
    }
}

/// Puts `data`, read from a member, at byte `at` of the request's buffers. A piece that is
/// the whole of a single buffer replaces it, which spares the copy in the common case of a
/// request on one member.
pub(crate) fn land(bufs: &mut [Vec<u8>], at: u64, data: Vec<u8>) {
    if let [only] = bufs {
        if at == 0 && data.len() == only.len() {
            *only = data;
            return;
        }
    }
    let mut skip = at as usize;
    let mut src = &data[..];
    for b in bufs.iter_mut() {
        if src.is_empty() {
            break;
        }
        if skip >= b.len() {
            skip -= b.len();
            continue;
        }
        let n = (b.len() - skip).min(src.len());
        b[skip..skip + n].copy_from_slice(&src[..n]);
        src = &src[n..];
        skip = 0;
    }
    debug_assert!(src.is_empty(), "a read piece reaches past its request's buffers");
    crate::read_buffers::give_back(data);
}

/// The reply `Client` expects for a finished request.
pub(crate) fn reply(cmd: u16, result: Result<Vec<Vec<u8>>, Failure>) -> Result<Outcome, Error> {
    match result {
        Ok(bufs) if cmd == CMD_READ => Ok(Outcome::Read(bufs)),
        Ok(_) => Ok(Outcome::Done),
        Err(f) => Err(Error::Server { errno: f.errno.code(), message: Some(f.message) }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::Errno;

    #[test]
    fn commands_carry_their_flags() {
        assert_eq!(command(CMD_READ, 0, 4096, 512).unwrap(), Command::Read { offset: 4096, len: 512 });
        assert_eq!(command(CMD_WRITE, CMD_FLAG_FUA, 0, 9).unwrap(), Command::Write { offset: 0, len: 9, fua: true });
        assert_eq!(
            command(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 1, 2).unwrap(),
            Command::Zero { offset: 1, len: 2, fua: false, may_trim: false }
        );
        assert_eq!(command(CMD_WRITE_ZEROES, 0, 1, 2).unwrap(), Command::Zero { offset: 1, len: 2, fua: false, may_trim: true });
        assert_eq!(command(CMD_TRIM, CMD_FLAG_FUA, 3, 4).unwrap(), Command::Trim { offset: 3, len: 4, fua: true });
        assert_eq!(command(CMD_FLUSH, 0, 0, 0).unwrap(), Command::Flush);
        assert!(matches!(command(CMD_CACHE, 0, 0, 1), Err(Error::Unsupported(_))));
        assert!(matches!(command(CMD_BLOCK_STATUS, 0, 0, 1), Err(Error::Unsupported(_))));
    }

    #[test]
    fn gather_keeps_order() {
        let (a, b, c) = ([1u8, 2], [], [3u8, 4, 5]);
        assert_eq!(gather(&[IoSlice::new(&a), IoSlice::new(&b), IoSlice::new(&c)]), vec![1, 2, 3, 4, 5]);
    }

    #[test]
    fn pieces_land_across_scattered_buffers() {
        let mut bufs = vec![vec![0u8; 3], vec![0u8; 0], vec![0u8; 4], vec![0u8; 2]];
        // Out of order, as member replies come.
        land(&mut bufs, 5, vec![6, 7, 8, 9]);
        land(&mut bufs, 0, vec![1, 2]);
        land(&mut bufs, 2, vec![3, 4, 5]);
        assert_eq!(bufs, vec![vec![1, 2, 3], vec![], vec![4, 5, 6, 7], vec![8, 9]]);
    }

    #[test]
    fn a_whole_piece_replaces_the_buffer() {
        let mut bufs = vec![vec![0u8; 4]];
        let data = vec![1u8, 2, 3, 4];
        let at = data.as_ptr();
        land(&mut bufs, 0, data);
        assert_eq!(bufs[0].as_ptr(), at);
        land(&mut bufs, 1, vec![9, 9]);
        assert_eq!(bufs[0], vec![1, 9, 9, 4]);
    }

    #[test]
    fn pieces_come_back_in_order_uncopied() {
        let mut r = ReadInto::Pieces { len: 7, got: Vec::new() };
        let (a, b, c) = (vec![5u8, 6, 7], vec![1u8, 2], vec![3u8, 4]);
        let at = [a.as_ptr(), b.as_ptr(), c.as_ptr()];
        r.land(4, a);
        r.land(0, b);
        r.land(2, c);
        let out = r.finish();
        assert_eq!(out, vec![vec![1, 2], vec![3, 4], vec![5, 6, 7]]);
        assert_eq!([out[2].as_ptr(), out[0].as_ptr(), out[1].as_ptr()], at);
    }

    #[test]
    fn pieces_that_do_not_tile_are_laid_in_arrival_order() {
        // The same range answered twice (two copies), and a gap: one buffer, as `Bufs`.
        let mut r = ReadInto::Pieces { len: 6, got: Vec::new() };
        r.land(0, vec![1, 1]);
        r.land(0, vec![2, 2]);
        r.land(4, vec![3, 3]);
        assert_eq!(r.finish(), vec![vec![2, 2, 0, 0, 3, 3]]);
        let short = ReadInto::Pieces { len: 4, got: vec![(0, vec![1, 2])] };
        assert_eq!(short.finish(), vec![vec![1, 2, 0, 0]]);
    }

    #[test]
    fn replies_follow_the_command() {
        assert!(matches!(reply(CMD_READ, Ok(vec![vec![1]])), Ok(Outcome::Read(b)) if b == vec![vec![1]]));
        assert!(matches!(reply(CMD_WRITE, Ok(vec![])), Ok(Outcome::Done)));
        let e = reply(CMD_WRITE, Err(Failure::io("no copy took it"))).err().unwrap();
        assert!(matches!(&e, Error::Server { errno, message: Some(m) } if *errno == Errno::Io.code() && m == "no copy took it"), "{e}");
    }
}
