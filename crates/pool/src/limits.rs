//! Every pool constant, with why.

/// md's default chunk: big enough that most requests touch one member, small enough that a
/// stream spreads over all.
pub const STRIPE_UNIT_DEFAULT_BYTES: u64 = 512 << 10;
/// A page: smaller units only add splitting.
pub const STRIPE_UNIT_MIN_BYTES: u64 = 4 << 10;
pub const STRIPE_UNIT_MAX_BYTES: u64 = 64 << 20;
/// The superblock keeps a role per member in one 4 KiB block.
pub const MEMBERS_MAX: usize = 64;

/// Bytes reserved at the start of every member for the pool's metadata: the superblock,
/// then the write-intent bitmap. Data starts right after, 1 MiB aligned.
pub const META_BYTES: u64 = 1 << 20;
/// The unit of metadata writes: each is one block, written whole.
pub const META_BLOCK_BYTES: u64 = 4096;
/// Bitmap blocks: everything after the superblock.
pub const BITMAP_BLOCKS: u64 = META_BYTES / META_BLOCK_BYTES - 1;
pub const BITMAP_BITS_MAX: u64 = BITMAP_BLOCKS * META_BLOCK_BYTES * 8;
/// The smallest write-intent region: "a few MiB", like DRBD's activity-log extents. One
/// metadata write covers every write into the region until it is cleaned.
pub const REGION_MIN_BYTES: u64 = 4 << 20;

/// md and DRBD time a peer out after a few seconds; Linux's nbd waits 30 s, TCP hours.
pub const MEMBER_TIMEOUT_DEFAULT_MS: u64 = 5_000;
/// A member missing this long is replaced by a spare: longer than a reboot or a network
/// blip takes (those come back and resync only dirty regions), short enough that the pool
/// is not left without redundancy for long (md takes a spare at once).
pub const SPARE_AFTER_DEFAULT_MS: u64 = 60_000;
/// Background resync stays below this, so that it does not starve the volume's users.
pub const RESYNC_RATE_DEFAULT_BYTES_PER_S: u64 = 128 << 20;
/// A resync copies this much per step, with writes to the range held back meanwhile.
pub const RESYNC_CHUNK_BYTES: u64 = 1 << 20;
/// Byte ranges a scrub report keeps: enough to find a few damaged spots, bounded when a
/// whole member is garbage (the region count stays exact).
pub const SCRUB_RANGES_MAX: usize = 256;
/// Resync steps in flight together (and scrub steps, separately).
pub const RESYNC_STEPS_MAX: usize = 4;
/// Reshape unit copies in flight together (each holds one stripe unit in memory).
pub const RESHAPE_STEPS_MAX: usize = 8;
/// How far past the checkpoint units may be claimed: requests on claimed units wait, and a
/// pause gives them back.
pub const RESHAPE_WINDOW_UNITS: u64 = 64;
/// Zeroing the space a reshape grows into goes in pieces this big (NBD lengths are 32-bit).
pub const RESHAPE_ZERO_CHUNK_BYTES: u64 = 1 << 30;
/// A dirty region is cleaned once no write has touched it for this long (md: seconds).
pub const CLEAN_DELAY_MS: u64 = 2_000;
/// The coordinator proves it is alive this often by writing its superblock.
pub const HEARTBEAT_MS: u64 = 1_000;
/// A second coordinator waits this long for a live one's heartbeat before taking over.
pub const LEASE_MS: u64 = 3 * HEARTBEAT_MS;
/// A superblock that fails its checksum is read again this many times before it is called
/// damaged: a live coordinator rewrites it every heartbeat, and a read that races the write
/// on the member's server can return half of each (buffered reads and splice do not wait for
/// a write to the same page).
pub const SUPERBLOCK_REREADS: u32 = 5;
/// Between those reads: far longer than one 4 KiB write takes, far shorter than a heartbeat.
pub const SUPERBLOCK_REREAD_DELAY_MS: u64 = 20;

const _: () = assert!(SUPERBLOCK_REREADS as u64 * SUPERBLOCK_REREAD_DELAY_MS < HEARTBEAT_MS);
const _: () = assert!(STRIPE_UNIT_DEFAULT_BYTES.is_power_of_two() && STRIPE_UNIT_MIN_BYTES.is_power_of_two());
const _: () = assert!(META_BYTES.is_multiple_of(META_BLOCK_BYTES) && META_BYTES.is_multiple_of(STRIPE_UNIT_MIN_BYTES));
const _: () = assert!(REGION_MIN_BYTES.is_multiple_of(RESYNC_CHUNK_BYTES));
const _: () = assert!(LEASE_MS > 2 * HEARTBEAT_MS);
const _: () = assert!(RESHAPE_STEPS_MAX as u64 <= RESHAPE_WINDOW_UNITS);
