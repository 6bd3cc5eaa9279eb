//! Buffers for the reads whose buffers the client chooses (a pool member's read, a read
//! handed back in pieces), kept once their bytes are used, so that the next such read takes
//! one instead of a new `vec![0; len]`. A new buffer of a large read's size costs a pass
//! that zeroes every byte (the allocator clears memory it reuses) or a page fault per page
//! (fresh memory): about a tenth of a pool gateway's CPU under 1 MiB reads (2026-11-27).
//! A kept buffer costs neither, and what it held before never shows: a read succeeds only
//! once its reply has written every byte of its buffers, and a failed read's buffers are
//! never data.

use std::collections::VecDeque;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::limits::{READ_BUFFERS_KEPT_BYTES_MAX, READ_BUFFER_KEPT_MIN_BYTES};

struct Kept {
    bufs: VecDeque<Vec<u8>>,
    /// Capacity of `bufs`, added up.
    bytes: usize,
}

static KEPT: Mutex<Kept> = Mutex::new(Kept::new());

fn kept() -> MutexGuard<'static, Kept> {
    // Nothing panics while holding the lock (it only moves buffers), so a poisoned lock
    // still guards a consistent list.
    KEPT.lock().unwrap_or_else(PoisonError::into_inner)
}

/// A buffer of `len` bytes for a read to fill: zeros, or the bytes of an earlier read.
pub fn take(len: usize) -> Vec<u8> {
    let found = if len >= READ_BUFFER_KEPT_MIN_BYTES { kept().take(len) } else { None };
    found.unwrap_or_else(|| vec![0; len])
}

/// A read's buffer whose bytes have been used, kept for a later read if it is large enough.
pub fn give_back(buf: Vec<u8>) {
    if buf.len() < READ_BUFFER_KEPT_MIN_BYTES || buf.capacity() > READ_BUFFERS_KEPT_BYTES_MAX {
        return;
    }
    let evicted = kept().keep(buf);
    // Freed after the lock.
    drop(evicted);
}

impl Kept {
    const fn new() -> Kept {
        Kept { bufs: VecDeque::new(), bytes: 0 }
    }

    /// A kept buffer at least `len` long whose allocation is not more than twice that: a
    /// small read does not hold a large buffer's memory (a buffer is kept at the length of
    /// its last read, so its capacity is what counts).
    fn take(&mut self, len: usize) -> Option<Vec<u8>> {
        let i = self.bufs.iter().position(|b| b.len() >= len && b.capacity() / 2 <= len)?;
        let mut buf = self.bufs.remove(i)?;
        self.bytes -= buf.capacity();
        buf.truncate(len);
        Some(buf)
    }

    /// Keeps `buf`; when the kept bytes would pass their bound the oldest go (returned, to
    /// be freed), so that sizes no longer read do not stay for good.
    fn keep(&mut self, buf: Vec<u8>) -> Vec<Vec<u8>> {
        let mut evicted = Vec::new();
        while self.bytes + buf.capacity() > READ_BUFFERS_KEPT_BYTES_MAX {
            let old = self.bufs.pop_front().expect("kept bytes are the kept buffers' capacity");
            self.bytes -= old.capacity();
            evicted.push(old);
        }
        self.bytes += buf.capacity();
        self.bufs.push_back(buf);
        evicted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kept_buffer_is_taken_again_for_a_read_its_length_or_down_to_half() {
        let mut kept = Kept::new();
        let len = 300_000;
        let buf = vec![7u8; len];
        let at = buf.as_ptr();
        assert!(kept.keep(buf).is_empty());
        assert!(kept.take(len + 1).is_none(), "a longer read needs a longer buffer");
        assert!(kept.take(len / 2 - 1).is_none(), "a read under half its length leaves it");
        let again = kept.take(len / 2).expect("half its length takes it");
        assert_eq!((again.as_ptr(), again.len()), (at, len / 2));
        assert_eq!((kept.bufs.len(), kept.bytes), (0, 0));
        kept.keep(again);
        assert!(kept.take(len).is_none(), "only the bytes of its last read count as written");
        assert!(kept.take(len / 2 - 1).is_none(), "its allocation is still more than twice that");
        assert_eq!(kept.take(len / 2).map(|b| b.as_ptr()), Some(at));
    }

    #[test]
    fn the_kept_bytes_stay_bounded_and_the_oldest_go_first() {
        let mut kept = Kept::new();
        let len = READ_BUFFERS_KEPT_BYTES_MAX / 3 + 1;
        let first = vec![1u8; len];
        let at = first.as_ptr();
        kept.keep(first);
        kept.keep(vec![2u8; len]);
        let evicted = kept.keep(vec![3u8; len]);
        assert_eq!(evicted.len(), 1);
        assert_eq!(evicted[0].as_ptr(), at, "the oldest went");
        assert_eq!(kept.bytes, kept.bufs.iter().map(Vec::capacity).sum::<usize>());
        assert!(kept.bytes <= READ_BUFFERS_KEPT_BYTES_MAX);
    }

    #[test]
    fn small_buffers_come_new_and_zeroed() {
        // Below the bound the list is never looked at, so this holds with other tests
        // giving buffers back at the same time.
        assert!(take(READ_BUFFER_KEPT_MIN_BYTES - 1).iter().all(|&b| b == 0));
    }
}
