//! A client's transmission phase on a connection negotiated without structured replies (as
//! the kernel's nbd driver negotiates one), without I/O: each request gets a slot, a cookie
//! and the bytes of its header; the bytes the server sends back go in and come out as
//! events naming the slot they answer. Whoever drives it owns the sockets and the buffers.
//!
//! A simple reply is a 16-byte header and, for a read that succeeded, exactly the bytes
//! asked for; a read that failed carries none. A reply this client cannot believe (a wrong
//! magic, a structured reply it never asked for, a cookie it never sent or that was
//! answered already) is an error, after which the stream is out of step and the caller
//! must end the connection.

use crate::client::{decode_simple, reply_magic, Malformed};
use crate::request::RawRequest;
use crate::wire::*;

/// What the bytes taken so far amount to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Event {
    /// The next `len` bytes of the input (the ones this call took) are read data for the
    /// request in `slot`, from byte `at` of its range on.
    Data { slot: u32, at: u32, len: u32 },
    /// The request in `slot` is answered: `error` is 0 or the server's error code. A read
    /// answered with 0 had every byte of its range in `Data` events (or `landed`) first.
    /// The slot stays taken until the caller `release`s it.
    Done { slot: u32, error: u32 },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Slot {
    Free,
    /// Sent and not answered; a read's length, to expect its data.
    Sent { read_len: Option<u32> },
    /// Answered, and not yet released by the caller.
    Answered,
}

/// A read's data still to come: `left` bytes for `slot`, from byte `at` of its range.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Data {
    slot: u32,
    at: u32,
    left: u32,
}

pub struct Link {
    slots: Vec<Slot>,
    /// Bumped each time a slot is taken, and put in the cookie's high half, so that a reply
    /// to a slot's earlier request cannot pass for one to its current request.
    generations: Vec<u32>,
    free: Vec<u32>,
    sent: usize,
    head: [u8; SIMPLE_REPLY_BYTES],
    head_have: usize,
    data: Option<Data>,
}

impl Default for Link {
    fn default() -> Link {
        Link::new()
    }
}

impl Link {
    pub fn new() -> Link {
        Link { slots: Vec::new(), generations: Vec::new(), free: Vec::new(), sent: 0, head: [0; SIMPLE_REPLY_BYTES], head_have: 0, data: None }
    }

    /// Requests sent and not yet answered.
    pub fn in_flight(&self) -> usize {
        self.sent
    }

    /// Takes a slot for a request and returns it with the request's header, to be sent
    /// (a write's payload right after it). The caller keeps `len` within the server's
    /// limits, and within 32 bits.
    pub fn request(&mut self, kind: u16, flags: u16, offset: u64, len: u32) -> (u32, [u8; REQUEST_BYTES]) {
        let slot = match self.free.pop() {
            Some(s) => s,
            None => {
                self.slots.push(Slot::Free);
                self.generations.push(0);
                (self.slots.len() - 1) as u32
            }
        };
        let i = slot as usize;
        debug_assert_eq!(self.slots[i], Slot::Free);
        self.generations[i] = self.generations[i].wrapping_add(1);
        self.slots[i] = Slot::Sent { read_len: (kind == CMD_READ).then_some(len) };
        self.sent += 1;
        let handle = (u64::from(self.generations[i]) << 32) | u64::from(slot);
        let raw = RawRequest { flags, kind, handle, offset, length: u64::from(len) };
        (slot, raw.encode())
    }

    /// Gives an answered slot back for reuse.
    pub fn release(&mut self, slot: u32) {
        let s = &mut self.slots[slot as usize];
        assert_eq!(*s, Slot::Answered, "only an answered slot is released");
        *s = Slot::Free;
        self.free.push(slot);
    }

    /// Takes what it can from the front of `input`: the bytes used, and at most one event.
    /// Call it again with the rest until it uses nothing and returns no event.
    pub fn take(&mut self, input: &[u8]) -> Result<(usize, Option<Event>), Malformed> {
        if let Some(d) = self.data {
            if d.left == 0 {
                self.data = None;
                return Ok((0, Some(self.answer(d.slot, 0))));
            }
            let len = d.left.min(input.len().min(u32::MAX as usize) as u32);
            if len == 0 {
                return Ok((0, None));
            }
            self.data = Some(Data { slot: d.slot, at: d.at + len, left: d.left - len });
            return Ok((len as usize, Some(Event::Data { slot: d.slot, at: d.at, len })));
        }
        let want = SIMPLE_REPLY_BYTES - self.head_have;
        let n = want.min(input.len());
        self.head[self.head_have..self.head_have + n].copy_from_slice(&input[..n]);
        self.head_have += n;
        if self.head_have < SIMPLE_REPLY_BYTES {
            return Ok((n, None));
        }
        self.head_have = 0;
        Ok((n, self.header()?))
    }

    /// The read data still to come before the next reply: (slot, at, left). A caller with
    /// no bytes of it in hand may receive it straight into the read's buffer, then say how
    /// much came with `landed`.
    pub fn data_wanted(&self) -> Option<(u32, u32, u32)> {
        self.data.filter(|d| d.left > 0).map(|d| (d.slot, d.at, d.left))
    }

    /// `n` bytes of the data `data_wanted` named arrived outside `take`; the read's `Done`
    /// when they were the last of it.
    pub fn landed(&mut self, n: u32) -> Option<Event> {
        let d = self.data.expect("data was wanted");
        assert!(n <= d.left, "more data landed than was wanted");
        if n == d.left {
            self.data = None;
            return Some(self.answer(d.slot, 0));
        }
        self.data = Some(Data { slot: d.slot, at: d.at + n, left: d.left - n });
        None
    }

    /// Ends every request still unanswered (the connection is gone): their slots, each now
    /// answered, to be released by the caller. The stream's parsing state is dropped.
    pub fn fail_all(&mut self) -> Vec<u32> {
        self.data = None;
        self.head_have = 0;
        let mut out = Vec::new();
        for (i, s) in self.slots.iter_mut().enumerate() {
            if matches!(s, Slot::Sent { .. }) {
                *s = Slot::Answered;
                out.push(i as u32);
            }
        }
        self.sent = 0;
        out
    }

    /// A whole header is in `self.head`: what it answers.
    fn header(&mut self) -> Result<Option<Event>, Malformed> {
        let magic = reply_magic(self.head[..4].try_into().expect("four bytes"));
        if magic != SIMPLE_REPLY_MAGIC {
            let what = match magic {
                STRUCTURED_REPLY_MAGIC | EXTENDED_REPLY_MAGIC => "a structured reply, which this connection did not negotiate".to_string(),
                other => format!("a reply with the unknown magic {other:#010x}"),
            };
            return Err(Malformed(format!("the server sent {what}")));
        }
        let (error, handle) = decode_simple(self.head[4..].try_into().expect("twelve bytes"));
        let slot = handle as u32;
        let generation = (handle >> 32) as u32;
        let read_len = match self.slots.get(slot as usize) {
            Some(Slot::Sent { read_len }) if self.generations[slot as usize] == generation => *read_len,
            _ => return Err(Malformed(format!("the server answered the cookie {handle:#x}, which names no request in flight"))),
        };
        match read_len {
            Some(len) if error == 0 && len > 0 => {
                self.data = Some(Data { slot, at: 0, left: len });
                Ok(None)
            }
            _ => Ok(Some(self.answer(slot, error))),
        }
    }

    fn answer(&mut self, slot: u32, error: u32) -> Event {
        self.slots[slot as usize] = Slot::Answered;
        self.sent -= 1;
        Event::Done { slot, error }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(handle_of: &[u8; REQUEST_BYTES], error: u32) -> Vec<u8> {
        let handle = u64::from_be_bytes(handle_of[8..16].try_into().unwrap());
        let mut b = Vec::new();
        b.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        b.extend_from_slice(&error.to_be_bytes());
        b.extend_from_slice(&handle.to_be_bytes());
        b
    }

    /// Feeds `input` in pieces of `step` bytes and collects the events, with each Data
    /// event's bytes.
    fn feed(link: &mut Link, input: &[u8], step: usize) -> Result<Vec<(Event, Vec<u8>)>, Malformed> {
        let mut out = Vec::new();
        for piece in input.chunks(step) {
            let mut pos = 0;
            loop {
                let (used, ev) = link.take(&piece[pos..])?;
                let bytes = piece[pos..pos + used].to_vec();
                pos += used;
                match ev {
                    Some(e @ Event::Data { .. }) => out.push((e, bytes)),
                    Some(e) => out.push((e, Vec::new())),
                    None if used == 0 => break,
                    None => {}
                }
            }
        }
        Ok(out)
    }

    #[test]
    fn a_request_header_carries_its_slot_and_a_fresh_generation_in_the_cookie() {
        let mut link = Link::new();
        let (slot, head) = link.request(CMD_WRITE, CMD_FLAG_FUA, 4096, 512);
        let raw = RawRequest::decode(&head).unwrap();
        assert_eq!((raw.kind, raw.flags, raw.offset, raw.length), (CMD_WRITE, CMD_FLAG_FUA, 4096, 512));
        assert_eq!(raw.handle as u32, slot);
        let first = raw.handle;
        feed(&mut link, &reply(&head, 0), 16).unwrap();
        link.release(slot);
        let (again, head) = link.request(CMD_WRITE, 0, 0, 1);
        assert_eq!(again, slot, "a released slot is reused");
        assert_ne!(RawRequest::decode(&head).unwrap().handle, first, "with another cookie");
        assert_eq!(link.in_flight(), 1);
    }

    #[test]
    fn replies_split_anywhere_come_out_whole_and_in_their_order() {
        for step in [1, 3, 16, 17, 1000] {
            let mut link = Link::new();
            let (r, rh) = link.request(CMD_READ, 0, 0, 40);
            let (w, wh) = link.request(CMD_WRITE, 0, 0, 8);
            let (f, fh) = link.request(CMD_READ, 0, 0, 9);
            let data: Vec<u8> = (0..40).collect();
            let mut input = reply(&wh, 0);
            input.extend(reply(&rh, 0));
            input.extend(&data);
            input.extend(reply(&fh, 5));
            let events = feed(&mut link, &input, step).unwrap();
            let mut got: Vec<u8> = Vec::new();
            for (e, bytes) in &events {
                if let Event::Data { slot, at, len } = *e {
                    assert_eq!(slot, r);
                    assert_eq!(at as usize, got.len(), "data comes in order");
                    assert_eq!(len as usize, bytes.len());
                    got.extend(bytes);
                }
            }
            assert_eq!(got, data, "step {step}");
            let done: Vec<Event> = events.into_iter().map(|(e, _)| e).filter(|e| matches!(e, Event::Done { .. })).collect();
            let want = [Event::Done { slot: w, error: 0 }, Event::Done { slot: r, error: 0 }, Event::Done { slot: f, error: 5 }];
            assert_eq!(done, want, "a failed read carries no data; step {step}");
            assert_eq!(link.in_flight(), 0);
        }
    }

    #[test]
    fn data_received_by_the_caller_finishes_the_read() {
        let mut link = Link::new();
        let (r, rh) = link.request(CMD_READ, 0, 0, 100);
        let mut input = reply(&rh, 0);
        input.extend([7u8; 30]);
        let events = feed(&mut link, &input, 1000).unwrap();
        assert_eq!(events.len(), 1, "the header, then 30 bytes of data");
        assert_eq!(link.data_wanted(), Some((r, 30, 70)));
        assert_eq!(link.landed(50), None);
        assert_eq!(link.data_wanted(), Some((r, 80, 20)));
        assert_eq!(link.landed(20), Some(Event::Done { slot: r, error: 0 }));
        assert_eq!(link.data_wanted(), None);
    }

    #[test]
    fn replies_it_cannot_believe_are_errors() {
        let mut link = Link::new();
        let (slot, head) = link.request(CMD_READ, 0, 0, 4);
        let mut bad = reply(&head, 0);
        bad[0] ^= 1;
        assert!(feed(&mut link, &bad, 16).unwrap_err().0.contains("unknown magic"));

        let mut link = Link::new();
        let (_, head) = link.request(CMD_READ, 0, 0, 4);
        let mut structured = reply(&head, 0);
        structured[..4].copy_from_slice(&STRUCTURED_REPLY_MAGIC.to_be_bytes());
        assert!(feed(&mut link, &structured, 16).unwrap_err().0.contains("structured"));

        let mut link = Link::new();
        let (s, head) = link.request(CMD_FLUSH, 0, 0, 0);
        assert_eq!(s, slot);
        let answer = reply(&head, 0);
        feed(&mut link, &answer, 16).unwrap();
        assert!(feed(&mut link, &answer, 16).unwrap_err().0.contains("names no request"), "answered twice");
        link.release(s);
        let (_, _) = link.request(CMD_FLUSH, 0, 0, 0);
        assert!(feed(&mut link, &answer, 16).unwrap_err().0.contains("names no request"), "an earlier generation's cookie");
    }

    #[test]
    fn failing_all_answers_what_was_unanswered_and_forgets_a_half_read_reply() {
        let mut link = Link::new();
        let (a, ah) = link.request(CMD_READ, 0, 0, 64);
        let (b, _) = link.request(CMD_WRITE, 0, 0, 64);
        let (c, ch) = link.request(CMD_TRIM, 0, 0, 64);
        feed(&mut link, &reply(&ch, 0), 16).unwrap();
        let mut partial = reply(&ah, 0);
        partial.extend([1u8; 10]);
        feed(&mut link, &partial, 100).unwrap();
        let mut failed = link.fail_all();
        failed.sort();
        assert_eq!(failed, vec![a, b]);
        assert_eq!((link.in_flight(), link.data_wanted()), (0, None));
        for s in [a, b, c] {
            link.release(s);
        }
    }
}
