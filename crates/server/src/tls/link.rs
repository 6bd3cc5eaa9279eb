//! TLS on a worker: between a connection's core and the ring, records are decrypted into
//! the buffers the core receives into and encrypted from the buffers it sends, in
//! user space. The core does not know TLS is there: it asks for a receive or a send as on
//! a plain socket, and the link answers it once the plaintext is in its buffer or the
//! ciphertext of its batch has left. Ciphertext moves by the same ring operations, and
//! OpenSSL only ever sees the two buffers of its `Channel`.

use std::collections::VecDeque;
use std::os::fd::RawFd;

use openssl::ssl::{ErrorCode, SslStream};

use super::channel::Channel;
use crate::engine::{Buf, ConnId, Part, Ring, SendBatch};
use crate::limits::{TLS_CIPHER_IN_BYTES, TLS_OUTPUT_MAX_BYTES, TLS_SEND_ROUND_BYTES};

/// Plaintext of a full TLS record: smaller writes are gathered up to this before
/// encrypting, so that small replies share records.
const RECORD_PLAIN_BYTES: usize = 16 * 1024;

/// An answer to an operation the core asked for, to be passed to its `handle_*`.
pub enum Answer {
    Recv { result: i32, buf: Buf },
    Send { result: i32, batch: Box<SendBatch> },
}

/// Where the link's socket operations go.
pub struct Wire<'a> {
    pub ring: &'a mut Ring,
    pub fd: RawFd,
    pub id: ConnId,
}

pub struct TlsLink {
    ssl: SslStream<Channel>,
    /// The core's receive, waiting for a record.
    parked: Option<(Buf, usize)>,
    recv_in_flight: bool,
    /// The core's batch, and how many of its plaintext bytes the ciphertext in flight
    /// carries; answered once `acked` reaches `done_at`.
    plain: Option<(Box<SendBatch>, usize)>,
    done_at: Option<u64>,
    /// Ciphertext handed to the ring so far, and acknowledged by it.
    queued: u64,
    acked: u64,
    send_in_flight: bool,
    /// Reused between sends: the one-part batch ciphertext goes out in, and the buffer that
    /// takes OpenSSL's next output while the previous one is sent.
    spare_batch: Option<Box<SendBatch>>,
    spare_out: Vec<u8>,
    /// Small pieces of plaintext gathered into one record.
    stage: Vec<u8>,
    answers: VecDeque<Answer>,
    /// The core shut the read side: a parked receive ends instead of waiting for more.
    read_shut: bool,
    /// A send failed: the socket is gone, and every later send gets this error.
    send_failed: Option<i32>,
}

impl TlsLink {
    pub fn new(mut ssl: SslStream<Channel>) -> TlsLink {
        ssl.get_mut().detach();
        TlsLink {
            ssl,
            parked: None,
            recv_in_flight: false,
            plain: None,
            done_at: None,
            queued: 0,
            acked: 0,
            send_in_flight: false,
            spare_batch: Some(SendBatch::new(1)),
            spare_out: Vec::new(),
            stage: Vec::with_capacity(RECORD_PLAIN_BYTES),
            answers: VecDeque::with_capacity(2),
            read_shut: false,
            send_failed: None,
        }
    }

    /// The next answer for the core, if any.
    pub fn answer(&mut self) -> Option<Answer> {
        self.answers.pop_front()
    }

    /// No socket operation of the link's own is in flight: the connection may be dropped
    /// once its core is done too.
    pub fn is_idle(&self) -> bool {
        !self.recv_in_flight && !self.send_in_flight
    }

    /// The version and cipher, for the log.
    pub fn describe(&self) -> String {
        let ssl = self.ssl.ssl();
        let cipher = ssl.current_cipher().map_or("?", |c| c.name());
        format!("{} {cipher}", ssl.version_str())
    }

    /// The core shut the socket's read side (to wake a parked receive): no more ciphertext
    /// is waited for.
    pub fn shut_read(&mut self) {
        self.read_shut = true;
        // A receive held back for the output to drain ends now; one in flight ends when
        // the shut socket answers it.
        if let Some((buf, _)) = self.parked.take_if(|_| !self.recv_in_flight) {
            self.answers.push_back(Answer::Recv { result: 0, buf });
        }
    }

    /// The core asks to receive into `buf[at..]`.
    pub fn recv(&mut self, wire: &mut Wire, buf: Buf, at: usize) {
        assert!(at < buf.len(), "a receive into a full buffer");
        debug_assert!(self.parked.is_none() && !self.recv_in_flight);
        self.parked = Some((buf, at));
        self.decrypt(wire);
    }

    /// Ciphertext arrived (or the receive failed).
    pub fn on_recv(&mut self, wire: &mut Wire, result: i32, buf: Vec<u8>) {
        self.recv_in_flight = false;
        let ch = self.ssl.get_mut();
        ch.input = Some(buf);
        match result {
            n if n > 0 => {
                ch.read = 0;
                ch.filled = n as usize;
            }
            0 => ch.input_ended = true,
            e => {
                ch.input_ended = true;
                if let Some((buf, _)) = self.parked.take() {
                    self.answers.push_back(Answer::Recv { result: e, buf });
                }
                return;
            }
        }
        self.decrypt(wire);
    }

    /// Decrypts what is buffered into the parked receive; receives more ciphertext when
    /// a record is still incomplete.
    fn decrypt(&mut self, wire: &mut Wire) {
        let Some((mut buf, at)) = self.parked.take() else { return };
        let mut n = 0;
        let mut end = None;
        while at + n < buf.len() {
            match self.ssl.ssl_read(&mut buf.as_mut_slice()[at + n..]) {
                Ok(k) => n += k,
                Err(e) if e.code() == ErrorCode::WANT_READ => break,
                Err(e) if e.code() == ErrorCode::ZERO_RETURN => {
                    end = Some(0);
                    break;
                }
                Err(e) => {
                    // A peer that hangs up without close_notify is an ordinary close.
                    let eof = self.ssl.get_ref().input_ended;
                    if !eof {
                        log::debug!("TLS receive failed: {e}");
                    }
                    end = Some(if eof { 0 } else { -libc::EPROTO });
                    break;
                }
            }
        }
        // Reading can make OpenSSL answer (a key update, an alert).
        self.flush(wire);
        if n > 0 {
            return self.answers.push_back(Answer::Recv { result: n as i32, buf });
        }
        if let Some(result) = end {
            return self.answers.push_back(Answer::Recv { result, buf });
        }
        let in_flight = self.in_flight();
        let ch = self.ssl.get_mut();
        if ch.input_ended || self.read_shut {
            return self.answers.push_back(Answer::Recv { result: 0, buf });
        }
        debug_assert_eq!(ch.unread(), 0, "OpenSSL wants more while ciphertext is buffered");
        if ch.output.len() + in_flight > TLS_OUTPUT_MAX_BYTES {
            // The client does not read what we send (OpenSSL's answers to its key updates
            // pile up): receive again once the output has drained.
            self.parked = Some((buf, at));
            return;
        }
        let input = ch.input.take().unwrap_or_else(|| vec![0; TLS_CIPHER_IN_BYTES]);
        self.parked = Some((buf, at));
        self.recv_in_flight = true;
        wire.ring.recv_bytes(wire.fd, input, 0, wire.id);
    }

    /// Ciphertext handed to the ring and not yet acknowledged.
    fn in_flight(&self) -> usize {
        (self.queued - self.acked) as usize
    }

    /// The core asks to send its batch: encrypt a round of it and send the ciphertext.
    pub fn send(&mut self, wire: &mut Wire, batch: Box<SendBatch>) {
        debug_assert!(self.plain.is_none());
        if let Some(result) = self.send_failed {
            return self.answers.push_back(Answer::Send { result, batch });
        }
        let mut taken = 0;
        let mut failed = None;
        let (ssl, stage) = (&mut self.ssl, &mut self.stage);
        let mut write = |bytes: &[u8]| -> bool {
            // Without partial writes (not enabled) OpenSSL writes all or fails.
            match ssl.ssl_write(bytes) {
                Ok(n) => debug_assert_eq!(n, bytes.len()),
                Err(e) => failed = Some(e),
            }
            failed.is_none()
        };
        batch.for_each_pending(|mut piece| {
            piece = &piece[..piece.len().min(TLS_SEND_ROUND_BYTES - taken)];
            taken += piece.len();
            while !piece.is_empty() {
                if stage.is_empty() && piece.len() >= RECORD_PLAIN_BYTES {
                    // Whole records straight from the buffer; the tail is gathered.
                    let whole = piece.len() / RECORD_PLAIN_BYTES * RECORD_PLAIN_BYTES;
                    if !write(&piece[..whole]) {
                        return false;
                    }
                    piece = &piece[whole..];
                    continue;
                }
                let take = piece.len().min(RECORD_PLAIN_BYTES - stage.len());
                stage.extend_from_slice(&piece[..take]);
                piece = &piece[take..];
                if stage.len() == RECORD_PLAIN_BYTES {
                    let ok = write(stage);
                    stage.clear();
                    if !ok {
                        return false;
                    }
                }
            }
            taken < TLS_SEND_ROUND_BYTES
        });
        if !stage.is_empty() {
            // A failed write left `failed` set; another changes nothing.
            write(stage);
            stage.clear();
        }
        if let Some(e) = failed {
            log::debug!("TLS send failed: {e}");
            return self.answers.push_back(Answer::Send { result: -libc::EPROTO, batch });
        }
        self.plain = Some((batch, taken));
        self.done_at = Some(self.queued + self.ssl.get_ref().output.len() as u64);
        self.flush(wire);
        self.answer_send();
    }

    /// Ciphertext left (or the send failed).
    pub fn on_send(&mut self, wire: &mut Wire, result: i32, mut batch: Box<SendBatch>) {
        self.send_in_flight = false;
        if result <= 0 {
            let result = if result == 0 { -libc::EPIPE } else { result };
            self.send_failed = Some(result);
            batch.drain(drop);
            self.spare_batch = Some(batch);
            if let Some((plain, _)) = self.plain.take() {
                self.done_at = None;
                self.answers.push_back(Answer::Send { result, batch: plain });
            }
            // A receive held back for the output to drain will not see it drain.
            if let Some((buf, _)) = self.parked.take_if(|_| !self.recv_in_flight) {
                self.answers.push_back(Answer::Recv { result, buf });
            }
            return;
        }
        self.acked += result as u64;
        let spare = &mut self.spare_out;
        batch.consume(result as usize, |mut part| {
            part.extra.clear();
            *spare = std::mem::take(&mut part.extra);
        });
        if !batch.is_empty() {
            self.send_in_flight = true;
            return wire.ring.send(wire.fd, batch, wire.id, true);
        }
        self.spare_batch = Some(batch);
        self.flush(wire);
        self.answer_send();
        if !self.send_in_flight && self.plain.is_none() && self.spare_out.capacity() > RECORD_PLAIN_BYTES {
            // Idle: give back the ciphertext buffer of the last round; a busy connection
            // keeps reusing it.
            self.spare_out = Vec::new();
        }
        if self.parked.is_some() && !self.recv_in_flight {
            // A receive held back while the output was full.
            self.decrypt(wire);
        }
    }

    /// Sends what OpenSSL has written, unless a send is already in flight (its completion
    /// sends the rest).
    fn flush(&mut self, wire: &mut Wire) {
        let ch = self.ssl.get_mut();
        if self.send_in_flight || ch.output.is_empty() {
            return;
        }
        let bytes = std::mem::replace(&mut ch.output, std::mem::take(&mut self.spare_out));
        self.queued += bytes.len() as u64;
        let mut batch = self.spare_batch.take().unwrap_or_else(|| SendBatch::new(1));
        batch.push(Part::new(0, &[], None, bytes));
        self.send_in_flight = true;
        wire.ring.send(wire.fd, batch, wire.id, true);
    }

    fn answer_send(&mut self) {
        if self.done_at.is_some_and(|at| self.acked >= at) {
            let (batch, taken) = self.plain.take().expect("a round is in flight");
            self.done_at = None;
            self.answers.push_back(Answer::Send { result: taken as i32, batch });
        }
    }

    /// Ends the TLS session with close_notify, best effort: the connection is closing, so
    /// the alert is sent straight from here without waiting (it is a few dozen bytes and
    /// the socket's buffer is empty once every reply has left).
    pub fn close_notify(&mut self, fd: std::os::fd::BorrowedFd) {
        if self.ssl.shutdown().is_ok() {
            let out = &self.ssl.get_ref().output;
            let _ = rustix::net::send(fd, out, rustix::net::SendFlags::NOSIGNAL | rustix::net::SendFlags::DONTWAIT);
        }
    }
}
