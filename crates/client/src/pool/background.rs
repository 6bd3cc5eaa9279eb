//! A pool's background work: the timer that calls `tick` when the coordinator asks (member
//! time-outs, heartbeats, cleaning, resync pacing), and reconnecting dropped members with
//! backoff. Both hold the pool weakly, so they end when it goes.

use super::found::read_found;
use super::member::Member;
use super::pump::{Shared, Wake};
use crate::limits::{POOL_RECONNECT_FIRST_MS, POOL_RECONNECT_MAX_MS};
use std::sync::Weak;
use std::time::Duration;
use tokio::sync::mpsc;

/// Sleeps until the coordinator's next wake-up, re-armed whenever it changes, and starts a
/// reconnect loop for each member the pump drops. Ends when the pool is dropped.
pub(crate) async fn supervise<M: Member>(pool: Weak<Shared<M>>, mut woken: mpsc::UnboundedReceiver<Wake>) {
    loop {
        let Some(deadline) = pool.upgrade().map(|s| s.arm()) else { return };
        let wake = match deadline {
            Some(at) => tokio::select! {
                _ = tokio::time::sleep_until(at) => None,
                w = woken.recv() => Some(w),
            },
            None => Some(woken.recv().await),
        };
        match wake {
            None => {
                if let Some(s) = pool.upgrade() {
                    s.run(|core, now| core.coord.tick(now));
                }
            }
            // Every sender is gone: so is the pool.
            Some(None) => return,
            Some(Some(Wake::Timer)) => {}
            Some(Some(Wake::Reconnect(member))) => {
                tokio::spawn(reconnect(pool.clone(), member));
            }
        }
    }
}

/// Tries the member again and again, waiting longer each time, until it answers and its
/// metadata can be read; then hands it back to the coordinator.
async fn reconnect<M: Member>(pool: Weak<Shared<M>>, member: usize) {
    let mut delay_ms = POOL_RECONNECT_FIRST_MS;
    loop {
        tokio::time::sleep(Duration::from_millis(delay_ms)).await;
        let Some(s) = pool.upgrade().filter(|s| !s.look(|core| core.closed)) else { return };
        // A replacement's shadow slot is gone once it took its member's place.
        let Some(uri) = s.look(|core| core.uris.get(member).cloned()) else { return };
        let options = s.options.clone();
        drop(s);
        let attempt = async {
            let m = M::connect(&uri, &options).await?;
            let found = read_found(&m).await?;
            Ok::<_, crate::error::Error>((m, found))
        };
        match attempt.await {
            Ok((m, found)) => {
                let Some(s) = pool.upgrade() else { return };
                if s.member_back(member, &uri, m, found) {
                    log::info!("pool member {uri} answers again");
                    return;
                }
                // Replaced while this attempt ran: the new address is tried next.
                delay_ms = POOL_RECONNECT_FIRST_MS;
            }
            Err(e) => {
                log::debug!("pool member {uri} still does not answer: {e}");
                delay_ms = (delay_ms * 2).min(POOL_RECONNECT_MAX_MS);
            }
        }
    }
}
