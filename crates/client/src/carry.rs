//! Member operations carried by a volume's caller. A pool or a cached volume decides which
//! reads, writes and flushes go to which of its members; a server worker with connections
//! of its own to those members (on its io_uring ring) takes them onto those connections,
//! rather than have each go to a task and its answer come back across threads. The volume
//! decides exactly as before; only who moves the bytes changes.
//!
//! What a carrier is offered is an operation the member can take as it is; everything else,
//! and whatever the carrier gives back, goes to a task as always. A carrier's connections
//! to a member are good while the volume's connection to it is the one `Target` was made
//! for: when the volume drops or replaces it, `Direct::on_cut` says so and the next
//! operation comes with another target.

use crate::error::Error;
use crate::export::Export;
use crate::uri::Uri;
use std::any::Any;
use std::ops::Range;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Whoever may carry member operations itself.
pub trait Carrier {
    /// Takes `op` and carries it out, finishing it later with `Carried::finish` (never
    /// before returning, nor dropping it here: the volume is locked while it offers); or
    /// hands it back, to go the usual way (rarely: moving it back costs nothing worth a
    /// box).
    #[allow(clippy::result_large_err)]
    fn carry(&mut self, op: Carried) -> Result<(), Carried>;
}

/// Where a member is, while one connection of the volume's to it lasts.
pub struct Target {
    /// Different for every connection any volume makes to any member.
    pub epoch: u64,
    pub uri: Uri,
    /// The member's export as the volume negotiated it: what a carrier's connection must
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

/// A member operation handed to a carrier. Dropped unfinished (its worker stopped), it goes
/// back to its volume, which runs it on a task or counts it failed, so that it never waits
/// for it.
pub struct Carried {
    pub member: usize,
    pub target: Arc<Target>,
    pub cmd: Cmd,
    /// What goes back to the volume; taken when it does.
    back: Option<Box<dyn Back>>,
}

/// The volume's side of one carried operation.
pub(crate) trait Back: Send {
    /// The operation is done (a read with its bytes) or failed; what the volume starts next
    /// is offered to `carrier`, if there is one.
    fn finish(self: Box<Self>, carrier: Option<&mut dyn Carrier>, member: usize, result: Result<Option<Vec<u8>>, Error>);
    /// The carrier dropped the operation unfinished; `cmd` is what it was.
    fn abandoned(self: Box<Self>, member: usize, cmd: Cmd);
    /// For the volume that made it, to take its own parts back.
    fn into_any(self: Box<Self>) -> Box<dyn Any>;
}

impl Carried {
    pub(crate) fn new(member: usize, target: Arc<Target>, cmd: Cmd, back: Box<dyn Back>) -> Carried {
        Carried { member, target, cmd, back: Some(back) }
    }

    /// The operation as it was made, for a volume to run it another way.
    pub(crate) fn into_parts(mut self) -> (Cmd, Box<dyn Any>) {
        let back = self.back.take().expect("a carried operation goes back once");
        (std::mem::replace(&mut self.cmd, Cmd::Flush), back.into_any())
    }

    /// The operation is done: a read with its bytes (exactly as many as it asked for), or
    /// failed. What the volume starts next is offered to `carrier`.
    pub fn finish(mut self, carrier: &mut dyn Carrier, result: Result<Option<Vec<u8>>, Error>) {
        let back = self.back.take().expect("a carried operation goes back once");
        back.finish(Some(carrier), self.member, result);
    }
}

impl Drop for Carried {
    fn drop(&mut self) {
        if let Some(back) = self.back.take() {
            back.abandoned(self.member, std::mem::replace(&mut self.cmd, Cmd::Flush));
        }
    }
}

/// What a request's answer is given to: a read's bytes in order, or why it failed (a
/// volume's failure is `Error::Server`, with the errno a client should see).
pub type Answered = Box<dyn FnOnce(Result<Vec<Vec<u8>>, Error>) + Send>;

/// The volume's side of `Direct`.
pub(crate) trait Side: Send + Sync {
    /// A request as `Direct::submit` takes it.
    #[allow(clippy::too_many_arguments)]
    fn submit(self: Arc<Self>, carrier: &mut dyn Carrier, cmd: u16, flags: u16, offset: u64, len: u32, write: Option<Vec<u8>>, done: Answered) -> Result<(), Error>;
    fn set_on_cut(&self, cut: Box<dyn Fn(usize) + Send + Sync>);
}

/// A pool or cached volume for a caller that carries member operations itself: requests
/// go to the volume on the caller's thread and are answered through a call.
#[derive(Clone)]
pub struct Direct {
    side: Arc<dyn Side>,
}

impl Direct {
    pub(crate) fn new(side: Arc<dyn Side>) -> Direct {
        Direct { side }
    }

    /// A request `Client` would send (already checked: range, alignment, read-only), with a
    /// write's bytes; `done` gets a read's bytes in order, or the failure. Member
    /// operations it starts at once are offered to `carrier`.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(&self, carrier: &mut dyn Carrier, cmd: u16, flags: u16, offset: u64, len: u32, write: Option<Vec<u8>>, done: Answered) -> Result<(), Error> {
        Arc::clone(&self.side).submit(carrier, cmd, flags, offset, len, write, done)
    }

    /// Sets what is told the member (by index) whose connection the volume dropped or
    /// replaced, so that a carrier closes its own connections to it. Once per volume.
    pub fn on_cut(&self, cut: Box<dyn Fn(usize) + Send + Sync>) {
        self.side.set_on_cut(cut);
    }
}
