//! Every limit sluice applies to what a peer controls, named once, with units last.
//! The server's configurable budgets take these as defaults.

/// Longest name or description string the spec lets either side send.
pub const STRING_MAX_BYTES: usize = 4096;

/// Largest option payload we read. The biggest legitimate option is SET_META_CONTEXT with a
/// few queries, each at most STRING_MAX_BYTES; anything larger is refused with ERR_TOO_BIG.
pub const OPTION_DATA_MAX_BYTES: u32 = 64 * 1024;

/// Options one client may send before transmission; ends clients that haggle forever.
pub const OPTIONS_PER_HANDSHAKE_MAX: u32 = 4096;

/// Metadata-context queries accepted in one LIST/SET_META_CONTEXT.
pub const META_QUERIES_MAX: u32 = 128;

/// Largest READ or WRITE payload. 32 MiB is what qemu and nbdkit advertise and what the
/// kernel client never exceeds; it bounds one request's buffer.
pub const REQUEST_PAYLOAD_MAX_BYTES: u32 = 32 * 1024 * 1024;

/// Block size we tell clients to prefer: the page size, so O_DIRECT and the page cache
/// both see whole pages.
pub const BLOCK_PREFERRED_BYTES: u32 = 4096;

/// Extents in one BLOCK_STATUS reply; bounds reply size for a huge, fragmented range.
pub const EXTENTS_PER_REPLY_MAX: usize = 1024;

/// Time a client has to finish the handshake before we drop it.
pub const HANDSHAKE_TIMEOUT_MS: u64 = 10_000;

/// Requests one connection may have in flight; more stay unread in the socket.
pub const INFLIGHT_REQUESTS_PER_CONNECTION_MAX: usize = 64;

/// Payload bytes one connection may have in flight; at least one maximal request must fit.
pub const INFLIGHT_BYTES_PER_CONNECTION_MAX: usize = 64 * 1024 * 1024;

/// Concurrent client connections, handshaking or transmitting, across the server.
pub const CONNECTIONS_MAX: usize = 1024;

const _: () = assert!(INFLIGHT_BYTES_PER_CONNECTION_MAX >= REQUEST_PAYLOAD_MAX_BYTES as usize);
const _: () = assert!((OPTION_DATA_MAX_BYTES as usize) >= 8 + 2 * STRING_MAX_BYTES);
const _: () = assert!(REQUEST_PAYLOAD_MAX_BYTES.is_multiple_of(BLOCK_PREFERRED_BYTES));
