//! The coordinator: one pool's live state, without I/O.
//!
//! The rules it keeps (docs/pool.md says why):
//! - A write to a mirrored pool first marks its regions dirty in the write-intent bitmap on
//!   every live member, durably (FUA), and waits for that; then it goes to every copy; it is
//!   acknowledged when every copy that is in sync has it (DRBD's protocol C).
//! - A member that fails an operation or does not answer within the timeout is declared
//!   missing: the survivors' superblocks record it (and the event counter moves) before any
//!   write that found it missing is acknowledged. Dirty bits are not cleaned while a member
//!   is missing or rebuilding, so they name every region it lacks.
//! - A member that returns with the history the survivors recorded gets only the dirty
//!   regions; otherwise all of them. Copying holds back writes to the range being copied.
//! - After a coordinator crash, the dirty regions are copied from the first in-sync member
//!   of each set to the others, and reads of them go to that first member until then.

mod api;

pub use api::*;

use crate::spec::PoolSpec;

/// One pool's coordinator.
pub struct Coordinator {
    _private: (),
}

impl Coordinator {
    /// Assembles the pool from what the driver found on each member (`None`: unreachable).
    /// Refuses when a member is unreachable (unless `degraded`), when members disagree about
    /// the pool, or when one belongs to another pool. The superblocks must have no live
    /// owner: the driver checks the lease (see `meta::Owner`) before calling this.
    pub fn assemble(spec: &PoolSpec, found: Vec<Option<Found>>, session: Session, degraded: bool, now: u64) -> Result<Coordinator, String> {
        let _ = (spec, found, session, degraded, now);
        todo!("being written")
    }

    /// Usable bytes of the volume.
    pub fn size(&self) -> u64 {
        todo!("being written")
    }

    /// Starts a volume request.
    pub fn submit(&mut self, cmd: Command, now: u64) -> ReqId {
        let _ = (cmd, now);
        todo!("being written")
    }

    /// Reports a member operation's outcome.
    pub fn handle(&mut self, op: OpId, outcome: OpOutcome, now: u64) {
        let _ = (op, outcome, now);
        todo!("being written")
    }

    /// The driver lost a member's connection (a read or write on it failed outside any
    /// operation, or it closed).
    pub fn member_lost(&mut self, member: usize, why: &str, now: u64) {
        let _ = (member, why, now);
        todo!("being written")
    }

    /// A member that was dropped answers again; `found` is what its metadata area holds now.
    pub fn member_back(&mut self, member: usize, found: Found, now: u64) {
        let _ = (member, found, now);
        todo!("being written")
    }

    /// Lets time pass: time-outs, heartbeats, cleaning dirty regions, resync pacing. Call it
    /// at `next_wakeup()` (or any time).
    pub fn tick(&mut self, now: u64) {
        let _ = now;
        todo!("being written")
    }

    /// When `tick` next has something to do.
    pub fn next_wakeup(&self) -> Option<u64> {
        todo!("being written")
    }

    /// The next thing for the driver to do.
    pub fn poll(&mut self) -> Option<Action> {
        todo!("being written")
    }

    /// Starts a clean stop: new requests fail, those in flight finish, dirty regions are
    /// cleaned where every copy is in sync, and the superblocks are released. `is_stopped`
    /// says when it is done (members can then be disconnected).
    pub fn stop(&mut self, now: u64) {
        let _ = now;
        todo!("being written")
    }

    pub fn is_stopped(&self) -> bool {
        todo!("being written")
    }

    pub fn status(&self) -> Status {
        todo!("being written")
    }
}

/// What `pool init` writes at offset 0 of each member (superblock and a clean bitmap), for
/// members of these device sizes. Refuses a member that already carries pool metadata
/// unless `force`.
pub fn format(spec: &PoolSpec, found: &[Found], pool_id: [u8; 16], force: bool) -> Result<Vec<Vec<u8>>, String> {
    let _ = (spec, found, pool_id, force);
    todo!("being written")
}

/// The pool's state as the members' metadata records it, without assembling it (for
/// `pool status`; `None`: unreachable).
pub fn survey(spec: &PoolSpec, found: &[Option<Found>]) -> Result<Status, String> {
    let _ = (spec, found);
    todo!("being written")
}
