//! The ring's side of links (a backend's own connections driven on a worker's ring,
//! `LinkEnd`) and of what backends keep per worker: submitting what a link asks for,
//! sending what links gathered just before the ring submits, and counting the storage
//! operations links carry.

use std::any::Any;
use std::rc::Rc;
use std::sync::Weak;

use io_uring::{opcode, types};

use super::op::{LinkEnd, LinkIo, LinkOp, Token};
use super::ring::Ring;

impl Ring {
    /// What the backend with `key` keeps on this worker, if it is a `T`.
    pub fn local<T: Any>(&self, key: u64) -> Option<Rc<T>> {
        self.locals.get(&key).and_then(|(v, _)| Rc::clone(v).downcast::<T>().ok())
    }

    /// Keeps `value` for the backend with `key` on this worker until `owner` dies (the
    /// backend went, on a reload that removed its export), or forgets what it kept.
    pub fn set_local(&mut self, key: u64, value: Option<(Rc<dyn Any>, Weak<()>)>) {
        match value {
            Some(v) => self.locals.insert(key, v),
            None => self.locals.remove(&key),
        };
    }

    /// Drops what backends that are gone kept here (their links close).
    fn sweep_locals(&mut self) {
        if !self.locals.is_empty() {
            self.locals.retain(|_, (_, owner)| owner.strong_count() > 0);
        }
    }

    /// A link took a storage operation: it counts as in flight until `link_finished`.
    pub fn link_started(&mut self) {
        self.linked += 1;
    }

    /// A storage operation a link carried is finished (its completion is in the worker's
    /// hands).
    pub fn link_finished(&mut self) {
        self.linked -= 1;
    }

    /// Has `link` send what it gathered before the ring next submits.
    pub fn flush_later(&mut self, link: Rc<dyn LinkEnd>) {
        self.flushes.push(link);
    }

    pub(super) fn flush_links(&mut self) {
        self.sweep_locals();
        if self.flushes.is_empty() {
            return;
        }
        // Both lists are kept between passes: no allocation per pass.
        let mut next = std::mem::take(&mut self.link_next);
        let mut links = std::mem::take(&mut self.flushes_spare);
        while !self.flushes.is_empty() {
            std::mem::swap(&mut self.flushes, &mut links);
            for link in links.drain(..) {
                link.flush(&mut next);
                for io in next.drain(..) {
                    self.link_io(&link, io);
                }
            }
        }
        self.flushes_spare = links;
        self.link_next = next;
    }

    /// Submits what `link` asked for.
    pub fn link_io(&mut self, link: &Rc<dyn LinkEnd>, io: LinkIo) {
        let fd = types::Fd(link.fd());
        let (sqe, op) = match io {
            LinkIo::Recv { buf, at, len, wait_all } => {
                assert!(len > 0 && at + len <= buf.len() && len <= u32::MAX as usize);
                // SAFETY: at + len <= buf.len(), checked above.
                let ptr = unsafe { buf.ptr().add(at) };
                let flags = if wait_all { libc::MSG_WAITALL } else { 0 };
                (opcode::Recv::new(fd, ptr, len as u32).flags(flags).build(), LinkOp::Recv { buf })
            }
            LinkIo::Send { mut batch } => {
                let msg = batch.prepare();
                let flags = libc::MSG_NOSIGNAL | libc::MSG_WAITALL;
                (opcode::SendMsg::new(fd, msg).flags(flags as u32).build(), LinkOp::Send { batch })
            }
            LinkIo::Readable => {
                let events = (libc::POLLIN | libc::POLLRDHUP) as u32;
                (opcode::PollAdd::new(fd, events).build(), LinkOp::Readable)
            }
        };
        self.push(sqe, Token::Link { link: Rc::clone(link), op });
    }
}
