//! What a member holds, and how a hit trusts it. A member is a RAM export cut into slots of
//! exactly one block, slot `i` at `i * block_bytes`: the block's bytes as the fill read
//! them from the backing (the short last block padded with zeros), nothing else. The member
//! keeps no description of the slot; the gateway keeps it all, in its directory: which
//! block of the volume a slot holds, the generation of the fill that wrote it (the
//! gateway's counter, new for every fill), and one sum per 4 KiB page of the block:
//! xxh3-64 of the page, seeded with `page_seed(identity, offset, generation, page)`
//! (`page_sums`, computed by the fill from the bytes it writes).
//!
//! A hit reads just the pages it needs and checks each against the directory's sum for it
//! (`check_pages`), seeded as the directory's entry says. The reference lives in the
//! gateway, which a member cannot alter, and it is the sums of exactly the fill the entry
//! names, so a page that matches holds that fill's bytes (zeros only where the fill wrote
//! zeros), up to a 2^-64 chance per page, whatever the member did. A member cannot forge a
//! match: it never sees the sums, and a page that matches them is the fill's data, which is
//! then correct data.
//!
//! A member may change any page behind the gateway's back: an elastic member drops pages
//! (they read back as zeros), a restarted one is all zeros, an old write lands late,
//! another gateway (another volume, or this one's earlier run) writes its own blocks over
//! ours. Each is a miss: those bytes were not this fill's, so their pages do not hash to its
//! sums, and the hit reads the backing. The seed is a second line: it binds a sum to its
//! fill (volume identity, the block's offset, generation) and page, so should the gateway
//! ever check a page against another fill's sums (a bug: the entry and its sums out of
//! step), no page of another fill, block, volume or place matches them unless its bytes are
//! equal to this fill's page, which is then correct data.

use xxhash_rust::xxh3::xxh3_64_with_seed;

use crate::limits::PAGE_BYTES;

/// The fill a slot's pages come from: what their sums are seeded with.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Origin {
    /// The volume's identity: random, chosen each time the cache starts.
    pub volume: u64,
    /// The block's offset in the volume.
    pub offset: u64,
    /// The gateway's counter, new for every fill.
    pub generation: u64,
}

/// Why pages did not check: each is a miss, counted as a verify failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PageError {
    /// Not whole pages, or not one sum per page.
    Length,
    /// A page's bytes are not the fill's.
    Mismatch,
}

/// The seed of page `page`'s sum: a hash of where and when the page was written, so a sum
/// matches only this fill's page `page` of this block of this volume.
fn page_seed(o: &Origin, page: u64) -> u64 {
    let mut key = [0u8; 24];
    key[0..8].copy_from_slice(&o.offset.to_le_bytes());
    key[8..16].copy_from_slice(&o.generation.to_le_bytes());
    key[16..24].copy_from_slice(&page.to_le_bytes());
    xxh3_64_with_seed(&key, o.volume)
}

fn page_sum(o: &Origin, page: u64, bytes: &[u8]) -> u64 {
    xxh3_64_with_seed(bytes, page_seed(o, page))
}

/// The sums of the pages of `data`, a whole block a fill writes to its slot: the gateway's
/// copy, which the directory keeps once the slot is installed and hits check pages against.
pub fn page_sums(o: &Origin, data: &[u8]) -> Vec<u64> {
    assert!((data.len() as u64).is_multiple_of(PAGE_BYTES), "a slot holds whole pages");
    data.chunks(PAGE_BYTES as usize).enumerate().map(|(i, page)| page_sum(o, i as u64, page)).collect()
}

/// Checks `pages`, the block's whole pages from page `first`, against `sums`, the sums
/// `page_sums` gave for those pages: a hit's check.
pub fn check_pages(o: &Origin, first: u64, pages: &[u8], sums: &[u64]) -> Result<(), PageError> {
    let n = pages.len() as u64;
    if !n.is_multiple_of(PAGE_BYTES) || n / PAGE_BYTES != sums.len() as u64 {
        return Err(PageError::Length);
    }
    for (i, (page, &sum)) in pages.chunks(PAGE_BYTES as usize).zip(sums).enumerate() {
        if page_sum(o, first + i as u64, page) != sum {
            return Err(PageError::Mismatch);
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests;
