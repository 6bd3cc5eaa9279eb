//! How a client connects, and whether and how it re-establishes a connection that drops.

use crate::limits::*;
use std::time::Duration;

/// How to connect.
#[derive(Clone, Debug)]
pub struct Options {
    /// Connections to open. More than one is used only when the server advertises
    /// CAN_MULTI_CONN (otherwise their caches could disagree); the rest are not opened.
    pub connections: usize,
    /// Ask for structured replies (needed for block status and chunked reads).
    pub structured: bool,
    /// Ask for extended headers first (64-bit lengths for everything but READ and WRITE),
    /// falling back to structured replies when the server refuses them. Only asked for
    /// together with `structured`.
    pub extended: bool,
    /// Ask for base:allocation, so `block_status` can report holes.
    pub block_status: bool,
    /// Time allowed to connect and finish the handshake, per connection.
    pub connect_timeout: Duration,
    /// Re-establish a connection that drops, and resend the requests it cut off. `None`
    /// (the default): a dropped connection stays down and its requests fail.
    pub reconnect: Option<Reconnect>,
    /// For a `pool:` URI: assemble a redundant pool even when members cannot be reached,
    /// as long as every set keeps an in-sync copy; the missing ones are tried again in the
    /// background and rebuilt when they answer. Only for members known to hold nothing
    /// newer than the others (mdadm's `--run`).
    pub degraded: bool,
}

impl Default for Options {
    fn default() -> Options {
        Options {
            connections: 1,
            structured: true,
            extended: true,
            block_status: true,
            connect_timeout: Duration::from_millis(CONNECT_TIMEOUT_MS),
            reconnect: None,
            degraded: false,
        }
    }
}

/// When a connection drops (an I/O error, the server closing it, or the server saying it
/// is shutting down), try again to connect: first after `initial_delay`, then after twice
/// as long each time, but never more than `max_delay`, until `give_up_after` has passed
/// since the drop. Each attempt must find the same export (size, flags, block sizes).
///
/// Requests cut off by the drop are sent again on the new connection, except a flush,
/// which fails with `Error::DurabilityLost`. Requests made meanwhile wait. Once the
/// client gives up, they fail with `Error::Disconnected`, and so does every later one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reconnect {
    /// The wait before the first attempt. Zero tries at once.
    pub initial_delay: Duration,
    /// The longest wait between two attempts.
    pub max_delay: Duration,
    /// How long after the drop the client stops trying and gives the connection up.
    pub give_up_after: Duration,
}

impl Default for Reconnect {
    fn default() -> Reconnect {
        Reconnect {
            initial_delay: Duration::from_millis(RECONNECT_INITIAL_DELAY_MS),
            max_delay: Duration::from_millis(RECONNECT_MAX_DELAY_MS),
            give_up_after: Duration::from_millis(RECONNECT_GIVE_UP_AFTER_MS),
        }
    }
}

impl Reconnect {
    /// The wait after one of `delay`: twice as long, up to the cap.
    pub(crate) fn next_delay(&self, delay: Duration) -> Duration {
        delay.saturating_mul(2).min(self.max_delay)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap() {
        let r = Reconnect { initial_delay: Duration::from_millis(100), max_delay: Duration::from_millis(350), ..Reconnect::default() };
        let waits: Vec<_> = std::iter::successors(Some(r.initial_delay), |&d| Some(r.next_delay(d))).take(4).collect();
        assert_eq!(waits, [100, 200, 350, 350].map(Duration::from_millis));
        assert_eq!(Options::default().reconnect, None);
    }
}
