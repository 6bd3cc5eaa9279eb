//! The slot format on a member: a member is a RAM export cut into slots of
//! `SLOT_HEADER_BYTES + block` bytes, slot `i` at `i * slot_bytes`. The header page says
//! which block of which volume the data is, and when it was written:
//!
//! | bytes  | field                                                           |
//! |--------|-----------------------------------------------------------------|
//! | 0..8   | magic `SLCACHE1`                                                |
//! | 8..12  | block size in bytes (u32 LE)                                    |
//! | 12..16 | bytes of the block inside the volume (u32 LE; the last is short)|
//! | 16..24 | volume identity: random, chosen each time the cache starts      |
//! | 24..32 | the block's offset in the volume                                |
//! | 32..40 | generation: the gateway's counter, new for every fill            |
//! | 40..48 | xxh3-64 of the block's data (all `block` bytes), seeded by the identity |
//! | 48..56 | xxh3-64 of bytes 0..48                                          |
//! | 56..4096 | zero, not read                                                |
//!
//! Why each: a member may lose any page of a slot behind the gateway's back (an elastic
//! member punches holes, a restarted one is all zeros, an old write may land late), so the
//! header and data are checked on every hit. The magic and the header checksum make an
//! all-zero or torn header fail; the identity makes a slot left by an earlier run or by
//! another volume fail; offset and generation make a slot reused for another block (or
//! refilled for the same one) fail for a read that expected the older fill; the data
//! checksum makes dropped or stale data pages fail. None of the fields can be zero in a
//! valid header (magic, identity and block size are never zero), so zeros never validate.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::limits::SLOT_HEADER_BYTES;

const MAGIC: [u8; 8] = *b"SLCACHE1";
const HEADER_USED_BYTES: usize = 56;

/// What a slot must say to be the block the directory expects.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Header {
    pub block_bytes: u32,
    pub data_len: u32,
    pub volume: u64,
    pub offset: u64,
    pub generation: u64,
}

/// Why a slot did not validate: each is a miss, counted as a verify failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SlotError {
    Length,
    Magic,
    HeaderChecksum,
    Volume,
    Geometry,
    Offset,
    Generation,
    DataChecksum,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

/// The bytes of a slot holding `data` (exactly `block_bytes`; a short last block padded
/// with zeros by the caller).
pub fn encode(h: &Header, data: &[u8]) -> Vec<u8> {
    assert_eq!(data.len() as u64, h.block_bytes as u64, "a slot holds a whole block");
    assert!(h.volume != 0 && h.block_bytes != 0, "zero identity or size would let zeros validate");
    let mut out = vec![0u8; SLOT_HEADER_BYTES as usize + data.len()];
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&h.block_bytes.to_le_bytes());
    out[12..16].copy_from_slice(&h.data_len.to_le_bytes());
    out[16..24].copy_from_slice(&h.volume.to_le_bytes());
    out[24..32].copy_from_slice(&h.offset.to_le_bytes());
    out[32..40].copy_from_slice(&h.generation.to_le_bytes());
    out[40..48].copy_from_slice(&xxh3_64_with_seed(data, h.volume).to_le_bytes());
    let sum = xxh3_64(&out[..48]);
    out[48..HEADER_USED_BYTES].copy_from_slice(&sum.to_le_bytes());
    out[SLOT_HEADER_BYTES as usize..].copy_from_slice(data);
    out
}

/// Checks a slot read back against what the directory expects; the block's data on success.
pub fn verify<'a>(slot: &'a [u8], want: &Header) -> Result<&'a [u8], SlotError> {
    let head = SLOT_HEADER_BYTES as usize;
    if slot.len() != head + want.block_bytes as usize {
        return Err(SlotError::Length);
    }
    if slot[0..8] != MAGIC {
        return Err(SlotError::Magic);
    }
    if xxh3_64(&slot[..48]) != u64_at(slot, 48) {
        return Err(SlotError::HeaderChecksum);
    }
    if u64_at(slot, 16) != want.volume {
        return Err(SlotError::Volume);
    }
    if u32_at(slot, 8) != want.block_bytes || u32_at(slot, 12) != want.data_len {
        return Err(SlotError::Geometry);
    }
    if u64_at(slot, 24) != want.offset {
        return Err(SlotError::Offset);
    }
    if u64_at(slot, 32) != want.generation {
        return Err(SlotError::Generation);
    }
    let data = &slot[head..];
    if xxh3_64_with_seed(data, want.volume) != u64_at(slot, 40) {
        return Err(SlotError::DataChecksum);
    }
    Ok(data)
}

/// The generation a slot's header claims (test hook: a core that trusts it is a core
/// without the generation check).
#[cfg(test)]
pub(crate) fn claimed_generation(slot: &[u8]) -> u64 {
    slot.get(32..40).map_or(0, |_| u64_at(slot, 32))
}

/// The volume identity a slot's header claims (test hook, as `claimed_generation`).
#[cfg(test)]
pub(crate) fn claimed_volume(slot: &[u8]) -> u64 {
    slot.get(16..24).map_or(0, |_| u64_at(slot, 16))
}

#[cfg(test)]
mod tests {
    use super::*;

    const H: Header = Header { block_bytes: 16384, data_len: 16384, volume: 0x5eed_1234, offset: 3 * 16384, generation: 42 };

    fn data() -> Vec<u8> {
        (0..H.block_bytes).map(|i| (i % 251) as u8 + 1).collect()
    }

    #[test]
    fn round_trip() {
        let d = data();
        assert_eq!(verify(&encode(&H, &d), &H), Ok(&d[..]));
    }

    #[test]
    fn all_zeros_never_validate() {
        let zeros = vec![0u8; SLOT_HEADER_BYTES as usize + H.block_bytes as usize];
        assert_eq!(verify(&zeros, &H), Err(SlotError::Magic));
        // Zero data with a valid header validates only when the block really was zeros.
        let z = vec![0u8; H.block_bytes as usize];
        assert!(verify(&encode(&H, &z), &H).is_ok());
    }

    #[test]
    fn any_zeroed_page_fails() {
        let slot = encode(&H, &data());
        for page in 0..slot.len() / 4096 {
            let mut s = slot.clone();
            s[page * 4096..(page + 1) * 4096].fill(0);
            assert!(verify(&s, &H).is_err(), "page {page} zeroed still validates");
        }
    }

    #[test]
    fn every_used_header_byte_corrupted_fails() {
        let slot = encode(&H, &data());
        for at in 0..HEADER_USED_BYTES {
            let mut s = slot.clone();
            s[at] ^= 0x10;
            assert!(verify(&s, &H).is_err(), "byte {at} flipped still validates");
        }
    }

    #[test]
    fn a_different_expectation_fails_with_its_reason() {
        let slot = encode(&H, &data());
        let cases = [
            (Header { volume: 7, ..H }, SlotError::Volume),
            (Header { offset: 0, ..H }, SlotError::Offset),
            (Header { generation: 41, ..H }, SlotError::Generation),
            (Header { data_len: 512, ..H }, SlotError::Geometry),
        ];
        for (want, why) in cases {
            assert_eq!(verify(&slot, &want), Err(why));
        }
        assert_eq!(verify(&slot[..100], &H), Err(SlotError::Length));
    }

    #[test]
    fn a_data_byte_corrupted_fails() {
        let slot = encode(&H, &data());
        for at in [SLOT_HEADER_BYTES as usize, slot.len() / 2, slot.len() - 1] {
            let mut s = slot.clone();
            s[at] ^= 1;
            assert_eq!(verify(&s, &H), Err(SlotError::DataChecksum));
        }
    }
}
