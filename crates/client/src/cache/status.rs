//! What a cached volume shows of itself (`/metrics`, `sluice info`): the core's counters
//! and each member's state.

use sluice_cache::Counters;

/// A cached volume's state now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Status {
    /// The cache block, in bytes.
    pub block_bytes: u64,
    pub counters: Counters,
    /// In the file's order.
    pub members: Vec<MemberStatus>,
}

/// One member: whether it is used now, and how much of its memory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub uri: String,
    pub up: bool,
    /// Failures in a row (failed operations, timeouts, connections refused) since it was
    /// last up; 0 while up.
    pub failures: u32,
    /// Slots it lends (its size over the slot size) while up; 0 while down.
    pub slots: u64,
    /// Slots holding a block.
    pub used: u64,
}
