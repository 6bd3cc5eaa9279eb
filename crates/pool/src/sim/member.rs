//! A simulated member: an NBD server whose data survives a process kill (the page cache
//! keeps it) but whose unflushed writes are lost on a power loss, that can stall, and whose
//! operations complete in any order.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use crate::coordinator::{Data, MemberCmd, OpId};
use crate::limits::META_BYTES;
use sluice_proto::rng::Rng;

/// Data is kept per 4 KiB sector as a version number (0: never written, reads as zeros).
pub const SECTOR: u64 = 4096;

/// An operation on its way to, or waiting in, a member.
pub struct Pending {
    pub op: OpId,
    pub cmd: MemberCmd,
    pub data: Data,
    /// Versions to write (captured when the operation was sent).
    pub payload: Vec<u64>,
    /// The connection it came on; answers on an older one are not reported.
    pub conn: u64,
    /// When the member gets to it (operations overtake each other).
    pub ready_at: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Health {
    Up,
    /// Processes nothing until then.
    Stalled { until: u64 },
    Down { until: u64 },
}

pub struct SimMember {
    pub meta: Vec<u8>,
    meta_durable: Vec<u8>,
    data: BTreeMap<u64, u64>,
    durable: BTreeMap<u64, u64>,
    unflushed: BTreeSet<u64>,
    meta_unflushed: bool,
    pub queue: VecDeque<Pending>,
    pub health: Health,
    /// The coordinator's current connection to it (bumped on each drop).
    pub conn: u64,
    /// The coordinator dropped it and has not been told it is back.
    pub dropped: bool,
    pub retry_at: u64,
    /// Fail the next operation with an I/O error.
    pub fail_next: bool,
    /// It lost power (and with it writes it had acknowledged but not flushed) and has not
    /// been rebuilt since.
    pub power_lost: bool,
    pub size: u64,
}

/// What a member did with an operation.
pub enum Done {
    Ok,
    Read(Vec<u64>),
    Meta(Vec<u8>),
    Failed,
}

impl SimMember {
    pub fn new(data_bytes: u64) -> SimMember {
        SimMember {
            meta: vec![0; META_BYTES as usize],
            meta_durable: vec![0; META_BYTES as usize],
            data: BTreeMap::new(),
            durable: BTreeMap::new(),
            unflushed: BTreeSet::new(),
            meta_unflushed: false,
            queue: VecDeque::new(),
            health: Health::Up,
            conn: 0,
            dropped: false,
            retry_at: 0,
            fail_next: false,
            power_lost: false,
            size: META_BYTES + data_bytes,
        }
    }

    pub fn sector(&self, s: u64) -> u64 {
        self.data.get(&s).copied().unwrap_or(0)
    }

    /// Carries out one operation now.
    pub fn apply(&mut self, p: &Pending) -> Done {
        if self.fail_next {
            self.fail_next = false;
            return Done::Failed;
        }
        match p.cmd {
            MemberCmd::Read { offset, len } if offset < META_BYTES => {
                Done::Meta(self.meta[offset as usize..(offset + len).min(META_BYTES) as usize].to_vec())
            }
            MemberCmd::Read { offset, len } => Done::Read(self.sectors(offset, len).map(|s| self.sector(s)).collect()),
            MemberCmd::Write { offset, len, fua } if offset < META_BYTES => {
                let Data::Bytes(bytes) = &p.data else { return Done::Failed };
                self.meta[offset as usize..(offset + len) as usize].copy_from_slice(bytes);
                self.meta_unflushed = true;
                if fua {
                    self.flush();
                }
                Done::Ok
            }
            MemberCmd::Write { offset, len, fua } => {
                let sectors: Vec<u64> = self.sectors(offset, len).collect();
                for (s, v) in sectors.into_iter().zip(p.payload.iter()) {
                    self.put(s, *v, fua);
                }
                Done::Ok
            }
            MemberCmd::Zero { offset, len, fua, .. } | MemberCmd::Trim { offset, len, fua } => {
                let sectors: Vec<u64> = self.sectors(offset, len).collect();
                for s in sectors {
                    self.put(s, 0, fua);
                }
                Done::Ok
            }
            MemberCmd::Flush => {
                self.flush();
                Done::Ok
            }
        }
    }

    fn sectors(&self, offset: u64, len: u64) -> impl Iterator<Item = u64> {
        assert!(offset >= META_BYTES && offset.is_multiple_of(SECTOR) && len.is_multiple_of(SECTOR), "data operations are whole sectors");
        assert!(offset + len <= self.size, "an operation past the member's end");
        let first = (offset - META_BYTES) / SECTOR;
        first..first + len / SECTOR
    }

    fn put(&mut self, s: u64, v: u64, fua: bool) {
        self.data.insert(s, v);
        if fua {
            self.durable.insert(s, v);
        } else {
            self.unflushed.insert(s);
        }
    }

    fn flush(&mut self) {
        for s in std::mem::take(&mut self.unflushed) {
            self.durable.insert(s, self.sector(s));
        }
        if self.meta_unflushed {
            self.meta_durable.copy_from_slice(&self.meta);
            self.meta_unflushed = false;
        }
    }

    /// The process dies: queued operations were processed or not; with `power`, what was
    /// not flushed is gone too.
    pub fn crash(&mut self, rng: &mut Rng, power: bool, until: u64) {
        for p in std::mem::take(&mut self.queue) {
            if rng.below(2) == 0 {
                self.apply(&p);
            }
        }
        if power {
            for s in std::mem::take(&mut self.unflushed) {
                match self.durable.get(&s) {
                    Some(&v) => self.data.insert(s, v),
                    None => self.data.remove(&s),
                };
            }
            self.meta.copy_from_slice(&self.meta_durable);
            self.meta_unflushed = false;
            self.power_lost = true;
        }
        self.fail_next = false;
        self.health = Health::Down { until };
    }

    /// Data sectors that differ between two members.
    pub fn differs_in(&self, other: &SimMember, sectors: std::ops::Range<u64>) -> Option<u64> {
        let keys: BTreeSet<u64> = self.data.range(sectors.clone()).chain(other.data.range(sectors)).map(|(&s, _)| s).collect();
        keys.into_iter().find(|&s| self.sector(s) != other.sector(s))
    }

    /// Changes a data sector on the medium itself (durably), as bit rot or a stray write
    /// would: the coordinator is not told.
    pub fn corrupt(&mut self, s: u64, v: u64) {
        self.data.insert(s, v);
        self.durable.insert(s, v);
        self.unflushed.remove(&s);
    }

    /// Whether data sector `s` is on the medium as it reads now (a power loss keeps it).
    pub fn durable_as_read(&self, s: u64) -> bool {
        self.durable.get(&s).copied().unwrap_or(0) == self.sector(s)
    }
}
