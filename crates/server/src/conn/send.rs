//! Sending: queued reply parts are gathered into one batch per sendmsg; a part whose data
//! waits in a pipe ends its batch, and its data follows by splice before anything else.
//! A short send goes on with the rest of the batch before anything newer.

use super::{Conn, Env, Io, Life};
use crate::engine::{Part, Pipe, SendBatch};

impl Conn {
    /// Sends queued replies when no send or splice is in flight.
    pub(super) fn pump_output(&mut self, env: &mut Env) {
        if self.splicing.is_some() {
            return;
        }
        if self.life == Life::Closing && self.queue.is_empty() && self.batch.is_some() {
            return self.fail(env, "closing after a read that failed part way");
        }
        let Some(mut batch) = self.batch.take() else { return };
        if self.queue.front().is_some_and(Part::is_bare_splice) {
            // Data with no header in front (a later piece of a contiguous read): no sendmsg,
            // straight to the splice.
            self.batch = Some(batch);
            let part = self.queue.pop_front().expect("checked above");
            self.mark_sending(env, &part);
            return self.start_splice_out(env, part);
        }
        while !batch.is_full() && !batch.ends_with_splice() {
            let Some(part) = self.queue.pop_front() else { break };
            self.mark_sending(env, &part);
            batch.push(part);
        }
        if batch.is_empty() {
            self.batch = Some(batch);
            return;
        }
        self.sending_since = Some(env.now);
        self.emit(Io::Send { batch });
    }

    fn mark_sending(&mut self, env: &Env, part: &Part) {
        if let Some(s) = self.slots[part.tag as usize].as_mut() {
            s.times.sending.get_or_insert(env.now);
        }
    }

    pub(super) fn send_done(&mut self, env: &mut Env, result: i32, mut batch: Box<SendBatch>) {
        let since = self.sending_since.take();
        if result < 0 {
            let e = std::io::Error::from_raw_os_error(-result);
            batch.drain(|part| self.sent(env, part));
            self.batch = Some(batch);
            return self.fail(env, &format!("send failed: {e}"));
        }
        if let Some(since) = since {
            self.pace.network_done(since, env.now, result as usize);
        }
        let mut finished = std::mem::take(&mut self.finished_parts);
        batch.consume(result as usize, |part| finished.push(part));
        for part in finished.drain(..) {
            if part.pipe.is_some() && !self.is_broken() {
                // The header is out; its data follows straight from the pipe.
                debug_assert!(batch.is_empty(), "a spliced part ends its batch");
                self.start_splice_out(env, part);
                continue;
            }
            self.sent(env, part);
        }
        self.finished_parts = finished;
        if !batch.is_empty() {
            // A short send: the rest goes first, before anything newer.
            self.sending_since = Some(env.now);
            return self.emit(Io::Send { batch });
        }
        self.batch = Some(batch);
        if self.splicing.is_some() {
            return;
        }
        self.pump_output(env);
        // Slots freed up: requests may be waiting in the receive buffer.
        if self.is_open() {
            self.pump_input(env);
        }
    }

    fn start_splice_out(&mut self, env: &Env, mut part: Part) {
        let pipe = part.pipe.take().expect("a spliced part has its pipe");
        let len = part.pipe_left;
        self.splicing = Some(part);
        self.sending_since = Some(env.now);
        self.emit(Io::SpliceOut { pipe, len });
    }

    pub(super) fn splice_out_done(&mut self, env: &mut Env, result: i32, pipe: Pipe) {
        let mut part = self.splicing.take().expect("a splice completion has its part");
        let since = self.sending_since.take();
        if self.is_broken() {
            drop(pipe);
            return self.sent(env, part);
        }
        if result <= 0 {
            let why = match result {
                0 => "the socket took no data".to_string(),
                e => std::io::Error::from_raw_os_error(-e).to_string(),
            };
            drop(pipe);
            self.sent(env, part);
            return self.fail(env, &format!("splice to the socket failed: {why}"));
        }
        if let Some(since) = since {
            self.pace.network_done(since, env.now, result as usize);
        }
        part.pipe_left -= result as usize;
        if part.pipe_left > 0 {
            part.pipe = Some(pipe);
            return self.start_splice_out(env, part);
        }
        // Drained: the pipe can carry another chunk.
        env.pipes.put(pipe);
        self.sent(env, part);
        self.pump_output(env);
        if self.is_open() {
            self.pump_input(env);
        }
    }

    /// A reply part left (or will never leave): its buffers are free, and its slot too once
    /// nothing else of it is pending.
    pub(super) fn sent(&mut self, env: &mut Env, mut part: Part) {
        drop(part.data.take());
        drop(part.pipe.take());
        if part.extra.capacity() > 0 {
            let mut v = std::mem::take(&mut part.extra);
            v.clear();
            self.spare_vecs.push(v);
        }
        let slot = part.tag as u16;
        self.slot_mut(slot).parts -= 1;
        self.release_if_idle(env, slot);
    }
}
