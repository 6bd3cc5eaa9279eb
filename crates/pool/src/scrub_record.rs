//! The last completed scrub, as every member's superblock records it (bytes 2048..2304 of
//! the superblock block), so that a scheduled scrub knows when the next one is due after
//! a restart, and `pool status` can say what the last one found without assembling.
//!
//! Layout, little-endian: kind (1 check, 2 repair; 0: no scrub recorded), flags (bit 0:
//! the scrub was cut short), 6 reserved bytes, then the completion time (ms since the Unix
//! epoch), bytes compared, mismatched regions, repaired regions. An all-zero range means
//! "no scrub recorded": superblocks written before scrubs existed decode unchanged.

/// Where the record lives in the superblock block.
pub const SCRUB_RECORD_AT: usize = 2048;
pub const SCRUB_RECORD_END: usize = 2304;
const _: () = assert!(SCRUB_RECORD_AT + 40 <= SCRUB_RECORD_END);

/// What a completed scrub found.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ScrubRecord {
    /// Repair (true) or check.
    pub repair: bool,
    /// Stopped before every set was compared (the pool stopped, a set lost its copies).
    pub partial: bool,
    /// Milliseconds since the Unix epoch when it ended.
    pub finished_wall_ms: u64,
    pub compared_bytes: u64,
    pub mismatched_regions: u64,
    pub repaired_regions: u64,
}

impl ScrubRecord {
    /// Writes the record into its range of a superblock block (`None`: all zero).
    pub fn encode_into(record: Option<&ScrubRecord>, block: &mut [u8]) {
        let b = &mut block[SCRUB_RECORD_AT..SCRUB_RECORD_END];
        b.fill(0);
        let Some(r) = record else { return };
        b[0] = if r.repair { 2 } else { 1 };
        b[1] = u8::from(r.partial);
        let words = [r.finished_wall_ms, r.compared_bytes, r.mismatched_regions, r.repaired_regions];
        for (i, w) in words.iter().enumerate() {
            b[8 + i * 8..16 + i * 8].copy_from_slice(&w.to_le_bytes());
        }
    }

    /// The record in a superblock block: None when none was written.
    pub fn decode(block: &[u8]) -> Result<Option<ScrubRecord>, String> {
        let b = &block[SCRUB_RECORD_AT..SCRUB_RECORD_END];
        let word = |i: usize| u64::from_le_bytes(b[8 + i * 8..16 + i * 8].try_into().expect("8 bytes"));
        let repair = match b[0] {
            0 => return Ok(None),
            1 => false,
            2 => true,
            k => return Err(format!("its pool superblock records an unknown scrub kind {k}")),
        };
        Ok(Some(ScrubRecord {
            repair,
            partial: b[1] & 1 == 1,
            finished_wall_ms: word(0),
            compared_bytes: word(1),
            mismatched_regions: word(2),
            repaired_regions: word(3),
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_round_trips_and_zeros_mean_none() {
        let mut block = vec![0u8; 4096];
        assert_eq!(ScrubRecord::decode(&block).unwrap(), None);
        let r = ScrubRecord { repair: true, partial: true, finished_wall_ms: 1_700_000_000_000, compared_bytes: 7 << 20, mismatched_regions: 3, repaired_regions: 2 };
        ScrubRecord::encode_into(Some(&r), &mut block);
        assert_eq!(ScrubRecord::decode(&block).unwrap(), Some(r));
        assert!(block[..SCRUB_RECORD_AT].iter().chain(&block[SCRUB_RECORD_END..]).all(|&b| b == 0));
        ScrubRecord::encode_into(None, &mut block);
        assert!(block.iter().all(|&b| b == 0));
        block[SCRUB_RECORD_AT] = 9;
        assert!(ScrubRecord::decode(&block).unwrap_err().contains("scrub kind"));
    }
}
