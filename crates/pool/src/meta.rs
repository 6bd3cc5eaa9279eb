//! The pool's metadata on every member, like md's superblock and internal bitmap: the
//! first `META_BYTES` of each member hold a superblock (block 0) and the write-intent
//! bitmap (blocks 1..). Any node can assemble the pool from the members alone.
//!
//! Superblock block, little-endian: magic, version, pool id, layout, copies, member count,
//! this member's index, stripe unit, data bytes per member, region bytes, event counter,
//! the owner (the coordinator's session, heartbeat, pid and host), one role per member,
//! and a CRC-32 of the block in its last four bytes.

use crate::limits::{BITMAP_BITS_MAX, MEMBERS_MAX, META_BLOCK_BYTES, REGION_MIN_BYTES};
use crate::scrub_record::ScrubRecord;
use crate::spec::{Layout, Placement};

const MAGIC: &[u8; 8] = b"SLUICEPL";
const VERSION: u32 = 1;
const HOST_MAX_BYTES: usize = 64;
const ROLES_AT: usize = 160;
const ROLE_BYTES: usize = 25;
const _: () = assert!(ROLES_AT + MEMBERS_MAX * ROLE_BYTES + 4 <= META_BLOCK_BYTES as usize);
/// One device identity per member (8 bytes each) after the scrub record.
const DEVICES_AT: usize = crate::scrub_record::SCRUB_RECORD_END;
const _: () = assert!(DEVICES_AT + MEMBERS_MAX * 8 + 4 <= META_BLOCK_BYTES as usize);
/// The reshape record (`Reshape`): old member count (u16; 0: no reshape), the checkpoint
/// (u64 units), the start (u64 unix seconds). Bytes 1792..2047 are the reshape's.
const RESHAPE_AT: usize = 1792;
const _: () = assert!(ROLES_AT + MEMBERS_MAX * ROLE_BYTES <= RESHAPE_AT && RESHAPE_AT + 24 <= 2048);

/// The layout byte of a raid10 with offset placement: a sluice that does not know offset
/// placement refuses the pool ("unknown layout") instead of reading it as "near".
const RAID10_OFFSET_CODE: u8 = 4;

/// A reshape in progress (`sluice pool grow`): the volume moves from the layout over the
/// first `from_members` members to the layout over all of them, in increasing volume order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Reshape {
    pub from_members: usize,
    /// Stripe units below this are in the new layout (durably copied).
    pub at: u64,
    /// When the reshape started, unix seconds.
    pub started: u64,
}

/// A member's place in the pool's history, as the coordinator that wrote it saw it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// Holds every acknowledged write (outside regions the bitmap marks dirty).
    Active,
    /// Declared missing when the pool's event counter was `since`: it lacks writes to the
    /// regions dirty since then. `since` is what its own superblock says if it returns
    /// with the same history.
    Missing { since: u64 },
    /// Being copied to: `done` of `total` bytes. It takes writes but serves no reads.
    /// `full`: it gets every region (it was blank or of unknown history), so an interrupted
    /// rebuild must start over rather than copy only dirty regions.
    Rebuilding { done: u64, total: u64, full: bool },
}

/// Who is coordinating a mirrored pool: one at a time.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Owner {
    /// 0 when the last coordinator released the pool cleanly.
    pub session: u64,
    /// Moves while the owner is alive.
    pub heartbeat: u64,
    pub pid: u32,
    pub host: String,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Superblock {
    pub pool_id: [u8; 16],
    pub layout: Layout,
    pub placement: Placement,
    pub copies: usize,
    pub index: usize,
    pub stripe_unit: u64,
    pub member_bytes: u64,
    pub region_bytes: u64,
    pub events: u64,
    pub owner: Owner,
    /// One per member, in member order.
    pub roles: Vec<Role>,
    /// The last completed scrub (see `scrub_record`).
    pub scrub: Option<ScrubRecord>,
    /// One per member: a random identity of the device that holds that place, given when
    /// it was initialised or put there (md's device UUID). A member whose own superblock
    /// names another device for its place than the pool does is not the one the pool
    /// knows there (an old member named again in the pool file): it gets everything
    /// copied. 0: not known (superblocks written before identities existed).
    pub devices: Vec<u64>,
    pub reshape: Option<Reshape>,
}

/// The region size for members with this many data bytes: at least `REGION_MIN_BYTES`,
/// doubled until the bitmap fits its blocks.
pub fn region_bytes(member_bytes: u64) -> u64 {
    let mut r = REGION_MIN_BYTES;
    while member_bytes.div_ceil(r) > BITMAP_BITS_MAX {
        r *= 2;
    }
    r
}

/// Bitmap blocks in use for this many regions.
pub fn bitmap_blocks(regions: u64) -> u64 {
    regions.div_ceil(META_BLOCK_BYTES * 8).max(1)
}

impl Superblock {
    pub fn members(&self) -> usize {
        self.roles.len()
    }

    pub fn regions(&self) -> u64 {
        self.member_bytes.div_ceil(self.region_bytes)
    }

    pub fn encode(&self) -> Vec<u8> {
        let mut b = vec![0u8; META_BLOCK_BYTES as usize];
        b[0..8].copy_from_slice(MAGIC);
        b[8..12].copy_from_slice(&VERSION.to_le_bytes());
        b[12..28].copy_from_slice(&self.pool_id);
        b[28] = match (self.layout, self.placement) {
            (Layout::Raid10, Placement::Offset) => RAID10_OFFSET_CODE,
            (layout, _) => layout.code(),
        };
        b[29..31].copy_from_slice(&(self.copies as u16).to_le_bytes());
        b[31..33].copy_from_slice(&(self.roles.len() as u16).to_le_bytes());
        b[33..35].copy_from_slice(&(self.index as u16).to_le_bytes());
        let words = [self.stripe_unit, self.member_bytes, self.region_bytes, self.events, self.owner.session, self.owner.heartbeat];
        for (i, w) in words.iter().enumerate() {
            b[40 + i * 8..48 + i * 8].copy_from_slice(&w.to_le_bytes());
        }
        b[88..92].copy_from_slice(&self.owner.pid.to_le_bytes());
        let host = self.owner.host.as_bytes();
        let n = host.len().min(HOST_MAX_BYTES);
        b[92] = n as u8;
        b[93..93 + n].copy_from_slice(&host[..n]);
        for (i, role) in self.roles.iter().enumerate() {
            let at = ROLES_AT + i * ROLE_BYTES;
            let (kind, x, y) = match *role {
                Role::Active => (1u8, 0, 0),
                Role::Missing { since } => (2, since, 0),
                Role::Rebuilding { done, total, full: false } => (3, done, total),
                Role::Rebuilding { done, total, full: true } => (4, done, total),
            };
            b[at] = kind;
            b[at + 1..at + 9].copy_from_slice(&x.to_le_bytes());
            b[at + 9..at + 17].copy_from_slice(&y.to_le_bytes());
        }
        ScrubRecord::encode_into(self.scrub.as_ref(), &mut b);
        for (i, d) in self.devices.iter().enumerate().take(self.roles.len()) {
            b[DEVICES_AT + i * 8..DEVICES_AT + i * 8 + 8].copy_from_slice(&d.to_le_bytes());
        }
        if let Some(r) = &self.reshape {
            b[RESHAPE_AT..RESHAPE_AT + 2].copy_from_slice(&(r.from_members as u16).to_le_bytes());
            b[RESHAPE_AT + 8..RESHAPE_AT + 16].copy_from_slice(&r.at.to_le_bytes());
            b[RESHAPE_AT + 16..RESHAPE_AT + 24].copy_from_slice(&r.started.to_le_bytes());
        }
        let end = b.len() - 4;
        let crc = crc32fast::hash(&b[..end]);
        b[end..].copy_from_slice(&crc.to_le_bytes());
        b
    }

    /// `Ok(None)` for a member without pool metadata (no magic); an error for metadata
    /// that is damaged or from an unknown version.
    pub fn decode(b: &[u8]) -> Result<Option<Superblock>, String> {
        if b.len() < META_BLOCK_BYTES as usize || &b[0..8] != MAGIC {
            return Ok(None);
        }
        let b = &b[..META_BLOCK_BYTES as usize];
        let end = b.len() - 4;
        if crc32fast::hash(&b[..end]).to_le_bytes() != b[end..] {
            return Err("its pool superblock is damaged (checksum mismatch)".into());
        }
        let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]) as usize;
        let u64_at = |i: usize| u64::from_le_bytes(b[i..i + 8].try_into().unwrap());
        let version = u32::from_le_bytes(b[8..12].try_into().unwrap());
        if version != VERSION {
            return Err(format!("its pool superblock has version {version}; this sluice knows version {VERSION}"));
        }
        let (layout, placement) = match b[28] {
            RAID10_OFFSET_CODE => (Layout::Raid10, Placement::Offset),
            code => (Layout::from_code(code).ok_or("its pool superblock names an unknown layout")?, Placement::Near),
        };
        let (copies, members, index) = (u16_at(29), u16_at(31), u16_at(33));
        if members == 0 || members > MEMBERS_MAX || index >= members || copies == 0 {
            return Err("its pool superblock has impossible member counts".into());
        }
        let host_len = (b[92] as usize).min(HOST_MAX_BYTES);
        let owner = Owner {
            session: u64_at(72),
            heartbeat: u64_at(80),
            pid: u32::from_le_bytes(b[88..92].try_into().unwrap()),
            host: String::from_utf8_lossy(&b[93..93 + host_len]).into_owned(),
        };
        let mut roles = Vec::with_capacity(members);
        for i in 0..members {
            let at = ROLES_AT + i * ROLE_BYTES;
            let (x, y) = (u64_at(at + 1), u64_at(at + 9));
            roles.push(match b[at] {
                1 => Role::Active,
                2 => Role::Missing { since: x },
                3 => Role::Rebuilding { done: x, total: y, full: false },
                4 => Role::Rebuilding { done: x, total: y, full: true },
                k => return Err(format!("its pool superblock has an unknown role {k}")),
            });
        }
        let sb = Superblock {
            pool_id: b[12..28].try_into().unwrap(),
            layout,
            placement,
            copies,
            index,
            stripe_unit: u64_at(40),
            member_bytes: u64_at(48),
            region_bytes: u64_at(56),
            events: u64_at(64),
            owner,
            roles,
            scrub: ScrubRecord::decode(b)?,
            devices: (0..members).map(|i| u64_at(DEVICES_AT + i * 8)).collect(),
            reshape: match u16_at(RESHAPE_AT) {
                0 => None,
                from if from < members => Some(Reshape { from_members: from, at: u64_at(RESHAPE_AT + 8), started: u64_at(RESHAPE_AT + 16) }),
                _ => return Err("its pool superblock records a reshape from more members than it has".into()),
            },
        };
        if sb.region_bytes == 0 || !sb.region_bytes.is_power_of_two() || sb.regions() > BITMAP_BITS_MAX {
            return Err("its pool superblock has an impossible region size".into());
        }
        Ok(Some(sb))
    }
}

impl Superblock {
    /// Whether this member's own superblock and the pool's (`auth`) name different devices
    /// for its place (both known).
    pub fn other_device_than(&self, auth: &Superblock) -> bool {
        let (own, known) = (self.devices.get(self.index).copied().unwrap_or(0), auth.devices.get(self.index).copied().unwrap_or(0));
        own != 0 && known != 0 && own != known
    }
}

/// A device identity, never 0, from anything that differs between calls (a random pool id
/// or session, and a counter).
pub fn device_id(seed: u64, n: u64) -> u64 {
    // splitmix64's mix.
    let mut z = seed ^ n.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    (z ^ (z >> 31)).max(1)
}

/// The pool id as users see it.
pub fn id_text(id: &[u8; 16]) -> String {
    id.iter().map(|b| format!("{b:02x}")).collect()
}

/// Reads bit `i` of a bitmap kept as 64-bit words (the on-disk order is the same: bit
/// `i` is bit `i % 8` of byte `i / 8`).
pub fn bit(words: &[u64], i: u64) -> bool {
    words.get((i / 64) as usize).is_some_and(|w| w >> (i % 64) & 1 == 1)
}

/// The bytes of bitmap block `block` (0-based, after the superblock) from in-memory words.
pub fn bitmap_block_bytes(words: &[u64], block: u64) -> Vec<u8> {
    let per_block = (META_BLOCK_BYTES / 8) as usize;
    let mut out = vec![0u8; META_BLOCK_BYTES as usize];
    let first = block as usize * per_block;
    for (i, w) in words.iter().skip(first).take(per_block).enumerate() {
        out[i * 8..i * 8 + 8].copy_from_slice(&w.to_le_bytes());
    }
    out
}

/// In-memory words from the bitmap bytes that follow the superblock on a member.
pub fn bitmap_words(bytes: &[u8], regions: u64) -> Vec<u64> {
    let n = regions.div_ceil(64) as usize;
    let mut words: Vec<u64> = bytes.chunks(8).take(n).map(|c| {
        let mut w = [0u8; 8];
        w[..c.len()].copy_from_slice(c);
        u64::from_le_bytes(w)
    }).collect();
    words.resize(n, 0);
    if !regions.is_multiple_of(64) {
        // Bits past the last region mean nothing; keep them clear.
        if let Some(last) = words.last_mut() {
            *last &= (1u64 << (regions % 64)) - 1;
        }
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Superblock {
        Superblock {
            pool_id: [7; 16],
            layout: Layout::Raid10,
            placement: Placement::Near,
            copies: 2,
            index: 3,
            stripe_unit: 512 << 10,
            member_bytes: 1 << 30,
            region_bytes: 4 << 20,
            events: 42,
            owner: Owner { session: 9, heartbeat: 100, pid: 1234, host: "node-a".into() },
            roles: vec![Role::Active, Role::Missing { since: 40 }, Role::Rebuilding { done: 5, total: 10, full: true }, Role::Active],
            devices: vec![11, 12, 0, 14],
            scrub: None,
            reshape: None,
        }
    }

    #[test]
    fn reshape_round_trips_and_old_blocks_have_none() {
        let sb = Superblock { reshape: Some(Reshape { from_members: 2, at: 77, started: 1_700_000_000 }), ..sample() };
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), Some(sb));
        // A block written before reshapes existed has zeros there.
        assert_eq!(Superblock::decode(&sample().encode()).unwrap().unwrap().reshape, None);
        let bad = Superblock { reshape: Some(Reshape { from_members: 4, at: 0, started: 0 }), ..sample() };
        assert!(Superblock::decode(&bad.encode()).unwrap_err().contains("reshape"));
    }

    #[test]
    fn superblock_round_trips() {
        let sb = sample();
        assert_eq!(Superblock::decode(&sb.encode()).unwrap(), Some(sb));
        let offset = Superblock { placement: Placement::Offset, ..sample() };
        assert_eq!(offset.encode()[28], RAID10_OFFSET_CODE);
        assert_eq!(Superblock::decode(&offset.encode()).unwrap(), Some(offset));
        assert_eq!(Superblock::decode(&[0u8; 4096]).unwrap(), None);
    }

    #[test]
    fn damage_is_an_error_not_a_blank_member() {
        let mut b = sample().encode();
        b[100] ^= 1;
        assert!(Superblock::decode(&b).unwrap_err().contains("checksum"));
    }

    #[test]
    fn regions_fit_the_bitmap() {
        assert_eq!(region_bytes(1 << 30), REGION_MIN_BYTES);
        let huge = 1u64 << 50;
        assert!(huge.div_ceil(region_bytes(huge)) <= BITMAP_BITS_MAX);
    }

    #[test]
    fn bitmap_bytes_round_trip() {
        let words = vec![0x8000_0000_0000_0001u64, 0b101];
        let bytes = bitmap_block_bytes(&words, 0);
        assert_eq!(bitmap_words(&bytes, 67), words);
        assert!(bit(&words, 0) && bit(&words, 63) && bit(&words, 66) && !bit(&words, 65));
    }
}
