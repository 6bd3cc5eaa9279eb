//! The operations the core asks for, carried out on the backing and the members. Each
//! returns the core's `Outcome` (a read's bytes, or why it failed). Both are the pool's
//! `Member` (the library's `Client`, which this module never names, so that the client and
//! the cache do not import each other).

use crate::error::Error;
use crate::pool::member::Member;
use sluice_cache::{BackingCmd, MemberCmd, Outcome};

pub(super) async fn backing<M: Member>(c: &M, cmd: BackingCmd) -> Outcome {
    let done = |r: Result<(), Error>| r.map(|()| Vec::new());
    let r = match cmd {
        BackingCmd::Read { offset, len } => c.read(offset, len as usize).await,
        BackingCmd::Write { offset, data, fua } => done(c.write(offset, &data, fua).await),
        BackingCmd::Zero { offset, len, fua, may_trim } => done(c.write_zeroes(offset, len, fua, may_trim).await),
        BackingCmd::Trim { offset, len, fua } => done(c.trim(offset, len, fua).await),
        BackingCmd::Flush => done(c.flush().await),
    };
    // The core says "backing" in its messages.
    r.map_err(|e| e.to_string())
}

pub(super) async fn member<M: Member>(c: &M, cmd: MemberCmd) -> Outcome {
    let r = match cmd {
        MemberCmd::Read { offset, len } => c.read(offset, len as usize).await,
        // No FUA: a member's memory is never the only copy of anything.
        MemberCmd::Write { offset, data } => c.write(offset, &data, false).await.map(|()| Vec::new()),
    };
    r.map_err(|e| e.to_string())
}
