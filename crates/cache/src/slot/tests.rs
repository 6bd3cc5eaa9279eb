use super::*;

const O: Origin = Origin { volume: 0x5eed_1234, offset: 3 * 16384, generation: 42 };
const BLOCK: usize = 16384;
const PAGE: usize = PAGE_BYTES as usize;

fn data(salt: u8) -> Vec<u8> {
    (0..BLOCK).map(|i| (i % 251) as u8 ^ salt).collect()
}

fn check(o: &Origin, first: usize, pages: &[u8], sums: &[u64]) -> Result<(), PageError> {
    check_pages(o, first as u64, pages, &sums[first..first + pages.len() / PAGE])
}

#[test]
fn a_fills_pages_check_alone_or_together() {
    let d = data(0);
    let sums = page_sums(&O, &d);
    assert_eq!(sums.len(), 4);
    for (first, end) in [(0usize, 1usize), (1, 3), (3, 4), (0, 4)] {
        assert_eq!(check(&O, first, &d[first * PAGE..end * PAGE], &sums), Ok(()));
    }
    assert_eq!(page_sums(&O, &vec![0; 4 << 20]).len(), 1024);
}

#[test]
fn not_whole_pages_or_not_a_sum_each_fail() {
    let d = data(0);
    let sums = page_sums(&O, &d);
    assert_eq!(check_pages(&O, 0, &d[..100], &sums[..1]), Err(PageError::Length));
    assert_eq!(check_pages(&O, 0, &d[..2 * PAGE], &sums[..1]), Err(PageError::Length));
    assert_eq!(check_pages(&O, 0, &d[..PAGE], &sums[..2]), Err(PageError::Length));
}

#[test]
fn a_changed_byte_fails() {
    let d = data(0);
    let sums = page_sums(&O, &d);
    for at in [0, PAGE - 1, BLOCK / 2, BLOCK - 1] {
        let mut c = d.clone();
        c[at] ^= 1;
        assert_eq!(check(&O, 0, &c, &sums), Err(PageError::Mismatch), "byte {at}");
    }
}

/// A page a member dropped, or a member restarted empty, reads as zeros: a miss, unless the
/// fill wrote zeros there.
#[test]
fn a_zeroed_page_fails_unless_the_fill_wrote_zeros() {
    let d = data(0);
    let sums = page_sums(&O, &d);
    for p in 0..4 {
        let mut c = d.clone();
        c[p * PAGE..(p + 1) * PAGE].fill(0);
        assert_eq!(check(&O, 0, &c, &sums), Err(PageError::Mismatch), "page {p} zeroed");
    }
    let zeros = vec![0u8; BLOCK];
    assert_eq!(check(&O, 0, &zeros, &page_sums(&O, &zeros)), Ok(()));
}

/// A slot another fill wrote (an old write landing late, a refill, another block, another
/// volume or gateway) or a page in another place fails our sums unless its bytes are ours.
#[test]
fn pages_of_another_fill_or_place_fail() {
    let d = data(0);
    let sums = page_sums(&O, &d);
    for other in [Origin { generation: 43, ..O }, Origin { offset: 5 * 16384, ..O }, Origin { volume: 99, ..O }] {
        // Our bytes checked under another fill's seed: the sums name ours only.
        assert_eq!(check(&other, 0, &d, &sums), Err(PageError::Mismatch), "{other:?}");
        // That fill's bytes in our slot.
        let theirs = data(7);
        assert_eq!(check(&O, 0, &theirs, &sums), Err(PageError::Mismatch));
        // Even with that fill's sums beside them, checked for ours: equal data only.
        let their_sums = page_sums(&other, &d);
        assert!(sums.iter().zip(&their_sums).all(|(a, b)| a != b), "one sum per fill: {other:?}");
    }
    // Pages 0 and 1 swapped: the same fill's bytes, in the wrong place.
    let mut swapped = d.clone();
    swapped[..PAGE].copy_from_slice(&d[PAGE..2 * PAGE]);
    swapped[PAGE..2 * PAGE].copy_from_slice(&d[..PAGE]);
    assert_eq!(check(&O, 0, &swapped, &sums), Err(PageError::Mismatch));
    // Page 1 checked as if it were page 0.
    assert_eq!(check_pages(&O, 0, &d[PAGE..2 * PAGE], &sums[1..2]), Err(PageError::Mismatch));
}
