//! Request intake: framing the byte stream into headers and payloads, the one validation
//! of each request, admission against the slot and byte budgets, and the payload of a
//! rejected write read and dropped so the stream stays in step.

use sluice_proto::request::header_bytes;
use sluice_proto::{validate, Command, RawRequest, Refusal, Request};

use super::state::{Receiving, Slot};
use super::{Conn, Env, Io};
use crate::engine::Buf;

impl Conn {
    pub(super) fn received(&mut self, env: &mut Env, result: i32, buf: Buf) {
        self.recv_in_flight = false;
        let n = match result {
            n if n > 0 => n as usize,
            0 => {
                self.put_back_recv_buf(env, buf);
                return self.stop_reading(env, "client closed the connection");
            }
            e => {
                self.put_back_recv_buf(env, buf);
                let why = format!("receive failed: {}", std::io::Error::from_raw_os_error(-e));
                return self.stop_reading(env, &why);
            }
        };
        match self.receiving {
            Receiving::Headers => {
                self.rbuf = Some(buf);
                self.rend += n;
            }
            Receiving::Payload { slot, filled } => {
                let filled = filled + n;
                if filled < buf.len() {
                    self.receiving = Receiving::Payload { slot, filled };
                    return self.recv(buf, filled, true);
                }
                self.slot_mut(slot).buf = Some(buf);
                self.slot_mut(slot).times.received = Some(env.now);
                self.receiving = Receiving::Headers;
                self.admit(env, slot);
            }
        }
        if self.is_open() {
            self.pump_input(env);
        }
    }

    fn recv(&mut self, buf: Buf, at: usize, whole: bool) {
        self.recv_in_flight = true;
        self.emit(Io::Recv { buf, at, whole });
    }

    fn put_back_recv_buf(&mut self, env: &mut Env, buf: Buf) {
        match self.receiving {
            Receiving::Headers => self.rbuf = Some(buf),
            Receiving::Payload { slot, .. } => {
                // The write never got its payload: answer nothing, just release it.
                self.slot_mut(slot).buf = Some(buf);
                self.release(env, slot);
                self.receiving = Receiving::Headers;
            }
        }
    }

    /// Parses whatever is buffered and posts the next receive when there is room.
    pub(super) fn pump_input(&mut self, env: &mut Env) {
        if !matches!(self.receiving, Receiving::Headers) || self.recv_in_flight {
            return;
        }
        while self.is_open() {
            let avail = self.rend - self.rstart;
            if self.discard > 0 {
                let take = (self.discard as usize).min(avail);
                self.rstart += take;
                self.discard -= take as u64;
                if self.discard > 0 {
                    break;
                }
                if let Some(slot) = self.after_discard.take() {
                    self.reply_rejected(env, slot);
                }
                continue;
            }
            if self.free_slots.is_empty() || self.inflight_bytes >= self.limits.inflight_bytes_per_connection {
                // Over budget: leave the rest in the socket until replies drain.
                return;
            }
            if env.budget.is_full() {
                // The worker's buffers are all spoken for; resume when some come back.
                return self.emit(Io::AwaitBudget);
            }
            let size = header_bytes(self.session.extended);
            if avail < size {
                break;
            }
            let rbuf = self.rbuf.as_ref().expect("the receive buffer is home while headers are parsed");
            let header = &rbuf.as_slice()[self.rstart..self.rstart + size];
            self.rstart += size;
            let raw = match RawRequest::decode_as(header, self.session.extended) {
                Ok(raw) => raw,
                Err(e) => {
                    log::warn!("{}: {e}; disconnecting", self.peer);
                    return self.stop_reading(env, "protocol error");
                }
            };
            if !self.request(env, raw) {
                // The request's payload goes straight into its buffer.
                return;
            }
        }
        if !self.is_open() {
            return;
        }
        let mut rbuf = self.rbuf.take().expect("the receive buffer is home while headers are parsed");
        if self.rstart > 0 {
            rbuf.as_mut_slice().copy_within(self.rstart..self.rend, 0);
            self.rend -= self.rstart;
            self.rstart = 0;
        }
        let at = self.rend;
        self.recv(rbuf, at, false);
    }

    /// Takes one decoded header. Returns false when its payload must be received first.
    fn request(&mut self, env: &mut Env, raw: RawRequest) -> bool {
        let request = match validate(&raw, &self.session) {
            Ok(r) => r,
            Err(Refusal::Disconnect(why)) => {
                log::warn!("{}: {:?}: {why}; disconnecting", self.peer, raw);
                self.stop_reading(env, "protocol error");
                return true;
            }
            Err(Refusal::Reply(rej)) => {
                log::debug!("{}: {:?} rejected: {} ({})", self.peer, raw, rej.errno, rej.reason);
                let mut s = Slot::new(Request { handle: raw.handle, command: Command::Flush }, env.now);
                s.rejection = Some((rej.errno, rej.reason));
                s.offset = raw.offset;
                let slot = self.occupy(s);
                if rej.discard > 0 {
                    // Clients match replies only to requests they finished sending: answer
                    // once the payload has been read and dropped.
                    self.discard = rej.discard;
                    self.after_discard = Some(slot);
                } else {
                    self.reply_rejected(env, slot);
                }
                return true;
            }
        };
        if request.command == Command::Disconnect {
            self.stop_reading(env, "client disconnected");
            return true;
        }
        let mut s = Slot::new(request, env.now);
        s.offset = raw.offset;
        let slot = self.occupy(s);
        self.metrics.request_started(self.metrics_export);
        match request.command {
            Command::Read { range, .. } => {
                // A read's buffers (or pipes) are taken per chunk, but count from now.
                self.hold_bytes(env, slot, range.length as usize);
            }
            Command::Write { range, .. } => {
                self.hold_bytes(env, slot, range.length as usize);
                return self.take_payload(env, slot, range.length as usize);
            }
            _ => {}
        }
        self.admit(env, slot);
        true
    }

    /// Copies what of a write's payload is buffered; receives the rest into its buffer.
    fn take_payload(&mut self, env: &mut Env, slot: u16, len: usize) -> bool {
        let mut buf = env.pool.get(len);
        let avail = (self.rend - self.rstart).min(len);
        let rbuf = self.rbuf.as_ref().expect("the receive buffer is home while headers are parsed");
        buf.as_mut_slice()[..avail].copy_from_slice(&rbuf.as_slice()[self.rstart..self.rstart + avail]);
        self.rstart += avail;
        if avail < len {
            self.receiving = Receiving::Payload { slot, filled: avail };
            self.recv(buf, avail, true);
            return false;
        }
        let s = self.slot_mut(slot);
        s.buf = Some(buf);
        s.times.received = Some(env.now);
        self.admit(env, slot);
        true
    }
}
