//! What a read may return: per 512-byte sector, the versions the backing held, in the order
//! the writes landed there (the simulated backing tells the model when each lands, so
//! overlapping writes in flight at once are ordered as the backing ordered them, and a
//! failed write that did not land is never a version). A read that started at event `s`
//! may return a version that landed before its reply, unless a write that landed after it,
//! itself landed before `s`, was replied (acknowledged, or failed) before `s`: never older
//! than the last acknowledged write, nor than a failed one that had landed when the read
//! started, and never what the backing never held.

use std::collections::BTreeMap;

pub const SECTOR: u64 = 512;

/// A write, zero or trim the clients issued.
#[derive(Clone, Copy, Debug)]
struct Write {
    /// The event of its reply (acknowledged or failed), once replied.
    replied: Option<u64>,
    landed: bool,
}

/// A version of a sector the backing held: its bytes' version and the write that put it
/// there (None: the volume's initial zeros).
#[derive(Clone, Copy, Debug)]
struct Landed {
    version: u64,
    write: Option<usize>,
    /// The event it landed at.
    at: u64,
}

#[derive(Default)]
pub struct Model {
    writes: Vec<Write>,
    /// Each write's sector versions (0 for a zero or trim), by write id.
    versions: Vec<(u64, Vec<u64>)>,
    sectors: BTreeMap<u64, Vec<Landed>>,
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
    /// A write of `len` bytes at `offset` starts: `zero` for zero or trim. Returns its id
    /// and its versions, one per sector. Writes of a sector may overlap in flight.
    pub fn write_started(&mut self, offset: u64, len: u64, zero: bool) -> (usize, Vec<u64>) {
        let versions: Vec<u64> = (offset / SECTOR..(offset + len) / SECTOR).map(|_| if zero { 0 } else { self.fresh() }).collect();
        self.writes.push(Write { replied: None, landed: false });
        self.versions.push((offset / SECTOR, versions.clone()));
        (self.writes.len() - 1, versions)
    }

    fn fresh(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }

    /// Write `w` landed on the backing at event `at` (whole: the simulated backing applies
    /// an operation at once), after every write that landed before. A failed write may land
    /// after its reply (its connection died with it on the way).
    pub fn write_landed(&mut self, w: usize, at: u64) {
        self.writes[w].landed = true;
        let (first, versions) = &self.versions[w];
        for (i, &version) in versions.iter().enumerate() {
            let history = self.sectors.entry(first + i as u64).or_insert_with(|| vec![Landed { version: 0, write: None, at: 0 }]);
            history.push(Landed { version, write: Some(w), at });
        }
    }

    /// Write `w` was replied at event `at`: acknowledged (`ok`), which it may be only once
    /// the backing has it, or failed.
    pub fn write_replied(&mut self, w: usize, at: u64, ok: bool) -> Result<(), String> {
        assert!(self.writes[w].replied.replace(at).is_none(), "write {w} replied twice");
        match ok && !self.writes[w].landed {
            true => Err(format!("write {w} acknowledged before the backing had it")),
            false => Ok(()),
        }
    }

    /// Checks a read of `offset..` started at event `started`, replied now.
    pub fn check_read(&self, offset: u64, data: &[u8], started: u64) -> Result<(), String> {
        for (i, bytes) in data.chunks(SECTOR as usize).enumerate() {
            let s = offset / SECTOR + i as u64;
            let got = sector_version(bytes).ok_or_else(|| format!("sector {s}: torn or foreign bytes"))?;
            let allowed = self.allowed(s, started);
            if !allowed.contains(&got) {
                return Err(format!("sector {s} read version {got}, allowed {allowed:?} (read started at event {started})"));
            }
        }
        Ok(())
    }

    /// Versions that landed (so before the reply) and that no write landing after them,
    /// before `started`, and replied before `started` replaced.
    fn allowed(&self, s: u64, started: u64) -> Vec<u64> {
        let Some(h) = self.sectors.get(&s) else { return vec![0] };
        let replaced_before_start = |l: &Landed| {
            l.at < started && l.write.is_some_and(|w| self.writes[w].replied.is_some_and(|at| at < started))
        };
        let last = h.iter().rposition(replaced_before_start).unwrap_or(0);
        h[last..].iter().map(|l| l.version).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_read_after_an_ack_sees_only_the_new_version() {
        let mut m = Model::default();
        let (w, v) = m.write_started(0, 512, false);
        assert!(m.check_read(0, &sector_bytes(0), 2).is_ok(), "in flight: old allowed");
        assert!(m.check_read(0, &sector_bytes(v[0]), 2).is_err(), "not landed: new refused");
        m.write_landed(w, 1);
        assert!(m.check_read(0, &sector_bytes(v[0]), 2).is_ok(), "landed: new allowed");
        m.write_replied(w, 4, true).unwrap();
        assert!(m.check_read(0, &sector_bytes(0), 3).is_ok(), "started before the ack: old allowed");
        assert!(m.check_read(0, &sector_bytes(0), 5).is_err(), "started after the ack: old refused");
        assert!(m.check_read(0, &sector_bytes(v[0]), 5).is_ok());
    }

    #[test]
    fn a_failed_write_is_a_version_only_if_it_landed() {
        let mut m = Model::default();
        let (w, v) = m.write_started(0, 512, false);
        assert!(m.write_replied(w, 2, false).is_ok(), "a failed write need not have landed");
        assert!(m.check_read(0, &sector_bytes(0), 3).is_ok());
        assert!(m.check_read(0, &sector_bytes(v[0]), 3).is_err(), "never landed");
        let (w, v) = m.write_started(512, 512, false);
        m.write_landed(w, 1);
        m.write_replied(w, 2, false).unwrap();
        assert!(m.check_read(512, &sector_bytes(v[0]), 3).is_ok());
        assert!(m.check_read(512, &sector_bytes(0), 3).is_err(), "the backing moved on");
    }

    #[test]
    fn a_failed_write_landing_after_its_reply_is_the_version_from_then_on() {
        let mut m = Model::default();
        let (w, v) = m.write_started(0, 512, false);
        m.write_replied(w, 2, false).unwrap();
        m.write_landed(w, 4);
        assert!(m.check_read(0, &sector_bytes(0), 3).is_ok(), "started before it landed: old allowed");
        assert!(m.check_read(0, &sector_bytes(v[0]), 3).is_ok(), "landed before the read's reply");
        assert!(m.check_read(0, &sector_bytes(0), 5).is_err(), "started after it landed: old refused");
        assert!(m.check_read(0, &sector_bytes(v[0]), 5).is_ok());
    }

    #[test]
    fn overlapping_writes_order_as_they_landed() {
        let mut m = Model::default();
        let (a, va) = m.write_started(0, 512, false);
        let (b, vb) = m.write_started(0, 512, false);
        m.write_landed(b, 1);
        m.write_landed(a, 2);
        m.write_replied(a, 3, true).unwrap();
        assert!(m.check_read(0, &sector_bytes(vb[0]), 4).is_err(), "a landed last and was acknowledged");
        assert!(m.check_read(0, &sector_bytes(va[0]), 4).is_ok());
        m.write_replied(b, 5, true).unwrap();
        assert!(m.check_read(0, &sector_bytes(vb[0]), 6).is_err(), "b's ack does not bring it back");
        assert!(m.check_read(0, &sector_bytes(va[0]), 6).is_ok());
    }

    #[test]
    fn an_ack_before_the_write_landed_is_refused() {
        let mut m = Model::default();
        let (w, _) = m.write_started(0, 512, false);
        assert!(m.write_replied(w, 2, true).is_err());
    }

    #[test]
    fn torn_sectors_are_refused() {
        let m = Model::default();
        let mut b = sector_bytes(0);
        b[100] = 1;
        assert!(m.check_read(0, &b, 1).is_err());
    }
}
