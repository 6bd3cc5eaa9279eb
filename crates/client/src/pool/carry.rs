//! The pool's side of carried member operations (`crate::carry`): which of the
//! coordinator's member operations a carrier may take, and how each comes back to the pump.
//! A carrier is offered a member read, a write (FUA only where the member has FUA) or a
//! flush (only where the member has flush); zeroing, trimming and whatever it gives back
//! run on a task as always.

use super::member_io::Payload;
use crate::carry::{Back, Carried, Carrier, Cmd, Side, Target};
use crate::error::Error;
use crate::export::Export;
use sluice_pool::{CopyId, MemberCmd, OpId, ReqId};
use std::any::Any;
use std::sync::Arc;

/// Where a member read's bytes go.
pub(crate) enum Sink {
    Nothing,
    Request { req: ReqId, at: u64 },
    Copy(CopyId),
    Meta,
}

/// The pool's side of carrying (its pump, driver.rs): carried operations back.
pub(crate) trait PoolSide: Side {
    fn finish_carried(self: Arc<Self>, carrier: Option<&mut dyn Carrier>, member: usize, op: OpId, sink: Sink, result: Result<Option<Vec<u8>>, Error>);
    /// A carried operation its carrier could not finish, to run on a task instead.
    fn rerun(self: Arc<Self>, member: usize, op: OpId, cmd: MemberCmd, payload: Payload, sink: Sink);
}

/// A carried operation's way back to the pool.
struct PoolBack {
    op: OpId,
    sink: Sink,
    member_cmd: MemberCmd,
    pool: Arc<dyn PoolSide>,
}

/// Whether `cmd` can go to a member with `export` as it is, with nothing made up.
pub(crate) fn fits(cmd: &MemberCmd, export: &Export) -> bool {
    match *cmd {
        MemberCmd::Read { len, .. } => len > 0,
        MemberCmd::Write { len, fua, .. } => len > 0 && (!fua || export.can_fua()),
        MemberCmd::Flush => export.can_flush(),
        MemberCmd::Zero { .. } | MemberCmd::Trim { .. } => false,
    }
}

/// The operation for a carrier, or its parts back when they do not make one (a write
/// without bytes: the task that takes it says what is wrong).
pub(crate) fn carried(pool: Arc<dyn PoolSide>, member: usize, op: OpId, target: Arc<Target>, member_cmd: MemberCmd, payload: Payload, sink: Sink) -> Result<Carried, (MemberCmd, Payload, Sink)> {
    let cmd = match (member_cmd, payload) {
        (MemberCmd::Read { offset, len }, Payload::None) => Cmd::Read { offset, len: len as usize },
        (MemberCmd::Write { offset, fua, .. }, Payload::Shared(data, range)) => Cmd::Write { offset, data, range, fua },
        (MemberCmd::Write { offset, fua, .. }, Payload::Owned(v)) => {
            let range = 0..v.len();
            Cmd::Write { offset, data: Arc::new(v), range, fua }
        }
        (MemberCmd::Flush, Payload::None) => Cmd::Flush,
        (member_cmd, payload) => return Err((member_cmd, payload, sink)),
    };
    Ok(Carried::new(member, target, cmd, Box::new(PoolBack { op, sink, member_cmd, pool })))
}

/// An operation a carrier handed back, as the task that carries it instead takes it.
pub(crate) fn parts(op: Carried) -> (MemberCmd, Payload, Sink) {
    let (cmd, back) = op.into_parts();
    let back = back.downcast::<PoolBack>().expect("a pool's carried operation comes back to it");
    (back.member_cmd, payload(cmd), back.sink)
}

/// What a task sends for `cmd`.
fn payload(cmd: Cmd) -> Payload {
    match cmd {
        Cmd::Write { data, range, .. } => Payload::Shared(data, range),
        Cmd::Read { .. } | Cmd::Flush => Payload::None,
    }
}

impl Back for PoolBack {
    fn finish(self: Box<Self>, carrier: Option<&mut dyn Carrier>, member: usize, result: Result<Option<Vec<u8>>, Error>) {
        let PoolBack { op, sink, pool, .. } = *self;
        pool.finish_carried(carrier, member, op, sink, result);
    }

    fn abandoned(self: Box<Self>, member: usize, cmd: Cmd) {
        let PoolBack { op, sink, member_cmd, pool } = *self;
        if matches!(cmd, Cmd::Write { .. }) {
            // It may have left whole and still land, after a later write to the same range
            // that a copy sent again would let through: the member must count as having
            // missed it (dropped, and resynced from the dirty regions), as for any write
            // that failed on it.
            pool.finish_carried(None, member, op, sink, Err(Error::Closed));
            return;
        }
        // A read or a flush is not the member's fault and harmless twice: it runs again on a
        // task.
        pool.rerun(member, op, member_cmd, payload(cmd), sink);
    }

    fn into_any(self: Box<Self>) -> Box<dyn Any> {
        self
    }
}
