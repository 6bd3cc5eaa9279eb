//! One class instance: the queue of its held requests (FIFO), its limit buckets, its
//! reservation credit and its weight tag. A shared class has one instance; any other has
//! one per client connection set.

use std::collections::VecDeque;

use crate::bucket::{Bucket, Credit};
use crate::class::Class;
use crate::request::{Applies, Dim, Id, Nanos, Op};

/// A held request: all the scheduler keeps of it.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    pub id: Id,
    pub op: Op,
    pub bytes: u64,
}

/// How a request was chosen: behind its class's reservation, or by weight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Phase {
    Reservation,
    Weight,
}

#[derive(Debug)]
pub struct Instance {
    pub class: String,
    /// The client it serves; None for a shared class.
    pub client: Option<u64>,
    /// Attachments (connections) that may still submit to it.
    pub refs: u32,
    pub queue: VecDeque<Entry>,
    limits: Vec<(Dim, Applies, Bucket)>,
    reserve_ops: Option<Credit>,
    reserve_bytes: Option<Credit>,
    /// The weight tag (start-time fair queueing): cost served so far divided by weight,
    /// in `TAG_SCALE` fixed point.
    pub tag: u128,
    pub weight: u32,
    /// Which instance this is, of all the scheduler created (slots are reused).
    pub serial: u64,
    /// Listed among the instances kept for their debts after their last connection.
    pub lingering: bool,
}

impl Instance {
    pub fn new(class: &str, client: Option<u64>, config: &Class, now: Nanos, serial: u64) -> Instance {
        let mut inst = Instance {
            class: class.to_string(),
            client,
            refs: 0,
            queue: VecDeque::new(),
            limits: Vec::new(),
            reserve_ops: None,
            reserve_bytes: None,
            tag: 0,
            weight: config.weight,
            serial,
            lingering: false,
        };
        inst.reconfigure(now, config);
        inst
    }

    /// Takes a new configuration of its class, keeping its queue, tokens and debts.
    pub fn reconfigure(&mut self, now: Nanos, config: &Class) {
        let mut limits = Vec::new();
        for (dim, applies, rate) in config.limits() {
            let Some(rate) = rate else { continue };
            let old = self.limits.iter().position(|(d, a, _)| (*d, *a) == (dim, applies));
            let bucket = match old {
                Some(i) => {
                    let mut b = self.limits.swap_remove(i).2;
                    b.reconfigure(now, rate, config.burst_ns);
                    b
                }
                None => Bucket::new(rate, config.burst_ns, now),
            };
            limits.push((dim, applies, bucket));
        }
        self.limits = limits;
        self.reserve_ops = credit(self.reserve_ops.take(), config.reservation_iops, now);
        self.reserve_bytes = credit(self.reserve_bytes.take(), config.reservation_bps, now);
        self.weight = config.weight;
    }

    /// Whether every limit of the class lets `e` start at `now`.
    pub fn allows(&self, now: Nanos, e: &Entry) -> bool {
        self.counting(e.op).all(|(dim, b)| b.fits(now, dim.units(e.bytes)))
    }

    /// The earliest time from `now` at which every limit lets `e` start.
    pub fn allowed_at(&self, now: Nanos, e: &Entry) -> Nanos {
        self.counting(e.op).map(|(dim, b)| b.fit_at(now, dim.units(e.bytes))).max().unwrap_or(now)
    }

    fn counting(&self, op: Op) -> impl Iterator<Item = (Dim, &Bucket)> {
        self.limits.iter().filter(move |(_, a, _)| a.covers(op)).map(|(d, _, b)| (*d, b))
    }

    /// How long the class has been due on its reservation at `now` (the dimension furthest
    /// behind); None without a reservation.
    pub fn behind_ns(&self, now: Nanos) -> Option<i128> {
        let ops = self.reserve_ops.as_ref().map(|c| c.behind_ns(now));
        let bytes = self.reserve_bytes.as_ref().map(|c| c.behind_ns(now));
        ops.max(bytes)
    }

    /// The class has work again after none: nothing owed on its reservation while idle is
    /// kept. (Its weight tag needs no care here: a tag behind the virtual time counts as
    /// the virtual time, when chosen and when charged, so idleness is not banked as share.)
    pub fn wake(&mut self, now: Nanos) {
        for c in [&mut self.reserve_ops, &mut self.reserve_bytes].into_iter().flatten() {
            c.wake(now);
        }
    }

    /// Counts a started request: every limit that covers it; the reservation if it was
    /// chosen for that (service by weight does not use up a reservation, as in mClock); the
    /// weight tag always (all service counts towards a class's share). Returns the tag the
    /// request started at.
    pub fn charge(&mut self, now: Nanos, e: &Entry, phase: Phase, vtime: u128, tag_step: u128) -> u128 {
        for (dim, applies, b) in self.limits.iter_mut() {
            if applies.covers(e.op) {
                b.take(now, dim.units(e.bytes));
            }
        }
        if phase == Phase::Reservation {
            if let Some(c) = self.reserve_ops.as_mut() {
                c.take(now, 1);
            }
            if let Some(c) = self.reserve_bytes.as_mut() {
                c.take(now, e.bytes);
            }
        }
        let start = self.tag.max(vtime);
        self.tag = start + tag_step;
        start
    }

    /// Whether every limit's bucket is full: forgetting the instance then loses nothing (a
    /// new one starts full), so a client cannot reset its limits by reconnecting.
    pub fn rested(&self, now: Nanos) -> bool {
        self.limits.iter().all(|(_, _, b)| b.is_full(now))
    }

    /// Whole tokens left in the class's tightest limit at `now`, for metrics (None: unlimited).
    pub fn tokens(&self, now: Nanos) -> Option<i64> {
        self.limits.iter().map(|(_, _, b)| b.tokens(now)).min()
    }
}

fn credit(old: Option<Credit>, rate: Option<u64>, now: Nanos) -> Option<Credit> {
    let rate = rate?;
    Some(match old {
        Some(mut c) => {
            c.set_rate(now, rate);
            c
        }
        None => Credit::new(rate, now),
    })
}
