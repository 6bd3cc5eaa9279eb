//! Which held request goes next (mClock's two phases): among classes whose next request
//! their limits let start, first the one furthest behind its reservation, if any is due;
//! else the one with the smallest weight tag.

use super::instance::{Instance, Phase};
use crate::request::Nanos;

/// The instance whose head request should start next, and why; None when every class with
/// held requests is at one of its limits.
pub fn choose(slots: &[Option<Instance>], active: &[u32], now: Nanos, vtime: u128) -> Option<(u32, Phase)> {
    let mut due: Option<(i128, u32)> = None;
    let mut share: Option<(u128, u32)> = None;
    for &i in active {
        let inst = slots[i as usize].as_ref().expect("active instances are live");
        let head = inst.queue.front().expect("active instances hold requests");
        if !inst.allows(now, head) {
            continue;
        }
        if let Some(behind) = inst.behind_ns(now).filter(|b| *b >= 0) {
            if due.is_none_or(|(most, _)| behind > most) {
                due = Some((behind, i));
            }
        }
        let tag = inst.tag.max(vtime);
        if share.is_none_or(|(least, _)| tag < least) {
            share = Some((tag, i));
        }
    }
    due.map(|(_, i)| (i, Phase::Reservation)).or(share.map(|(_, i)| (i, Phase::Weight)))
}
