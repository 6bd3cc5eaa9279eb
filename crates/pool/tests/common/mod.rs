//! A coordinator driven over members kept in memory (byte vectors, the metadata area
//! included), for tests that hold chosen operations back: shared by the review tests.
#![allow(dead_code)]

use sluice_pool::*;
use std::collections::HashMap;

pub const MB: u64 = 1 << 20;
pub const DATA: u64 = 16 * MB;

/// Members as byte vectors (metadata area included); the shadow is pushed when it comes.
pub struct W {
    pub c: Coordinator,
    pub disks: Vec<Vec<u8>>,
    pub pending: Vec<(OpId, usize, MemberCmd, Data)>,
    pub copies: HashMap<CopyId, Vec<u8>>,
    pub reads: HashMap<ReqId, Vec<u8>>,
    pub writes: HashMap<ReqId, Vec<u8>>,
    pub done: HashMap<ReqId, Result<(), Failure>>,
    pub swaps: Vec<(usize, usize)>,
    pub spares_taken: Vec<usize>,
    pub now: u64,
}

impl W {
    pub fn pump(&mut self) {
        while let Some(a) = self.c.poll() {
            match a {
                Action::Member { op, member, cmd, data } => self.pending.push((op, member, cmd, data)),
                Action::Complete { req, result } => {
                    self.done.insert(req, result);
                }
                Action::Release { copy } => {
                    self.copies.remove(&copy);
                }
                Action::Swap { member, shadow } => {
                    assert_eq!(shadow + 1, self.disks.len());
                    let d = self.disks.pop().unwrap();
                    self.disks[member] = d;
                    self.swaps.push((member, shadow));
                }
                Action::SpareTaken { member, .. } => self.spares_taken.push(member),
                Action::Compare { id, copies } => {
                    let first = self.copies[&copies[0]].clone();
                    let diffs = copies[1..].iter().map(|c| sluice_pool::coordinator::differing_ranges(&first, &self.copies[c])).collect();
                    self.c.compared(id, Ok(diffs), self.now);
                }
                _ => {}
            }
        }
    }

    /// Carries out pending op `i`.
    pub fn run(&mut self, i: usize) {
        let (op, m, cmd, data) = self.pending.remove(i);
        let out = match (cmd, data) {
            (MemberCmd::Read { offset, len }, Data::Meta) => OpOutcome::Data(self.disks[m][offset as usize..(offset + len) as usize].to_vec()),
            (MemberCmd::Read { offset, len }, Data::Copy(id)) => {
                self.copies.insert(id, self.disks[m][offset as usize..(offset + len) as usize].to_vec());
                OpOutcome::Done
            }
            (MemberCmd::Read { offset, len }, Data::Request { req, at }) => {
                let b = self.disks[m][offset as usize..(offset + len) as usize].to_vec();
                let buf = self.reads.get_mut(&req).unwrap();
                buf[at as usize..(at + len) as usize].copy_from_slice(&b);
                OpOutcome::Done
            }
            (MemberCmd::Write { offset, len, .. }, d) => {
                let b = match d {
                    Data::Bytes(b) => b,
                    Data::Copy(id) => self.copies[&id].clone(),
                    Data::Request { req, at } => self.writes[&req][at as usize..(at + len) as usize].to_vec(),
                    _ => unreachable!(),
                };
                self.disks[m][offset as usize..offset as usize + b.len()].copy_from_slice(&b);
                OpOutcome::Done
            }
            _ => OpOutcome::Done,
        };
        self.c.handle(op, out, self.now);
        self.pump();
    }

    /// Runs every pending op but those `hold` keeps.
    pub fn settle(&mut self, hold: impl Fn(&(OpId, usize, MemberCmd, Data)) -> bool) {
        for _ in 0..100_000 {
            self.pump();
            let Some(i) = self.pending.iter().position(|p| !hold(p)) else { return };
            self.run(i);
        }
        panic!("runaway");
    }

    pub fn tick(&mut self, dt: u64) {
        self.now += dt;
        self.c.tick(self.now);
        self.pump();
    }

    pub fn read(&mut self, offset: u64, len: u64, hold: impl Fn(&(OpId, usize, MemberCmd, Data)) -> bool) -> Vec<u8> {
        let id = self.c.submit(Command::Read { offset, len }, self.now);
        self.reads.insert(id, vec![0; len as usize]);
        self.pump();
        self.settle(hold);
        assert!(matches!(self.done.get(&id), Some(Ok(()))), "read failed: {:?}", self.done.get(&id));
        self.reads.remove(&id).unwrap()
    }

    pub fn found(&self, m: usize) -> Found {
        Found { size: self.disks[m].len() as u64, meta: self.disks[m][..MB as usize].to_vec(), read_only: false }
    }
}
