//! The budgets an operator may change (config file `[limits]`). Defaults and the reasons
//! for them live with the protocol limits in `sluice_proto::limits`.

use serde::Deserialize;
use sluice_proto::limits as l;

#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Limits {
    pub inflight_requests_per_connection: usize,
    pub inflight_bytes_per_connection: usize,
    /// Payload bytes all connections of one worker thread may hold; bounds server memory.
    pub inflight_bytes_per_worker: usize,
    pub connections: usize,
    pub handshake_timeout_ms: u64,
    /// Registered buffer region per worker thread.
    pub buffer_pool_bytes_per_worker: usize,
}

/// Registered memory per worker: two maximal requests, or 64 requests of 1 MiB, so common
/// queue depths never touch the heap fallback. Registration pins this much RAM per thread.
pub const BUFFER_POOL_BYTES_PER_WORKER: usize = 2 * l::REQUEST_PAYLOAD_MAX_BYTES as usize;

/// Payload bytes one worker's connections may hold together: four connections' full
/// budgets. With the per-connection cap, four stalled clients are needed to make others wait.
pub const INFLIGHT_BYTES_PER_WORKER: usize = 4 * l::INFLIGHT_BYTES_PER_CONNECTION_MAX;

/// Capacity asked for each splice pipe, which bounds the chunk of a spliced read. 1 MiB is
/// the default pipe-max-size, so unprivileged servers get it too.
pub const PIPE_BYTES: usize = 1024 * 1024;

/// Pipes one worker may have in use; beyond that, reads are copied. Each pipe is two file
/// descriptors, and the byte budget already bounds the data they hold.
pub const PIPES_PER_WORKER_MAX: usize = 128;

/// Submission queue entries per ring; completions get twice as many by io_uring's default.
pub const RING_ENTRIES: u32 = 1024;

/// Time given to in-flight requests to finish after SIGINT/SIGTERM before exiting anyway.
pub const SHUTDOWN_DRAIN_TIMEOUT_MS: u64 = 5_000;

const _: () = assert!(BUFFER_POOL_BYTES_PER_WORKER >= l::REQUEST_PAYLOAD_MAX_BYTES as usize);

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            inflight_requests_per_connection: l::INFLIGHT_REQUESTS_PER_CONNECTION_MAX,
            inflight_bytes_per_connection: l::INFLIGHT_BYTES_PER_CONNECTION_MAX,
            inflight_bytes_per_worker: INFLIGHT_BYTES_PER_WORKER,
            connections: l::CONNECTIONS_MAX,
            handshake_timeout_ms: l::HANDSHAKE_TIMEOUT_MS,
            buffer_pool_bytes_per_worker: BUFFER_POOL_BYTES_PER_WORKER,
        }
    }
}

impl Limits {
    /// Refuses settings that would break an invariant the code relies on.
    pub fn check(&self) -> Result<(), String> {
        if self.inflight_requests_per_connection == 0 || self.inflight_requests_per_connection > u16::MAX as usize {
            return Err("inflight-requests-per-connection must be between 1 and 65535".into());
        }
        if self.inflight_bytes_per_connection < l::REQUEST_PAYLOAD_MAX_BYTES as usize {
            return Err(format!(
                "inflight-bytes-per-connection must be at least {} (one maximal request)",
                l::REQUEST_PAYLOAD_MAX_BYTES
            ));
        }
        if self.inflight_bytes_per_worker < self.inflight_bytes_per_connection {
            return Err("inflight-bytes-per-worker must be at least inflight-bytes-per-connection".into());
        }
        if self.connections == 0 {
            return Err("connections must be at least 1".into());
        }
        if self.buffer_pool_bytes_per_worker < l::REQUEST_PAYLOAD_MAX_BYTES as usize {
            return Err(format!("buffer-pool-bytes-per-worker must be at least {}", l::REQUEST_PAYLOAD_MAX_BYTES));
        }
        Ok(())
    }
}
