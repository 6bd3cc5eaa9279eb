//! What a read may return: per 512-byte sector, the history of its writes (the generator
//! never has two writes of one sector in flight at once, so they are ordered), each with
//! the event it started at and the one it was acknowledged at. A read that started at event
//! `s` may return a version whose write started before the reply, unless a later write of
//! the sector was acknowledged before `s`: never older than the last acknowledged write,
//! and a write in flight may read either way.

use std::collections::BTreeMap;

pub const SECTOR: u64 = 512;

#[derive(Clone, Copy, Debug)]
struct Version {
    version: u64,
    started: u64,
    acked: Option<u64>,
    /// The write failed: it may or may not have landed, and does not hide what came before.
    failed: bool,
}

#[derive(Default)]
pub struct Model {
    sectors: BTreeMap<u64, Vec<Version>>,
    /// Sectors with a write (zero, trim) in flight.
    busy: BTreeMap<u64, u64>,
    next_version: u64,
}

/// The bytes of a sector holding `version` (0: zeros, as a trim or zero leaves it).
pub fn sector_bytes(version: u64) -> Vec<u8> {
    version.to_le_bytes().repeat((SECTOR / 8) as usize)
}

fn sector_version(bytes: &[u8]) -> Option<u64> {
    let v = u64::from_le_bytes(bytes[..8].try_into().expect("eight bytes"));
    bytes.chunks(8).all(|w| w == v.to_le_bytes()).then_some(v)
}

impl Model {
    /// Whether `offset..offset + len` has no write in flight (a write may start there).
    pub fn free(&self, offset: u64, len: u64) -> bool {
        self.busy.range(offset / SECTOR..(offset + len) / SECTOR).next().is_none()
    }

    /// A write of `len` bytes at `offset` starts at event `at`: `zero` for zero or trim.
    /// Returns the versions, one per sector.
    pub fn write_started(&mut self, offset: u64, len: u64, zero: bool, at: u64) -> Vec<u64> {
        let mut versions = Vec::new();
        for s in offset / SECTOR..(offset + len) / SECTOR {
            let version = if zero { 0 } else { self.fresh() };
            let history = self.sectors.entry(s).or_insert_with(|| vec![Version { version: 0, started: 0, acked: Some(0), failed: false }]);
            history.push(Version { version, started: at, acked: None, failed: false });
            assert!(self.busy.insert(s, version).is_none(), "two writes of sector {s} in flight");
            versions.push(version);
        }
        versions
    }

    fn fresh(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    /// The write was replied at event `at`: acknowledged (`ok`) or failed.
    pub fn write_acked(&mut self, offset: u64, len: u64, at: u64, ok: bool) {
        for s in offset / SECTOR..(offset + len) / SECTOR {
            self.busy.remove(&s);
            let last = self.sectors.get_mut(&s).and_then(|h| h.last_mut()).expect("a started write");
            last.acked = Some(at);
            last.failed = !ok;
        }
    }

    /// Checks a read of `offset..` started at event `started`, replied now (event `now`).
    pub fn check_read(&self, offset: u64, data: &[u8], started: u64, now: u64) -> Result<(), String> {
        for (i, bytes) in data.chunks(SECTOR as usize).enumerate() {
            let s = offset / SECTOR + i as u64;
            let got = sector_version(bytes).ok_or_else(|| format!("sector {s}: torn or foreign bytes"))?;
            let allowed = self.allowed(s, started, now);
            if !allowed.contains(&got) {
                return Err(format!("sector {s} read version {got}, allowed {allowed:?} (read started at event {started})"));
            }
        }
        Ok(())
    }

    fn allowed(&self, s: u64, started: u64, now: u64) -> Vec<u64> {
        let Some(h) = self.sectors.get(&s) else { return vec![0] };
        let superseded = |i: usize| h[i + 1..].iter().any(|later| !later.failed && later.acked.is_some_and(|a| a < started));
        (0..h.len()).filter(|&i| h[i].started < now && !superseded(i)).map(|i| h[i].version).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_after_an_ack_sees_only_the_new_version() {
        let mut m = Model::default();
        let v = m.write_started(0, 512, false, 1)[0];
        assert!(m.check_read(0, &sector_bytes(0), 2, 3).is_ok(), "in flight: old allowed");
        assert!(m.check_read(0, &sector_bytes(v), 2, 3).is_ok(), "in flight: new allowed");
        m.write_acked(0, 512, 4, true);
        assert!(m.check_read(0, &sector_bytes(0), 3, 5).is_ok(), "started before the ack: old allowed");
        assert!(m.check_read(0, &sector_bytes(0), 5, 6).is_err(), "started after the ack: old refused");
        assert!(m.check_read(0, &sector_bytes(v), 5, 6).is_ok());
    }

    #[test]
    fn a_failed_write_leaves_either_version() {
        let mut m = Model::default();
        let v = m.write_started(0, 512, false, 1)[0];
        m.write_acked(0, 512, 2, false);
        assert!(m.check_read(0, &sector_bytes(0), 3, 4).is_ok());
        assert!(m.check_read(0, &sector_bytes(v), 3, 4).is_ok());
    }

    #[test]
    fn torn_sectors_are_refused() {
        let m = Model::default();
        let mut b = sector_bytes(0);
        b[100] = 1;
        assert!(m.check_read(0, &b, 0, 1).is_err());
    }
}
