//! The simulated volume and members, chosen from the seed.

use super::model::SECTOR;
use crate::api::Params;
use sluice_proto::rng::Rng;

/// Blocks one request touches at most (reads and writes span up to three blocks' bytes).
pub const RUN_BLOCKS_MAX: usize = 4;

pub fn params(rng: &mut Rng) -> Params {
    let block_bytes = 4096 << rng.below(3);
    let blocks = 8 + rng.below(40);
    let volume_bytes = blocks * block_bytes - rng.below(block_bytes / SECTOR) * SECTOR;
    let members = (0..1 + rng.below(4)).map(|i| format!("nbd://node{i}/ram")).collect();
    Params {
        volume_bytes,
        block_bytes,
        identity: 0x5eed_0000 + rng.below(1 << 20) + 1,
        members,
        prefetch: rng.below(5) != 0,
        prefetch_window_blocks: 1 + rng.below(8),
        member_timeout_ms: crate::limits::MEMBER_TIMEOUT_DEFAULT_MS,
    }
}
