//! The operations the core asks for, carried out through `Client`s: the backing's and the
//! members'. Each returns the core's `Outcome` (a read's bytes, or why it failed).

use crate::client::Client;
use crate::error::Error;
use crate::options::Options;
use crate::uri::Uri;
use sluice_cache::{BackingCmd, MemberCmd, Outcome};
use std::future::Future;
use std::pin::Pin;

/// A connection being opened. Boxed: the backing may be a pool, and a `Client` opening a
/// cached volume is the same async function as the one opening its backing.
pub(super) fn connect(uri: Uri, options: Options) -> Pin<Box<dyn Future<Output = Result<Client, Error>> + Send>> {
    Box::pin(async move { Client::connect_with(&uri, &options).await })
}

pub(super) async fn backing(c: &Client, cmd: BackingCmd) -> Outcome {
    let done = |r: Result<(), Error>| r.map(|()| Vec::new());
    let r = match cmd {
        BackingCmd::Read { offset, len } => c.read_owned(offset, vec![0; len as usize]).await,
        BackingCmd::Write { offset, data, fua } => done(c.write(offset, &data, fua).await),
        BackingCmd::Zero { offset, len, fua, may_trim } => done(c.write_zeroes(offset, len, fua, may_trim, false).await),
        BackingCmd::Trim { offset, len, fua } => done(c.trim(offset, len, fua).await),
        BackingCmd::Flush => done(c.flush().await),
    };
    r.map_err(|e| format!("backing: {e}"))
}

pub(super) async fn member(c: &Client, cmd: MemberCmd) -> Outcome {
    let r = match cmd {
        MemberCmd::Read { offset, len } => c.read_owned(offset, vec![0; len as usize]).await,
        // No FUA: a member's memory is never the only copy of anything.
        MemberCmd::Write { offset, data } => c.write(offset, &data, false).await.map(|()| Vec::new()),
    };
    r.map_err(|e| e.to_string())
}
