use super::*;

const H: Header = Header { block_bytes: 16384, data_len: 16384, volume: 0x5eed_1234, offset: 3 * 16384, generation: 42 };
const PAGE: usize = PAGE_BYTES as usize;

fn data(h: &Header, salt: u8) -> Vec<u8> {
    (0..h.block_bytes).map(|i| (i % 251) as u8 ^ salt).collect()
}

fn head_len(h: &Header) -> usize {
    header_bytes(h.block_bytes as u64) as usize
}

/// Page `p`'s bytes and its sum's bytes in `slot`.
fn page_and_sum(h: &Header, p: usize) -> (std::ops::Range<usize>, std::ops::Range<usize>) {
    let at = header_prefix_bytes(p as u64) as usize;
    (head_len(h) + p * PAGE..head_len(h) + (p + 1) * PAGE, at..at + 8)
}

#[test]
fn the_header_is_whole_pages_and_holds_every_sum() {
    assert_eq!(header_bytes(4096), 4096);
    assert_eq!(header_bytes(64 << 10), 4096);
    assert_eq!(header_bytes(2 << 20), 8192, "48 bytes and 512 sums overflow one page");
    assert_eq!(header_bytes(4 << 20), 12288);
    for shift in 12..=22 {
        let block = 1u64 << shift;
        assert!(header_prefix_bytes(block / PAGE_BYTES) <= header_bytes(block));
    }
}

#[test]
fn round_trip() {
    for h in [H, Header { block_bytes: 4096, data_len: 1024, offset: 0, ..H }, Header { block_bytes: 4 << 20, data_len: 4 << 20, ..H }] {
        let d = data(&h, 0);
        assert_eq!(verify(&encode(&h, &d).0, &h), Ok(&d[..]));
    }
}

#[test]
fn part_of_a_slot_verifies_alone() {
    let d = data(&H, 0);
    let slot = encode(&H, &d).0;
    for (first, end) in [(0u64, 1u64), (1, 3), (3, 4), (0, 4)] {
        let head = &slot[..header_prefix_bytes(end) as usize];
        let pages = &slot[head_len(&H) + first as usize * PAGE..head_len(&H) + end as usize * PAGE];
        assert_eq!(verify_header(head, &H), Ok(()));
        assert_eq!(verify_pages(head, &H, first, pages), Ok(()));
        assert_eq!(verify_pages(&head[..head.len() - 8], &H, first, pages), Err(SlotError::Length), "a sum not read");
    }
    assert_eq!(verify_pages(&slot[..header_prefix_bytes(4) as usize], &H, 0, &slot[head_len(&H)..][..100]), Err(SlotError::Length));
}

/// The sums `encode` hands the gateway are the header's, and a hit's check of pages
/// against them passes for the fill's pages and fails for a changed one, another fill's
/// (same bytes, another generation), or too few sums.
#[test]
fn the_gateways_sums_check_pages_as_the_headers_do() {
    let d = data(&H, 0);
    let (slot, sums) = encode(&H, &d);
    assert_eq!(sums.len(), 4);
    for (p, sum) in sums.iter().enumerate() {
        assert_eq!(slot[page_and_sum(&H, p).1], sum.to_le_bytes());
    }
    for (first, end) in [(0usize, 1usize), (1, 3), (0, 4)] {
        let pages = &d[first * PAGE..end * PAGE];
        assert_eq!(check_pages(&H, first as u64, pages, &sums[first..end]), Ok(()));
        let mut changed = pages.to_vec();
        changed[PAGE - 1] ^= 1;
        assert_eq!(check_pages(&H, first as u64, &changed, &sums[first..end]), Err(SlotError::PageChecksum));
        let refill = Header { generation: 43, ..H };
        assert_eq!(check_pages(&refill, first as u64, pages, &sums[first..end]), Err(SlotError::PageChecksum));
        assert_eq!(check_pages(&H, first as u64, pages, &sums[first..end - 1]), Err(SlotError::Length));
    }
    assert_eq!(check_pages(&H, 0, &d[..100], &sums[..1]), Err(SlotError::Length));
}

#[test]
fn all_zeros_never_validate() {
    let zeros = vec![0u8; head_len(&H) + H.block_bytes as usize];
    assert_eq!(verify(&zeros, &H), Err(SlotError::Magic));
    // Zero data with a valid header validates only when the block really was zeros.
    let z = vec![0u8; H.block_bytes as usize];
    assert!(verify(&encode(&H, &z).0, &H).is_ok());
}

#[test]
fn any_zeroed_page_fails() {
    for h in [H, Header { block_bytes: 4 << 20, data_len: 4 << 20, ..H }] {
        let slot = encode(&h, &data(&h, 0)).0;
        for page in 0..slot.len() / PAGE {
            let mut s = slot.clone();
            s[page * PAGE..(page + 1) * PAGE].fill(0);
            assert!(verify(&s, &h).is_err(), "page {page} zeroed still validates");
        }
    }
}

#[test]
fn every_used_header_byte_corrupted_fails() {
    let slot = encode(&H, &data(&H, 0)).0;
    for at in 0..header_prefix_bytes(H.block_bytes as u64 / PAGE_BYTES) as usize {
        let mut s = slot.clone();
        s[at] ^= 0x10;
        assert!(verify(&s, &H).is_err(), "byte {at} flipped still validates");
    }
}

#[test]
fn a_different_expectation_fails_with_its_reason() {
    let slot = encode(&H, &data(&H, 0)).0;
    let cases = [
        (Header { volume: 7, ..H }, SlotError::Volume),
        (Header { offset: 0, ..H }, SlotError::Offset),
        (Header { generation: 41, ..H }, SlotError::Generation),
        (Header { data_len: 512, ..H }, SlotError::Geometry),
        (Header { block_bytes: 8192, ..H }, SlotError::Length),
    ];
    for (want, why) in cases {
        assert_eq!(verify(&slot, &want), Err(why));
    }
    assert_eq!(verify(&slot[..100], &H), Err(SlotError::Length));
    assert_eq!(verify_header(&slot[..40], &H), Err(SlotError::Length));
    assert_eq!(verify_header(&slot[..52], &H), Err(SlotError::Length), "half a sum");
}

#[test]
fn a_data_byte_corrupted_fails() {
    let slot = encode(&H, &data(&H, 0)).0;
    for at in [head_len(&H), slot.len() / 2, slot.len() - 1] {
        let mut s = slot.clone();
        s[at] ^= 1;
        assert_eq!(verify(&s, &H), Err(SlotError::PageChecksum));
    }
}

/// A page of another fill, with or without its sum, in place of ours: another generation
/// of the same block (same bytes or not), another block, another volume, another page of
/// the same fill.
#[test]
fn a_page_from_elsewhere_fails_even_with_its_sum() {
    let ours = encode(&H, &data(&H, 0)).0;
    let others = [
        (Header { generation: 43, ..H }, data(&H, 0)),
        (Header { generation: 43, ..H }, data(&H, 7)),
        (Header { offset: 5 * 16384, ..H }, data(&H, 0)),
        (Header { volume: 99, ..H }, data(&H, 0)),
    ];
    for (other, d) in &others {
        let theirs = encode(other, d).0;
        for p in 0..4 {
            let (page, sum) = page_and_sum(&H, p);
            let mut s = ours.clone();
            s[page.clone()].copy_from_slice(&theirs[page.clone()]);
            s[sum.clone()].copy_from_slice(&theirs[sum]);
            assert_eq!(verify(&s, &H), Err(SlotError::PageChecksum), "page {p} of {other:?} with its sum");
            if theirs[page.clone()] != ours[page.clone()] {
                let mut s = ours.clone();
                s[page.clone()].copy_from_slice(&theirs[page]);
                assert_eq!(verify(&s, &H), Err(SlotError::PageChecksum), "page {p} of {other:?}");
            }
        }
    }
    // Pages 0 and 1 swapped with their sums: same fill, wrong place.
    let mut s = ours.clone();
    let ((p0, s0), (p1, s1)) = (page_and_sum(&H, 0), page_and_sum(&H, 1));
    s[p0.clone()].copy_from_slice(&ours[p1.clone()]);
    s[p1].copy_from_slice(&ours[p0]);
    s[s0.clone()].copy_from_slice(&ours[s1.clone()]);
    s[s1].copy_from_slice(&ours[s0]);
    assert_eq!(verify(&s, &H), Err(SlotError::PageChecksum));
}

#[test]
fn a_zero_page_with_a_zero_sum_fails() {
    let (page, sum) = page_and_sum(&H, 2);
    let mut s = encode(&H, &data(&H, 0)).0;
    s[page].fill(0);
    s[sum].fill(0);
    assert_eq!(verify(&s, &H), Err(SlotError::PageChecksum));
}
