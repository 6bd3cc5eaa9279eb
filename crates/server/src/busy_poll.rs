//! How long a worker spins on its ring before it sleeps. A sleeping worker is woken by an
//! interrupt to its CPU, which costs tens of microseconds when that CPU is idle (in a VM, a
//! halted vCPU): at one request in flight that is most of the request's time. Spinning a
//! little catches the next request without it; spinning when nothing comes burns a CPU the
//! node's own jobs could use. So the budget adapts: it stays at its maximum while spins
//! catch work or idle gaps (spin and sleep together) are no longer than the maximum, so
//! traffic is dense; it halves after each longer gap, which a spin could not have caught
//! (a disk read that takes longer than the spin, a client that pauses), and reaches zero
//! when traffic stops, so a server at rest spins once, for at most the maximum, and then
//! sleeps until something arrives.
//!
//! A worker's waits are told apart by what they are for (`Waits`): its storage, its clients
//! after small replies, and its clients after bulk replies. The first two keep budgets of
//! their own (a cold disk read outlasts any useful spin; a client often asks again within
//! one), as one budget would swing between them. The third never spins. Bulk means that
//! since the worker last heard from any of its clients it has handed them more than one
//! client can take in during the longest spin: a client reading one request at a time asks
//! again only once it has taken in its reply, after the spin would have ended, and one
//! with more in flight keeps its socket busy meanwhile, so no wake-up is felt. Spinning
//! there, with a small wait caught in between putting the budget back in full each time,
//! cost 1M reads a quarter to a third of the server's CPU at one in flight and at eight,
//! for no rate. The count is the worker's, not each client's. A client asking 4K at a time
//! beside a 1M reader on one worker did not pay for it (measured: 20-22 µs a request, 21-25
//! with the spin): the bulk reader's completions keep waking the worker anyway.

use std::time::Duration;

use crate::limits::{BUSY_POLL_MIN_NS, CLIENT_TAKE_IN_BYTES_PER_US};

/// The spin budgets of one worker, by what its next wait is for.
pub struct Waits {
    storage: BusyPoll,
    client: BusyPoll,
    /// Zero: a wait after bulk replies sleeps at once.
    after_bulk: BusyPoll,
    /// Reply bytes from which a client cannot have asked again within the longest spin.
    bulk_bytes: usize,
    /// Reply bytes handed to clients since anything was last received from one.
    sent_since_recv: usize,
}

impl Waits {
    pub fn new(max: Duration) -> Waits {
        let take_in = max.as_micros().saturating_mul(u128::from(CLIENT_TAKE_IN_BYTES_PER_US));
        Waits {
            storage: BusyPoll::new(max),
            client: BusyPoll::new(max),
            after_bulk: BusyPoll::new(Duration::ZERO),
            bulk_bytes: usize::try_from(take_in).unwrap_or(usize::MAX),
            sent_since_recv: 0,
        }
    }

    /// A receive from a client completed: the next wait is for whatever that client does
    /// next, whatever it was sent before.
    pub fn received(&mut self) {
        self.sent_since_recv = 0;
    }

    /// `bytes` left for a client.
    pub fn sent(&mut self, bytes: usize) {
        self.sent_since_recv = self.sent_since_recv.saturating_add(bytes);
    }

    /// The budget for a wait, with or without storage operations in flight.
    pub fn next(&mut self, storage_in_flight: bool) -> &mut BusyPoll {
        if storage_in_flight {
            &mut self.storage
        } else if self.sent_since_recv >= self.bulk_bytes {
            &mut self.after_bulk
        } else {
            &mut self.client
        }
    }
}

pub struct BusyPoll {
    max: Duration,
    budget: Duration,
}

impl BusyPoll {
    /// `max` zero never spins.
    pub fn new(max: Duration) -> BusyPoll {
        BusyPoll { max, budget: max }
    }

    /// How long to spin before the next sleep; zero: sleep at once.
    pub fn budget(&self) -> Duration {
        self.budget
    }

    /// The spin caught work before its budget ran out.
    pub fn caught(&mut self) {
        self.budget = self.max;
    }

    /// The spin caught nothing, and the worker was idle for `gap` in all, spinning and
    /// sleeping. A gap no longer than the maximum spin means work comes close together:
    /// spin in full. A longer one could not have been caught: halve the spin.
    pub fn slept(&mut self, gap: Duration) {
        if gap <= self.max {
            self.budget = self.max;
        } else {
            self.budget /= 2;
            if self.budget < Duration::from_nanos(BUSY_POLL_MIN_NS) {
                self.budget = Duration::ZERO;
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const US: Duration = Duration::from_micros(1);

    #[test]
    fn waits_after_bulk_replies_sleep_and_those_after_small_ones_still_spin() {
        // One connection reading 1M at a time and one reading 4K at a time, on one worker.
        let mut w = Waits::new(50 * US);
        for _ in 0..20 {
            w.received();
            w.sent(1 << 20);
            assert_eq!(w.next(false).budget(), Duration::ZERO, "after a 1M reply: sleep at once");
            w.next(false).slept(300 * US);
            w.received();
            w.sent(4096);
            assert_eq!(w.next(false).budget(), 50 * US, "after a 4K reply: spin in full");
            w.next(false).caught();
        }
        w.next(true).slept(Duration::from_secs(1));
        w.received();
        assert_eq!(w.next(false).budget(), 50 * US, "a slow disk read leaves the client's budget alone");
        assert_eq!(w.next(true).budget(), 25 * US);
    }

    #[test]
    fn bulk_is_more_than_a_client_takes_in_during_the_longest_spin() {
        let max = 50 * US;
        let mut w = Waits::new(max);
        let line = 50 * CLIENT_TAKE_IN_BYTES_PER_US as usize;
        w.sent(line - 1);
        assert_eq!(w.next(false).budget(), max, "a byte short of the line: the client's budget");
        w.sent(1);
        assert_eq!(w.next(false).budget(), Duration::ZERO, "at the line: no spin");
        assert_eq!(w.next(true).budget(), max, "storage in flight: the storage's budget");
        w.received();
        assert_eq!(w.next(false).budget(), max, "a request came: the next wait is the client's again");
    }

    #[test]
    fn zero_never_spins() {
        let mut p = BusyPoll::new(Duration::ZERO);
        assert_eq!(p.budget(), Duration::ZERO);
        p.slept(Duration::ZERO);
        p.caught();
        assert_eq!(p.budget(), Duration::ZERO);
    }

    #[test]
    fn spins_in_full_while_spins_catch_work() {
        let mut p = BusyPoll::new(50 * US);
        for _ in 0..10 {
            p.caught();
            assert_eq!(p.budget(), 50 * US);
        }
    }

    #[test]
    fn long_sleeps_wind_the_spin_down_to_nothing_and_short_ones_restore_it() {
        let mut p = BusyPoll::new(64 * US);
        let mut spun = Duration::ZERO;
        for _ in 0..20 {
            spun += p.budget();
            p.slept(Duration::from_secs(1));
        }
        assert_eq!(p.budget(), Duration::ZERO, "an idle server stops spinning");
        assert!(spun < 2 * 64 * US, "the spins wasted on the way down add up to under twice the maximum: {spun:?}");
        p.slept(10 * US);
        assert_eq!(p.budget(), 64 * US, "dense traffic again: spin in full");
    }

    #[test]
    fn gaps_a_little_longer_than_the_spin_wind_it_down() {
        // One cold disk read at a time, 80 µs each: a 50 µs spin never catches it.
        let mut p = BusyPoll::new(50 * US);
        for _ in 0..8 {
            p.slept(80 * US);
        }
        assert_eq!(p.budget(), Duration::ZERO);
        p.slept(80 * US);
        assert_eq!(p.budget(), Duration::ZERO, "and it stays off while the gaps stay long");
    }

    #[test]
    fn a_sleep_as_long_as_the_maximum_still_counts_as_dense() {
        let mut p = BusyPoll::new(20 * US);
        p.slept(Duration::from_millis(1));
        assert_eq!(p.budget(), 10 * US);
        p.slept(20 * US);
        assert_eq!(p.budget(), 20 * US);
    }
}
