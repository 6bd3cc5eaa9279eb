//! Random choices for seeded simulations and fuzz targets: from fuzz input while it lasts,
//! then from a xorshift generator, so a seed or an input replays exactly.

/// Random choices: from fuzz input while it lasts, then from a xorshift generator.
pub struct Rng {
    bytes: Vec<u8>,
    at: usize,
    state: u64,
}

impl Rng {
    pub fn seeded(seed: u64) -> Rng {
        Rng { bytes: Vec::new(), at: 0, state: seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1 }
    }

    pub fn from_bytes(bytes: &[u8]) -> Rng {
        Rng { bytes: bytes.to_vec(), at: 0, state: (bytes.len() as u64).wrapping_mul(0x2545_f491_4f6c_dd1d) | 1 }
    }

    fn next(&mut self) -> u64 {
        if let Some(b) = self.bytes.get(self.at..self.at + 4) {
            self.at += 4;
            return u32::from_le_bytes(b.try_into().expect("four bytes")) as u64;
        }
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        self.state
    }

    /// A number in `0..n` (0 when n is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next() % n
        }
    }
}
