//! Unit tests of the core's concerns, each driven by hand without a socket: framing
//! (intake), refused requests (intake, reply), out-of-order chunks (read, reply), the
//! contiguous order of simple replies (reply), DISC (lifecycle), and automatic chunks read
//! through a window and sized by the rates the core measured (read, pace).

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::wire::*;
use sluice_proto::{RawRequest, Session};

use super::{Conn, Env, Io};
use crate::admission::Budget;
use crate::backend::{Backend, Caps, Outcome, StorageOp};
use crate::engine::{Buf, Held, Pipes, Pool, Ring, StorageId, Tag};
use crate::export::{Chunking, DataPath, Export};
use crate::limits::{Limits, CHUNK_AUTO_MIN_BYTES, CHUNK_COST_NS, CHUNK_WINDOW_COUNT};
use crate::metrics::Metrics;

/// Storage whose operations the tests complete by hand; `splice` says it can fill pipes,
/// `direct` that it has an O_DIRECT path (4 KiB aligned), `chunk_cost_ns` what it says a
/// chunk costs.
pub(super) struct Later {
    splice: bool,
    direct: bool,
    chunk_cost_ns: Option<u64>,
}

const SIZE: u64 = 16 << 20;

impl Backend for Later {
    fn kind(&self) -> &'static str {
        "later"
    }
    fn size(&self) -> u64 {
        SIZE
    }
    fn caps(&self) -> Caps {
        let direct_align = self.direct.then_some(4096);
        Caps { trim: true, zero: true, fua: true, splice: self.splice, direct_align, chunk_cost_ns: self.chunk_cost_ns, ..Caps::default() }
    }
    fn start(&self, _: StorageOp, _: StorageId, _: &mut Ring) -> Option<Outcome> {
        unreachable!("these tests complete operations by hand")
    }
}

pub(super) struct Rig {
    pub(super) conn: Conn,
    pool: Pool,
    pipes: Pipes,
    budget: Budget,
    recv: Option<(Buf, usize)>,
    /// The pending receive wants its whole buffer filled (a write's payload).
    pub(super) recv_whole: bool,
    pub(super) storage: Vec<(Tag, StorageOp)>,
    pub(super) wire: Vec<u8>,
    pub(super) shut_read: bool,
    /// The core's clock: tests move it to stand for time spent in storage and on the wire.
    now: Instant,
    /// Sends take their bytes at this rate (bytes per second); None: at once.
    network: Option<f64>,
}

impl Rig {
    fn new(structured: bool) -> Rig {
        Rig::chunked(structured, Chunking::Fixed(4096))
    }

    fn chunked(structured: bool, chunking: Chunking) -> Rig {
        Rig::build(structured, chunking, DataPath::Copy, Pipes::new(0, 0))
    }

    fn build(structured: bool, chunking: Chunking, data_path: DataPath, pipes: Pipes) -> Rig {
        Rig::build_with(chunking, data_path, pipes, |s| s.structured = structured)
    }

    /// A rig whose session `adjust` changes from the compact default.
    pub(super) fn build_with(chunking: Chunking, data_path: DataPath, pipes: Pipes, adjust: impl FnOnce(&mut Session)) -> Rig {
        Rig::build_costing(chunking, data_path, pipes, adjust, None)
    }

    fn build_costing(chunking: Chunking, data_path: DataPath, pipes: Pipes, adjust: impl FnOnce(&mut Session), chunk_cost_ns: Option<u64>) -> Rig {
        let export = Export {
            name: String::new(),
            description: None,
            read_only: false,
            data_path,
            chunking,
            elastic: None,
            identity: String::new(),
            backend: Box::new(Later {
                splice: data_path.uses_splice(),
                direct: matches!(data_path, DataPath::Direct | DataPath::SpliceDirect),
                chunk_cost_ns,
            }),
        };
        let flags = export.flags() | FLAG_SEND_DF;
        let mut session = Session { size: SIZE, flags, structured: false, extended: false, base_allocation: None, payload_max_bytes: 32 << 20 };
        adjust(&mut session);
        let metrics = Metrics::new(&[String::new()]);
        let conn = Conn::new("test".into(), Arc::new(export), session, Limits::default(), metrics);
        let mut rig = Rig {
            conn,
            pool: Pool::new(8 << 20, std::time::Duration::from_secs(5), Default::default()),
            pipes,
            budget: Budget::new(64 << 20),
            recv: None,
            recv_whole: false,
            storage: Vec::new(),
            wire: Vec::new(),
            shut_read: false,
            now: Instant::now(),
            network: None,
        };
        rig.with(|c, env| c.resume(env));
        rig
    }

    /// Runs an event, then carries out sends at once (whole) and keeps the rest pending.
    pub(super) fn with(&mut self, event: impl FnOnce(&mut Conn, &mut Env)) {
        let mut env = Env { now: self.now, pool: &mut self.pool, pipes: &mut self.pipes, budget: &mut self.budget };
        event(&mut self.conn, &mut env);
        while let Some(io) = self.conn.poll_io() {
            match io {
                Io::Recv { buf, at, whole } => {
                    self.recv = Some((buf, at));
                    self.recv_whole = whole;
                }
                Io::Send { batch } => {
                    let n = batch.pending_bytes();
                    batch.copy_out(n, &mut self.wire);
                    if let Some(rate) = self.network {
                        env.now += Duration::from_secs_f64(n as f64 / rate);
                    }
                    self.conn.handle_send(&mut env, n as i32, batch);
                }
                Io::Storage { tag, op } => self.storage.push((tag, op)),
                Io::Shutdown(super::Shutdown::Read) => self.shut_read = true,
                Io::Shutdown(_) | Io::SpliceOut { .. } | Io::AwaitBudget => panic!("not expected here"),
            }
        }
        self.now = env.now;
    }

    pub(super) fn deliver(&mut self, bytes: &[u8]) {
        let (mut buf, at) = self.recv.take().expect("the core is receiving");
        buf.as_mut_slice()[at..at + bytes.len()].copy_from_slice(bytes);
        self.with(|c, env| c.handle_recv(env, bytes.len() as i32, buf));
    }

    /// Completes the pending storage operation with this tag, filling reads with `fill`.
    pub(super) fn complete(&mut self, tag: Tag, fill: u8) {
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
    RawRequest { flags, kind, handle, offset, length: length.into() }.encode()
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
fn a_writes_payload_is_asked_for_whole_and_headers_are_not() {
    let mut rig = Rig::new(false);
    assert!(!rig.recv_whole, "headers: whatever has arrived");
    let len = 256 * 1024;
    let mut bytes = request(CMD_WRITE, 0, 1, 0, len as u32).to_vec();
    bytes.extend((0..len).map(|i| (i % 251) as u8));
    rig.deliver(&bytes[..1000]);
    assert!(rig.recv_whole, "the rest of the payload is wanted whole");
    // A short answer (a kernel that does not wait for it all) is taken as before.
    rig.deliver(&bytes[1000..5000]);
    assert!(rig.recv_whole && rig.storage.is_empty());
    rig.deliver(&bytes[5000..]);
    assert!(!rig.recv_whole, "the next receive is for headers");
    let [(_, StorageOp::Write { buf, at, len: n, .. })] = &rig.storage[..] else { panic!("one write") };
    assert_eq!(&buf.as_slice()[*at..*at + *n], &bytes[REQUEST_BYTES..]);
}

#[test]
fn a_refused_write_is_answered_only_after_its_payload_is_dropped() {
    let mut rig = Rig::new(false);
    let mut bytes = request(CMD_WRITE, 0, 1, SIZE - 512, 4096).to_vec();
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
    let head = sluice_proto::reply::offset_data_header(sluice_proto::reply::ReplyTo::compact(5), 8192 + 2 * 4096, 4096, false);
    assert_eq!(rig.wire[..head.len()], *head, "the last chunk, first");
    assert!(rig.wire[head.len()..].iter().all(|&b| b == 0xcc));
    rig.complete(tag(slot, 0), 0xaa);
    rig.complete(tag(slot, 1), 0xbb);
    let done = sluice_proto::reply::offset_data_header(sluice_proto::reply::ReplyTo::compact(5), 8192 + 4096, 4096, true);
    let at = rig.wire.len() - 4096 - done.len();
    assert_eq!(rig.wire[at..at + done.len()], *done, "the final chunk carries DONE");
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

/// The byte every offset of the rig's storage holds, in the tests that read it back.
fn pattern(offset: u64) -> u8 {
    (offset % 251) as u8 + 1
}

impl Rig {
    /// Completes a pending read with the pattern bytes, after `took` of storage time.
    fn read_done(&mut self, tag: Tag, took: Duration) {
        let i = self.storage.iter().position(|(t, _)| *t == tag).expect("such an operation is pending");
        let (_, op) = self.storage.remove(i);
        let StorageOp::Read { offset, len, into: Held::Buf(mut buf), at, .. } = op else { panic!("not a read into a buffer") };
        for (k, b) in buf.as_mut_slice()[at..at + len].iter_mut().enumerate() {
            *b = pattern(offset + k as u64);
        }
        self.now += took;
        self.with(|c, env| c.handle_storage(env, tag, len as i32, Held::Buf(buf)));
    }

    /// Chunk reads of a slot at the storage now.
    fn reads_of(&self, slot: u16) -> usize {
        self.storage.iter().filter(|(t, op)| t.slot == slot && matches!(op, StorageOp::Read { .. })).count()
    }

    /// Reads `len` bytes at 0, completing chunk reads oldest first, each taking its length
    /// at `storage` bytes per second (None: at once); returns the chunk reads' lengths.
    fn read_through(&mut self, handle: u64, len: u32, storage: Option<f64>) -> Vec<usize> {
        self.wire.clear();
        self.deliver(&request(CMD_READ, 0, handle, 0, len));
        let mut lens = Vec::new();
        while let Some((tag, StorageOp::Read { len, .. })) = self.storage.first() {
            let (tag, len) = (*tag, *len);
            lens.push(len);
            self.read_done(tag, storage.map_or(Duration::ZERO, |r| Duration::from_secs_f64(len as f64 / r)));
        }
        let (data, _, error) = reassemble(&self.wire, true, 0, len as usize);
        assert!(!error && data.iter().enumerate().all(|(i, &b)| b == pattern(i as u64)), "read {handle} differs");
        lens
    }
}

/// One read's reply on the wire: its data placed by offset, the number of data pieces, and
/// whether it ended in an error.
fn reassemble(wire: &[u8], structured: bool, offset: u64, len: usize) -> (Vec<u8>, usize, bool) {
    if !structured {
        let (error, _) = sluice_proto::client::decode_simple(wire[4..SIMPLE_REPLY_BYTES].try_into().unwrap());
        return (wire[SIMPLE_REPLY_BYTES..SIMPLE_REPLY_BYTES + len].to_vec(), 1, error != 0);
    }
    let (mut data, mut pieces, mut error, mut at) = (vec![0u8; len], 0, false, 0);
    while at < wire.len() {
        let h = sluice_proto::client::ChunkHeader::decode(wire[at + 4..at + CHUNK_HEADER_BYTES].try_into().unwrap());
        let payload = &wire[at + CHUNK_HEADER_BYTES..at + CHUNK_HEADER_BYTES + h.len as usize];
        if h.kind == REPLY_TYPE_OFFSET_DATA {
            let from = (u64::from_be_bytes(payload[..8].try_into().unwrap()) - offset) as usize;
            data[from..from + payload.len() - 8].copy_from_slice(&payload[8..]);
            pieces += 1;
        }
        error |= h.is_error();
        at += CHUNK_HEADER_BYTES + h.len as usize;
        assert_eq!(h.done(), at == wire.len(), "DONE on the last chunk, and only there");
    }
    (data, pieces, error)
}

#[test]
fn auto_reads_keep_at_most_a_window_of_chunks_at_the_storage() {
    for (structured, flags) in [(false, 0), (true, 0), (true, CMD_FLAG_DF)] {
        let mut rig = Rig::chunked(structured, Chunking::Auto);
        let (offset, len) = (12345, 4 << 20);
        rig.deliver(&request(CMD_READ, flags, 9, offset, len as u32));
        let slot = rig.storage[0].0.slot;
        let (mut reads, mut most) = (0, 0);
        while !rig.storage.is_empty() {
            most = most.max(rig.reads_of(slot));
            // The newest, then the oldest: chunks come back out of order.
            let t = rig.storage[if reads % 2 == 0 { rig.storage.len() - 1 } else { 0 }].0;
            rig.read_done(t, Duration::from_micros(200));
            reads += 1;
        }
        let mode = format!("structured {structured}, flags {flags}");
        assert_eq!(most, CHUNK_WINDOW_COUNT, "{mode}: chunk reads at the storage at once");
        assert!(reads > CHUNK_WINDOW_COUNT, "{mode}: the read was cut into only {reads} chunks");
        let (data, pieces, error) = reassemble(&rig.wire, structured, offset, len);
        assert!(!error, "{mode}");
        assert!(data.iter().enumerate().all(|(i, &b)| b == pattern(offset + i as u64)), "{mode}: the data differs");
        assert_eq!(pieces, if structured && flags == 0 { reads } else { 1 }, "{mode}");
    }
}

#[test]
fn a_failed_chunk_gives_up_the_chunks_not_yet_read() {
    let mut rig = Rig::chunked(true, Chunking::Auto);
    rig.deliver(&request(CMD_READ, 0, 4, 0, 4 << 20));
    let slot = rig.storage[0].0.slot;
    assert_eq!(rig.reads_of(slot), CHUNK_WINDOW_COUNT);
    let (first, op) = rig.storage.remove(0);
    let StorageOp::Read { into, .. } = op else { panic!("not a read") };
    rig.with(|c, env| c.handle_storage(env, first, -libc::EIO, into));
    assert_eq!(rig.reads_of(slot), CHUNK_WINDOW_COUNT - 1, "nothing more is read after the error");
    while let Some(&(t, _)) = rig.storage.first() {
        rig.read_done(t, Duration::ZERO);
    }
    let (_, pieces, error) = reassemble(&rig.wire, true, 0, 4 << 20);
    assert!(error && pieces == 0, "the reply is the error alone");
    rig.deliver(&request(CMD_DISC, 0, 5, 0, 0));
    assert!(rig.conn.is_done(), "every chunk is accounted for, so the read's slot was freed");
}

#[test]
fn auto_chunks_follow_the_measured_rates() {
    // Reads and sends that complete at once.
    let mut rig = Rig::chunked(true, Chunking::Auto);
    let first = rig.read_through(1, 4 << 20, None);
    assert!(first.len() > 1, "before anything is measured, 4 MiB reads are split: {first:?}");
    assert_eq!(rig.read_through(2, 4 << 20, None), [4 << 20], "what completes at once is read whole");
    // Cold: a disk and a network of 200 MB/s; smaller chunks than the first read's.
    let mut rig = Rig::chunked(true, Chunking::Auto);
    rig.network = Some(200e6);
    rig.read_through(1, 4 << 20, Some(200e6));
    let cold = rig.read_through(2, 4 << 20, Some(200e6));
    assert!(cold.len() > first.len(), "{} chunks cold, {} at first", cold.len(), first.len());
    assert!(cold.iter().all(|&c| c == CHUNK_AUTO_MIN_BYTES), "{cold:?}");
}

#[test]
fn a_backend_whose_chunks_cost_more_gets_larger_chunks() {
    // Cold, as above: a disk and a network of 200 MB/s.
    let chunks = |cost: Option<u64>| {
        let mut rig = Rig::build_costing(Chunking::Auto, DataPath::Copy, Pipes::new(0, 0), |s| s.structured = true, cost);
        rig.network = Some(200e6);
        rig.read_through(1, 4 << 20, Some(200e6));
        rig.read_through(2, 4 << 20, Some(200e6))
    };
    let local = chunks(None);
    assert!(local.iter().all(|&c| c == CHUNK_AUTO_MIN_BYTES), "{local:?}");
    // Four times the cost, twice the chunk.
    let remote = chunks(Some(4 * CHUNK_COST_NS));
    assert!(remote.iter().all(|&c| c == 2 * CHUNK_AUTO_MIN_BYTES), "{remote:?}");
}

#[test]
fn small_reads_on_a_splice_export_are_copied_without_a_pipe() {
    let mut rig = Rig::build(true, Chunking::Fixed(1 << 20), DataPath::Splice, Pipes::new(4, 1 << 20));
    if rig.pipes.bytes() < 1 << 20 {
        eprintln!("SKIP: this system grants no 1 MiB pipes");
        return;
    }
    rig.deliver(&request(CMD_READ, 0, 1, 0, 4096));
    assert!(matches!(rig.storage[..], [(_, StorageOp::Read { into: Held::Buf(_), .. })]), "a 4 KiB read goes to a buffer");
    assert_eq!(rig.pipes.in_use(), 0, "and takes no pipe");
    let t = rig.storage[0].0;
    rig.complete(t, 7);
    assert_eq!(rig.pipes.in_use(), 0);
    // The control: a lone large read on the same export is spliced.
    rig.deliver(&request(CMD_READ, 0, 2, 0, 1 << 20));
    assert!(matches!(rig.storage[..], [(_, StorageOp::Read { into: Held::Pipe(_), .. })]), "a lone 1 MiB read fills a pipe");
}

#[test]
fn large_reads_in_flight_together_are_each_spliced() {
    let mut rig = Rig::build(true, Chunking::Fixed(1 << 20), DataPath::Splice, Pipes::new(4, 1 << 20));
    if rig.pipes.bytes() < 1 << 20 {
        eprintln!("SKIP: this system grants no 1 MiB pipes");
        return;
    }
    let mut bytes = request(CMD_READ, 0, 1, 0, 1 << 20).to_vec();
    bytes.extend_from_slice(&request(CMD_READ, 0, 2, 1 << 20, 1 << 20));
    bytes.extend_from_slice(&request(CMD_READ, 0, 3, 2 << 20, 256 << 10));
    rig.deliver(&bytes);
    assert_eq!(rig.storage.len(), 3, "all three reads reach the storage at once");
    assert!(rig.storage.iter().all(|(_, op)| matches!(op, StorageOp::Read { into: Held::Pipe(_), .. })), "each fills a pipe");
    assert_eq!(rig.pipes.in_use(), 3);
}

#[test]
fn an_o_direct_splice_is_taken_only_by_a_read_that_is_alone() {
    let mut rig = Rig::build(true, Chunking::Fixed(1 << 20), DataPath::SpliceDirect, Pipes::new(4, 1 << 20));
    if rig.pipes.bytes() < 1 << 20 {
        eprintln!("SKIP: this system grants no 1 MiB pipes");
        return;
    }
    let mut bytes = request(CMD_READ, 0, 1, 0, 1 << 20).to_vec();
    bytes.extend_from_slice(&request(CMD_READ, 0, 2, 1 << 20, 1 << 20));
    rig.deliver(&bytes);
    assert!(
        matches!(rig.storage[..], [(_, StorageOp::Read { into: Held::Pipe(_), direct: true, .. }), (_, StorageOp::Read { into: Held::Buf(_), direct: true, .. })]),
        "the first read splices from the O_DIRECT descriptor, the second reads into a buffer"
    );
    assert_eq!(rig.pipes.in_use(), 1);
}

#[test]
fn a_request_held_at_the_backend_past_the_threshold_is_slow_until_it_ends() {
    use crate::metrics::Look;
    let mut rig = Rig::new(true);
    let threshold = Duration::from_millis(Limits::default().slow_request_ms);
    let start = rig.now;
    assert_eq!(rig.conn.watch(start), Look::default(), "nothing at the backend yet");
    let mut bytes = request(CMD_FLUSH, 0, 1, 0, 0).to_vec();
    bytes.extend_from_slice(&request(CMD_READ, 0, 2, 0, 4096));
    rig.deliver(&bytes);
    let (flush, read) = (rig.storage[0].0, rig.storage[1].0);
    let before = start + threshold - Duration::from_millis(1);
    assert_eq!(rig.conn.watch(before), Look { slow: 0, oldest: Some(start) });
    assert_eq!(rig.conn.watch(start + threshold), Look { slow: 2, oldest: Some(start) });
    // The read ends; the flush is still held, and still counted once.
    rig.now = start + threshold;
    rig.complete(read, 0x11);
    assert_eq!(rig.conn.watch(start + 3 * threshold), Look { slow: 1, oldest: Some(start) });
    rig.complete(flush, 0);
    assert_eq!(rig.conn.watch(start + 4 * threshold), Look::default(), "both ended");
    // A request the backend answers in time is never slow.
    rig.deliver(&request(CMD_FLUSH, 0, 3, 0, 0));
    let t = rig.storage[0].0;
    let at = rig.now;
    assert_eq!(rig.conn.watch(at + threshold / 2), Look { slow: 0, oldest: Some(at) });
    rig.complete(t, 0);
    assert_eq!(rig.conn.watch(at + 2 * threshold), Look::default());
}
