//! Who this coordinator is (written into the superblocks as their owner) and fresh pool
//! ids. Neither needs to be secret, only different from any other: std's randomly keyed
//! hasher over the clock, the pid and a counter gives that without a dependency.

use sluice_pool::Session;
use std::hash::{BuildHasher, Hasher};
use std::sync::atomic::{AtomicU64, Ordering};

/// A random u64 (not for secrets).
pub(crate) fn random_u64() -> u64 {
    static CALLS: AtomicU64 = AtomicU64::new(0);
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    h.write_u128(now.as_nanos());
    h.write_u32(std::process::id());
    h.write_u64(CALLS.fetch_add(1, Ordering::Relaxed));
    h.finish()
}

/// This process as a pool's coordinator.
pub(crate) fn session() -> Session {
    let id = std::iter::repeat_with(random_u64).find(|&v| v != 0).unwrap_or(1);
    Session { id, pid: std::process::id(), host: host_name() }
}

/// A new pool's id.
pub(crate) fn pool_id() -> [u8; 16] {
    let mut id = [0u8; 16];
    id[..8].copy_from_slice(&random_u64().to_le_bytes());
    id[8..].copy_from_slice(&random_u64().to_le_bytes());
    id
}

/// The host name, as users see it in "pool is being served by HOST".
pub(crate) fn host_name() -> String {
    let name = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
    match name.trim() {
        "" => "unknown-host".to_string(),
        n => n.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sessions_differ_and_name_this_process() {
        let (a, b) = (session(), session());
        assert!(a.id != 0 && b.id != 0 && a.id != b.id);
        assert_eq!(a.pid, std::process::id());
        assert!(!a.host.is_empty());
        assert_ne!(pool_id(), pool_id());
    }
}
