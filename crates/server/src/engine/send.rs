//! Replies on their way out: a part is one reply (or one piece of a read's reply) with an
//! inline header, data in a buffer or a pipe, and trailing bytes; a batch gathers parts for
//! one sendmsg and keeps its iovecs at a fixed address while the kernel reads them.

use std::collections::VecDeque;

use super::buffer::Buf;
use super::pipe::Pipe;

/// Bytes of a reply header stored inline in a send part: the largest, an OFFSET_HOLE with
/// an extended header, is 44.
pub const INLINE_HEAD_BYTES: usize = sluice_proto::reply::HEAD_MAX_BYTES;

/// One reply on its way out: an inline header, then data (a window of a buffer, or bytes
/// waiting in a pipe to be spliced after the header), then optional extra bytes (block
/// status descriptors, error messages).
pub struct Part {
    pub tag: u32,
    head: [u8; INLINE_HEAD_BYTES],
    head_len: u8,
    pub data: Option<Buf>,
    data_start: usize,
    data_len: usize,
    pub extra: Vec<u8>,
    /// Data that follows the header straight from a pipe, and how much of it is still there.
    pub pipe: Option<Pipe>,
    pub pipe_left: usize,
    sent: usize,
}

impl Part {
    pub fn new(tag: u32, head: &[u8], data: Option<Buf>, extra: Vec<u8>) -> Part {
        let len = data.as_ref().map_or(0, Buf::len);
        Part::window(tag, head, data, 0, len, extra)
    }

    /// A part whose data is `data[start..start + len]`.
    pub fn window(tag: u32, head: &[u8], data: Option<Buf>, start: usize, len: usize, extra: Vec<u8>) -> Part {
        assert!(data.as_ref().map_or(start + len == 0, |d| start + len <= d.len()));
        let mut h = [0u8; INLINE_HEAD_BYTES];
        h[..head.len()].copy_from_slice(head);
        Part {
            tag,
            head: h,
            head_len: head.len() as u8,
            data,
            data_start: start,
            data_len: len,
            extra,
            pipe: None,
            pipe_left: 0,
            sent: 0,
        }
    }

    /// A header sent by sendmsg, then `len` bytes spliced from `pipe` to the socket.
    pub fn spliced(tag: u32, head: &[u8], pipe: Pipe, len: usize) -> Part {
        let mut p = Part::window(tag, head, None, 0, 0, Vec::new());
        p.pipe = Some(pipe);
        p.pipe_left = len;
        p
    }

    fn total(&self) -> usize {
        self.head_len as usize + self.data_len + self.extra.len()
    }

    /// Only spliced data: nothing for sendmsg to do.
    pub fn is_bare_splice(&self) -> bool {
        self.pipe.is_some() && self.total() == 0
    }
}

/// A gather list for one sendmsg. It lives in a Box so the iovecs and msghdr keep their
/// addresses while the kernel reads them.
pub struct SendBatch {
    parts: VecDeque<Part>,
    iov: Vec<libc::iovec>,
    msg: libc::msghdr,
    parts_max: usize,
}

impl SendBatch {
    pub fn new(parts_max: usize) -> Box<SendBatch> {
        Box::new(SendBatch {
            parts: VecDeque::with_capacity(parts_max),
            iov: Vec::with_capacity(3 * parts_max),
            // SAFETY: msghdr is plain old data for which all-zero is a valid value.
            msg: unsafe { std::mem::zeroed() },
            parts_max,
        })
    }

    pub fn is_full(&self) -> bool {
        self.parts.len() >= self.parts_max
    }

    pub fn is_empty(&self) -> bool {
        self.parts.is_empty()
    }

    pub fn push(&mut self, part: Part) {
        assert!(!self.is_full());
        assert!(self.parts.back().is_none_or(|p| p.pipe.is_none()), "a spliced part ends its batch");
        self.parts.push_back(part);
    }

    /// Whether the last part's data follows by splice, so the header should not be pushed
    /// out on its own.
    pub fn ends_with_splice(&self) -> bool {
        self.parts.back().is_some_and(|p| p.pipe.is_some())
    }

    /// Accounts `n` sent bytes; parts sent in full are passed to `done` in order.
    pub fn consume(&mut self, mut n: usize, mut done: impl FnMut(Part)) {
        while let Some(front) = self.parts.front_mut() {
            let left = front.total() - front.sent;
            if n < left {
                front.sent += n;
                return;
            }
            n -= left;
            done(self.parts.pop_front().expect("front exists"));
        }
        debug_assert_eq!(n, 0, "the kernel reported more bytes sent than were queued");
    }

    /// Takes every part back, sent or not (the connection is going away).
    pub fn drain(&mut self, done: impl FnMut(Part)) {
        self.parts.drain(..).for_each(done);
    }

    pub(super) fn prepare(&mut self) -> *const libc::msghdr {
        self.iov.clear();
        for p in &self.parts {
            let mut skip = p.sent;
            // SAFETY: Part::window checked data_start + data_len <= the buffer's length.
            let data = p.data.as_ref().map(|b| (unsafe { b.ptr().add(p.data_start) } as *const u8, p.data_len));
            let pieces = [
                (p.head.as_ptr(), p.head_len as usize),
                data.unwrap_or((std::ptr::null(), 0)),
                (p.extra.as_ptr(), p.extra.len()),
            ];
            for (ptr, len) in pieces {
                if skip >= len {
                    skip -= len;
                    continue;
                }
                // SAFETY: skip < len, so the pointer stays inside the piece.
                let base = unsafe { ptr.add(skip) };
                self.iov.push(libc::iovec { iov_base: base as *mut libc::c_void, iov_len: len - skip });
                skip = 0;
            }
        }
        self.msg.msg_iov = self.iov.as_mut_ptr();
        self.msg.msg_iovlen = self.iov.len() as _;
        &self.msg
    }

    /// Calls `f` with each run of bytes a send would transmit now, in order: what is left of
    /// each part's header, data and extra bytes (spliced data excluded), until `f` returns
    /// false. For callers that move the bytes themselves rather than through sendmsg.
    pub fn for_each_pending(&self, mut f: impl FnMut(&[u8]) -> bool) {
        for p in &self.parts {
            let data = p.data.as_ref().map_or(&[][..], |b| &b.as_slice()[p.data_start..p.data_start + p.data_len]);
            let mut skip = p.sent;
            for piece in [&p.head[..p.head_len as usize], data, &p.extra[..]] {
                let from = skip.min(piece.len());
                skip -= from;
                if from < piece.len() && !f(&piece[from..]) {
                    return;
                }
            }
        }
    }

    /// Appends to `out` the bytes a send would transmit now, up to `max` of them.
    pub fn copy_out(&self, max: usize, out: &mut Vec<u8>) {
        let mut left = max;
        self.for_each_pending(|piece| {
            let take = piece.len().min(left);
            out.extend_from_slice(&piece[..take]);
            left -= take;
            left > 0
        });
    }

    /// Bytes a send would transmit now (spliced data excluded).
    pub fn pending_bytes(&self) -> usize {
        self.parts.iter().map(|p| p.total() - p.sent).sum()
    }
}

