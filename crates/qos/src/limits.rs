//! Every limit and tuning constant of the QoS scheduler, named once with its unit last and
//! the reason for its value. Relations between them are asserted at compile time.

/// Nanoseconds in a second: rates are per second, time is in nanoseconds.
pub const NANOS_PER_SEC: u64 = 1_000_000_000;

/// Seconds of its limit a class may spend at once unless it says otherwise (`burst`), as
/// nbdkit's rate filter and qemu's throttling default to: a client that was idle may catch
/// up by one second's worth, no more.
pub const BURST_DEFAULT_NS: u64 = NANOS_PER_SEC;

/// The longest `burst` accepted: an hour of a limit spent at once is no limit at all, and
/// keeping it bounded keeps `rate * burst` far inside the buckets' integers.
pub const BURST_MAX_NS: u64 = 3_600 * NANOS_PER_SEC;

/// The burst of the server-wide storage limits (`[limits] storage-bps`, `storage-iops`):
/// the node's own jobs should see the cap within a second, as with a class's default.
pub const STORAGE_BURST_NS: u64 = NANOS_PER_SEC;

/// A class's share when it names none (`weight`), as in cgroups' io.weight.
pub const WEIGHT_DEFAULT: u32 = 100;

/// The largest weight: io.weight's range (1..=10000). A ratio of 10,000 to 1 between two
/// classes is already more than anyone can measure on a disk.
pub const WEIGHT_MAX: u32 = 10_000;

/// The largest rate a limit or reservation may name, in operations or bytes per second:
/// 2^50 (a petabyte per second) is beyond any node, and it keeps `rate * burst` (at most
/// 2^50 * 2^42 ns) inside the buckets' i128 arithmetic with room to spare.
pub const RATE_MAX_PER_SEC: u64 = 1 << 50;

/// What one request costs in the weights' currency: one operation plus its bytes counted
/// in operations of this size, when the server-wide limits do not say otherwise (with
/// both `storage-bps` and `storage-iops` set, their ratio is the size). The size at which
/// a device spends as long moving a request's bytes as on the operation itself is about
/// 8 KiB for flash and about 1 MiB for a disk; 64 KiB lies between them (in log scale),
/// so a 1 MiB request costs 17 and a 4 KiB one about 1.06.
pub const COST_BYTES_PER_OP_DEFAULT: u64 = 64 * 1024;

/// The fixed-point scale of a request's cost: one operation is this many cost units, so
/// the bytes' part (a 4 KiB read in 64 KiB operations is 1/16) keeps its precision.
pub const COST_UNITS_PER_OP: u64 = 1 << 16;

/// The fixed-point scale of the weight tags: a tag advances by `cost * TAG_SCALE / weight`,
/// rounded up. With costs of at least 2^16 units the rounding is below 2^-48 of a step,
/// so shares do not drift over any run.
pub const TAG_SCALE: u128 = 1 << 32;

/// Class instances kept after their last connection closed, until their buckets fill up
/// again (so that reconnecting does not reset a limit). A peer that churns through client
/// addresses would otherwise make the scheduler hold an instance per address for up to the
/// longest burst; past this many, the oldest is forgotten (about 200 bytes each: under a
/// MiB in all).
pub const LINGERING_INSTANCES_MAX: usize = 4096;

/// Lingering instances looked at (and forgotten if rested) per `attach`: a few, so that
/// an attach costs little however many linger, and more than one, so that they are
/// looked at faster than connections can add them.
pub const LINGERING_SWEEP_COUNT: usize = 4;

const _: () = assert!(LINGERING_SWEEP_COUNT > 1 && LINGERING_SWEEP_COUNT <= LINGERING_INSTANCES_MAX);
const _: () = assert!(WEIGHT_DEFAULT >= 1 && WEIGHT_DEFAULT <= WEIGHT_MAX);
const _: () = assert!(BURST_DEFAULT_NS <= BURST_MAX_NS && STORAGE_BURST_NS <= BURST_MAX_NS);
// Tokens are kept in units times nanoseconds-per-second; the largest bucket must fit an i128
// with room for a debt of the largest request.
const _: () = assert!((RATE_MAX_PER_SEC as u128) * (BURST_MAX_NS as u128) < (1u128 << 100));
const _: () = assert!(COST_UNITS_PER_OP >= 1 << 16 && COST_BYTES_PER_OP_DEFAULT > 0);
