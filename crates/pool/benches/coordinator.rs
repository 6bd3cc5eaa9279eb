//! What the coordinator itself costs per volume request, without any I/O: `cargo bench -p
//! sluice-pool --bench coordinator`. Members answer every operation at once (metadata
//! from memory), 32 requests stay in flight, and each request is one 4 KiB read or write
//! inside one stripe unit, so the figure is the coordinator's bookkeeping per request:
//! submit, route, issue, settle, answer, and `next_wakeup` once per call as a driver asks.

use std::collections::VecDeque;
use std::time::Instant;

use sluice_pool::coordinator::{format, Action, Command, Coordinator, Data, Found, MemberCmd, OpId, OpOutcome, Session};
use sluice_pool::limits::META_BYTES;
use sluice_pool::spec::PoolSpec;

const DEPTH: usize = 32;
const MEMBER_BYTES: u64 = 1 << 30;

struct Bench {
    coord: Coordinator,
    /// Each member's metadata area, for the coordinator's own reads of it.
    meta: Vec<Vec<u8>>,
    /// Member operations not answered yet, oldest first.
    out: VecDeque<(OpId, OpOutcome)>,
    done: u64,
}

impl Bench {
    fn new(text: &str) -> Bench {
        let spec = PoolSpec::parse(text).expect("a pool file");
        let blank = Found { size: MEMBER_BYTES, meta: vec![0; META_BYTES as usize], read_only: false };
        let found: Vec<Found> = spec.members.iter().map(|_| blank.clone()).collect();
        let meta: Vec<Vec<u8>> = format(&spec, &found, [7; 16], false)
            .expect("formats")
            .into_iter()
            .map(|b| {
                let mut m = vec![0; META_BYTES as usize];
                m[..b.len()].copy_from_slice(&b);
                m
            })
            .collect();
        let found = meta.iter().map(|m| Some(Found { size: MEMBER_BYTES, meta: m.clone(), read_only: false })).collect();
        let session = Session { id: 1, pid: 1, host: "bench".into() };
        let coord = Coordinator::assemble(&spec, found, session, false, 0).expect("assembles");
        Bench { coord, meta, out: VecDeque::new(), done: 0 }
    }

    /// Carries out what the coordinator asks for; member operations are answered later.
    fn drain(&mut self) {
        while let Some(a) = self.coord.poll() {
            match a {
                Action::Member { op, member, cmd, data } => {
                    let outcome = match (cmd, data) {
                        (MemberCmd::Write { offset, .. }, Data::Bytes(b)) if offset < META_BYTES => {
                            self.meta[member][offset as usize..offset as usize + b.len()].copy_from_slice(&b);
                            OpOutcome::Done
                        }
                        (MemberCmd::Read { offset, len }, Data::Meta) => OpOutcome::Data(self.meta[member][offset as usize..(offset + len) as usize].to_vec()),
                        _ => OpOutcome::Done,
                    };
                    self.out.push_back((op, outcome));
                }
                Action::Complete { result, .. } => {
                    result.expect("the request succeeds");
                    self.done += 1;
                }
                _ => {}
            }
        }
        std::hint::black_box(self.coord.next_wakeup());
    }

    /// Runs `n` requests from `make` with DEPTH in flight; nanoseconds per request.
    fn run(&mut self, n: u64, mut make: impl FnMut(u64) -> Command) -> f64 {
        let mut now = 0;
        // A mirror takes writes once its claim has been read back: let that happen first.
        for _ in 0..100 {
            now += 100;
            self.coord.tick(now);
            self.drain();
            while let Some((op, o)) = self.out.pop_front() {
                self.coord.handle(op, o, now);
                self.drain();
            }
        }
        let (start, first) = (Instant::now(), self.done);
        let mut sent = 0;
        while self.done - first < n {
            while sent < n && (sent - (self.done - first)) < DEPTH as u64 {
                self.coord.submit(make(sent), now);
                self.drain();
                sent += 1;
            }
            if let Some((op, o)) = self.out.pop_front() {
                self.coord.handle(op, o, now);
                self.drain();
            }
            now += 1;
        }
        start.elapsed().as_nanos() as f64 / n as f64
    }
}

fn main() {
    let stripe = "layout = \"stripe\"\nmembers = [\"nbd://a/x\"]\n";
    let mirror = "layout = \"mirror\"\nmembers = [\"nbd://a/x\", \"nbd://b/x\"]\n";
    let n = 400_000;
    let at = |i: u64| (i * 7919 % 100_000) * 4096;
    let rows: [(&str, &str, bool); 3] = [("1-member stripe, 4K reads", stripe, false), ("2-way mirror, 4K reads", mirror, false), ("2-way mirror, 4K writes", mirror, true)];
    for (name, text, write) in rows {
        let mut b = Bench::new(text);
        let ns = b.run(n, |i| match write {
            true => Command::Write { offset: at(i), len: 4096, fua: false },
            false => Command::Read { offset: at(i), len: 4096 },
        });
        println!("{name}: {ns:.0} ns per request ({n} requests, {DEPTH} in flight)");
    }
}
