//! Sequential stream detection for prefetch: a read that starts where a recent read ended
//! continues that stream; after `PREFETCH_TRIGGER_READS` such reads the stream's next
//! window of blocks is worth reading ahead. Each stream remembers how far ahead it was
//! already read, so a block is asked for once per stream.

use std::ops::Range;

use crate::limits::{PREFETCH_TRIGGER_READS, STREAMS_MAX};

#[derive(Clone, Copy, Debug)]
struct Stream {
    next_offset: u64,
    reads: u32,
    /// Blocks before this were already asked for.
    ahead_until: u64,
    last_used: u64,
}

#[derive(Default)]
pub struct Streams {
    streams: Vec<Stream>,
    tick: u64,
}

impl Streams {
    /// A client read of `offset..offset + len`: the blocks to read ahead, if it continues a
    /// sequential stream (`window` blocks past its end, within `blocks` of the volume).
    pub fn note(&mut self, offset: u64, len: u64, block_bytes: u64, window: u64, blocks: u64) -> Option<Range<u64>> {
        self.tick += 1;
        let tick = self.tick;
        let end = offset + len;
        let s = match self.streams.iter_mut().position(|s| s.next_offset == offset) {
            Some(i) => &mut self.streams[i],
            None => self.forget_oldest(),
        };
        if s.next_offset == offset {
            s.reads += 1;
        } else {
            *s = Stream { next_offset: offset, reads: 1, ahead_until: 0, last_used: 0 };
        }
        s.next_offset = end;
        s.last_used = tick;
        if s.reads < PREFETCH_TRIGGER_READS {
            return None;
        }
        let from = s.ahead_until.max(end / block_bytes);
        let to = (end.div_ceil(block_bytes) + window).min(blocks);
        s.ahead_until = s.ahead_until.max(to);
        (from < to).then_some(from..to)
    }

    /// A stream to reuse: a new one while there is room, else the least recently used.
    fn forget_oldest(&mut self) -> &mut Stream {
        if self.streams.len() < STREAMS_MAX {
            self.streams.push(Stream { next_offset: u64::MAX, reads: 0, ahead_until: 0, last_used: 0 });
            return self.streams.last_mut().expect("just pushed");
        }
        self.streams.iter_mut().min_by_key(|s| s.last_used).expect("STREAMS_MAX > 0")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_second_sequential_read_starts_the_window_once() {
        let mut s = Streams::default();
        assert_eq!(s.note(0, 4096, 4096, 4, 100), None);
        assert_eq!(s.note(4096, 4096, 4096, 4, 100), Some(2..6));
        assert_eq!(s.note(8192, 4096, 4096, 4, 100), Some(6..7));
        assert_eq!(s.note(50 * 4096, 4096, 4096, 4, 100), None);
    }

    #[test]
    fn interleaved_streams_are_told_apart_and_bounded() {
        let mut s = Streams::default();
        let mut started = 0;
        for i in 0..3u64 {
            for k in 0..3u64 {
                started += s.note(k * 1_000_000 + i * 4096, 4096, 4096, 2, 1000).is_some() as u32;
            }
        }
        assert_eq!(started, 6, "each of three streams reads ahead from its second read on");
        for k in 0..100u64 {
            s.note(k * 1_000_000, 512, 4096, 2, 1000);
        }
        assert_eq!(s.streams.len(), STREAMS_MAX);
    }

    #[test]
    fn the_window_stops_at_the_volume_end() {
        let mut s = Streams::default();
        s.note(0, 8192, 4096, 8, 5);
        assert_eq!(s.note(8192, 8192, 4096, 8, 5), Some(4..5));
    }
}
