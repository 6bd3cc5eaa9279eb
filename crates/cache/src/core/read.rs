//! Reads: cut into blocks; a cached block is read from its slot and verified on return (a
//! failed check is a miss, read again from the backing: see `hit`); missing blocks are read from the
//! backing in runs of whole blocks, so a partial read still fills the block it touches
//! (at most one block of extra reading at each end, as nbdkit's cache filter); a block whose
//! fill is reading the backing already waits for that read.

use super::state::{OpKind, Pending, Source, Stage};
use super::Cache;
use crate::api::{BackingCmd, Failure, Outcome, ReqId};

impl Cache {
    pub(super) fn start_read(&mut self, req: ReqId, offset: u64, len: u64) {
        self.reqs.insert(req, Pending { offset, buf: vec![0; len as usize], parts: 1, error: None });
        if len > 0 {
            self.note_stream(offset, len);
            let bs = self.p.block_bytes;
            let mut run: Vec<Option<u64>> = Vec::new();
            let mut first = offset / bs;
            for b in offset / bs..(offset + len).div_ceil(bs) {
                let waitable = self.fill_of.get(&b).copied().filter(|f| {
                    let fill = &self.fills[f];
                    !fill.stale && matches!(fill.stage, Stage::Reading)
                });
                match (self.dir.get(b), waitable) {
                    (Some(e), _) => self.read_slot(req, b, e),
                    (None, Some(f)) => self.wait_fill(req, f),
                    (None, None) => {
                        if run.is_empty() {
                            first = b;
                        }
                        run.push(self.try_fill(b, Source::Demand));
                        continue;
                    }
                }
                self.read_run(req, first, std::mem::take(&mut run));
            }
            self.read_run(req, first, run);
        }
        self.part_done(req, None);
    }

    /// `req` waits for the fill's backing read: its miss is counted when the data comes,
    /// or by the backing read it makes itself if the fill cannot serve it.
    fn wait_fill(&mut self, req: ReqId, fill: u64) {
        self.reqs.get_mut(&req).expect("a pending read").parts += 1;
        self.fills.get_mut(&fill).expect("a live fill").waiters.push(req);
    }

    /// Blocks `first..first + fills.len()` from the backing for `req` (nothing if empty):
    /// whole blocks, except that an end block without a fill is read only as far as `req`
    /// needs it (so reads that cannot fill, with every member down, read no more than asked).
    pub(super) fn read_run(&mut self, req: ReqId, first: u64, fills: Vec<Option<u64>>) {
        let (Some(head), Some(tail)) = (fills.first(), fills.last()) else { return };
        for b in first..first + fills.len() as u64 {
            self.count_miss(req, b);
        }
        let p = self.reqs.get_mut(&req).expect("a pending read");
        p.parts += 1;
        let bs = self.p.block_bytes;
        let mut start = first * bs;
        // Not `(first + n) * bs`: the last block's end may lie past u64::MAX.
        let mut end = start + (fills.len() as u64 * bs).min(self.p.volume_bytes - start);
        if head.is_none() {
            start = start.max(p.offset);
        }
        if tail.is_none() {
            end = end.min(p.offset + p.buf.len() as u64);
        }
        self.demand_reads += 1;
        let kind = OpKind::BackingRead { req: Some(req), first, start, len: end - start, fills };
        self.backing(kind, BackingCmd::Read { offset: start, len: end - start });
    }

    pub(super) fn count_miss(&mut self, req: ReqId, block: u64) {
        let bytes = self.overlap(req, block * self.p.block_bytes, self.block_len(block));
        self.counters.misses += 1;
        self.counters.miss_bytes += bytes;
    }

    /// A backing read is done: `start` is where it began (blocks from `first`).
    pub(super) fn backing_read_done(&mut self, req: Option<ReqId>, first: u64, start: u64, fills: Vec<Option<u64>>, outcome: Outcome) {
        let bs = self.p.block_bytes;
        if req.is_some() {
            self.demand_reads -= 1;
        }
        let data = match outcome {
            Ok(data) => data,
            Err(e) => {
                if let Some(req) = req {
                    self.part_done(req, Some(e.context("backing read")));
                }
                return fills.into_iter().flatten().for_each(|f| self.fill_read_done(f, None));
            }
        };
        if let Some(req) = req {
            self.copy_into(req, start, &data);
            self.part_done(req, None);
        }
        for (i, f) in fills.into_iter().enumerate() {
            let Some(f) = f else { continue };
            let lo = ((first + i as u64) * bs - start) as usize;
            let mut block = data.get(lo..(lo + bs as usize).min(data.len())).unwrap_or_default().to_vec();
            block.resize(bs as usize, 0);
            self.fill_read_done(f, Some(block));
        }
    }

    /// A piece of `req` that was to come from a member (now failed or not valid) reads
    /// the backing instead; the piece's count carries over to the new read.
    pub(super) fn reread(&mut self, req: ReqId, block: u64) {
        let fill = self.try_fill(block, Source::Demand);
        self.read_run(req, block, vec![fill]);
        self.part_done(req, None);
    }

    /// Copies what of `data` (volume bytes from `from`) falls inside `req`'s range into its
    /// reply; the bytes copied.
    pub(super) fn copy_into(&mut self, req: ReqId, from: u64, data: &[u8]) -> u64 {
        let p = self.reqs.get_mut(&req).expect("a pending read");
        let (lo, hi) = (from.max(p.offset), (from + data.len() as u64).min(p.offset + p.buf.len() as u64));
        if lo >= hi {
            return 0;
        }
        p.buf[(lo - p.offset) as usize..(hi - p.offset) as usize].copy_from_slice(&data[(lo - from) as usize..(hi - from) as usize]);
        hi - lo
    }

    fn overlap(&self, req: ReqId, from: u64, len: u64) -> u64 {
        let p = &self.reqs[&req];
        let (lo, hi) = (from.max(p.offset), (from + len).min(p.offset + p.buf.len() as u64));
        hi.saturating_sub(lo)
    }

    /// One piece of `req` is done (with an error, perhaps); the last one replies.
    pub(super) fn part_done(&mut self, req: ReqId, error: Option<Failure>) {
        let p = self.reqs.get_mut(&req).expect("a pending request");
        if p.error.is_none() {
            p.error = error;
        }
        p.parts -= 1;
        if p.parts == 0 {
            let p = self.reqs.remove(&req).expect("just seen");
            let result = match p.error {
                Some(e) => Err(e),
                None => Ok(p.buf),
            };
            self.actions.push_back(crate::api::Action::Reply { req, result });
        }
    }
}
