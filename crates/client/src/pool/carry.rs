//! Member operations carried by the pool's caller: a server worker with connections of its
//! own to the members (on its io_uring ring) takes a request's member reads, writes and
//! flushes onto them, rather than have each go to a task and its answer come back across
//! threads. The coordinator decides exactly as before; only who moves the bytes changes.
//!
//! What a carrier is offered is an operation the member can take as it is (a FUA write
//! only where the member has FUA, a flush only where it has flush); everything else, and
//! whatever the carrier gives back, goes to a task as always. A carrier's connections to
//! a member are good while the member's connection is the one `Target` was made for: when
//! the pool drops or replaces it, the pool's `on_cut` hook says so and the next operation
//! comes with another target.

use super::member_io::Payload;
pub use super::requests::Answered;
use super::requests::Answer;
use crate::error::Error;
use crate::export::Export;
use crate::uri::Uri;
use sluice_pool::{CopyId, MemberCmd, OpId, ReqId};
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Whoever may carry member operations itself.
pub trait Carrier {
    /// Takes `op` and carries it out, finishing it later with `Carried::finish` (never
    /// before returning, nor dropping it here: the pool is locked while it offers); or
    /// hands it back, to go the usual way (rarely: moving it back costs nothing worth a
    /// box).
    #[allow(clippy::result_large_err)]
    fn carry(&mut self, op: Carried) -> Result<(), Carried>;
}

/// Where a member is, while one connection of the pool's to it lasts.
pub struct Target {
    /// Different for every connection the pool makes to any member.
    pub epoch: u64,
    pub uri: Uri,
    /// The member's export as the pool negotiated it: what a carrier's connection must
    /// find too.
    pub export: Export,
}

impl Target {
    pub(crate) fn new(uri: &Uri, export: &Export) -> Arc<Target> {
        static EPOCHS: AtomicU64 = AtomicU64::new(1);
        Arc::new(Target { epoch: EPOCHS.fetch_add(1, Ordering::Relaxed), uri: uri.clone(), export: export.clone() })
    }
}

/// What a carried operation does.
pub enum Cmd {
    Read { offset: u64, len: usize },
    /// Sends `data[range]`.
    Write { offset: u64, data: Arc<Vec<u8>>, range: Range<usize>, fua: bool },
    Flush,
}

/// A member operation handed to a carrier. Dropped unfinished (its worker stopped), a read
/// or flush runs again on a task and a write fails, so that the coordinator never waits
/// for it.
pub struct Carried {
    pub member: usize,
    pub target: Arc<Target>,
    pub cmd: Cmd,
    /// What goes back to the pool; taken when it does.
    back: Option<Back>,
}

struct Back {
    op: OpId,
    sink: Sink,
    member_cmd: MemberCmd,
    pool: Arc<dyn PoolSide>,
}

/// Where a member read's bytes go.
pub(crate) enum Sink {
    Nothing,
    Request { req: ReqId, at: u64 },
    Copy(CopyId),
    Meta,
}

/// The pool's side of carrying (its pump, driver.rs): requests in, carried operations back.
pub(crate) trait PoolSide: Send + Sync {
    /// A request as `Direct::submit` takes it.
    #[allow(clippy::too_many_arguments)]
    fn submit(self: Arc<Self>, carrier: &mut dyn Carrier, cmd: u16, flags: u16, offset: u64, len: u32, write: Option<Vec<u8>>, done: Answer) -> Result<(), Error>;
    fn finish_carried(self: Arc<Self>, carrier: Option<&mut dyn Carrier>, member: usize, op: OpId, sink: Sink, result: Result<Option<Vec<u8>>, Error>);
    fn set_on_cut(&self, cut: Box<dyn Fn(usize) + Send + Sync>);
    /// A carried operation its carrier could not finish, to run on a task instead.
    fn rerun(self: Arc<Self>, member: usize, op: OpId, cmd: MemberCmd, payload: Payload, sink: Sink);
}

impl Carried {
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
    pub(crate) fn new(pool: Arc<dyn PoolSide>, member: usize, op: OpId, target: Arc<Target>, member_cmd: MemberCmd, payload: Payload, sink: Sink) -> Result<Carried, (MemberCmd, Payload, Sink)> {
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
        Ok(Carried { member, target, cmd, back: Some(Back { op, sink, member_cmd, pool }) })
    }

    /// The operation as the task that carries it instead takes it.
    pub(crate) fn into_parts(mut self) -> (MemberCmd, Payload, Sink) {
        let back = self.back.take().expect("a carried operation goes back once");
        (back.member_cmd, self.take_payload(), back.sink)
    }

    /// What a task sends for it.
    fn take_payload(&mut self) -> Payload {
        match std::mem::replace(&mut self.cmd, Cmd::Flush) {
            Cmd::Write { data, range, .. } => Payload::Shared(data, range),
            Cmd::Read { .. } | Cmd::Flush => Payload::None,
        }
    }

    /// The operation is done: a read with its bytes (exactly as many as it asked for), or
    /// failed. What the coordinator starts next is offered to `carrier`.
    pub fn finish(mut self, carrier: &mut dyn Carrier, result: Result<Option<Vec<u8>>, Error>) {
        let back = self.back.take().expect("a carried operation goes back once");
        back.pool.finish_carried(Some(carrier), self.member, back.op, back.sink, result);
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        let Some(back) = self.back.take() else { return };
        if matches!(self.cmd, Cmd::Write { .. }) {
            // It may have left whole and still land, after a later write to the same range
            // that a copy sent again would let through: the member must count as having
            // missed it (dropped, and resynced from the dirty regions), as for any write
            // that failed on it.
            back.pool.finish_carried(None, self.member, back.op, back.sink, Err(Error::Closed));
            return;
        }
        // A read or a flush is not the member's fault and harmless twice: it runs again on a
        // task.
        let payload = self.take_payload();
        back.pool.rerun(self.member, back.op, back.member_cmd, payload, back.sink);
    }
}

/// A pool for a caller that carries member operations itself: requests go to the
/// coordinator on the caller's thread and are answered through a call.
#[derive(Clone)]
pub struct Direct {
    pool: Arc<dyn PoolSide>,
}

impl Direct {
    pub(crate) fn new(pool: Arc<dyn PoolSide>) -> Direct {
        Direct { pool }
    }

    /// A request `Client` would send (already checked: range, alignment, read-only), with a
    /// write's bytes; `done` gets a read's bytes in order, or the failure. Member
    /// operations it starts at once are offered to `carrier`.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(&self, carrier: &mut dyn Carrier, cmd: u16, flags: u16, offset: u64, len: u32, write: Option<Vec<u8>>, done: Answered) -> Result<(), Error> {
        Arc::clone(&self.pool).submit(carrier, cmd, flags, offset, len, write, Answer::Call(done))
    }

    /// Sets what is told the member (by index) whose connection the pool dropped or
    /// replaced, so that a carrier closes its own connections to it. Once per pool.
    pub fn on_cut(&self, cut: Box<dyn Fn(usize) + Send + Sync>) {
        self.pool.set_on_cut(cut);
    }
}
