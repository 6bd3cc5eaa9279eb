//! Where each byte of the volume lives: stripe units go round the mirror sets ("near"
//! layout), and every member of a set holds the same bytes at the same member offset.

use crate::limits::META_BYTES;
use crate::spec::Layout;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Map {
    pub layout: Layout,
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
        Ok(Map { layout, unit, copies, sets, member_bytes })
    }

    pub fn size(&self) -> u64 {
        self.member_bytes * self.sets as u64
    }

    /// Members of set `set`.
    pub fn members_of(&self, set: usize) -> std::ops::Range<usize> {
        set * self.copies..(set + 1) * self.copies
    }

    pub fn set_of(&self, member: usize) -> usize {
        member / self.copies
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
        assert_eq!(m.members_of(1), 2..4);
        assert_eq!(m.set_of(3), 1);
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
