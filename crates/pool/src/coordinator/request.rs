//! Volume requests: split at stripe units, marked dirty before a write starts, fanned out
//! to the copies, and answered when the rules allow.

use super::api::{Action, Command, Data, Failure, MemberCmd, OpOutcome, ReqId};
use super::state::{Op, Phase, PieceState, Purpose, Request, Stopping};
use super::Coordinator;
use crate::limits::{META_BLOCK_BYTES, META_BYTES};
use crate::meta::Role;
use sluice_proto::Errno;

impl Coordinator {
    pub(super) fn start_request(&mut self, id: ReqId, cmd: Command) {
        if self.stopping != Stopping::Running {
            let f = Failure { errno: Errno::Shutdown, message: "the pool is stopping".into() };
            return self.actions.push_back(Action::Complete { req: id, result: Err(f) });
        }
        if let Some(why) = &self.fenced {
            let f = Failure::io(why.clone());
            return self.actions.push_back(Action::Complete { req: id, result: Err(f) });
        }
        let (offset, len) = cmd.range();
        // Routed again when it starts (a reshape may move its units meanwhile); a write
        // marks its regions in both layouts and waits for what holds them. Nothing looks
        // at a read's pieces before it starts.
        let pieces = match cmd.is_write() {
            true => self.route_both(offset, len).into_iter().map(PieceState::new).collect(),
            false => Vec::new(),
        };
        let mut req = Request {
            cmd,
            phase: Phase::Blocked,
            pieces,
            out: 0,
            flushed: 0,
            sent: 0,
            failure: None,
            regions: Vec::new(),
            marks: Vec::new(),
            need_sb: 0,
        };
        if cmd.is_write() && self.redundant() {
            req.need_sb = self.startup_gen;
            self.mark_dirty(&mut req);
        }
        self.requests.insert(id, req);
        self.blocked.push_back(id);
    }

    /// Sets the dirty bits of the regions a write touches and notes which bitmap writes it
    /// must wait for.
    fn mark_dirty(&mut self, req: &mut Request) {
        for p in &req.pieces {
            let first = p.member_offset / self.region_bytes;
            let last = (p.member_offset + p.len - 1) / self.region_bytes;
            for r in first..=last {
                if !req.regions.contains(&r) {
                    req.regions.push(r);
                }
            }
        }
        req.marks = self.mark_regions(&req.regions);
    }

    /// Sets the dirty bits of `regions` (a use each) and says which bitmap (block,
    /// generation) writes must be durable first.
    pub(super) fn mark_regions(&mut self, regions: &[u64]) -> Vec<(usize, u64)> {
        let mut marks: Vec<(usize, u64)> = Vec::new();
        for &r in regions {
            let block = 1 + (r / (META_BLOCK_BYTES * 8)) as usize;
            let word = &mut self.bits[(r / 64) as usize];
            if *word >> (r % 64) & 1 == 0 {
                *word |= 1 << (r % 64);
                self.gen[block] += 1;
            }
            let use_ = self.uses.entry(r).or_default();
            use_.writes += 1;
            use_.last = self.now;
            if !marks.iter().any(|&(b, _)| b == block) {
                marks.push((block, 0));
            }
        }
        // Each block's generation once every bit is set: waiting for it also covers a set
        // still being written by an earlier request.
        for mark in &mut marks {
            mark.1 = self.gen[mark.0];
        }
        marks
    }

    /// Starts blocked requests whose marks are durable and that no resync lock holds back.
    pub(super) fn unblock_requests(&mut self) -> bool {
        let mut moved = false;
        let mut still = std::collections::VecDeque::new();
        while let Some(id) = self.blocked.pop_front() {
            let ready = match self.requests.get(&id) {
                None => continue,
                Some(req) => self.may_start(req),
            };
            if ready {
                self.run(id);
                moved = true;
            } else {
                still.push_back(id);
            }
        }
        self.blocked = still;
        moved
    }

    fn may_start(&self, req: &Request) -> bool {
        let (offset, len) = req.cmd.range();
        if self.reshape_holds(offset, len) {
            return false;
        }
        if !req.cmd.is_write() {
            return true;
        }
        if !self.durable(0, req.need_sb) || !req.marks.iter().all(|&(b, g)| self.durable(b, g)) {
            return false;
        }
        // A mirrored pool (or a stripe being reshaped) takes writes once its claim has been
        // on the members for a heartbeat and read back as its own: a second coordinator
        // that started at the same moment has claimed by then, and one of the two stands
        // down.
        if self.meta_kept && self.heartbeat == 0 {
            return false;
        }
        if req.pieces.iter().any(|p| self.swap_pending(p.set, p.member_offset)) {
            return false;
        }
        !req.pieces.iter().any(|p| {
            let (start, end) = (p.member_offset, p.member_offset + p.len);
            self.locks.iter().any(|l| l.overlaps(p.set, start, end)) || self.scrub_holds(p.set, start, end)
        })
    }

    /// Whether metadata block `block` of generation `gen` is on every live member.
    pub(super) fn durable(&self, block: usize, gen: u64) -> bool {
        !self.meta_kept || self.members.iter().filter(|m| m.live()).all(|m| m.written[block] >= gen)
    }

    fn run(&mut self, id: ReqId) {
        let Some(mut req) = self.requests.remove(&id) else { return };
        req.phase = Phase::Running;
        self.route_at_start(&mut req);
        match req.cmd {
            Command::Flush => {
                for m in 0..self.members.len() {
                    if self.members[m].live() {
                        req.sent |= 1 << m;
                        req.out += 1;
                        self.issue(m, MemberCmd::Flush, Data::None, Purpose::Flush { req: id });
                    }
                }
            }
            Command::Read { .. } => {
                for i in 0..req.pieces.len() {
                    self.send_read(id, &mut req, i);
                }
            }
            cmd => {
                for i in 0..req.pieces.len() {
                    let p = &req.pieces[i];
                    if let Some(why) = self.write_refusal(p.set, p.member_offset) {
                        req.failure.get_or_insert(Failure::io(why));
                        continue;
                    }
                    let p = &req.pieces[i];
                    let (offset, len) = (META_BYTES + p.member_offset, p.len);
                    let mcmd = match cmd {
                        Command::Write { fua, .. } => MemberCmd::Write { offset, len, fua },
                        Command::Zero { fua, may_trim, .. } => MemberCmd::Zero { offset, len, fua, may_trim },
                        Command::Trim { fua, .. } => MemberCmd::Trim { offset, len, fua },
                        _ => unreachable!("reads and flushes are handled above"),
                    };
                    let data = match cmd {
                        Command::Write { .. } => Data::Request { req: id, at: p.at },
                        _ => Data::None,
                    };
                    for m in self.map.members_at(p.set, p.member_offset) {
                        if self.members[m].live() {
                            req.pieces[i].tried |= 1 << m;
                            req.pieces[i].out += 1;
                            req.out += 1;
                            self.issue(m, mcmd, data.clone(), Purpose::Piece { req: id, piece: i });
                        }
                    }
                    if let Some(shadow) = self.mirror_to(req.pieces[i].set, req.pieces[i].member_offset) {
                        req.out += 1;
                        self.issue(shadow, mcmd, data, Purpose::ShadowPiece { req: id });
                    }
                }
            }
        }
        if req.out == 0 {
            self.drained.push(id);
        }
        self.requests.insert(id, req);
    }

    /// One of request `req`'s operations is back.
    pub(super) fn one_back(&mut self, req: ReqId) {
        if let Some(r) = self.requests.get_mut(&req) {
            r.out -= 1;
            if r.out == 0 {
                self.drained.push(req);
            }
        }
    }

    /// Pieces where the units are now; during a reshape, a write below the in-memory
    /// checkpoint waits for a durable one before its answer.
    fn route_at_start(&mut self, req: &mut Request) {
        let (offset, len) = req.cmd.range();
        req.pieces = self.route(offset, len).into_iter().map(PieceState::new).collect();
        if req.cmd.is_write() {
            if let Some(gen) = self.reshape_need_sb(offset, len) {
                req.need_sb = req.need_sb.max(gen);
            }
        }
    }

    /// Sends piece `i` of a read to one copy that holds it, or fails the piece.
    fn send_read(&mut self, id: ReqId, req: &mut Request, i: usize) {
        let p = &req.pieces[i];
        let Some(m) = self.reader(p.set, p.member_offset, p.len, p.tried) else {
            let f = Failure::io(format!("no copy of volume offset {} can be read (set {} has no in-sync member)", req.cmd.range().0 + p.at, p.set));
            req.failure.get_or_insert(f);
            return;
        };
        let (offset, len, at) = (META_BYTES + p.member_offset, p.len, p.at);
        req.pieces[i].tried |= 1 << m;
        req.pieces[i].out += 1;
        req.out += 1;
        self.issue(m, MemberCmd::Read { offset, len }, Data::Request { req: id, at }, Purpose::Piece { req: id, piece: i });
    }

    /// Why a write to `set` at member offset `at` must fail, if it must. With no in-sync
    /// member, only a copy being rebuilt is there: it must not get writes the set's in-sync
    /// copy lacks when it returns. An in-sync member that is away (the last copy of some
    /// set) returns in sync with all its sets, so none of them may take writes without it.
    fn write_refusal(&self, set: usize, at: u64) -> Option<String> {
        if let Some(m) = self.map.members_at(set, at).find(|&m| self.members[m].role == Role::Active && !self.members[m].connected) {
            return Some(format!("member {m} ({}), the last in-sync copy of part of the volume, is away", self.spec.members[m]));
        }
        self.first_in_sync(set, at).is_none().then(|| format!("set {set} has no in-sync member"))
    }

    /// The member a read of set `set` goes to: an in-sync one that no copy job still has to
    /// bring up to date there, least busy first; if every in-sync member has such a job
    /// (its source failed), the first of them, so successive reads agree. The set's first
    /// in-sync member is the source of every copy into it, so it is never behind there.
    pub(super) fn reader(&self, set: usize, start: u64, len: u64, tried: u64) -> Option<usize> {
        let (first, last) = (start / self.region_bytes, (start + len - 1) / self.region_bytes);
        let source = self.first_in_sync(set, start);
        let synced = self.map.members_at(set, start).filter(|&m| self.members[m].in_sync() && tried >> m & 1 == 0);
        let behind = |m: usize| Some(m) != source && self.jobs.iter().flatten().any(|j| j.target == m && j.todo.range(first..=last).next().is_some());
        let busy = |m: usize| self.ops.values().filter(|o| o.member == m).count();
        let clean = synced.clone().filter(|&m| !behind(m));
        // With one copy to choose, how busy it is does not matter (a stripe's every read).
        let clean = match clean.clone().nth(1) {
            None => clean.min(),
            Some(_) => clean.min_by_key(|&m| (busy(m), m)),
        };
        clean.or_else(|| synced.min())
    }

    /// Takes a member operation's outcome for a request.
    pub(super) fn settle_request(&mut self, op: &Op, outcome: &OpOutcome) {
        let ok = !matches!(outcome, OpOutcome::Failed(_));
        match op.purpose {
            Purpose::Flush { req } => {
                if let Some(r) = self.requests.get_mut(&req).filter(|_| ok) {
                    r.flushed |= 1 << op.member;
                }
            }
            Purpose::Piece { req, piece } => {
                let Some(r) = self.requests.get_mut(&req) else { return };
                r.pieces[piece].out -= 1;
                if ok {
                    r.pieces[piece].done |= 1 << op.member;
                } else if matches!(r.cmd, Command::Read { .. }) && r.pieces[piece].done == 0 {
                    // Another copy, before this answer counts: the request stays out.
                    let mut r = self.requests.remove(&req).expect("found above");
                    self.send_read(req, &mut r, piece);
                    self.requests.insert(req, r);
                }
            }
            _ => unreachable!("only request operations come here"),
        }
        self.one_back(req_of(op.purpose));
    }

    /// A member failed: requests that used it must not be answered before the survivors
    /// record that.
    pub(super) fn requests_saw_failure(&mut self, member: usize) {
        let gen = self.gen[0];
        for r in self.requests.values_mut() {
            let used = r.sent >> member & 1 == 1 || r.pieces.iter().any(|p| p.tried >> member & 1 == 1);
            if used && r.phase == Phase::Running {
                r.need_sb = r.need_sb.max(gen);
            }
        }
    }

    /// The superblock generation that must be durable before `r` is answered.
    fn needed_sb(&self, r: &Request) -> u64 {
        match r.cmd.is_write() {
            true => r.need_sb.max(self.fail_gen),
            false => r.need_sb,
        }
    }

    /// Answers running requests whose operations are all back, once their verdict may be
    /// given (a write's failure seen by the survivors' superblocks first).
    pub(super) fn finish_requests(&mut self) -> bool {
        let mut moved = false;
        let mut i = 0;
        while i < self.drained.len() {
            let id = self.drained[i];
            let Some(r) = self.requests.get(&id) else {
                self.drained.swap_remove(i);
                continue;
            };
            debug_assert!(r.phase == Phase::Running && r.out == 0, "a drained request is running with nothing out");
            if r.failure.is_none() && !self.durable(0, self.needed_sb(r)) {
                i += 1;
                continue;
            }
            self.drained.swap_remove(i);
            moved = true;
            let r = self.requests.remove(&id).expect("found above");
            let result = self.verdict(&r);
            for &reg in &r.regions {
                if let Some(u) = self.uses.get_mut(&reg) {
                    u.writes -= 1;
                    u.last = self.now;
                }
            }
            self.actions.push_back(Action::Complete { req: id, result });
        }
        moved
    }

    /// A request succeeded when every piece reached a copy that is still in sync (for a
    /// read: any copy it was read from), and a flush when every set kept an in-sync member
    /// that flushed.
    fn verdict(&self, r: &Request) -> Result<(), Failure> {
        if let Some(f) = &r.failure {
            return Err(f.clone());
        }
        let synced = |m: usize| self.members[m].in_sync();
        match r.cmd {
            Command::Read { .. } => match r.pieces.iter().all(|p| p.done != 0) {
                true => Ok(()),
                false => Err(Failure::io("no copy could be read")),
            },
            Command::Flush if !self.redundant() => {
                // A stripe member that is away may have lost writes it acknowledged.
                match r.flushed == r.sent && self.members.iter().all(|m| m.live()) {
                    true => Ok(()),
                    false => Err(Failure::io("a member of the stripe is missing or failed the flush")),
                }
            }
            Command::Flush => {
                match self.map.groups().find(|&(s, at)| !self.map.members_at(s, at).any(|m| synced(m) && r.flushed >> m & 1 == 1)) {
                    Some((s, _)) => Err(Failure::io(format!("no in-sync member of set {s} completed the flush"))),
                    None => Ok(()),
                }
            }
            _ => {
                // A member that went away as the last copy of some set comes back taken as
                // it is (it holds the newest data of all its sets): a write it missed is not
                // on every copy, even if its partner here took it.
                let away = |m: usize| self.members[m].role == Role::Active && !self.members[m].connected;
                let lost = r.pieces.iter().find(|p| {
                    let mut group = self.map.members_at(p.set, p.member_offset);
                    !group.clone().any(|m| synced(m) && p.done >> m & 1 == 1) || group.any(|m| away(m) && p.done >> m & 1 == 0)
                });
                match lost {
                    None => Ok(()),
                    Some(p) => Err(Failure::io(format!(
                        "the write at volume offset {} reached no in-sync copy",
                        r.cmd.range().0 + p.at
                    ))),
                }
            }
        }
    }

    /// Fails every request that has not been answered (the pool was taken over).
    pub(super) fn fail_all(&mut self, why: &str) {
        for (&id, r) in self.requests.iter_mut() {
            r.failure.get_or_insert_with(|| Failure::io(why));
            if r.phase == Phase::Blocked {
                r.phase = Phase::Running;
                self.blocked.retain(|&b| b != id);
                self.drained.push(id);
            }
        }
    }

    /// Roles of the members of a set, for the tests' eyes.
    #[allow(dead_code)]
    pub(super) fn roles_of(&self, set: usize) -> Vec<Role> {
        self.map.members_at(set, 0).map(|m| self.members[m].role).collect()
    }
}

/// The request an operation of a request's is for.
fn req_of(purpose: Purpose) -> ReqId {
    match purpose {
        Purpose::Flush { req } | Purpose::Piece { req, .. } | Purpose::ShadowPiece { req } => req,
        _ => unreachable!("only request operations come here"),
    }
}
