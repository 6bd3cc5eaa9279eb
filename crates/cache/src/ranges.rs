//! A set of block numbers kept as disjoint, non-adjacent ranges: the blocks a failed
//! write touched (`core::write`), which stay as few entries however many blocks they hold.

use std::collections::BTreeMap;

#[derive(Default, Debug)]
pub struct Ranges {
    /// Start to end (exclusive); no two overlap or touch.
    map: BTreeMap<u64, u64>,
}

impl Ranges {
    /// Adds `start..end`, merged with the ranges it overlaps or touches.
    pub fn insert(&mut self, mut start: u64, mut end: u64) {
        if start >= end {
            return;
        }
        // The range before it may reach it; any that start inside it are swallowed.
        if let Some((&s, &e)) = self.map.range(..=start).next_back() {
            if e >= start {
                start = s;
                end = end.max(e);
            }
        }
        let inside: Vec<u64> = self.map.range(start..=end).map(|(&s, _)| s).collect();
        for s in inside {
            end = end.max(self.map.remove(&s).expect("listed"));
        }
        self.map.insert(start, end);
    }

    pub fn contains(&self, x: u64) -> bool {
        self.map.range(..=x).next_back().is_some_and(|(_, &e)| x < e)
    }

    /// How many ranges it keeps.
    pub fn len(&self) -> usize {
        self.map.len()
    }

    pub fn is_empty(&self) -> bool {
        self.map.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::Ranges;

    #[test]
    fn ranges_merge_when_they_overlap_or_touch_and_stay_apart_otherwise() {
        let mut r = Ranges::default();
        r.insert(10, 20);
        r.insert(30, 40);
        assert_eq!(r.len(), 2);
        assert!(r.contains(10) && r.contains(19) && !r.contains(20) && !r.contains(9) && !r.contains(25));
        r.insert(20, 22);
        assert_eq!(r.len(), 2, "touching 10..20 merges");
        assert!(r.contains(21) && !r.contains(22));
        r.insert(5, 35);
        assert_eq!(r.len(), 1, "swallows one and reaches into the other");
        assert!(r.contains(5) && r.contains(39) && !r.contains(40) && !r.contains(4));
        r.insert(7, 8);
        r.insert(3, 3);
        assert_eq!(r.len(), 1);
        assert!(!r.contains(3));
    }

    /// Against a plain set of every block, over random inserts.
    #[test]
    fn ranges_hold_exactly_the_blocks_inserted() {
        let mut rng = sluice_proto::rng::Rng::seeded(7);
        for _ in 0..200 {
            let (mut r, mut all) = (Ranges::default(), std::collections::BTreeSet::new());
            for _ in 0..1 + rng.below(12) {
                let start = rng.below(100);
                let end = start + rng.below(15);
                r.insert(start, end);
                all.extend(start..end);
            }
            for x in 0..120 {
                assert_eq!(r.contains(x), all.contains(&x), "block {x}: {r:?}");
            }
            let runs = all.iter().filter(|&&x| x == 0 || !all.contains(&(x - 1))).count();
            assert_eq!(r.len(), runs, "{r:?}");
        }
    }
}
