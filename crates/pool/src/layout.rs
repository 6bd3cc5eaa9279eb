//! Where each byte of the volume lives: stripe units go round the mirror sets, and every
//! member of a set holds the same bytes at the same member offset.
//!
//! Which members make up a set is the placement. "near" (md's default) keeps fixed sets of
//! `copies` consecutive members, so a lost member's reads all fall on its partners. "offset"
//! regroups the members every placement period of member offsets: for two copies, the
//! periods go round the n - 1 pairings of the circle method (every two members share a set
//! in exactly one of them); for more copies, members rotate past fixed seats the same way.
//! A lost member's partners then differ from one period to the next, and a stream reads its
//! share from all the survivors (with 4 members and one lost, 3 links of 4 instead of 2).
//! Copies stay at the same member offset, so dirty regions, resync and scrub work per
//! member offset as before; only "the members of this set" depends on the offset.

use crate::limits::{META_BYTES, RESYNC_CHUNK_BYTES};
use crate::spec::{Layout, Placement};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Map {
    pub layout: Layout,
    pub placement: Placement,
    /// Stripe unit; `u64::MAX` for a mirror (one set, no striping).
    pub unit: u64,
    pub copies: usize,
    pub sets: usize,
    /// Data bytes per member (after the metadata area), a whole number of units.
    pub member_bytes: u64,
}

/// A piece of a request that lies on one mirror set.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub set: usize,
    /// Data offset on the set's members (add `META_BYTES` for the device offset).
    pub member_offset: u64,
    pub len: u64,
    /// Offset of the piece within the request.
    pub at: u64,
}

impl Map {
    /// The map for members of these sizes (device bytes, metadata area included), or why not.
    pub fn new(layout: Layout, unit: u64, copies: usize, members: usize, smallest_member: u64) -> Result<Map, String> {
        let sets = members / copies;
        let usable = smallest_member.saturating_sub(META_BYTES);
        let member_bytes = match layout {
            Layout::Mirror => usable / 4096 * 4096,
            _ => usable / unit * unit,
        };
        if member_bytes == 0 {
            return Err(format!("the smallest member ({smallest_member} bytes) has no room for data after the 1 MiB metadata area"));
        }
        Ok(Map { layout, placement: Placement::Near, unit, copies, sets, member_bytes })
    }

    /// Member offsets per placement period: a whole number of stripe units and of resync
    /// chunks (which start at multiples of their size), so that no request piece, copy
    /// chunk or scrub chunk spans two periods, and each has one set of members.
    pub fn period(&self) -> u64 {
        self.unit.max(RESYNC_CHUNK_BYTES)
    }

    /// How many different groupings of the members into sets the volume uses.
    pub fn rotations(&self) -> usize {
        if self.placement == Placement::Near || self.sets < 2 {
            return 1;
        }
        let circle = (self.sets * self.copies - 1) as u64;
        circle.min(self.member_bytes.div_ceil(self.period())) as usize
    }

    fn rotation(&self, member_offset: u64) -> usize {
        match self.rotations() {
            1 => 0,
            _ => (member_offset / self.period() % (self.sets * self.copies - 1) as u64) as usize,
        }
    }

    /// The members of set `set` at member offset `member_offset`, first copy first.
    pub fn members_at(&self, set: usize, member_offset: u64) -> impl Iterator<Item = usize> + Clone + use<> {
        let (map, r) = (*self, self.rotation(member_offset));
        (0..self.copies).map(move |k| map.member(set, k, r))
    }

    /// Copy `k` of set `set` in rotation `r`: members sit on seats, the last one fixed and
    /// the others turning one seat per rotation round a circle of n - 1.
    fn member(&self, set: usize, k: usize, r: usize) -> usize {
        if self.rotations() == 1 {
            return set * self.copies + k;
        }
        let circle = self.sets * self.copies - 1;
        let seat = match (self.copies, k) {
            // The circle method: seat j faces seat -j, and seat 0 the fixed one.
            (2, 0) => set,
            (2, _) => circle - set,
            _ => set * self.copies + k,
        };
        if seat == circle { circle } else { (seat + r) % circle }
    }

    /// The set that member `member` belongs to at member offset `member_offset`.
    pub fn set_at(&self, member: usize, member_offset: u64) -> usize {
        (0..self.sets).find(|&s| self.members_at(s, member_offset).any(|m| m == member)).expect("every member is in one set")
    }

    /// One member offset in each rotation, with every set there: together they name every
    /// group of members that holds copies of the same bytes.
    pub fn groups(&self) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..self.rotations()).flat_map(move |r| (0..self.sets).map(move |s| (s, r as u64 * self.period())))
    }

    /// The groups `member` belongs to: its set in each rotation, at a member offset there.
    pub fn groups_of(&self, member: usize) -> impl Iterator<Item = (usize, u64)> + '_ {
        (0..self.rotations()).map(move |r| {
            let at = r as u64 * self.period();
            (self.set_at(member, at), at)
        })
    }

    pub fn size(&self) -> u64 {
        self.member_bytes * self.sets as u64
    }

    /// Splits `offset..offset + len` (inside the volume) at unit boundaries.
    pub fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        let mut at = 0;
        std::iter::from_fn(move || {
            if at >= len {
                return None;
            }
            let v = offset + at;
            let piece = if self.sets == 1 {
                Piece { set: 0, member_offset: v, len: len - at, at }
            } else {
                let unit_index = v / self.unit;
                let within = v % self.unit;
                let set = (unit_index % self.sets as u64) as usize;
                let member_offset = unit_index / self.sets as u64 * self.unit + within;
                Piece { set, member_offset, len: (self.unit - within).min(len - at), at }
            };
            at += piece.len;
            Some(piece)
        })
    }
}

/// A volume moving between two layouts of the same members (`sluice pool grow`): stripe
/// units below `at` are where `to` puts them, the others where `from` does. Both maps have
/// the same unit, copies and member size; `to` has more sets.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reshape {
    pub from: Map,
    pub to: Map,
    pub at: u64,
}

impl Reshape {
    /// Units of the volume before the reshape: the ones that move.
    pub fn units(&self) -> u64 {
        self.from.size() / self.from.unit
    }

    /// The unit that `from` keeps where `to` puts `unit`: `None` when that is a new set,
    /// or `unit` itself (the first row stays where it is).
    pub fn occupant(&self, unit: u64) -> Option<u64> {
        let (n, m) = (self.from.sets as u64, self.to.sets as u64);
        (unit % m < n).then(|| unit / m * n + unit % m)
    }

    /// Splits `offset..offset + len` at unit boundaries, each piece where its unit is now.
    pub fn pieces(&self, offset: u64, len: u64) -> impl Iterator<Item = Piece> + '_ {
        self.to.pieces(offset, len).map(move |p| {
            let v = offset + p.at;
            if v / self.to.unit < self.at {
                return p;
            }
            let old = self.from.pieces(v, p.len).next().expect("a piece of a non-empty range");
            Piece { at: p.at, ..old }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reshape_moves_each_unit_onto_a_slot_already_moved_from() {
        let from = Map::new(Layout::Stripe, 4096, 1, 2, META_BYTES + 8 * 4096).unwrap();
        let to = Map { sets: 3, ..from };
        let r = Reshape { from, to, at: 0 };
        for u in 0..r.units() {
            match r.occupant(u) {
                // The slot's old unit is never later than the unit that takes it.
                Some(o) => assert!(o <= u && (o == u) == (u < 2), "unit {u} occupant {o}"),
                None => assert!(u % 3 == 2),
            }
        }
        let half = Reshape { at: 3, ..r };
        let p: Vec<Piece> = half.pieces(2 * 4096 + 100, 2 * 4096).collect();
        assert_eq!(
            p,
            vec![
                // Unit 2 is moved (to set 2, row 0), unit 3 not yet (set 1, row 1).
                Piece { set: 2, member_offset: 100, len: 3996, at: 0 },
                Piece { set: 1, member_offset: 4096, len: 4096, at: 3996 },
                Piece { set: 0, member_offset: 8192, len: 100, at: 8092 },
            ]
        );
    }

    #[test]
    fn raid10_goes_round_the_sets() {
        let m = Map::new(Layout::Raid10, 4096, 2, 4, META_BYTES + 16 * 4096 + 100).unwrap();
        assert_eq!((m.sets, m.member_bytes, m.size()), (2, 16 * 4096, 32 * 4096));
        let p: Vec<Piece> = m.pieces(4096 - 10, 8192 + 20).collect();
        assert_eq!(
            p,
            vec![
                Piece { set: 0, member_offset: 4086, len: 10, at: 0 },
                Piece { set: 1, member_offset: 0, len: 4096, at: 10 },
                Piece { set: 0, member_offset: 4096, len: 4096, at: 4106 },
                Piece { set: 1, member_offset: 4096, len: 10, at: 8202 },
            ]
        );
        assert_eq!(m.members_at(1, 12345).collect::<Vec<_>>(), vec![2, 3]);
        assert_eq!(m.set_at(3, 0), 1);
        assert_eq!(m.groups().count(), 2);
    }

    fn offset(members: usize, copies: usize) -> Map {
        let m = Map::new(Layout::Raid10, 64 << 10, copies, members, META_BYTES + (256 << 20)).unwrap();
        Map { placement: Placement::Offset, ..m }
    }

    #[test]
    fn offset_sets_split_the_members_in_every_period() {
        for (n, c) in [(4, 2), (6, 2), (8, 2), (6, 3), (8, 4), (9, 3)] {
            let m = offset(n, c);
            assert_eq!(m.rotations(), n - 1);
            for r in 0..2 * n as u64 {
                let at = r * m.period() + 4096;
                let mut all: Vec<usize> = (0..m.sets).flat_map(|s| m.members_at(s, at)).collect();
                all.sort();
                assert_eq!(all, (0..n).collect::<Vec<_>>(), "{n} members, {c} copies, period {r}");
                for x in 0..n {
                    assert!(m.members_at(m.set_at(x, at), at).any(|y| y == x));
                }
            }
            for x in 0..n {
                assert_eq!(m.groups_of(x).count(), n - 1);
            }
        }
    }

    #[test]
    fn offset_pairs_every_two_members_once_per_round() {
        for n in [4, 6, 10] {
            let m = offset(n, 2);
            let mut met = std::collections::BTreeMap::new();
            for (s, at) in m.groups() {
                let pair: Vec<usize> = m.members_at(s, at).collect();
                *met.entry((pair[0].min(pair[1]), pair[0].max(pair[1]))).or_insert(0) += 1;
            }
            assert_eq!(met.len(), n * (n - 1) / 2, "{met:?}");
            assert!(met.values().all(|&k| k == 1), "{met:?}");
        }
    }

    #[test]
    fn offset_spreads_a_lost_members_reads() {
        // Member 0 lost; each survivor reads its own sets' halves and all of set-mates of 0.
        let m = offset(4, 2);
        let mut load = [0.0f64; 4];
        for (s, at) in m.groups() {
            let group: Vec<usize> = m.members_at(s, at).collect();
            let alive: Vec<usize> = group.iter().copied().filter(|&x| x != 0).collect();
            for &x in &alive {
                load[x] += 1.0 / alive.len() as f64;
            }
        }
        assert_eq!(load, [0.0, 2.0, 2.0, 2.0]);
        let near = Map { placement: Placement::Near, ..m };
        assert_eq!(near.rotations(), 1);
        assert_eq!(near.members_at(0, 10 * m.period()).collect::<Vec<_>>(), vec![0, 1]);
    }

    #[test]
    fn mirror_is_one_piece() {
        let m = Map::new(Layout::Mirror, u64::MAX, 3, 3, META_BYTES + (1 << 30)).unwrap();
        let p: Vec<Piece> = m.pieces(12345, 1 << 20).collect();
        assert_eq!(p, vec![Piece { set: 0, member_offset: 12345, len: 1 << 20, at: 0 }]);
    }

    #[test]
    fn every_byte_has_one_place() {
        let m = Map::new(Layout::Stripe, 8192, 1, 3, META_BYTES + 10 * 8192).unwrap();
        let mut seen = std::collections::HashSet::new();
        for p in m.pieces(0, m.size()) {
            for b in (0..p.len).step_by(512) {
                assert!(seen.insert((p.set, p.member_offset + b)));
                assert!(p.member_offset + b < m.member_bytes);
            }
        }
        assert_eq!(seen.len() as u64, m.size() / 512);
    }
}
