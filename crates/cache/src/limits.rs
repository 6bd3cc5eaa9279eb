//! Every limit and tuning constant of the cache core, named once with its unit last and the
//! reason for its value. Relations between them are asserted at compile time.

/// The smallest cache block: one page (`PAGE_BYTES`), the unit a member may drop.
pub const BLOCK_MIN_BYTES: u64 = 4096;

/// The largest cache block: past 4 MiB a 4 KiB miss reads a thousand times what it needs
/// from the backing, and one slot write holds a member's connection for milliseconds.
pub const BLOCK_MAX_BYTES: u64 = 4 << 20;

/// The block when the file names none: 64 KiB is where a 10 GbE link spends about as long
/// moving the bytes as on the round trip, so larger blocks stop paying for their misses.
pub const BLOCK_DEFAULT_BYTES: u64 = 64 << 10;

/// The page: the unit a member may drop (an elastic member punches holes of pages), and the
/// unit a hit reads and checks (each page of a block has its own sum, in the gateway's
/// directory). Blocks are whole pages, so every slot on a member is page-aligned.
pub const PAGE_BYTES: u64 = 4096;

/// Slots one member may hold: the directory keeps about 72 bytes per slot in the gateway's
/// memory, so this caps a member at 1.1 GiB of gateway memory for its slots (16 Mi slots:
/// 1 TiB of 64 KiB blocks).
pub const MEMBER_SLOTS_MAX: u64 = 16 << 20;

/// Pages one member's slots may hold: the directory keeps a page sum (8 bytes) per page in
/// the gateway's memory, so this caps a member at 2 GiB of sums (1 TiB lent, 0.2%), whatever
/// the block; with 64 KiB blocks it allows as many slots as `MEMBER_SLOTS_MAX`.
pub const MEMBER_PAGES_MAX: u64 = 1 << 28;

/// Slots a member may lend for blocks of `pages` pages: `MEMBER_SLOTS_MAX`, and no more
/// than `MEMBER_PAGES_MAX` pages.
pub const fn member_slots_max(pages: u64) -> u64 {
    let by_pages = MEMBER_PAGES_MAX / pages;
    if by_pages < MEMBER_SLOTS_MAX { by_pages } else { MEMBER_SLOTS_MAX }
}

/// Members one cached volume may have: placement hashes every member on every fill, and a
/// rack has fewer nodes lending memory than this.
pub const MEMBERS_MAX: usize = 64;

/// Sequential streams followed at once for prefetch: a few readers (a copy, a scan, a
/// backup) per volume; more than this and the oldest is forgotten.
pub const STREAMS_MAX: usize = 8;

/// Consecutive reads that make a stream sequential: two, as the kernel's readahead, so a
/// lone read next to another does not start a prefetch.
pub const PREFETCH_TRIGGER_READS: u32 = 2;

/// How far ahead of a sequential reader prefetch reads: 8 MiB covers a disk's ~10 ms of
/// latency at 800 MB/s, so a reader at the backing's own rate never waits for it.
pub const PREFETCH_WINDOW_BYTES: u64 = 8 << 20;

/// Blocks a stream's window may hold however small the block: the prefetch queue is
/// bounded by `STREAMS_MAX * PREFETCH_WINDOW_BLOCKS_MAX` entries.
pub const PREFETCH_WINDOW_BLOCKS_MAX: u64 = 256;

/// Prefetch and hint (NBD_CMD_CACHE) fills in flight at once, in bytes: a prefetch window's
/// worth, so a reader at the backing's own rate never waits (8 fills of 64 KiB, the count
/// this replaced, kept half a megabyte in flight: 30 MB/s from a 60 MB/s disk), and the
/// gateway holds at most this much read-ahead data per volume.
pub const PREFETCH_INFLIGHT_BYTES_MAX: u64 = PREFETCH_WINDOW_BYTES;

/// The most blocks one prefetch or hint read of the backing covers, in bytes: a disk serves
/// one 1 MiB read far sooner than sixteen of 64 KiB (a seek each, or an IOPS budget: at 500
/// IOPS, 64 KiB reads cap a 60 MB/s disk at 32 MB/s), and a demand read behind it waits at
/// most that long.
pub const PREFETCH_RUN_BYTES_MAX: u64 = 1 << 20;

/// Paced fills in flight for a block size: `PREFETCH_INFLIGHT_BYTES_MAX` of them, and at
/// least two, so a volume of 4 MiB blocks still reads ahead while it serves one.
pub const fn paced_fills_max(block_bytes: u64) -> usize {
    let n = PREFETCH_INFLIGHT_BYTES_MAX / block_bytes;
    if n < 2 { 2 } else { n as usize }
}

/// Blocks one paced read of the backing covers, for a block size (at least one).
pub const fn paced_run_blocks(block_bytes: u64) -> u64 {
    let n = PREFETCH_RUN_BYTES_MAX / block_bytes;
    if n < 1 { 1 } else { n }
}

/// Demand reads at the backing past which prefetch and hints wait: the backing is busy
/// serving clients, and read-ahead would only queue in front of their next reads.
pub const PREFETCH_DEMAND_READS_MAX: usize = 16;

/// The first wait before reconnecting a member that failed, as the pool's members: soon
/// enough that a restarted member is back in a second.
pub const MEMBER_RECONNECT_BACKOFF_MIN_MS: u64 = 250;

/// The longest wait between reconnection attempts: a node gone for good is tried twice a
/// minute, cheaply.
pub const MEMBER_RECONNECT_BACKOFF_MAX_MS: u64 = 30_000;

/// A member operation older than this marks the member down, unless the file's
/// `member-timeout` says otherwise: a RAM member answers in microseconds, so seconds mean a
/// dead node or link, and its reads are better served by the backing than waited for.
pub const MEMBER_TIMEOUT_DEFAULT_MS: u64 = 2_000;

/// Trims one member has in flight at once; the slots dropped past them wait in the
/// directory, each sent when one before it is answered. A client's trim or write of a
/// large range drops every slot it covers at once (a discard of the whole volume: all of
/// them), and each trim is a member operation timed from when it is sent: sent all at
/// once, thousands would queue on the member's connections ahead of hits and fills, and
/// the last ones would pass the member timeout however fast the member answers, marking
/// it down. A RAM member answers a trim in microseconds, so a few dozen keep it busy.
pub const MEMBER_TRIMS_INFLIGHT_MAX: usize = 32;

/// Longest `member-timeout`: a read waits this long for a silent member before the backing
/// serves it, and an hour is already far past any reason to wait.
pub const MEMBER_TIMEOUT_MAX_MS: u64 = 3_600_000;

const _: () = assert!(BLOCK_MIN_BYTES.is_power_of_two() && BLOCK_MAX_BYTES.is_power_of_two());
const _: () = assert!(BLOCK_MIN_BYTES <= BLOCK_DEFAULT_BYTES && BLOCK_DEFAULT_BYTES <= BLOCK_MAX_BYTES);
const _: () = assert!(BLOCK_MIN_BYTES.is_multiple_of(PAGE_BYTES));
const _: () = assert!(MEMBER_SLOTS_MAX <= u32::MAX as u64 && MEMBERS_MAX <= u16::MAX as usize);
const _: () = assert!(MEMBER_SLOTS_MAX * (BLOCK_DEFAULT_BYTES / PAGE_BYTES) <= MEMBER_PAGES_MAX);
const _: () = assert!(MEMBER_PAGES_MAX / (BLOCK_MAX_BYTES / PAGE_BYTES) > 0);
const _: () = assert!(PREFETCH_TRIGGER_READS >= 1 && PREFETCH_DEMAND_READS_MAX >= 1);
const _: () = assert!(PREFETCH_RUN_BYTES_MAX <= PREFETCH_INFLIGHT_BYTES_MAX);
const _: () = assert!(MEMBER_RECONNECT_BACKOFF_MIN_MS <= MEMBER_RECONNECT_BACKOFF_MAX_MS);

/// How long to wait before reconnection attempt `failures` (1 for the first) of a member:
/// doubling from the minimum up to the maximum.
pub fn reconnect_backoff_ms(failures: u32) -> u64 {
    let shift = failures.saturating_sub(1).min(20);
    (MEMBER_RECONNECT_BACKOFF_MIN_MS << shift).min(MEMBER_RECONNECT_BACKOFF_MAX_MS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_doubles_up_to_the_maximum() {
        assert_eq!(reconnect_backoff_ms(1), MEMBER_RECONNECT_BACKOFF_MIN_MS);
        assert_eq!(reconnect_backoff_ms(2), 2 * MEMBER_RECONNECT_BACKOFF_MIN_MS);
        assert_eq!(reconnect_backoff_ms(100), MEMBER_RECONNECT_BACKOFF_MAX_MS);
    }

    #[test]
    fn a_member_lends_at_most_a_tebibyte_of_pages_beyond_64k_blocks() {
        assert_eq!(member_slots_max(1), MEMBER_SLOTS_MAX);
        assert_eq!(member_slots_max(BLOCK_DEFAULT_BYTES / PAGE_BYTES), MEMBER_SLOTS_MAX);
        assert_eq!(member_slots_max(BLOCK_MAX_BYTES / PAGE_BYTES) * BLOCK_MAX_BYTES, 1 << 40);
    }
}
