//! What the cache counts for `/metrics` and `sluice info`: one counter each, only ever
//! added to (per-member state is read from the directory when asked).

/// Running totals since the cache started.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Counters {
    /// Blocks a read found in the cache and verified.
    pub hits: u64,
    /// Blocks a read went to the backing for (not cached, or failed their check).
    pub misses: u64,
    /// Bytes of client reads served from the members.
    pub hit_bytes: u64,
    /// Bytes of client reads served from the backing.
    pub miss_bytes: u64,
    /// Member reads hits made: one per hit, of the pages the read needs.
    pub hit_reads: u64,
    /// Bytes those reads moved: over `hit_bytes`, what reading whole pages costs (the
    /// partial pages at a read's edges, read whole to be checked).
    pub hit_read_bytes: u64,
    /// Blocks written to a member slot and made readable.
    pub fills: u64,
    /// Bytes brought in by prefetch or hints that a client read then used.
    pub prefetched_used_bytes: u64,
    /// Bytes brought in by prefetch or hints that left the cache (or never entered it) unread.
    pub prefetched_wasted_bytes: u64,
    /// Fills dropped because a write to their block started while they were in flight.
    pub fills_overtaken: u64,
    /// Blocks pushed out of their slot to make room.
    pub evictions: u64,
    /// Slots read back that failed their check (dropped pages, a restarted member, a reuse).
    pub verify_failures: u64,
    /// Slots the cache dropped without reusing them (invalidated, or written by a fill a
    /// write overtook) and asked their member to trim, so it gives their memory back.
    pub member_trims: u64,
    /// Times a member was marked down (failed operation, timeout, or the shell said so).
    pub member_failures: u64,
    /// Writes, zeroes and trims the backing failed: the blocks they touched are not cached
    /// again (see `core::write`).
    pub failed_writes: u64,
}

impl Counters {
    /// Hits over all blocks read, in percent (0 before any read).
    pub fn hit_percent(&self) -> f64 {
        match self.hits + self.misses {
            0 => 0.0,
            n => 100.0 * self.hits as f64 / n as f64,
        }
    }
}
