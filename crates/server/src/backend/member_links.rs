//! A pool's or a cached volume's member operations on the workers' own connections to its
//! members. The worker hands a request to the pool's coordinator or the cache's core itself
//! (`Direct`), and the member reads, writes and flushes it starts at once go out over that
//! worker's link to each member (`link`), on its ring; their answers go back to the volume
//! on the same thread, which may start more there. Only the request's own answer crosses
//! the ring's mailbox, from the same thread. No task, no runtime thread in between.
//!
//! Large member reads (`POOL_LINK_READ_MAX_BYTES`) stay on the volume's own connections,
//! where the member answers several at once.
//!
//! Each member gets links as a plain remote does (multi-conn, not TLS), for as long as the
//! volume's connection to it lasts (`Target`): when the volume drops or replaces a member,
//! its links are cut at once, and the next operation for it opens new ones. Whatever a link
//! cannot carry (zeroing, trimming, a worker whose link is not up, a cache's reads of the
//! backing) goes the volume's usual way, on its tasks.

use std::io;
use std::sync::{Arc, Mutex, Weak};

use sluice_client::carry::{Carried, Carrier, Cmd as CarriedCmd, Direct, Target};
use sluice_client::{read_buffers, Error};
use sluice_proto::wire::{CMD_FLAG_FUA, CMD_FLUSH, CMD_READ, CMD_WRITE};
use tokio::runtime::Handle;

use super::link::To;
use super::links::Links;
use crate::engine::{Buf, CarriedEnd, Completer, Held, Payload, Ring};
use crate::limits::POOL_LINK_READ_MAX_BYTES;

pub struct MemberLinks {
    direct: Direct,
    /// The volume, for the log.
    spec: String,
    /// Where links are opened.
    runtime: Handle,
    /// By member, once an operation was offered for it.
    members: Mutex<Vec<Option<ForMember>>>,
}

/// A member's links, for one connection of the volume's to it.
struct ForMember {
    /// The `Target::epoch` they were made for.
    epoch: u64,
    /// None where the member cannot have any (TLS, no multi-conn).
    links: Option<Arc<Links>>,
}

impl MemberLinks {
    pub fn new(direct: Direct, spec: &str, runtime: Handle) -> Arc<MemberLinks> {
        let links = Arc::new(MemberLinks { direct, spec: spec.to_owned(), runtime, members: Mutex::new(Vec::new()) });
        let weak: Weak<MemberLinks> = Arc::downgrade(&links);
        links.direct.on_cut(Box::new(move |member| {
            if let Some(links) = weak.upgrade() {
                links.cut(member);
            }
        }));
        links
    }

    /// Hands a request to the volume on this worker; `done` gets its answer.
    #[allow(clippy::too_many_arguments)]
    pub fn submit(self: &Arc<Self>, ring: &mut Ring, cmd: u16, fua: bool, offset: u64, len: usize, write: Option<Vec<u8>>, done: Completer, answer: impl FnOnce(Result<(), Error>) -> i32 + Send + 'static) {
        let call = Box::new(move |r: Result<Vec<Vec<u8>>, Error>| match r {
            Ok(pieces) if cmd == CMD_READ => {
                let n = pieces.iter().map(Vec::len).sum::<usize>() as i32;
                done.complete(n, Payload::Pieces { pieces, spent: read_buffers::give_back });
            }
            Ok(_) => done.complete(answer(Ok(())), Payload::Nothing),
            Err(e) => done.complete(answer(Err(e)), Payload::Nothing),
        });
        let flags = if fua { CMD_FLAG_FUA } else { 0 };
        let length = u32::try_from(len).expect("a request's length fits in 32 bits");
        // Refused only when the volume is stopping: the dropped call answers ECANCELED.
        if let Err(e) = self.direct.submit(&mut OnWorker { ring, volume: self }, cmd, flags, offset, length, write, call) {
            log::debug!("{}: request refused: {e}", self.spec);
        }
    }

    /// The volume dropped or replaced `member`: its links end now.
    fn cut(&self, member: usize) {
        let taken = self.members.lock().expect("a member's links are only ever replaced").get_mut(member).and_then(Option::take);
        if let Some(ForMember { links: Some(links), .. }) = taken {
            links.cut();
        }
    }

    /// `member`'s links while the volume's connection to it is `target`'s.
    fn links(&self, member: usize, target: &Target) -> Option<Arc<Links>> {
        let mut members = self.members.lock().expect("a member's links are only ever replaced");
        if members.len() <= member {
            members.resize_with(member + 1, || None);
        }
        if let Some(known) = members[member].as_ref().filter(|m| m.epoch == target.epoch) {
            return known.links.clone();
        }
        // Another connection of the volume's: the old links go (they close once no worker
        // holds them, and are cut now in case one is stuck).
        if let Some(ForMember { links: Some(old), .. }) = members[member].take() {
            old.cut();
        }
        let spec = format!("{} member {}", self.spec, target.uri);
        let links = Links::new(&target.uri, &spec, &target.export).map(Arc::new);
        members[member] = Some(ForMember { epoch: target.epoch, links: links.clone() });
        links
    }
}

/// A worker offering the volume's member operations to its links.
struct OnWorker<'a> {
    ring: &'a mut Ring,
    volume: &'a Arc<MemberLinks>,
}

impl Carrier for OnWorker<'_> {
    fn carry(&mut self, op: Carried) -> Result<(), Carried> {
        if matches!(op.cmd, CarriedCmd::Read { len, .. } if len > POOL_LINK_READ_MAX_BYTES) {
            return Err(op);
        }
        let Some(links) = self.volume.links(op.member, &op.target) else { return Err(op) };
        let (kind, flags, offset, len) = match &op.cmd {
            CarriedCmd::Read { offset, len } => (CMD_READ, 0, *offset, *len),
            CarriedCmd::Write { offset, range, fua, .. } => (CMD_WRITE, if *fua { CMD_FLAG_FUA } else { 0 }, *offset, range.len()),
            CarriedCmd::Flush => (CMD_FLUSH, 0, 0, 0),
        };
        let Some(link) = links.get(self.ring, offset, len, &self.volume.runtime) else { return Err(op) };
        let buf = match &op.cmd {
            // Read buffers as the volume's tasks take them: the pieces go on as they are.
            CarriedCmd::Read { len, .. } => Some(Buf::from_vec(read_buffers::take(*len), read_buffers::give_back)),
            CarriedCmd::Write { data, range, .. } => Some(Buf::shared(Arc::clone(data), range.clone())),
            CarriedCmd::Flush => None,
        };
        let end = Box::new(MemberDone { op, volume: Arc::clone(self.volume) });
        link.start(kind, flags, offset, buf, 0, len, To::Carried(end), self.ring).map_err(|(_, to)| match to {
            To::Carried(end) => end.into_any().downcast::<MemberDone>().expect("the operation handed over").op,
            To::Storage(_) => unreachable!("a carried operation comes back as it went"),
        })
    }
}

/// A member operation on a link, waiting for its answer.
struct MemberDone {
    op: Carried,
    volume: Arc<MemberLinks>,
}

impl CarriedEnd for MemberDone {
    fn done(self: Box<Self>, result: i32, held: Held, ring: &mut dyn std::any::Any) {
        let ring = ring.downcast_mut::<Ring>().expect("a link's operations finish on its worker's ring");
        let MemberDone { op, volume } = *self;
        let read = matches!(op.cmd, CarriedCmd::Read { .. });
        let outcome = match held {
            // The link gives the remote's own errno (one of the protocol's), or EIO when it
            // failed: the first as the remote's answer, so that a cache's client gets the
            // backing's ENOSPC.
            _ if result < 0 && result != -libc::EIO => Err(Error::Server { errno: result.unsigned_abs(), message: None }),
            _ if result < 0 => Err(Error::Io(Arc::new(io::Error::from_raw_os_error(-result)))),
            Held::Buf(buf) if read => match buf.into_vec() {
                Ok(bytes) => Ok(Some(bytes)),
                Err(_) => Err(Error::Protocol("a member read came back in another buffer".into())),
            },
            _ => Ok(None),
        };
        op.finish(&mut OnWorker { ring, volume: &volume }, outcome);
    }

    fn into_any(self: Box<Self>) -> Box<dyn std::any::Any> {
        self
    }
}
