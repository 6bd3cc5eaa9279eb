//! A binary buddy allocator over block indices. It hands out power-of-two runs of
//! `BLOCK_BYTES` blocks and merges them back; it never touches memory itself, so it is safe
//! code that the engine's buffer pool drives.

const NIL: u32 = u32::MAX;
const NOT_FREE: u8 = u8::MAX;

pub struct Buddy {
    /// Largest order; a top-level run is 2^max_order blocks.
    max_order: u8,
    /// Head of the free list of each order.
    heads: Vec<u32>,
    /// Doubly linked free lists threaded through the first block of each free run.
    next: Vec<u32>,
    prev: Vec<u32>,
    /// Order of the free run starting at a block, or NOT_FREE.
    free_order: Vec<u8>,
    free_blocks: usize,
}

impl Buddy {
    /// `blocks` must be a multiple of 2^max_order.
    pub fn new(blocks: usize, max_order: u8) -> Buddy {
        assert!(max_order < 31 && blocks.is_multiple_of(1usize << max_order) && blocks < NIL as usize);
        let mut b = Buddy {
            max_order,
            heads: vec![NIL; max_order as usize + 1],
            next: vec![NIL; blocks],
            prev: vec![NIL; blocks],
            free_order: vec![NOT_FREE; blocks],
            free_blocks: 0,
        };
        for start in (0..blocks).step_by(1 << max_order) {
            b.push(start as u32, max_order);
        }
        b
    }

    pub fn free_blocks(&self) -> usize {
        self.free_blocks
    }

    /// First block of a free run of 2^order blocks, or None when no run that large is free.
    pub fn alloc(&mut self, order: u8) -> Option<u32> {
        if order > self.max_order {
            return None;
        }
        let mut o = order;
        while self.heads[o as usize] == NIL {
            o += 1;
            if o > self.max_order {
                return None;
            }
        }
        let block = self.heads[o as usize];
        self.unlink(block, o);
        while o > order {
            o -= 1;
            self.push(block + (1 << o), o);
        }
        Some(block)
    }

    /// Returns a run that `alloc(order)` handed out.
    pub fn free(&mut self, mut block: u32, mut order: u8) {
        debug_assert_eq!(self.free_order[block as usize], NOT_FREE, "block {block} freed twice");
        while order < self.max_order {
            let buddy = block ^ (1 << order);
            if self.free_order[buddy as usize] != order {
                break;
            }
            self.unlink(buddy, order);
            block = block.min(buddy);
            order += 1;
        }
        self.push(block, order);
    }

    fn push(&mut self, block: u32, order: u8) {
        let head = self.heads[order as usize];
        self.next[block as usize] = head;
        self.prev[block as usize] = NIL;
        if head != NIL {
            self.prev[head as usize] = block;
        }
        self.heads[order as usize] = block;
        self.free_order[block as usize] = order;
        self.free_blocks += 1 << order;
    }

    fn unlink(&mut self, block: u32, order: u8) {
        let (n, p) = (self.next[block as usize], self.prev[block as usize]);
        if p == NIL {
            self.heads[order as usize] = n;
        } else {
            self.next[p as usize] = n;
        }
        if n != NIL {
            self.prev[n as usize] = p;
        }
        self.free_order[block as usize] = NOT_FREE;
        self.free_blocks -= 1 << order;
    }
}

/// Smallest order whose run of `block_bytes` blocks holds `len` bytes.
pub fn order_for(len: usize, block_bytes: usize) -> u8 {
    let blocks = len.div_ceil(block_bytes).max(1);
    blocks.next_power_of_two().trailing_zeros() as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_and_merges_back_to_whole() {
        let mut b = Buddy::new(16, 3);
        let total = b.free_blocks();
        let a = b.alloc(0).unwrap();
        let c = b.alloc(1).unwrap();
        let d = b.alloc(3).unwrap();
        assert_eq!(b.free_blocks(), total - 1 - 2 - 8);
        // No two live runs overlap.
        let runs = [(a, 1), (c, 2), (d, 8)];
        for (i, &(s1, l1)) in runs.iter().enumerate() {
            for &(s2, l2) in &runs[i + 1..] {
                assert!(s1 + l1 <= s2 || s2 + l2 <= s1, "{runs:?} overlap");
            }
        }
        b.free(a, 0);
        b.free(c, 1);
        b.free(d, 3);
        assert_eq!(b.free_blocks(), total);
        // Fully merged again: two top-level runs can be taken.
        assert!(b.alloc(3).is_some() && b.alloc(3).is_some() && b.alloc(0).is_none());
    }

    #[test]
    fn refuses_what_does_not_fit() {
        let mut b = Buddy::new(8, 3);
        assert_eq!(b.alloc(4), None);
        assert!(b.alloc(3).is_some());
        assert_eq!(b.alloc(0), None);
    }

    #[test]
    fn random_alloc_free_keeps_accounting() {
        let mut b = Buddy::new(64, 4);
        let mut live: Vec<(u32, u8)> = Vec::new();
        let mut x = 0x9e3779b97f4a7c15u64;
        for _ in 0..10_000 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if !x.is_multiple_of(3) || live.is_empty() {
                let order = (x >> 8) as u8 % 5;
                if let Some(block) = b.alloc(order) {
                    assert_eq!(block % (1 << order), 0, "runs are aligned to their size");
                    live.push((block, order));
                }
            } else {
                let (block, order) = live.swap_remove((x >> 16) as usize % live.len());
                b.free(block, order);
            }
            let used: usize = live.iter().map(|&(_, o)| 1usize << o).sum();
            assert_eq!(used + b.free_blocks(), 64);
        }
    }

    #[test]
    fn order_for_rounds_up() {
        assert_eq!(order_for(1, 4096), 0);
        assert_eq!(order_for(4096, 4096), 0);
        assert_eq!(order_for(4097, 4096), 1);
        assert_eq!(order_for(32 << 20, 4096), 13);
    }
}
