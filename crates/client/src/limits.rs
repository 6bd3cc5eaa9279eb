//! Bounds the client puts on what a server controls, and its defaults. Units last.

/// Largest READ or WRITE the client sends when the server names no maximum: the spec's
/// default, which every server accepts.
pub const REQUEST_DEFAULT_MAX_BYTES: u32 = 32 * 1024 * 1024;

/// Largest TRIM, WRITE_ZEROES, CACHE or BLOCK_STATUS length sent in one request; a larger
/// range is split. A power of two, so it stays aligned to any minimum block size.
pub const RANGE_REQUEST_MAX_BYTES: u32 = 1 << 30;

/// Largest payload of a non-data, non-block-status reply chunk (errors, holes, NONE). A
/// server claiming more is refused instead of believed.
pub const CHUNK_PAYLOAD_MAX_BYTES: u32 = 1 << 20;

/// Largest BLOCK_STATUS chunk: 2^21 extents. qemu-nbd sends up to 2^17 (1 MiB of
/// descriptors) and the spec sets no limit, so this leaves room while bounding memory.
pub const BLOCK_STATUS_PAYLOAD_MAX_BYTES: u32 = 4 + 8 * (1 << 21);

/// Separate byte ranges a read's reply may arrive in before the client gives up. Chunks
/// that touch are merged, so a server sending whole chunks in any order stays far below.
pub const COVERED_RANGES_MAX: usize = 4096;

/// Exports NBD_OPT_LIST may name, and the bytes of names and descriptions together.
pub const LIST_ENTRIES_MAX: usize = 16384;
pub const LIST_BYTES_MAX: usize = 16 << 20;

/// Largest option reply payload read during the handshake.
pub const OPTION_REPLY_MAX_BYTES: u32 = 64 * 1024;

/// Option replies accepted for one option other than NBD_OPT_LIST.
pub const OPTION_REPLIES_MAX: usize = 1024;

/// Default connections for multi-conn when the caller asks for "as many as useful".
pub const CONNECTIONS_DEFAULT: usize = 4;

/// Connections one client opens at most.
pub const CONNECTIONS_MAX: usize = 64;

/// Time allowed to connect and finish the handshake.
pub const CONNECT_TIMEOUT_MS: u64 = 10_000;

/// How often an attached device's guardian looks at the device and its sockets without a
/// link-dead notice (a backstop: a notice can be lost when the socket's buffer is full).
pub const ATTACH_CHECK_INTERVAL_MS: u64 = 1_000;
/// The guardian's reconnection backoff: the first retry comes soon (a restart takes
/// seconds), then the delay doubles up to the most, so a long outage costs the server
/// little and a returning one waits at most this long.
pub const ATTACH_BACKOFF_FIRST_MS: u64 = 250;
pub const ATTACH_BACKOFF_MAX_MS: u64 = 5_000;

/// Reconnecting (`Reconnect::default()`): a server restarting takes a moment, so the first
/// attempt waits a little; then the waits double up to the cap, so that a server that
/// stays away is not hammered; after a minute, about what a caller waits for a disk before
/// calling it failed, the client gives up.
pub const RECONNECT_INITIAL_DELAY_MS: u64 = 100;
pub const RECONNECT_MAX_DELAY_MS: u64 = 10_000;
pub const RECONNECT_GIVE_UP_AFTER_MS: u64 = 60_000;

/// Times one request is sent before it fails with `Error::Disconnected`. Each try after
/// the first needs a connection re-established, so this only stops a request that makes
/// the server drop it, or one caught in a server that keeps accepting and dropping.
pub const REQUEST_ATTEMPTS_MAX: u32 = 8;

/// Buffered bytes between the socket and the reply parser: one receive brings in many
/// small replies (15 of 4 KiB), and a large read's data comes straight from the socket
/// after what the buffer already holds (`DATA_DIRECT_MIN_BYTES`), so that part, copied
/// twice, is at most this much. Against 256 KiB, on the 2-core machine (2026-11-27, a proxy
/// of a file export, interleaved): 1M QD8 reads 1.03-1.24x the rate at 0.82-0.95x the
/// gateway's CPU per GiB, 4K QD32 and QD1 the same within their noise.
pub const READ_BUFFER_BYTES: usize = 64 * 1024;

/// The largest buffer of queued request headers a connection keeps for its next burst
/// (128 extended headers): one rare larger burst does not hold its memory for the
/// connection's life.
pub const QUEUE_KEPT_BYTES_MAX: usize = 4096;

/// A read's data that has at least this much left to come once the buffered bytes are
/// taken is received straight into the request's buffer (`replies::read_data`): large
/// enough that the receive it costs is small beside the copy it saves, small enough that
/// a 1 MiB reply's tail skips the buffer. Measured the same way: 1M QD8 through a proxy
/// 1.04-1.12x the rate at 0.85-0.91x the gateway's CPU per GiB than all through the buffer.
pub const DATA_DIRECT_MIN_BYTES: usize = 64 * 1024;

/// Connections a pool opens to each member that allows multi-conn, at least: the pool's
/// requests to one member come from every caller at once.
pub const POOL_MEMBER_CONNECTIONS: usize = CONNECTIONS_DEFAULT;

/// A dropped member is retried after this long at first, then twice as long each time up to
/// the maximum: quick to notice a restart, cheap while a member stays down.
pub const POOL_RECONNECT_FIRST_MS: u64 = 100;
pub const POOL_RECONNECT_MAX_MS: u64 = 2_000;

/// Zeros written per request where a member lacks WRITE_ZEROES: one shared buffer, a
/// request's worth of work.
pub const POOL_ZERO_CHUNK_BYTES: usize = 1 << 20;

/// A pool's clean stop waits for what is in flight, which the member timeout bounds, and
/// for the superblocks to be released; this much more, then it gives up (the next
/// assembly then waits out the lease).
pub const POOL_STOP_MARGIN_MS: u64 = 2_000;

/// The pool's block sizes as it advertises them: sector-sized writes are fine on every
/// member sluice knows, a page is the size worth sending, and the maximum is the request
/// size every server accepts.
pub const POOL_BLOCK_MIN_BYTES: u32 = 512;
pub const POOL_BLOCK_PREFERRED_BYTES: u32 = 4096;
pub const POOL_BLOCK_MAX_BYTES: u32 = REQUEST_DEFAULT_MAX_BYTES;

const _: () = assert!(RANGE_REQUEST_MAX_BYTES.is_power_of_two());
const _: () = assert!(POOL_RECONNECT_FIRST_MS <= POOL_RECONNECT_MAX_MS);
const _: () = assert!(ATTACH_BACKOFF_FIRST_MS <= ATTACH_BACKOFF_MAX_MS && ATTACH_CHECK_INTERVAL_MS < ATTACH_BACKOFF_MAX_MS);
const _: () = assert!(POOL_BLOCK_MIN_BYTES.is_power_of_two() && POOL_BLOCK_PREFERRED_BYTES.is_multiple_of(POOL_BLOCK_MIN_BYTES));
const _: () = assert!(CHUNK_PAYLOAD_MAX_BYTES >= OPTION_REPLY_MAX_BYTES);
const _: () = assert!(RECONNECT_INITIAL_DELAY_MS <= RECONNECT_MAX_DELAY_MS);
const _: () = assert!(RECONNECT_MAX_DELAY_MS <= RECONNECT_GIVE_UP_AFTER_MS);
const _: () = assert!(REQUEST_ATTEMPTS_MAX >= 2);

/// A pool's control socket: the longest request line a peer may send (the longest one is a
/// repair naming its source URI), and how long it has to send it.
pub const POOL_CONTROL_LINE_MAX_BYTES: u64 = 4096;
pub const POOL_CONTROL_REQUEST_TIMEOUT_MS: u64 = 5_000;
/// How often a scrub's progress goes out on the control socket.
pub const POOL_CONTROL_PROGRESS_MS: u64 = 500;
/// The longest reply line `sluice pool check` accepts from a coordinator (a report with
/// every range it keeps fits many times over).
pub const POOL_CONTROL_REPLY_MAX_BYTES: u64 = 1 << 20;

/// Read buffers of the client's own choosing (a pool member's read, `read_pieces`) kept
/// for reuse once their bytes are used (`read_buffers`): at most this many bytes of them
/// in the process. Buffers wait there only between one read's end and the next one's
/// start, so this is enough for 1 MiB reads at QD8 through a pool (2-core machine,
/// 2026-11-27: 4 MiB as fast as 8), and what an idle process keeps stays small.
pub const READ_BUFFERS_KEPT_BYTES_MAX: usize = 4 << 20;

/// Smaller read buffers are not kept: the allocator hands those out from its own caches,
/// and zeroing them is cheap next to a request's other costs.
pub const READ_BUFFER_KEPT_MIN_BYTES: usize = 64 * 1024;

const _: () = assert!(READ_BUFFER_KEPT_MIN_BYTES <= READ_BUFFERS_KEPT_BYTES_MAX);
