//! A pool as `Client` uses it: requests in, replies out, a clean stop, and the live status.

use super::background::supervise;
use super::carry::{PoolSide, Sink};
use crate::carry::{Answered, Carrier, Direct, Side};
use super::member::Member;
use super::pump::Shared;
use super::requests::{self, ReadInto, Request};
use crate::connection::Outcome;
use crate::error::Error;
use crate::limits::POOL_STOP_MARGIN_MS;
use crate::uri::Uri;
use sluice_pool::{Coordinator, Status};
use sluice_proto::wire::{CMD_READ, CMD_WRITE};
use std::io::IoSlice;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// An assembled pool and the tasks that carry out its coordinator's actions.
pub(crate) struct PoolDriver<M: Member> {
    shared: Arc<Shared<M>>,
    /// How long a clean stop may take: what is in flight ends within the member timeout.
    stop_limit: Duration,
}

impl<M: Member> PoolDriver<M> {
    /// Starts driving an assembled coordinator whose clock started at `start`; `members`
    /// are in the pool file's order, None for one the pool was assembled without.
    /// `file` is the pool file, kept in step when a spare takes a member's place.
    pub(crate) fn start(coord: Coordinator, members: Vec<Option<M>>, uris: Vec<Uri>, options: M::Options, start: Instant, member_timeout_ms: u64, file: Option<PathBuf>) -> PoolDriver<M> {
        let (shared, woken) = Shared::new(coord, members, uris, options, start, file);
        tokio::spawn(supervise(Arc::downgrade(&shared), woken));
        // Assembling may already have asked for work (superblocks to write, resync).
        shared.run(|_, _| ());
        PoolDriver { shared, stop_limit: Duration::from_millis(member_timeout_ms + POOL_STOP_MARGIN_MS) }
    }

    /// One request that `Client` checked and split, as it would send it to a server.
    pub(crate) async fn call(&self, cmd: u16, flags: u16, offset: u64, len: u32, payload: &[IoSlice<'_>], bufs: Vec<Vec<u8>>) -> Result<Outcome, Error> {
        let write = (cmd == CMD_WRITE).then(|| requests::gather(payload));
        self.submit(cmd, flags, offset, len, write, bufs).await
    }

    /// A write whose bytes the caller hands over (`Client::write_owned`): the member writes
    /// send them from the caller's buffer, which `call` would copy first.
    pub(crate) async fn write_owned(&self, flags: u16, offset: u64, data: Vec<u8>) -> Result<Outcome, Error> {
        let len = u32::try_from(data.len()).expect("a pool's requests stay within 32 bits");
        self.submit(CMD_WRITE, flags, offset, len, Some(data), Vec::new()).await
    }

    async fn submit(&self, cmd: u16, flags: u16, offset: u64, len: u32, write: Option<Vec<u8>>, bufs: Vec<Vec<u8>>) -> Result<Outcome, Error> {
        let (done, answer) = oneshot::channel();
        enqueue(&self.shared, None, cmd, flags, offset, len, write, bufs, requests::Answer::Channel(done))?;
        match answer.await {
            Ok(result) => requests::reply(cmd, result),
            // The pool went away with the request unanswered.
            Err(_) => Err(Error::Closed),
        }
    }

    /// The pool for a caller that carries member operations itself.
    pub(crate) fn direct(&self) -> Direct {
        Direct::new(Arc::clone(&self.shared) as Arc<dyn Side>)
    }

    /// Stops the coordinator cleanly (requests in flight finish, the superblocks are
    /// released, so the next assembly need not wait out the lease), then disconnects the
    /// members. Requests after this fail with `Error::Closed`.
    pub(crate) async fn disconnect(&self) {
        let mut stopped = self.shared.stopped();
        self.shared.run(|core, now| {
            if !core.closed {
                core.closed = true;
                core.coord.stop(now);
            }
        });
        if tokio::time::timeout(self.stop_limit, stopped.wait_for(|&s| s)).await.is_err() {
            log::warn!("the pool did not stop cleanly within {:?}; the next assembly waits out the lease", self.stop_limit);
        }
        for m in self.shared.take_members() {
            m.disconnect().await;
        }
    }

    /// Puts the server at `uri` in `member`'s place (see `Shared::replace`). Refused for a
    /// stripe, and for the only in-sync member of a set.
    pub(crate) fn replace(&self, member: usize, uri: Uri) -> Result<(), Error> {
        self.shared.replace(member, uri)
    }

    /// Spares for members missing `spare_after_ms`, as a reloaded pool file names them.
    pub(crate) fn set_spares(&self, spares: Vec<String>, spare_after_ms: u64) {
        self.shared.run(|core, now| core.coord.set_spares(spares, spare_after_ms, now));
    }

    /// Connects the servers at `uris` and adds them at the end of the member list (see
    /// `Coordinator::grow`): a stripe or raid10 reshapes onto them, a mirror copies to them.
    pub(crate) async fn grow(&self, uris: Vec<Uri>) -> Result<(), Error> {
        let mut added = Vec::with_capacity(uris.len());
        for uri in uris {
            let found = async {
                let m = M::connect(&uri, &self.shared.options).await?;
                match super::found::read_found(&m).await {
                    Ok(f) => Ok((m, f)),
                    Err(e) => {
                        m.disconnect().await;
                        Err(e)
                    }
                }
            };
            match found.await {
                Ok((m, f)) => added.push((uri, m, f)),
                Err(e) => {
                    for (_, m, _) in added {
                        m.disconnect().await;
                    }
                    return Err(Error::Pool(format!("{uri} cannot be reached: {e}")));
                }
            }
        }
        let unix_secs = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
        if let Err((e, back)) = self.shared.add_members(added, unix_secs) {
            for m in back {
                m.disconnect().await;
            }
            return Err(e);
        }
        Ok(())
    }

    /// Whether `count` members could be added now: Ok, or why not.
    pub(crate) fn can_grow(&self, count: usize) -> Result<(), Error> {
        self.shared.look(|core| core.coord.can_grow(count)).map_err(Error::Refused)
    }

    /// Where the members are now, in the pool file's order.
    pub(crate) fn member_uris(&self) -> Vec<Uri> {
        // Not a live replacement's shadow, past the members.
        self.shared.look(|core| core.uris[..core.coord.status().members.len()].to_vec())
    }

    /// Whether `members` could all be replaced now: Ok, or why not.
    pub(crate) fn can_replace(&self, members: &[usize]) -> Result<(), Error> {
        self.shared.look(|core| core.coord.can_replace(members)).map_err(Error::Refused)
    }

    /// The volume's size now (it grows when a reshape is done).
    pub(crate) fn size(&self) -> u64 {
        self.shared.look(|core| core.coord.size())
    }

    /// The pool's state now: members, resync progress, dirty regions.
    pub(crate) fn status(&self) -> Status {
        self.shared.look(|core| core.coord.status())
    }

    /// Listens on the pool's control socket (see `control`) until the pool stops.
    pub(crate) fn listen_control(&self, pool_id: &str) {
        super::control::listen(&self.shared, pool_id);
    }

    /// Starts a scrub (see `Coordinator::start_scrub`).
    pub(crate) fn start_scrub(&self, repair: bool, from: Option<usize>) -> Result<(), Error> {
        self.shared.run(|core, now| core.coord.start_scrub(repair, from, now)).map_err(Error::Refused)
    }

    /// Connections open to the members, all together.
    pub(crate) fn connections(&self) -> usize {
        self.shared.connections()
    }
}

/// Hands the coordinator one request, answered through `done`; member operations it starts
/// at once are offered to `carrier`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn enqueue<M: Member>(shared: &Arc<Shared<M>>, carrier: Option<&mut dyn Carrier>, cmd: u16, flags: u16, offset: u64, len: u32, write: Option<Vec<u8>>, bufs: Vec<Vec<u8>>, done: requests::Answer) -> Result<(), Error> {
    let command = requests::command(cmd, flags, offset, len)?;
    // A read without buffers (`Client::read_pieces`) keeps the members' own.
    let read = match cmd == CMD_READ && bufs.is_empty() {
        true => ReadInto::Pieces { len: len as u64, got: Vec::new() },
        false => ReadInto::Bufs(bufs),
    };
    let request = Request { write: write.map(Arc::new), read, done };
    shared.run_with(carrier, |core, now| {
        if core.closed {
            return Err(Error::Closed);
        }
        let req = core.coord.submit(command, now);
        core.requests.insert(req, request);
        Ok(())
    })
}

impl<M: Member> Side for Shared<M> {
    fn submit(self: Arc<Self>, carrier: &mut dyn Carrier, cmd: u16, flags: u16, offset: u64, len: u32, write: Option<Vec<u8>>, done: Answered) -> Result<(), Error> {
        enqueue(&self, Some(carrier), cmd, flags, offset, len, write, Vec::new(), requests::Answer::Call(done))
    }

    fn set_on_cut(&self, cut: Box<dyn Fn(usize) + Send + Sync>) {
        let _ = self.on_cut.set(cut);
    }
}

impl<M: Member> PoolSide for Shared<M> {
    fn finish_carried(self: Arc<Self>, carrier: Option<&mut dyn Carrier>, member: usize, op: sluice_pool::OpId, sink: Sink, result: Result<Option<Vec<u8>>, Error>) {
        self.finish_with(carrier, member, op, sink, result);
    }

    fn rerun(self: Arc<Self>, member: usize, op: sluice_pool::OpId, cmd: sluice_pool::MemberCmd, payload: super::member_io::Payload, sink: Sink) {
        self.run(|core, _| self.rerun_op(core, member, op, cmd, payload, sink));
    }
}
