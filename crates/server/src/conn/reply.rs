//! Replies and the rules for their order on the wire. Replies go out as requests complete,
//! with one exception: a reply whose data must stay contiguous (a simple reply to a read, or
//! a DF read's single OFFSET_DATA chunk) that has started going out holds back every other
//! reply until its last part is queued.

use sluice_proto::reply::{self, Extent, ReplyTo};
use sluice_proto::wire::SIMPLE_REPLY_BYTES;
use sluice_proto::{Command, Errno};

use super::{Conn, Env, Life};
use crate::engine::Part;

/// The header in front of a contiguous read's first chunk.
pub(super) enum Head {
    Simple([u8; SIMPLE_REPLY_BYTES]),
    Data(reply::Head),
    None,
}

impl Head {
    pub(super) fn bytes(&self) -> &[u8] {
        match self {
            Head::Simple(h) => h,
            Head::Data(h) => h,
            Head::None => &[],
        }
    }
}

impl Conn {
    /// Whom a slot's reply chunks answer, in the framing the session negotiated.
    pub(super) fn reply_to(&self, slot: u16) -> ReplyTo {
        let s = self.slot(slot);
        ReplyTo { handle: s.request.handle, offset: s.offset, extended: self.session.extended }
    }

    /// Success with no data: every command but a non-empty read. With extended headers
    /// there are no simple replies: a NONE chunk says it.
    pub(super) fn reply_ok(&mut self, env: &mut Env, slot: u16) {
        let handle = self.slot(slot).request.handle;
        let zero_length_read = matches!(self.slot(slot).request.command, Command::Read { .. });
        let part = if (zero_length_read && self.session.structured) || self.session.extended {
            Part::new(slot as u32, &reply::done_none(self.reply_to(slot)), None, Vec::new())
        } else {
            Part::new(slot as u32, &reply::simple(handle, None), None, Vec::new())
        };
        self.queue_part(env, slot, part, true);
    }

    /// The answer to a request that validation refused.
    pub(super) fn reply_rejected(&mut self, env: &mut Env, slot: u16) {
        let (errno, reason) = self.slot(slot).rejection.expect("only refused requests are answered as refused");
        self.reply_error(env, slot, errno, reason, None);
    }

    pub(super) fn reply_block_status(&mut self, env: &mut Env, slot: u16, context_id: u32, extents: &[Extent]) {
        let to = self.reply_to(slot);
        let mut extra = self.spare_vecs.pop().unwrap_or_default();
        reply::block_status(&mut extra, to, context_id, extents);
        self.queue_part(env, slot, Part::new(slot as u32, &[], None, extra), true);
    }

    pub(super) fn reply_error(&mut self, env: &mut Env, slot: u16, errno: Errno, message: &str, offset: Option<u64>) {
        let to = self.reply_to(slot);
        self.slot_mut(slot).failed = true;
        let handle = to.handle;
        let part = if self.session.structured {
            let mut extra = self.spare_vecs.pop().unwrap_or_default();
            reply::error_chunk(&mut extra, to, errno, message, offset);
            Part::new(slot as u32, &[], None, extra)
        } else {
            Part::new(slot as u32, &reply::simple(handle, Some(errno)), None, Vec::new())
        };
        self.queue_part(env, slot, part, true);
    }

    /// Stops taking requests and queueing replies; the connection closes once what is
    /// already queued has been sent.
    pub(super) fn close_after_queue(&mut self, env: &mut Env, why: &str) {
        self.stop_reading(env, why);
        if self.life == Life::Draining {
            self.life = Life::Closing;
        }
        while let Some(part) = self.deferred.pop_front() {
            self.sent(env, part);
        }
    }

    /// Queues one part of a slot's reply; `last` marks the part that completes it.
    pub(super) fn queue_part(&mut self, env: &mut Env, slot: u16, part: Part, last: bool) {
        let s = self.slot_mut(slot);
        debug_assert!(!s.final_queued, "nothing follows a reply's final part");
        s.parts += 1;
        s.final_queued |= last;
        s.times.queued.get_or_insert(env.now);
        if matches!(self.life, Life::Broken | Life::Closing) {
            return self.sent(env, part);
        }
        if self.streaming.is_some_and(|x| x != slot) {
            return self.deferred.push_back(part);
        }
        self.queue.push_back(part);
        if last && self.streaming == Some(slot) {
            self.end_stream(env);
        }
    }

    /// A contiguous reply is fully queued: what waited goes out, and the next contiguous
    /// read may start.
    fn end_stream(&mut self, env: &mut Env) {
        self.streaming = None;
        self.queue.extend(self.deferred.drain(..));
        for _ in 0..self.stream_waiters.len() {
            let Some(waiter) = self.stream_waiters.pop_front() else { break };
            if self.streaming.is_some() {
                self.stream_waiters.push_back(waiter);
            } else if self.slots[waiter as usize].as_ref().is_some_and(|s| !s.final_queued) {
                self.flush_read(env, waiter);
            }
        }
    }
}
