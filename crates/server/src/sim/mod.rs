//! A deterministic simulation of one connection's transmission core: a seeded client
//! stream (valid and invalid requests, DISC, garbage), operations completed in random
//! order, short receives and sends, storage errors and short reads, and abrupt closes. After
//! every step it checks what the core may never do; at the end, that every request was
//! answered exactly once (when nothing cut the connection) and that every buffer, pipe and
//! budget byte came back. Some runs hold requests in a QoS scheduler whose storage queue
//! depth is small, letting them go in random order between the other steps; at the end the
//! scheduler must hold nothing and count nothing at the storage. `cargo test` runs it over
//! many seeds; the fuzz target `conn` feeds it bytes.

mod client;

mod storage;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::wire::FLAG_SEND_DF;
use sluice_proto::Session;

use crate::admission::Budget;
use crate::backend::{Backend, Caps, Outcome, StorageOp};
use crate::conn::{Conn, Env, Io, Shutdown};
use crate::engine::{Buf, Pipe, Pipes, Pool, Ring, SendBatch, StorageId, Tag};
use crate::export::{Chunking, DataPath, Export};
use crate::limits::{Limits, CHUNK_WINDOW_COUNT, PIPE_BYTES, REMOTE_CHUNK_COST_NS, SOCKET_SPLICE_PIPE_SHARE_MAX};
use crate::metrics::{Metrics, QosRecorder};
use crate::qos::{Parts, Qos, QosConfig};
use client::{Checker, Sent};
pub use sluice_proto::rng::Rng;

/// A backend the simulation stands in for: it has capabilities, and its operations
/// complete whenever the simulation decides, as a remote member's would.
struct Simulated {
    size: u64,
    caps: Caps,
    pipe_share: usize,
}

impl Backend for Simulated {
    fn kind(&self) -> &'static str {
        "simulated"
    }
    fn size(&self) -> u64 {
        self.size
    }
    fn caps(&self) -> Caps {
        self.caps
    }
    fn pipe_share(&self) -> usize {
        self.pipe_share
    }
    fn start(&self, _op: StorageOp, _id: StorageId, _ring: &mut Ring) -> Option<Outcome> {
        unreachable!("the simulation completes storage operations itself")
    }
}

/// What one run did, for tests that want to see coverage.
#[derive(Debug, Default)]
pub struct Report {
    pub steps: usize,
    pub answered: usize,
    pub clean: bool,
    /// The session used extended headers.
    pub extended: bool,
    /// Requests held by the QoS scheduler and let go later.
    pub held: usize,
}

/// Everything outside the core: the worker's resources and the client's view.
struct World {
    rng: Rng,
    pool: Pool,
    pipes: Pipes,
    budget: Budget,
    size: u64,
    direct_align: Option<usize>,
    /// Chunk reads of one request the storage may hold at once (automatic chunking).
    window: Option<usize>,
    input: Vec<u8>,
    delivered: usize,
    sent: HashMap<u64, Sent>,
    checker: Checker,
    recv: Option<(Buf, usize)>,
    send: Option<Box<SendBatch>>,
    splice: Option<(Pipe, usize)>,
    storage: Vec<(Tag, StorageOp)>,
    awaiting_budget: bool,
    /// The socket was shut in both directions: nothing may be sent after.
    shut: bool,
    stopped: bool,
    /// Something cut replies short (a failed send or read, a stop): answers may be missing.
    cut: bool,
    /// The QoS scheduler, in the runs that restrict the connection, and how many requests
    /// it let go after holding them.
    qos: Option<Arc<Qos>>,
    held: usize,
}

const STEPS_MAX: usize = 200_000;
const SIZE_BYTES: u64 = 4 << 20;

/// Runs one simulated connection to its end; Err says which rule the core broke.
pub fn run(mut rng: Rng) -> Result<Report, String> {
    let structured = rng.below(4) != 0;
    let framing = client::Framing { structured, extended: structured && rng.below(3) == 0 };
    let export = Arc::new(random_export(&mut rng));
    let limits = Limits {
        inflight_requests_per_connection: 1 + rng.below(12) as usize,
        inflight_bytes_per_connection: 64 * 1024 + rng.below(1 << 20) as usize,
        inflight_bytes_per_worker: 64 * 1024 + rng.below(2 << 20) as usize,
        ..Limits::default()
    };
    let flags = export.flags() | if structured { FLAG_SEND_DF } else { 0 };
    let session = Session {
        size: SIZE_BYTES,
        flags,
        structured,
        extended: framing.extended,
        base_allocation: structured.then_some(1),
        payload_max_bytes: REQUEST_PAYLOAD_MAX_BYTES,
    };
    let count = 1 + rng.below(120) as usize;
    let (input, sent) = client::requests(&mut rng, SIZE_BYTES, framing, count);
    let pool = Pool::new(1 << 20, std::time::Duration::from_secs(5), Default::default());
    let mut world = World {
        rng,
        pool,
        pipes: Pipes::new(1 + (count % 4), PIPE_BYTES),
        budget: Budget::new(limits.inflight_bytes_per_worker),
        size: SIZE_BYTES,
        direct_align: export.direct_align(),
        window: (export.chunking == Chunking::Auto).then_some(CHUNK_WINDOW_COUNT),
        input,
        delivered: 0,
        sent,
        checker: Checker::new(framing),
        recv: None,
        send: None,
        splice: None,
        storage: Vec::new(),
        awaiting_budget: false,
        shut: false,
        stopped: false,
        cut: false,
        qos: None,
        held: 0,
    };
    let metrics = Metrics::new(std::slice::from_ref(&export.name));
    let mut conn = Conn::new("sim".into(), Arc::clone(&export), session, limits, metrics);
    if world.rng.below(3) == 0 {
        world.restrict(&mut conn, &export.name)?;
    }
    conn.resume(&mut world.env());
    world.collect(&mut conn)?;
    let mut steps = 0;
    while !conn.is_done() {
        steps += 1;
        if steps > STEPS_MAX {
            return Err("the connection never finished".into());
        }
        world.step(&mut conn)?;
        world.collect(&mut conn)?;
    }
    conn.unrestrict(&mut world.env());
    drop(conn);
    world.finish(steps)
}

/// Every way of cutting reads; `Auto` twice, as the default.
const CHUNKINGS: [Chunking; 6] = [
    Chunking::Off,
    Chunking::Fixed(4096),
    Chunking::Fixed(64 << 10),
    Chunking::Fixed(1 << 20),
    Chunking::Auto,
    Chunking::Auto,
];

fn random_export(rng: &mut Rng) -> Export {
    let data_path = [DataPath::Copy, DataPath::Splice, DataPath::Direct, DataPath::SpliceDirect][rng.below(4) as usize];
    let trim = rng.below(2) == 0;
    let caps = Caps {
        trim,
        zero: rng.below(2) == 0,
        fua: rng.below(2) == 0,
        extents: true,
        rotational: false,
        splice: data_path.uses_splice(),
        direct_align: data_path.uses_direct().then_some(4096),
        instant: rng.below(8) == 0,
        // The simulated client writes at any offset.
        block_min: None,
        // Half the copy-path exports stand for remote ones (which have no other path) and
        // take their chunk cost, which cuts larger chunks. Decided from draws made anyway,
        // so that each seed's export is drawn as before.
        chunk_cost_ns: (data_path == DataPath::Copy && trim).then_some(REMOTE_CHUNK_COST_NS),
    };
    Export {
        name: "sim".into(),
        description: None,
        read_only: false,
        data_path,
        chunking: CHUNKINGS[rng.below(CHUNKINGS.len() as u64) as usize],
        elastic: None,
        identity: String::new(),
        // Half the spliced exports stand for remote ones, whose chunks fill a share of a
        // pipe (from a draw made anyway, so that each seed's export is drawn as before).
        backend: Box::new(Simulated { size: SIZE_BYTES, caps, pipe_share: if trim { SOCKET_SPLICE_PIPE_SHARE_MAX } else { 1 } }),
    }
}

impl World {
    fn env(&mut self) -> Env<'_> {
        Env { now: Instant::now(), pool: &mut self.pool, pipes: &mut self.pipes, budget: &mut self.budget }
    }

    /// Takes every operation the core asks for, checking it may ask for it now.
    fn collect(&mut self, conn: &mut Conn) -> Result<(), String> {
        let mut answered_now = false;
        while let Some(io) = conn.poll_io() {
            match io {
                Io::Recv { buf, at, .. } if self.recv.is_none() => self.recv = Some((buf, at)),
                Io::Send { .. } | Io::SpliceOut { .. } if self.shut => return Err("a send after the socket was shut".into()),
                Io::Send { batch } if self.send.is_none() && self.splice.is_none() => self.send = Some(batch),
                Io::SpliceOut { pipe, len } if self.send.is_none() && self.splice.is_none() => {
                    self.splice = Some((pipe, len));
                    if self.rng.below(2) == 0 {
                        // Spliced at once while the socket has room, as the worker does, in
                        // the middle of the core's burst: maybe only part of it.
                        self.complete_splice(conn)?;
                        answered_now = true;
                    }
                }
                Io::Storage { tag, op } => {
                    storage::check_op(&op, self.size, self.direct_align)?;
                    self.check_window(tag, &op)?;
                    if self.rng.below(3) == 0 {
                        // Finished at once, as a backend may: the reply waits for the flush.
                        let (outcome, read_failed) = storage::carry_out(op, &mut self.rng)?;
                        self.cut |= read_failed;
                        conn.handle_storage_now(&mut self.env(), tag, outcome.result, outcome.held);
                        answered_now = true;
                    } else {
                        self.storage.push((tag, op));
                    }
                }
                Io::Shutdown(Shutdown::Both) => self.shut = true,
                Io::Shutdown(Shutdown::Read) => {}
                Io::AwaitBudget => self.awaiting_budget = true,
                Io::Recv { .. } => return Err("two receives at once".into()),
                Io::Send { .. } | Io::SpliceOut { .. } => return Err("two sends at once".into()),
            }
        }
        if answered_now {
            conn.flush(&mut self.env());
            return self.collect(conn);
        }
        if self.awaiting_budget && !self.budget.is_full() {
            self.awaiting_budget = false;
            conn.resume(&mut self.env());
            return self.collect(conn);
        }
        Ok(())
    }

    /// With automatic chunking, a read's chunks reach the storage a window at a time.
    fn check_window(&self, tag: Tag, op: &StorageOp) -> Result<(), String> {
        let Some(window) = self.window.filter(|_| matches!(op, StorageOp::Read { .. })) else { return Ok(()) };
        let same = |(t, op): &&(Tag, StorageOp)| t.slot == tag.slot && matches!(op, StorageOp::Read { .. });
        let reading = self.storage.iter().filter(same).count();
        if reading >= window {
            return Err(format!("slot {}: a chunk read beyond the window of {window}", tag.slot));
        }
        Ok(())
    }

    /// Completes one operation in flight, chosen at random, or stops the connection.
    fn step(&mut self, conn: &mut Conn) -> Result<(), String> {
        let mut choices = Vec::with_capacity(4);
        if self.recv.is_some() {
            choices.push(0);
        }
        if self.send.is_some() {
            choices.push(1);
        }
        if self.splice.is_some() {
            choices.push(2);
        }
        if !self.storage.is_empty() {
            choices.extend([3, 3]);
        }
        if self.qos.as_ref().is_some_and(|q| q.has_ready(0)) {
            choices.push(4);
        }
        if choices.is_empty() {
            return Err("nothing in flight, yet the connection is not done".into());
        }
        if !self.stopped && self.rng.below(2000) == 0 {
            self.stopped = true;
            self.cut = true;
            conn.stop(&mut self.env(), "simulated shutdown");
            return Ok(());
        }
        match choices[self.rng.below(choices.len() as u64) as usize] {
            0 => self.complete_recv(conn),
            1 => self.complete_send(conn),
            2 => self.complete_splice(conn),
            3 => self.complete_storage(conn),
            _ => self.start_held(conn),
        }
    }

    /// Restricts the connection: no rate limits (time is the machine's here), a storage
    /// queue depth of one to three, so requests are held until others finish.
    fn restrict(&mut self, conn: &mut Conn, export: &str) -> Result<(), String> {
        let limits = Limits { storage_inflight: Some(1 + self.rng.below(3) as u32), ..Limits::default() };
        let qos = Arc::new(Qos::new(QosConfig::default(), &limits, 1, Arc::new(QosRecorder::default()))?);
        let mut port = qos.attach(export, &Default::default(), 0).ok_or("QoS with a storage cap is on")?;
        port.place(0, 0);
        conn.restrict(port);
        self.qos = Some(qos);
        Ok(())
    }

    /// Starts the held requests the scheduler let go.
    fn start_held(&mut self, conn: &mut Conn) -> Result<(), String> {
        let qos = Arc::clone(self.qos.as_ref().expect("chosen because something is ready"));
        let mut ready = Vec::new();
        qos.take_ready(0, &mut ready);
        for id in ready {
            if !conn.handle_qos_start(&mut self.env(), Parts::of(id).slot) {
                return Err(format!("request {id} let go, yet not held"));
            }
            self.held += 1;
        }
        Ok(())
    }

    fn complete_recv(&mut self, conn: &mut Conn) -> Result<(), String> {
        let (mut buf, at) = self.recv.take().expect("chosen because it is in flight");
        let left = self.input.len() - self.delivered;
        let result = if left == 0 {
            // The client has said everything: it hangs up, cleanly or not.
            if self.rng.below(4) == 0 { -libc::ECONNRESET } else { 0 }
        } else {
            let n = 1 + self.rng.below(left.min(buf.len() - at) as u64) as usize;
            buf.as_mut_slice()[at..at + n].copy_from_slice(&self.input[self.delivered..self.delivered + n]);
            self.delivered += n;
            n as i32
        };
        conn.handle_recv(&mut self.env(), result, buf);
        Ok(())
    }

    fn complete_send(&mut self, conn: &mut Conn) -> Result<(), String> {
        let batch = self.send.take().expect("chosen because it is in flight");
        let pending = batch.pending_bytes();
        let result = match self.rng.below(200) {
            0 => {
                self.cut = true;
                -libc::EPIPE
            }
            1..=40 if pending > 1 => 1 + self.rng.below(pending as u64 - 1) as i32,
            _ => pending as i32,
        };
        if result > 0 {
            let mut bytes = Vec::with_capacity(result as usize);
            batch.copy_out(result as usize, &mut bytes);
            self.checker.take(&bytes, &self.sent, self.delivered)?;
        }
        conn.handle_send(&mut self.env(), result, batch);
        Ok(())
    }

    fn complete_splice(&mut self, conn: &mut Conn) -> Result<(), String> {
        let (pipe, len) = self.splice.take().expect("chosen because it is in flight");
        if self.rng.below(200) == 0 {
            self.cut = true;
            conn.handle_splice_out(&mut self.env(), -libc::EPIPE, pipe);
            return Ok(());
        }
        let want = 1 + self.rng.below(len as u64) as usize;
        let bytes = storage::drain_pipe(&pipe, want)?;
        self.checker.take(&bytes, &self.sent, self.delivered)?;
        conn.handle_splice_out(&mut self.env(), bytes.len() as i32, pipe);
        Ok(())
    }

    fn complete_storage(&mut self, conn: &mut Conn) -> Result<(), String> {
        let i = self.rng.below(self.storage.len() as u64) as usize;
        let (tag, op) = self.storage.swap_remove(i);
        let (outcome, read_failed) = storage::carry_out(op, &mut self.rng)?;
        self.cut |= read_failed;
        conn.handle_storage(&mut self.env(), tag, outcome.result, outcome.held);
        Ok(())
    }

    /// The checks once the connection is done.
    fn finish(self, steps: usize) -> Result<Report, String> {
        if let Some(qos) = &self.qos {
            // Let go just as the connection closed: the worker tells the scheduler.
            let mut stray = Vec::new();
            qos.take_ready(0, &mut stray);
            stray.iter().for_each(|_| qos.stray(0));
            if !qos.is_idle() {
                return Err("the QoS scheduler still holds requests or counts some at the storage".into());
            }
        }
        if self.budget.used_bytes() != 0 {
            return Err(format!("{} budget bytes never came back", self.budget.used_bytes()));
        }
        if self.pool.bytes_out() != 0 {
            return Err(format!("{} pool bytes never came back", self.pool.bytes_out()));
        }
        if self.pipes.in_use() != 0 {
            return Err(format!("{} pipes never came back", self.pipes.in_use()));
        }
        let answered: std::collections::HashSet<u64> = self.checker.finished().collect();
        let clean = !self.cut;
        if clean {
            if self.checker.partial() != 0 {
                return Err(format!("{} bytes of a reply left hanging", self.checker.partial()));
            }
            let missing = self.sent.iter().find(|(h, s)| s.answerable && s.end <= self.delivered && !answered.contains(h));
            if let Some((handle, s)) = missing {
                return Err(format!("request {handle} ({s:?}) was never answered"));
            }
        }
        Ok(Report { steps, answered: answered.len(), clean, extended: self.checker.framing.extended, held: self.held })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeded_runs_keep_every_rule() {
        let mut clean = 0;
        let mut answered = 0;
        let mut extended = 0;
        let mut held = 0;
        for seed in 0..400 {
            match run(Rng::seeded(seed)) {
                Ok(r) => {
                    clean += r.clean as usize;
                    answered += r.answered;
                    extended += (r.clean && r.extended) as usize;
                    held += r.held;
                }
                Err(e) => panic!("seed {seed}: {e}"),
            }
        }
        // The runs must exercise the clean path and answer many requests, or they test little.
        assert!(clean > 100, "only {clean} clean runs");
        assert!(answered > 5_000, "only {answered} requests answered");
        assert!(extended > 30, "only {extended} clean runs with extended headers");
        assert!(held > 500, "only {held} requests held by the QoS scheduler and let go");
    }

    #[test]
    fn fuzz_style_input_keeps_every_rule() {
        for len in [0usize, 3, 64, 1000] {
            let bytes: Vec<u8> = (0..len).map(|i| (i * 31 % 256) as u8).collect();
            if let Err(e) = run(Rng::from_bytes(&bytes)) {
                panic!("{len} bytes: {e}");
            }
        }
    }
}
