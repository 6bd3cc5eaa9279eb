//! How a client connects.

use crate::limits::CONNECT_TIMEOUT_MS;
use std::time::Duration;

/// How to connect.
#[derive(Clone, Debug)]
pub struct Options {
    /// Connections to open. More than one is used only when the server advertises
    /// CAN_MULTI_CONN (otherwise their caches could disagree); the rest are not opened.
    pub connections: usize,
    /// Ask for structured replies (needed for block status and chunked reads).
    pub structured: bool,
    /// Ask for base:allocation, so `block_status` can report holes.
    pub block_status: bool,
    /// Time allowed to connect and finish the handshake, per connection.
    pub connect_timeout: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            connections: 1,
            structured: true,
            block_status: true,
            connect_timeout: Duration::from_millis(CONNECT_TIMEOUT_MS),
        }
    }
}
