//! Scrub results without a coordinator: a report from what the superblocks record (no
//! ranges: only counts are kept), and the comparison a driver makes of two copies.

use super::api::ScrubReport;
use crate::meta::Superblock;
use crate::scrub_record::ScrubRecord;

/// The newest scrub record among the superblocks.
pub(super) fn newest_record(sbs: &[Option<Superblock>]) -> Option<ScrubRecord> {
    sbs.iter().flatten().filter_map(|sb| sb.scrub).max_by_key(|r| r.finished_wall_ms)
}

pub(super) fn from_record(r: &ScrubRecord) -> ScrubReport {
    ScrubReport {
        repair: r.repair,
        running: false,
        done_bytes: r.compared_bytes,
        total_bytes: r.compared_bytes,
        mismatched_regions: r.mismatched_regions,
        repaired_regions: r.repaired_regions,
        finished_wall_ms: Some(r.finished_wall_ms),
        error: r.partial.then(|| "it ended before every set was compared".to_string()),
        ..ScrubReport::default()
    }
}

/// The last scrub the superblocks record, for `pool status` without assembling.
pub(super) fn recorded(sbs: &[Option<Superblock>]) -> Option<ScrubReport> {
    newest_record(sbs).map(|r| from_record(&r))
}

/// Byte ranges (start, end) where `b` differs from `a`, merged; bytes past the shorter one
/// count as differing.
pub fn differing_ranges(a: &[u8], b: &[u8]) -> Vec<(u64, u64)> {
    const BLOCK: usize = 4096;
    let mut out: Vec<(u64, u64)> = Vec::new();
    let mut push = |s: usize, e: usize| match out.last_mut() {
        Some(last) if last.1 == s as u64 => last.1 = e as u64,
        _ => out.push((s as u64, e as u64)),
    };
    let n = a.len().min(b.len());
    for at in (0..n).step_by(BLOCK) {
        let end = (at + BLOCK).min(n);
        if a[at..end] == b[at..end] {
            continue;
        }
        let mut i = at;
        while i < end {
            if a[i] == b[i] {
                i += 1;
                continue;
            }
            let s = i;
            while i < end && a[i] != b[i] {
                i += 1;
            }
            push(s, i);
        }
    }
    if a.len() != b.len() {
        push(n, a.len().max(b.len()));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn differences_are_exact_and_merged() {
        let a = vec![7u8; 10_000];
        let mut b = a.clone();
        assert!(differing_ranges(&a, &b).is_empty());
        b[5] = 0;
        b[6] = 0;
        b[4095] = 1;
        b[4096] = 1;
        b[9_000] = 3;
        assert_eq!(differing_ranges(&a, &b), vec![(5, 7), (4095, 4097), (9_000, 9_001)]);
        assert_eq!(differing_ranges(&a, &a[..9_999]), vec![(9_999, 10_000)]);
    }
}
