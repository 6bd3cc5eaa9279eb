//! Unit tests of the core's concerns, each driven by hand without a socket: framing
//! (intake), refused requests (intake, reply), out-of-order chunks (read, reply), the
//! contiguous order of simple replies (reply), and DISC (lifecycle).

use std::sync::Arc;
use std::time::Instant;

use sluice_proto::wire::*;
use sluice_proto::{RawRequest, Session};

use super::{Conn, Env, Io};
use crate::admission::Budget;
use crate::backend::{Backend, Caps, Outcome, StorageOp};
use crate::engine::{Buf, Held, Pipes, Pool, Ring, StorageId, Tag};
use crate::export::{DataPath, Export};
use crate::limits::Limits;
use crate::metrics::Metrics;

struct Later;

impl Backend for Later {
    fn kind(&self) -> &'static str {
        "later"
    }
    fn size(&self) -> u64 {
        1 << 20
    }
    fn caps(&self) -> Caps {
        Caps { trim: true, zero: true, fua: true, ..Caps::default() }
    }
    fn start(&self, _: StorageOp, _: StorageId, _: &mut Ring) -> Option<Outcome> {
        unreachable!("these tests complete operations by hand")
    }
}

struct Rig {
    conn: Conn,
    pool: Pool,
    pipes: Pipes,
    budget: Budget,
    recv: Option<(Buf, usize)>,
    storage: Vec<(Tag, StorageOp)>,
    wire: Vec<u8>,
    shut_read: bool,
}

impl Rig {
    fn new(structured: bool) -> Rig {
        let export = Export {
            name: String::new(),
            description: None,
            read_only: false,
            data_path: DataPath::Copy,
            chunk_bytes: 4096,
            backend: Box::new(Later),
        };
        let flags = export.flags() | FLAG_SEND_DF;
        let session = Session { size: 1 << 20, flags, structured, base_allocation: None, payload_max_bytes: 1 << 20 };
        let metrics = Metrics::new(&[String::new()]);
        let conn = Conn::new("test".into(), Arc::new(export), session, Limits::default(), metrics);
        let mut rig = Rig {
            conn,
            pool: Pool::new(4 << 20, 1 << 20).unwrap(),
            pipes: Pipes::new(0, 0),
            budget: Budget::new(64 << 20),
            recv: None,
            storage: Vec::new(),
            wire: Vec::new(),
            shut_read: false,
        };
        rig.with(|c, env| c.resume(env));
        rig
    }

    /// Runs an event, then carries out sends at once (whole) and keeps the rest pending.
    fn with(&mut self, event: impl FnOnce(&mut Conn, &mut Env)) {
        let mut env = Env { now: Instant::now(), pool: &mut self.pool, pipes: &mut self.pipes, budget: &mut self.budget };
        event(&mut self.conn, &mut env);
        while let Some(io) = self.conn.poll_io() {
            match io {
                Io::Recv { buf, at } => self.recv = Some((buf, at)),
                Io::Send { batch } => {
                    let n = batch.pending_bytes();
                    batch.copy_out(n, &mut self.wire);
                    self.conn.handle_send(&mut env, n as i32, batch);
                }
                Io::Storage { tag, op } => self.storage.push((tag, op)),
                Io::Shutdown(super::Shutdown::Read) => self.shut_read = true,
                Io::Shutdown(_) | Io::SpliceOut { .. } | Io::AwaitBudget => panic!("not expected here"),
            }
        }
    }

    fn deliver(&mut self, bytes: &[u8]) {
        let (mut buf, at) = self.recv.take().expect("the core is receiving");
        buf.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes);
        self.with(|c, env| c.handle_recv(env, bytes.len() as i32, buf));
    }

    /// Completes the pending storage operation with this tag, filling reads with `fill`.
    fn complete(&mut self, tag: Tag, fill: u8) {
        let i = self.storage.iter().position(|(t, _)| *t == tag).expect("such an operation is pending");
        let (_, op) = self.storage.remove(i);
        let (result, held) = match op {
            StorageOp::Read { len, into: Held::Buf(mut buf), at, .. } => {
                buf.as_mut_slice()[at..at + len].fill(fill);
                (len as i32, Held::Buf(buf))
            }
            StorageOp::Write { len, buf, .. } => (len as i32, Held::Buf(buf)),
            _ => (0, Held::Nothing),
        };
        self.with(|c, env| c.handle_storage(env, tag, result, held));
    }
}

fn request(kind: u16, flags: u16, handle: u64, offset: u64, length: u32) -> [u8; REQUEST_BYTES] {
    RawRequest { flags, kind, handle, offset, length }.encode()
}

fn tag(slot: u16, chunk: u16) -> Tag {
    Tag { slot, chunk }
}

#[test]
fn a_header_split_across_receives_is_one_request() {
    let mut rig = Rig::new(false);
    let flush = request(CMD_FLUSH, 0, 7, 0, 0);
    rig.deliver(&flush[..10]);
    assert!(rig.storage.is_empty(), "nothing runs on part of a header");
    rig.deliver(&flush[10..]);
    assert!(matches!(rig.storage[..], [(_, StorageOp::Flush)]));
    let t = rig.storage[0].0;
    rig.complete(t, 0);
    assert_eq!(rig.wire, sluice_proto::reply::simple(7, None));
}

#[test]
fn a_refused_write_is_answered_only_after_its_payload_is_dropped() {
    let mut rig = Rig::new(false);
    let mut bytes = request(CMD_WRITE, 0, 1, (1 << 20) - 512, 4096).to_vec();
    bytes.extend_from_slice(&[9; 4096]);
    bytes.extend_from_slice(&request(CMD_FLUSH, 0, 2, 0, 0));
    rig.deliver(&bytes[..1000]);
    assert!(rig.wire.is_empty(), "the client is still sending the refused write");
    rig.deliver(&bytes[1000..]);
    let error = sluice_proto::reply::simple(1, Some(sluice_proto::Errno::NoSpc));
    assert_eq!(rig.wire, error, "refused once its payload is gone; the flush is next");
    let t = rig.storage[0].0;
    rig.complete(t, 0);
    assert_eq!(rig.wire[16..], sluice_proto::reply::simple(2, None));
}

#[test]
fn structured_read_chunks_leave_in_completion_order() {
    let mut rig = Rig::new(true);
    rig.deliver(&request(CMD_READ, 0, 5, 8192, 3 * 4096));
    assert_eq!(rig.storage.len(), 3, "one storage read per 4 KiB chunk, all at once");
    let slot = rig.storage[0].0.slot;
    rig.complete(tag(slot, 2), 0xcc);
    let head = sluice_proto::reply::offset_data_header(5, 8192 + 2 * 4096, 4096, false);
    assert_eq!(rig.wire[..head.len()], head, "the last chunk, first");
    assert!(rig.wire[head.len()..].iter().all(|&b| b == 0xcc));
    rig.complete(tag(slot, 0), 0xaa);
    rig.complete(tag(slot, 1), 0xbb);
    let done = sluice_proto::reply::offset_data_header(5, 8192 + 4096, 4096, true);
    let at = rig.wire.len() - 4096 - done.len();
    assert_eq!(rig.wire[at..at + done.len()], done, "the final chunk carries DONE");
}

#[test]
fn a_simple_read_goes_out_in_order_and_holds_back_other_replies() {
    let mut rig = Rig::new(false);
    let mut bytes = request(CMD_READ, 0, 1, 0, 2 * 4096).to_vec();
    bytes.extend_from_slice(&request(CMD_FLUSH, 0, 2, 0, 0));
    rig.deliver(&bytes);
    let read_slot = rig.storage[0].0.slot;
    let flush = rig.storage.iter().find(|(_, op)| matches!(op, StorageOp::Flush)).unwrap().0;
    rig.complete(tag(read_slot, 1), 0xbb);
    assert!(rig.wire.is_empty(), "the second chunk cannot go before the first");
    rig.complete(tag(read_slot, 0), 0xaa);
    rig.complete(flush, 0);
    let mut want = sluice_proto::reply::simple(1, None).to_vec();
    want.extend_from_slice(&[0xaa; 4096]);
    want.extend_from_slice(&[0xbb; 4096]);
    want.extend_from_slice(&sluice_proto::reply::simple(2, None));
    assert_eq!(rig.wire, want);
}

#[test]
fn disc_stops_reading_but_answers_what_came_before() {
    let mut rig = Rig::new(false);
    let mut bytes = request(CMD_FLUSH, 0, 1, 0, 0).to_vec();
    bytes.extend_from_slice(&request(CMD_DISC, 0, 2, 0, 0));
    bytes.extend_from_slice(&request(CMD_FLUSH, 0, 3, 0, 0));
    rig.deliver(&bytes);
    assert_eq!(rig.storage.len(), 1, "nothing after DISC is run");
    assert!(rig.recv.is_none(), "nothing more is received");
    assert!(!rig.conn.is_done(), "the flush is still to be answered");
    let t = rig.storage[0].0;
    rig.complete(t, 0);
    assert_eq!(rig.wire, sluice_proto::reply::simple(1, None));
    assert!(rig.conn.is_done());
}

#[test]
fn replies_finished_at_once_leave_in_one_send() {
    let mut rig = Rig::new(false);
    let mut bytes = Vec::new();
    for handle in 1..=3 {
        bytes.extend_from_slice(&request(CMD_FLUSH, 0, handle, 0, 0));
    }
    let (mut buf, at) = rig.recv.take().expect("the core is receiving");
    buf.as_mut_slice()[at..at + bytes.len()].copy_from_slice(&bytes);
    let mut env = Env { now: Instant::now(), pool: &mut rig.pool, pipes: &mut rig.pipes, budget: &mut rig.budget };
    rig.conn.handle_recv(&mut env, bytes.len() as i32, buf);
    let mut sends = Vec::new();
    let mut answered_now = Vec::new();
    while let Some(io) = rig.conn.poll_io() {
        match io {
            Io::Storage { tag, .. } => answered_now.push(tag),
            Io::Send { batch } => sends.push(batch),
            _ => {}
        }
    }
    assert_eq!(answered_now.len(), 3);
    for tag in answered_now {
        rig.conn.handle_storage_now(&mut env, tag, 0, Held::Nothing);
    }
    assert!(rig.conn.poll_io().is_none_or(|io| !matches!(io, Io::Send { .. })), "no send before the flush");
    rig.conn.flush(&mut env);
    while let Some(io) = rig.conn.poll_io() {
        if let Io::Send { batch } = io {
            sends.push(batch);
        }
    }
    assert_eq!(sends.len(), 1, "one send for the three replies");
    assert_eq!(sends[0].pending_bytes(), 3 * SIMPLE_REPLY_BYTES);
}
