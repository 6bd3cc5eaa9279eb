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

use std::time::Duration;

use crate::limits::BUSY_POLL_MIN_NS;

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
