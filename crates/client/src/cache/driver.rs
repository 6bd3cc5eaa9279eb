//! A cached volume as `Client` uses it: requests in, replies out, the live status, and a
//! clean stop; and as a server's worker uses it (`Direct`), carrying member operations.
//!
//! Memory stays bounded by the callers: each request is held until answered, so the
//! requests the shell holds are the callers' requests in flight (a server's per-connection
//! in-flight limit times its connections; a `Client` user's own futures). What it holds
//! besides is bounded by the core: its operations per request (a request's blocks, at most
//! one more at each end), prefetch and hints (`PREFETCH_INFLIGHT_MAX` fills, `STREAMS_MAX`
//! windows), and one pending connection per member.

use super::shell::{self, Answer, Shared};
use super::status::Status;
use crate::carry::{Answered, Carrier, Direct, Side};
use crate::connection::Outcome;
use crate::error::Error;
use crate::pool::member::Member;
use crate::pool::requests::{gather, land};
use crate::uri::Uri;
use sluice_cache::{Config, Request};
use sluice_proto::wire::*;
use std::io::IoSlice;
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use tokio::sync::oneshot;

pub(crate) struct CacheDriver<M: Member> {
    shared: Arc<Shared<M>>,
    /// Connections open now: the backing's and the members' (kept by the shell).
    connections: Arc<AtomicUsize>,
}

impl<M: Member> CacheDriver<M> {
    /// Starts the task that owns the core; the members connect in the background.
    pub(crate) fn start(path: &Path, config: Config, backing: M, backing_uri: &Uri, members: Vec<Uri>, member_options: M::Options) -> CacheDriver<M> {
        let connections = Arc::new(AtomicUsize::new(backing.connections()));
        let shared = shell::spawn(path, config, backing, backing_uri, members, member_options, Arc::clone(&connections));
        CacheDriver { shared, connections }
    }

    /// One request that `Client` checked and split, as it would send it to a server.
    pub(crate) async fn call(&self, cmd: u16, flags: u16, offset: u64, len: u32, payload: &[IoSlice<'_>], bufs: Vec<Vec<u8>>) -> Result<Outcome, Error> {
        let write = (cmd == CMD_WRITE).then(|| gather(payload));
        self.submit(cmd, flags, offset, len, write, bufs).await
    }

    /// A write whose bytes the caller hands over (`Client::write_owned`): the core takes
    /// the caller's buffer, which `call` would copy first.
    pub(crate) async fn write_owned(&self, flags: u16, offset: u64, data: Vec<u8>) -> Result<Outcome, Error> {
        let len = u32::try_from(data.len()).expect("a cached volume's requests stay within 32 bits");
        self.submit(CMD_WRITE, flags, offset, len, Some(data), Vec::new()).await
    }

    /// Sends the core a request and waits for its answer. A read without buffers
    /// (`Client::read_pieces`) gets the core's own.
    async fn submit(&self, cmd: u16, flags: u16, offset: u64, len: u32, write: Option<Vec<u8>>, mut bufs: Vec<Vec<u8>>) -> Result<Outcome, Error> {
        let request = request(cmd, flags, offset, len as u64, write)?;
        let (done, answer) = oneshot::channel();
        self.shared.request(None, request, Answer::Channel(done))?;
        match answer.await {
            Ok(Ok(data)) if cmd == CMD_READ => {
                if data.len() as u64 != len as u64 {
                    return Err(Error::Protocol(format!("the cache answered a read of {len} bytes with {}", data.len())));
                }
                if bufs.is_empty() {
                    return Ok(Outcome::Read(vec![data]));
                }
                land(&mut bufs, 0, data);
                Ok(Outcome::Read(bufs))
            }
            Ok(Ok(_)) => Ok(Outcome::Done),
            Ok(Err(f)) => Err(Error::Server { errno: f.errno.code(), message: Some(f.message) }),
            // The task stopped with the request unanswered.
            Err(_) => Err(Error::Closed),
        }
    }

    /// The counters and the members' state now; None once the volume stopped.
    pub(crate) async fn status(&self) -> Option<Status> {
        self.shared.status()
    }

    /// Stops taking requests, lets those in flight finish, then disconnects the backing
    /// and the members.
    pub(crate) async fn disconnect(&self) {
        let (tx, rx) = oneshot::channel();
        if self.shared.stop(Some(tx)) {
            let _ = rx.await;
        }
    }

    /// The volume for a caller that carries member operations itself.
    pub(crate) fn direct(&self) -> Direct {
        Direct::new(Arc::clone(&self.shared) as Arc<dyn Side>)
    }

    pub(crate) fn connections(&self) -> usize {
        self.connections.load(Ordering::Relaxed)
    }
}

impl<M: Member> Drop for CacheDriver<M> {
    /// The task holds the connections; without a client left, it stops.
    fn drop(&mut self) {
        self.shared.stop(None);
    }
}

impl<M: Member> Side for Shared<M> {
    fn submit(self: Arc<Self>, carrier: &mut dyn Carrier, cmd: u16, flags: u16, offset: u64, len: u32, write: Option<Vec<u8>>, done: Answered) -> Result<(), Error> {
        let request = request(cmd, flags, offset, len as u64, write)?;
        self.request(Some(carrier), request, Answer::Call(done))
    }

    fn set_on_cut(&self, cut: Box<dyn Fn(usize) + Send + Sync>) {
        Shared::set_on_cut(self, cut);
    }
}

/// The core's request for an NBD request that `Client` already checked (range, alignment,
/// read-only, flags the export advertises).
/// A write's bytes are `write`.
fn request(cmd: u16, flags: u16, offset: u64, len: u64, write: Option<Vec<u8>>) -> Result<Request, Error> {
    let fua = flags & CMD_FLAG_FUA != 0;
    match cmd {
        CMD_READ => Ok(Request::Read { offset, len }),
        CMD_WRITE => Ok(Request::Write { offset, data: write.unwrap_or_default(), fua }),
        CMD_WRITE_ZEROES => Ok(Request::Zero { offset, len, fua, may_trim: flags & CMD_FLAG_NO_HOLE == 0 }),
        CMD_TRIM => Ok(Request::Trim { offset, len, fua }),
        CMD_FLUSH => Ok(Request::Flush),
        CMD_CACHE => Ok(Request::Cache { offset, len }),
        // The volume does not advertise base:allocation, so Client never sends it.
        _ => Err(Error::Unsupported("BLOCK_STATUS")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_carry_their_flags() {
        let data = vec![7u8; 3];
        assert_eq!(request(CMD_READ, 0, 4096, 512, None).unwrap(), Request::Read { offset: 4096, len: 512 });
        assert_eq!(request(CMD_WRITE, CMD_FLAG_FUA, 0, 3, Some(data.clone())).unwrap(), Request::Write { offset: 0, data, fua: true });
        assert_eq!(request(CMD_WRITE_ZEROES, CMD_FLAG_NO_HOLE, 1, 2, None).unwrap(), Request::Zero { offset: 1, len: 2, fua: false, may_trim: false });
        assert_eq!(request(CMD_TRIM, 0, 3, 4, None).unwrap(), Request::Trim { offset: 3, len: 4, fua: false });
        assert_eq!(request(CMD_CACHE, 0, 8, 9, None).unwrap(), Request::Cache { offset: 8, len: 9 });
        assert_eq!(request(CMD_FLUSH, 0, 0, 0, None).unwrap(), Request::Flush);
        assert!(matches!(request(CMD_BLOCK_STATUS, 0, 0, 1, None), Err(Error::Unsupported(_))));
    }
}
