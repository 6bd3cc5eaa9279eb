//! Token buckets for limits, and reservation credit, in exact integers.
//!
//! Tokens are kept in units (operations or bytes) times nanoseconds per second, so a rate in
//! units per second times a time in nanoseconds adds exactly: no rounding at refill, and no
//! drift however long the run. Time is the caller's `Nanos`; a bucket only ever looks at the
//! time passed in.

use crate::limits::NANOS_PER_SEC;
use crate::request::Nanos;

const SCALE: i128 = NANOS_PER_SEC as i128;

/// A limit: `rate` units per second, of which `rate * burst` may be spent at once. A
/// request costing more than the whole bucket may start once the bucket is full and leaves
/// it in debt, so no request waits forever; over any window the bucket lets through at
/// most `rate * window + max(capacity, largest request)`.
#[derive(Clone, Debug)]
pub struct Bucket {
    rate: u64,
    /// Capacity, in scaled units.
    cap: i128,
    /// Scaled units at `at`; below zero while in debt.
    tokens: i128,
    at: Nanos,
}

impl Bucket {
    /// A full bucket: a client that starts after a quiet spell may spend its burst at once.
    pub fn new(rate: u64, burst_ns: u64, now: Nanos) -> Bucket {
        let cap = rate as i128 * burst_ns as i128;
        Bucket { rate, cap, tokens: cap, at: now }
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    /// Scaled tokens at `now` (a time before the last one counts as that one).
    fn level(&self, now: Nanos) -> i128 {
        let passed = now.saturating_sub(self.at) as i128;
        (self.tokens + self.rate as i128 * passed).min(self.cap)
    }

    /// Whole units in the bucket at `now` (negative while in debt), for metrics.
    pub fn tokens(&self, now: Nanos) -> i64 {
        (self.level(now).div_euclid(SCALE)).clamp(i64::MIN as i128, i64::MAX as i128) as i64
    }

    /// What must be in the bucket for `units` to start: all of them, or a full bucket.
    fn need(&self, units: u64) -> i128 {
        (units as i128 * SCALE).min(self.cap)
    }

    /// Whether the bucket has filled up again (nothing of the past is left to remember).
    pub fn is_full(&self, now: Nanos) -> bool {
        self.level(now) >= self.cap
    }

    pub fn fits(&self, now: Nanos, units: u64) -> bool {
        self.level(now) >= self.need(units)
    }

    /// The earliest time from `now` at which `units` fit.
    pub fn fit_at(&self, now: Nanos, units: u64) -> Nanos {
        let short = self.need(units) - self.level(now);
        if short <= 0 {
            return now;
        }
        let rate = self.rate as i128;
        let wait = (short + rate - 1) / rate;
        now.saturating_add(u64::try_from(wait).unwrap_or(u64::MAX))
    }

    /// Spends `units` at `now` (whether or not they fit: the caller decided).
    pub fn take(&mut self, now: Nanos, units: u64) {
        let now = now.max(self.at);
        self.tokens = self.level(now) - units as i128 * SCALE;
        self.at = now;
    }

    /// A new rate or burst at run time: what was earned so far at the old rate is kept, up
    /// to the new capacity, and so is any debt.
    pub fn reconfigure(&mut self, now: Nanos, rate: u64, burst_ns: u64) {
        let now = now.max(self.at);
        let level = self.level(now);
        self.rate = rate;
        self.cap = rate as i128 * burst_ns as i128;
        self.tokens = level.min(self.cap);
        self.at = now;
    }
}

/// Reservation credit: `rate` units per second are owed to a class while it has work. At
/// zero or above the class is due (behind its reservation, mClock's R tag at or before
/// now); serving it in the reservation phase spends credit. A class that goes idle keeps
/// no credit (its tag moves up to now), so idleness is not banked.
#[derive(Clone, Debug)]
pub struct Credit {
    rate: u64,
    credit: i128,
    at: Nanos,
}

impl Credit {
    /// Credit for a class that has just become busy: due at once.
    pub fn new(rate: u64, now: Nanos) -> Credit {
        Credit { rate, credit: 0, at: now }
    }

    pub fn rate(&self) -> u64 {
        self.rate
    }

    fn level(&self, now: Nanos) -> i128 {
        self.credit + self.rate as i128 * now.saturating_sub(self.at) as i128
    }

    /// How long the class has been due at `now`, in nanoseconds (negative: not yet due).
    pub fn behind_ns(&self, now: Nanos) -> i128 {
        self.level(now) / self.rate as i128
    }

    /// The earliest time from `now` at which the class is due.
    pub fn due_at(&self, now: Nanos) -> Nanos {
        let short = -self.level(now);
        if short <= 0 {
            return now;
        }
        let rate = self.rate as i128;
        now.saturating_add(u64::try_from((short + rate - 1) / rate).unwrap_or(u64::MAX))
    }

    pub fn take(&mut self, now: Nanos, units: u64) {
        let now = now.max(self.at);
        self.credit = self.level(now) - units as i128 * SCALE;
        self.at = now;
    }

    /// The class has just become busy after being idle: what it was owed while idle is
    /// dropped; a debt (served ahead of its reservation) is kept.
    pub fn wake(&mut self, now: Nanos) {
        let now = now.max(self.at);
        self.credit = self.level(now).min(0);
        self.at = now;
    }

    pub fn set_rate(&mut self, now: Nanos, rate: u64) {
        let now = now.max(self.at);
        self.credit = self.level(now);
        self.rate = rate;
        self.at = now;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: u64 = NANOS_PER_SEC;

    #[test]
    fn starts_full_and_refills_at_its_rate() {
        let mut b = Bucket::new(1000, S, 0);
        assert!(b.fits(0, 1000));
        b.take(0, 1000);
        assert_eq!(b.tokens(0), 0);
        assert!(!b.fits(0, 1));
        assert_eq!(b.fit_at(0, 1), S / 1000);
        assert!(b.fits(S / 1000, 1));
        assert_eq!(b.tokens(S / 2), 500);
        assert_eq!(b.tokens(10 * S), 1000, "capped at the burst");
    }

    #[test]
    fn a_cost_above_the_bucket_waits_for_a_full_one_and_leaves_a_debt() {
        let mut b = Bucket::new(100, S, 0);
        assert!(b.fits(0, 250), "a full bucket lets any one request through");
        b.take(0, 250);
        assert_eq!(b.tokens(0), -150);
        assert_eq!(b.fit_at(0, 250), 25 * S / 10);
        assert_eq!(b.fit_at(0, 1), 15 * S / 10 + S / 100);
    }

    #[test]
    fn fit_at_rounds_up_so_the_wake_is_never_early() {
        let mut b = Bucket::new(3, S, 0);
        b.take(0, 3);
        let t = b.fit_at(0, 1);
        assert_eq!(t, S / 3 + 1);
        assert!(b.fits(t, 1) && !b.fits(t - 1, 1));
    }

    #[test]
    fn no_drift_over_a_long_run() {
        // 7 ops/s, a request every 1/7 s for a simulated day: exactly as many fit as the rate says.
        let mut b = Bucket::new(7, S, 0);
        b.take(0, 7);
        let mut now = 0;
        let mut started = 0u64;
        while now < 86_400 * S {
            now = b.fit_at(now, 1);
            b.take(now, 1);
            started += 1;
        }
        assert_eq!(started, 7 * 86_400, "one per 1/7 s, to the request");
        assert_eq!(now, 86_400 * S, "the last one exactly at the end of the day");
    }

    #[test]
    fn reconfigure_keeps_what_was_earned_up_to_the_new_capacity() {
        let mut b = Bucket::new(1000, S, 0);
        b.reconfigure(0, 10, S);
        assert_eq!(b.tokens(0), 10);
        b.take(0, 30);
        b.reconfigure(0, 1000, 2 * S);
        assert_eq!(b.tokens(0), -20, "a debt is kept");
        assert_eq!(b.tokens(S), 980);
    }

    #[test]
    fn credit_is_due_at_its_rate_and_not_banked_while_idle() {
        let mut c = Credit::new(100, 0);
        assert!(c.behind_ns(0) >= 0);
        c.take(0, 1);
        assert_eq!(c.due_at(0), S / 100);
        assert!(c.behind_ns(S / 200) < 0);
        assert_eq!(c.behind_ns(S), S as i128 * 99 / 100);
        c.wake(S);
        assert_eq!(c.behind_ns(S), 0, "an idle class gets no credit for its idleness");
        c.take(S, 5);
        c.wake(S);
        assert_eq!(c.due_at(S), S + 5 * S / 100, "a debt is kept");
        c.set_rate(S, 500);
        assert_eq!(c.due_at(S), S + S / 100);
    }
}
