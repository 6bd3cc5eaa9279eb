//! Where a reply chunk's bytes land in a read's buffers, which the caller gave in pieces.

/// Where a chunk's bytes land in its request's buffers: (buffer, range within it) pieces,
/// in order, for `left` bytes starting `skip` bytes into the request. The connection checked that
/// they lie inside it. It borrows the buffers only between steps, so each piece can be
/// written in turn.
pub(crate) struct Spans {
    skip: usize,
    pub(crate) left: usize,
    i: usize,
}

impl Spans {
    pub(crate) fn new(skip: u32, left: u32) -> Spans {
        Spans { skip: skip as usize, left: left as usize, i: 0 }
    }

    pub(crate) fn next(&mut self, bufs: &[Vec<u8>]) -> Option<(usize, std::ops::Range<usize>)> {
        while self.left > 0 {
            let (i, len) = (self.i, bufs.get(self.i)?.len());
            self.i += 1;
            if self.skip >= len {
                self.skip -= len;
                continue;
            }
            let (at, take) = (self.skip, (len - self.skip).min(self.left));
            (self.skip, self.left) = (0, self.left - take);
            return Some((i, at..at + take));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::Spans;

    fn all(skip: u32, left: u32, lens: &[usize]) -> (Vec<(usize, std::ops::Range<usize>)>, usize) {
        let bufs: Vec<Vec<u8>> = lens.iter().map(|&n| vec![0; n]).collect();
        let mut s = Spans::new(skip, left);
        let mut out = Vec::new();
        while let Some(x) = s.next(&bufs) {
            out.push(x);
        }
        (out, s.left)
    }

    #[test]
    fn spans_cross_empty_buffers_and_boundaries() {
        assert_eq!(all(2, 6, &[3, 0, 4, 2]), (vec![(0, 2..3), (2, 0..4), (3, 0..1)], 0));
        assert_eq!(all(3, 6, &[3, 0, 4, 2]), (vec![(2, 0..4), (3, 0..2)], 0));
        assert_eq!(all(0, 9, &[0, 3, 0, 4, 2, 0]), (vec![(1, 0..3), (3, 0..4), (4, 0..2)], 0));
        assert_eq!(all(7, 1, &[3, 0, 4, 2]), (vec![(3, 0..1)], 0));
        assert_eq!(all(9, 0, &[3, 0, 4, 2]), (vec![], 0));
        // Past the buffers: stops with bytes left (the debug_assert's case).
        assert_eq!(all(8, 3, &[3, 0, 4, 2]), (vec![(3, 1..2)], 2));
    }
}
