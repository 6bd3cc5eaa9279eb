//! Limits of the protocol as sluice speaks it, on both sides, named once with units last:
//! how much a peer may send in the handshake and in one request. The server's own budgets
//! (connections, requests in flight, timeouts) live in the server crate.

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

const _: () = assert!((OPTION_DATA_MAX_BYTES as usize) >= 8 + 2 * STRING_MAX_BYTES);
