//! The slot format on a member: a member is a RAM export cut into slots of
//! `header_bytes(block) + block` bytes, slot `i` at `i * slot_bytes`. The header (whole
//! pages, so the block stays page-aligned) says which block of which volume the data is,
//! when it was written, and what each of its pages holds:
//!
//! | bytes          | field                                                        |
//! |----------------|--------------------------------------------------------------|
//! | 0..8           | magic `SLCACHE2`                                             |
//! | 8..12          | block size in bytes (u32 LE)                                 |
//! | 12..16         | bytes of the block inside the volume (u32 LE; the last is short) |
//! | 16..24         | volume identity: random, chosen each time the cache starts   |
//! | 24..32         | the block's offset in the volume                             |
//! | 32..40         | generation: the gateway's counter, new for every fill        |
//! | 40..48         | xxh3-64 of bytes 0..40                                       |
//! | 48 + 8i..+8    | page `i`'s sum: xxh3-64 of the block's page `i` (4 KiB), seeded with `page_seed(volume, offset, generation, i)` |
//! | the rest       | zero, not read                                               |
//!
//! Why each: a member may lose any page of a slot behind the gateway's back (an elastic
//! member punches holes, a restarted one is all zeros, an old write may land late), so
//! nothing read back from a slot is taken unchecked. When a whole slot is checked
//! (`verify`), the magic and the header checksum make an all-zero or torn header fail; the
//! identity makes a slot left by an earlier run or by another volume fail; offset and
//! generation make a slot reused for another block (or refilled for the same one) fail for
//! a read that expected the older fill. None of those fields can be zero in a valid header
//! (magic, identity and block size are never zero).
//!
//! A hit reads no header: `encode` hands the fill its page sums too, the directory keeps
//! them for the slot from the moment it installs the block, and a hit reads just the pages
//! it needs and checks each against the directory's copy (`check_pages`), seeded with
//! (identity, offset, generation, page index) as the directory says. That is at least as
//! strong as checking the header and the sums written beside the pages: the reference
//! lives in the gateway, which a member cannot alter, and it is the sums of exactly the
//! fill the directory's entry names, so a page that matches holds that fill's bytes (zeros
//! only where the fill wrote zeros), up to a 2^-64 chance, whatever the member did to the
//! header or the pages. The seed is then a second line: should the copy ever be another
//! fill's than the entry's, its sums were hashed under that fill's seed, so no page
//! matches them under the entry's, and the hit is a miss.
//!
//! The header is still written with every fill: it is the slot's description of itself,
//! which `verify` checks for a whole slot read back without the gateway's copy (the tests
//! below hold it to that). There the page sums come from the member, unchecksummed: the
//! fixed fields name exactly one fill of this run (generations are never reused), and a
//! sum and a page that both come from elsewhere (another block, another generation,
//! another volume, or page `j`, with the sum written beside it) were hashed under another
//! seed, so they do not match: the seed binds each sum to its slot, fill and place.

use xxhash_rust::xxh3::{xxh3_64, xxh3_64_with_seed};

use crate::limits::PAGE_BYTES;

const MAGIC: [u8; 8] = *b"SLCACHE2";
/// Bytes of the fields before the page sums (header checksum included).
const FIXED_BYTES: u64 = 48;
const SUM_BYTES: u64 = 8;

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
    PageChecksum,
}

fn u64_at(b: &[u8], at: usize) -> u64 {
    u64::from_le_bytes(b[at..at + 8].try_into().expect("eight bytes"))
}

fn u32_at(b: &[u8], at: usize) -> u32 {
    u32::from_le_bytes(b[at..at + 4].try_into().expect("four bytes"))
}

/// Bytes of the header before a block of `block_bytes`: the fixed fields and one sum per
/// page, in whole pages (one page up to 1 MiB blocks, two for 2 MiB, three for 4 MiB).
pub fn header_bytes(block_bytes: u64) -> u64 {
    header_prefix_bytes(block_bytes / PAGE_BYTES).next_multiple_of(PAGE_BYTES)
}

/// Bytes from the header's start that hold the fixed fields and the sums of pages
/// `0..pages`.
pub fn header_prefix_bytes(pages: u64) -> u64 {
    FIXED_BYTES + pages * SUM_BYTES
}

/// The seed of page `page`'s sum: a hash of where and when the page was written, so a sum
/// matches only this fill's page `page` of this block of this volume.
fn page_seed(h: &Header, page: u64) -> u64 {
    let mut key = [0u8; 24];
    key[0..8].copy_from_slice(&h.offset.to_le_bytes());
    key[8..16].copy_from_slice(&h.generation.to_le_bytes());
    key[16..24].copy_from_slice(&page.to_le_bytes());
    xxh3_64_with_seed(&key, h.volume)
}

fn page_sum(h: &Header, page: u64, bytes: &[u8]) -> u64 {
    xxh3_64_with_seed(bytes, page_seed(h, page))
}

/// The bytes of a slot holding `data` (exactly `block_bytes`; a short last block padded
/// with zeros by the caller), and its page sums: the gateway's copy, which the directory
/// keeps once the slot is installed and hits check their pages against.
pub fn encode(h: &Header, data: &[u8]) -> (Vec<u8>, Vec<u64>) {
    assert_eq!(data.len() as u64, h.block_bytes as u64, "a slot holds a whole block");
    assert!(h.volume != 0 && h.block_bytes != 0, "zero identity or size would let zeros validate");
    let head = header_bytes(h.block_bytes as u64) as usize;
    let mut out = vec![0u8; head + data.len()];
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&h.block_bytes.to_le_bytes());
    out[12..16].copy_from_slice(&h.data_len.to_le_bytes());
    out[16..24].copy_from_slice(&h.volume.to_le_bytes());
    out[24..32].copy_from_slice(&h.offset.to_le_bytes());
    out[32..40].copy_from_slice(&h.generation.to_le_bytes());
    let sum = xxh3_64(&out[..40]);
    out[40..48].copy_from_slice(&sum.to_le_bytes());
    let sums: Vec<u64> = data.chunks(PAGE_BYTES as usize).enumerate().map(|(i, page)| page_sum(h, i as u64, page)).collect();
    for (i, sum) in sums.iter().enumerate() {
        let at = header_prefix_bytes(i as u64) as usize;
        out[at..at + 8].copy_from_slice(&sum.to_le_bytes());
    }
    out[head..].copy_from_slice(data);
    (out, sums)
}

/// Checks the start of a slot's header (`header_prefix_bytes(n)` bytes for some `n`)
/// against what the directory expects: every fixed field. The sums are checked with
/// their pages, by `verify_pages`.
pub fn verify_header(head: &[u8], want: &Header) -> Result<(), SlotError> {
    let len = head.len() as u64;
    let pages = want.block_bytes as u64 / PAGE_BYTES;
    if len < FIXED_BYTES || !(len - FIXED_BYTES).is_multiple_of(SUM_BYTES) || len > header_prefix_bytes(pages) {
        return Err(SlotError::Length);
    }
    if head[0..8] != MAGIC {
        return Err(SlotError::Magic);
    }
    if xxh3_64(&head[..40]) != u64_at(head, 40) {
        return Err(SlotError::HeaderChecksum);
    }
    if u64_at(head, 16) != want.volume {
        return Err(SlotError::Volume);
    }
    if u32_at(head, 8) != want.block_bytes || u32_at(head, 12) != want.data_len {
        return Err(SlotError::Geometry);
    }
    if u64_at(head, 24) != want.offset {
        return Err(SlotError::Offset);
    }
    if u64_at(head, 32) != want.generation {
        return Err(SlotError::Generation);
    }
    Ok(())
}

/// Checks `pages`, the block's whole pages from page `first`, against the sums in `head`
/// (a header `verify_header` passed, long enough to hold their sums).
pub fn verify_pages(head: &[u8], want: &Header, first: u64, pages: &[u8]) -> Result<(), SlotError> {
    let n = (pages.len() as u64).div_ceil(PAGE_BYTES);
    if header_prefix_bytes(first + n) > head.len() as u64 {
        return Err(SlotError::Length);
    }
    pages_match(want, first, pages, |page| u64_at(head, header_prefix_bytes(page) as usize))
}

/// Checks `pages`, the block's whole pages from page `first`, against `sums`, the sums
/// `encode` gave for those pages (the gateway's copy): a hit's check.
pub fn check_pages(want: &Header, first: u64, pages: &[u8], sums: &[u64]) -> Result<(), SlotError> {
    if (pages.len() as u64).div_ceil(PAGE_BYTES) != sums.len() as u64 {
        return Err(SlotError::Length);
    }
    pages_match(want, first, pages, |page| sums[(page - first) as usize])
}

/// Whether each whole page of `pages` (the block's from page `first`) hashes, under its
/// seed, to `sum(page index)`.
fn pages_match(want: &Header, first: u64, pages: &[u8], sum: impl Fn(u64) -> u64) -> Result<(), SlotError> {
    if !(pages.len() as u64).is_multiple_of(PAGE_BYTES) {
        return Err(SlotError::Length);
    }
    for (i, page) in pages.chunks(PAGE_BYTES as usize).enumerate() {
        let index = first + i as u64;
        if page_sum(want, index, page) != sum(index) {
            return Err(SlotError::PageChecksum);
        }
    }
    Ok(())
}

/// Checks a whole slot read back; the block's data on success.
pub fn verify<'a>(slot: &'a [u8], want: &Header) -> Result<&'a [u8], SlotError> {
    let head = header_bytes(want.block_bytes as u64) as usize;
    if slot.len() != head + want.block_bytes as usize {
        return Err(SlotError::Length);
    }
    let prefix = &slot[..header_prefix_bytes(want.block_bytes as u64 / PAGE_BYTES) as usize];
    verify_header(prefix, want)?;
    verify_pages(prefix, want, 0, &slot[head..])?;
    Ok(&slot[head..])
}

#[cfg(test)]
mod tests;
