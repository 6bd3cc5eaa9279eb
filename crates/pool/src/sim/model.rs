//! What the volume may read back: per 4 KiB sector, the one version an acknowledged write
//! left, or the versions a failed or interrupted write may have left. A read that returns
//! one of several possible versions settles it: later reads must agree.

use std::collections::BTreeMap;

use super::member::SECTOR;

#[derive(Clone, Debug, PartialEq, Eq)]
enum Allowed {
    Exact(u64),
    Either(Vec<u64>),
    /// The copies differ here behind the coordinator's back (a scrub test flipped one):
    /// a read may return any of these, each time, until a repair makes them equal.
    Diverged(Vec<u64>),
}

pub struct Model {
    sectors: BTreeMap<u64, Allowed>,
    /// Sectors with a request in flight: the generator keeps requests apart.
    busy: BTreeMap<u64, u32>,
    next_version: u64,
}

impl Model {
    pub fn new() -> Model {
        Model { sectors: BTreeMap::new(), busy: BTreeMap::new(), next_version: 0 }
    }

    fn get(&self, s: u64) -> Allowed {
        self.sectors.get(&s).cloned().unwrap_or(Allowed::Exact(0))
    }

    pub fn free(&self, offset: u64, len: u64) -> bool {
        self.busy.range(offset / SECTOR..(offset + len) / SECTOR).next().is_none()
    }

    pub fn hold(&mut self, offset: u64, len: u64) {
        for s in offset / SECTOR..(offset + len) / SECTOR {
            *self.busy.entry(s).or_default() += 1;
        }
    }

    pub fn release(&mut self, offset: u64, len: u64) {
        for s in offset / SECTOR..(offset + len) / SECTOR {
            if let Some(n) = self.busy.get_mut(&s) {
                *n -= 1;
                if *n == 0 {
                    self.busy.remove(&s);
                }
            }
        }
    }

    /// Fresh versions for a write of `len` bytes.
    pub fn versions(&mut self, len: u64) -> Vec<u64> {
        (0..len / SECTOR)
            .map(|_| {
                self.next_version += 1;
                self.next_version
            })
            .collect()
    }

    /// A write (or zero: all versions 0) was acknowledged, or not (`ok` false: it may or
    /// may not have landed, on any copy).
    pub fn wrote(&mut self, offset: u64, versions: &[u64], ok: bool) {
        for (i, &v) in versions.iter().enumerate() {
            let s = offset / SECTOR + i as u64;
            let next = match (ok, self.get(s)) {
                (true, _) => Allowed::Exact(v),
                (false, Allowed::Exact(old)) if old == v => Allowed::Exact(v),
                (false, Allowed::Exact(old)) => Allowed::Either(vec![old, v]),
                (false, Allowed::Either(mut vs) | Allowed::Diverged(mut vs)) => {
                    if !vs.contains(&v) {
                        vs.push(v);
                    }
                    Allowed::Either(vs)
                }
            };
            self.sectors.insert(s, next);
        }
    }

    /// Checks a read; settles sectors that had several possible versions.
    pub fn read(&mut self, offset: u64, got: &[u64]) -> Result<(), String> {
        for (i, &v) in got.iter().enumerate() {
            let s = offset / SECTOR + i as u64;
            match self.get(s) {
                Allowed::Exact(x) if x == v => {}
                Allowed::Either(vs) if vs.contains(&v) => {
                    self.sectors.insert(s, Allowed::Exact(v));
                }
                Allowed::Diverged(vs) if vs.contains(&v) => {}
                want => return Err(format!("volume sector {s} read version {v}, but {want:?} was allowed")),
            }
        }
        Ok(())
    }

    /// Volume sector `s` now reads as its old version on some copies and `v` on others.
    pub fn diverge(&mut self, s: u64, v: u64) {
        let old = match self.get(s) {
            Allowed::Exact(x) => vec![x],
            Allowed::Either(vs) | Allowed::Diverged(vs) => vs,
        };
        self.sectors.insert(s, Allowed::Diverged([old, vec![v]].concat()));
    }

    /// A repair made the copies of sector `s` equal: one of the versions, to be settled by
    /// the next read.
    pub fn converge(&mut self, s: u64) {
        if let Allowed::Diverged(vs) = self.get(s) {
            self.sectors.insert(s, Allowed::Either(vs));
        }
    }

    /// A fresh version no write uses.
    pub fn fresh(&mut self) -> u64 {
        self.next_version += 1;
        self.next_version
    }
}
