//! Reconnecting (`Options::reconnect`): a fake server, built on the proto crate's handshake
//! over an in-memory disk, drops connections on cue; the client must resend what was cut
//! off, report what it cannot, and give up when it should. No test sleeps: each waits for
//! what the server saw, or for the client's own answer.

use sluice_client::{Client, Error, Options, Reconnect, Uri};
use sluice_proto::wire::*;
use sluice_proto::reply::ReplyTo;
use sluice_proto::request::header_bytes;
use sluice_proto::{reply, Catalog, Errno, ExportSummary, Handshake, Next, RawRequest};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};

const SIZE: u64 = 1 << 20;

/// What one connection of the fake server does with requests of a given command.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Plan {
    Serve,
    /// Closes the connection when one arrives, without answering it.
    CloseOn(u16),
    /// Closes the connection after answering the first one.
    CloseAfter(u16),
    /// Answers it with ESHUTDOWN, as a server going away does.
    ShutdownOn(u16),
    /// Answers it with a reply of bad magic.
    GarbageOn(u16),
}

/// One connection the fake server accepts: the export size it offers, what it does, and
/// (when set) a gate it waits on before the handshake.
struct Accept {
    size: u64,
    plan: Plan,
    gate: Option<oneshot::Receiver<()>>,
}

fn accept(size: u64, plan: Plan) -> Accept {
    Accept { size, plan, gate: None }
}

/// A connection that serves once the sender is used or dropped, and not before its
/// handshake.
fn gated() -> (oneshot::Sender<()>, Accept) {
    let (open, gate) = oneshot::channel();
    (open, Accept { size: SIZE, plan: Plan::Serve, gate: Some(gate) })
}

struct Fake {
    uri: Uri,
    /// (connection number, command) of every request the server received.
    seen: mpsc::UnboundedReceiver<(usize, u16)>,
    accepted: Arc<AtomicUsize>,
}

impl Fake {
    /// Serves `accepts` one connection after the other, then closes its listener: the
    /// server is then gone for good.
    async fn start(accepts: Vec<Accept>) -> Fake {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = Uri::parse(&format!("nbd://127.0.0.1:{}/", listener.local_addr().unwrap().port())).unwrap();
        let disk: Arc<Mutex<Vec<u8>>> = Arc::new(Mutex::new((0..SIZE).map(|i| (i * 7 % 251) as u8).collect()));
        let (tx, seen) = mpsc::unbounded_channel();
        let accepted = Arc::new(AtomicUsize::new(0));
        let count = accepted.clone();
        tokio::spawn(async move {
            for (n, a) in accepts.into_iter().enumerate() {
                let (s, _) = listener.accept().await.unwrap();
                count.fetch_add(1, Ordering::SeqCst);
                if let Some(gate) = a.gate {
                    let _ = gate.await;
                }
                tokio::spawn(connection(s, n, a.size, a.plan, disk.clone(), tx.clone()));
            }
        });
        Fake { uri, seen, accepted }
    }

    /// Waits until the server has received a request of command `cmd` on connection `n`.
    async fn saw(&mut self, n: usize, cmd: u16) {
        while let Some(got) = self.seen.recv().await {
            if got == (n, cmd) {
                return;
            }
        }
        panic!("the fake server stopped before connection {n} saw command {cmd}");
    }

    /// Every request received so far that the test has not waited for.
    fn rest(&mut self) -> Vec<(usize, u16)> {
        std::iter::from_fn(|| self.seen.try_recv().ok()).collect()
    }
}

struct OneExport(u64);

impl Catalog for OneExport {
    fn lookup(&self, _name: &str) -> Option<ExportSummary> {
        let flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_CAN_MULTI_CONN;
        Some(ExportSummary { size: self.0, flags, description: None, block_min: 1, block_preferred: 4096, block_max: 32 << 20, identity: None })
    }
    fn list(&self) -> Vec<(String, Option<String>)> {
        vec![(String::new(), None)]
    }
}

/// The server side of the handshake; whether structured replies and extended headers were
/// agreed.
async fn handshake(s: &mut TcpStream, size: u64) -> Option<(bool, bool)> {
    s.write_all(&Handshake::greeting()).await.ok()?;
    let (mut machine, mut next, mut out) = (Handshake::new(), Handshake::start(), Vec::new());
    loop {
        match next {
            Next::Read(n) => {
                let mut b = vec![0u8; n];
                s.read_exact(&mut b).await.ok()?;
                next = machine.input(&b, &OneExport(size), &mut out);
                s.write_all(&out).await.ok()?;
                out.clear();
            }
            Next::Transmission(n) => return Some((n.structured, n.extended)),
            // A machine made without TLS never asks for it.
            Next::Close { .. } | Next::StartTls => return None,
        }
    }
}

async fn connection(mut s: TcpStream, n: usize, size: u64, plan: Plan, disk: Arc<Mutex<Vec<u8>>>, seen: mpsc::UnboundedSender<(usize, u16)>) {
    let Some((structured, extended)) = handshake(&mut s, size).await else { return };
    loop {
        let mut h = vec![0u8; header_bytes(extended)];
        if s.read_exact(&mut h).await.is_err() {
            return;
        }
        let r = RawRequest::decode_as(&h, extended).unwrap();
        let mut payload = vec![0u8; r.payload_len(extended) as usize];
        if s.read_exact(&mut payload).await.is_err() || r.kind == CMD_DISC {
            return;
        }
        let _ = seen.send((n, r.kind));
        let out = match plan {
            Plan::CloseOn(k) if k == r.kind => return,
            Plan::ShutdownOn(k) if k == r.kind && extended => {
                let mut out = Vec::new();
                reply::error_chunk(&mut out, to(&r, true), Errno::Shutdown, "", None);
                out
            }
            Plan::ShutdownOn(k) if k == r.kind => reply::simple(r.handle, Some(Errno::Shutdown)).to_vec(),
            Plan::GarbageOn(k) if k == r.kind => vec![0xff; SIMPLE_REPLY_BYTES],
            _ => answer(&r, &payload, &disk, structured, extended),
        };
        if s.write_all(&out).await.is_err() || plan == Plan::CloseAfter(r.kind) {
            return;
        }
    }
}

fn to(r: &RawRequest, extended: bool) -> ReplyTo {
    ReplyTo { handle: r.handle, offset: r.offset, extended }
}

fn answer(r: &RawRequest, payload: &[u8], disk: &Mutex<Vec<u8>>, structured: bool, extended: bool) -> Vec<u8> {
    let range = r.offset as usize..(r.offset + r.length) as usize;
    let mut disk = disk.lock().unwrap();
    let done = if extended { reply::done_none(to(r, true)).to_vec() } else { reply::simple(r.handle, None).to_vec() };
    match r.kind {
        CMD_READ if structured => [&reply::offset_data_header(to(r, extended), r.offset, r.length as u32, true)[..], &disk[range]].concat(),
        CMD_READ => [&reply::simple(r.handle, None)[..], &disk[range]].concat(),
        CMD_WRITE => {
            disk[range].copy_from_slice(payload);
            done
        }
        _ => done,
    }
}

/// Reconnecting quickly, so tests run fast; `give_up_after` as given.
fn options(give_up_after: Duration) -> Options {
    let policy = Reconnect { initial_delay: Duration::from_millis(1), max_delay: Duration::from_millis(20), give_up_after };
    Options { reconnect: Some(policy), ..Options::default() }
}

/// A fake server whose first connection does as `first` says and whose second serves,
/// and a client of it that reconnects.
async fn first_then_serve(first: Plan) -> (Fake, Client) {
    let fake = Fake::start(vec![accept(SIZE, first), accept(SIZE, Plan::Serve)]).await;
    let c = Client::connect_with(&fake.uri, &options(Duration::from_secs(10))).await.unwrap();
    (fake, c)
}

fn patterned(offset: u64, len: usize) -> Vec<u8> {
    (offset..offset + len as u64).map(|i| (i * 7 % 251) as u8).collect()
}

/// Runs a test on a runtime of several threads (so that the client's tasks race as they
/// would in use), with a bound, so that a client that hangs fails the test instead.
fn run(test: impl std::future::Future<Output = ()>) {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build().unwrap();
    rt.block_on(async { tokio::time::timeout(Duration::from_secs(20), test).await.expect("the client hung") });
}

#[test]
fn a_read_cut_off_by_a_drop_is_sent_again_after_reconnecting() {
    run(async {
        let (mut fake, c) = first_then_serve(Plan::CloseOn(CMD_READ)).await;
        let data = c.read_owned(4096, vec![0; 8192]).await.unwrap();
        assert_eq!(data, patterned(4096, 8192));
        assert_eq!(fake.rest(), [(0, CMD_READ), (1, CMD_READ)]);
        // The new connection carries later requests too.
        assert_eq!(c.read_owned(0, vec![0; 512]).await.unwrap(), patterned(0, 512));
    });
}

#[test]
fn with_multi_conn_a_request_cut_off_goes_to_a_connection_still_up() {
    run(async {
        // The first connection's replacement is held at the gate until the test ends.
        let (_held, third) = gated();
        let mut fake = Fake::start(vec![accept(SIZE, Plan::CloseOn(CMD_READ)), accept(SIZE, Plan::Serve), third]).await;
        let two = Options { connections: 2, ..options(Duration::from_secs(10)) };
        let c = Client::connect_with(&fake.uri, &two).await.unwrap();
        assert_eq!(c.connections(), 2);
        // Both are idle, so the first connection gets the read.
        assert_eq!(c.read_owned(4096, vec![0; 4096]).await.unwrap(), patterned(4096, 4096));
        assert_eq!(fake.rest(), [(0, CMD_READ), (1, CMD_READ)]);
    });
}

#[test]
fn a_write_cut_off_is_sent_again_and_a_flush_after_it_succeeds() {
    run(async {
        let (mut fake, c) = first_then_serve(Plan::CloseOn(CMD_WRITE)).await;
        c.write(8192, &[0xab; 4096], false).await.unwrap();
        assert_eq!(c.read_owned(8192, vec![0; 4096]).await.unwrap(), vec![0xab; 4096]);
        // The write was never acknowledged on the connection that dropped, so nothing
        // acknowledged was lost: the flush is an ordinary one.
        c.flush().await.unwrap();
        assert_eq!(fake.rest(), [(0, CMD_WRITE), (1, CMD_WRITE), (1, CMD_READ), (1, CMD_FLUSH)]);
    });
}

#[test]
fn a_flush_cut_off_fails_with_durability_lost_and_is_not_sent_again() {
    run(async {
        let (mut fake, c) = first_then_serve(Plan::CloseOn(CMD_FLUSH)).await;
        c.write(0, &[1; 512], false).await.unwrap();
        let e = c.flush().await.unwrap_err();
        assert!(matches!(e, Error::DurabilityLost), "{e}");
        assert!(e.to_string().contains("may not be durable"), "{e}");
        // Said once: the next flush is an ordinary one, on the new connection.
        c.flush().await.unwrap();
        assert_eq!(fake.rest(), [(0, CMD_WRITE), (0, CMD_FLUSH), (1, CMD_FLUSH)]);
    });
}

#[test]
fn writes_acknowledged_then_lost_unflushed_are_reported_by_the_next_flush() {
    run(async {
        let (mut fake, c) = first_then_serve(Plan::CloseAfter(CMD_WRITE)).await;
        c.write(0, &[2; 512], false).await.unwrap();
        assert!(matches!(c.flush().await, Err(Error::DurabilityLost)));
        c.flush().await.unwrap();
        // The write is not resent: it was acknowledged, and only the caller knows whether
        // writing it again is still right.
        assert!(!fake.rest().contains(&(1, CMD_WRITE)));
    });
}

#[test]
fn writes_with_fua_are_durable_so_a_drop_loses_nothing() {
    run(async {
        let (mut fake, c) = first_then_serve(Plan::CloseAfter(CMD_WRITE)).await;
        c.write(0, &[3; 512], true).await.unwrap();
        // Reads wait for the new connection, so the drop has been noted before the flush.
        c.read_owned(0, vec![0; 512]).await.unwrap();
        c.flush().await.unwrap();
        assert_eq!(fake.rest().last(), Some(&(1, CMD_FLUSH)));
    });
}

#[test]
fn requests_made_while_reconnecting_wait_for_the_new_connection() {
    run(async {
        let (open, second) = gated();
        let mut fake = Fake::start(vec![accept(SIZE, Plan::CloseOn(CMD_READ)), second]).await;
        let c = Client::connect_with(&fake.uri, &options(Duration::from_secs(10))).await.unwrap();
        let read = |offset| {
            let c = c.clone();
            tokio::spawn(async move { c.read_owned(offset, vec![0; 4096]).await })
        };
        let first = read(0);
        fake.saw(0, CMD_READ).await;
        // The connection is gone and the next one is held at the gate.
        let later = read(65536);
        open.send(()).unwrap();
        assert_eq!(first.await.unwrap().unwrap(), patterned(0, 4096));
        assert_eq!(later.await.unwrap().unwrap(), patterned(65536, 4096));
    });
}

#[test]
fn a_server_shutting_down_is_ridden_through() {
    run(async {
        let (fake, c) = first_then_serve(Plan::ShutdownOn(CMD_READ)).await;
        assert_eq!(c.read_owned(512, vec![0; 512]).await.unwrap(), patterned(512, 512));
        assert_eq!(fake.accepted.load(Ordering::SeqCst), 2);
    });
}

#[test]
fn without_reconnect_a_drop_fails_the_request_and_the_client_stays_down() {
    run(async {
        let fake = Fake::start(vec![accept(SIZE, Plan::CloseOn(CMD_READ)), accept(SIZE, Plan::Serve)]).await;
        let c = Client::connect_with(&fake.uri, &Options::default()).await.unwrap();
        let e = c.read_owned(0, vec![0; 512]).await.unwrap_err();
        assert!(matches!(e, Error::Closed | Error::Io(_)), "{e}");
        assert!(matches!(c.read_owned(0, vec![0; 512]).await, Err(Error::Closed)));
        assert!(matches!(c.flush().await, Err(Error::Closed)));
        assert_eq!(fake.accepted.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn a_server_that_never_comes_back_fails_requests_after_give_up_after() {
    run(async {
        let give_up_after = Duration::from_millis(300);
        let fake = Fake::start(vec![accept(SIZE, Plan::CloseOn(CMD_READ))]).await;
        let c = Client::connect_with(&fake.uri, &options(give_up_after)).await.unwrap();
        let started = tokio::time::Instant::now();
        let e = c.read_owned(0, vec![0; 512]).await.unwrap_err();
        assert!(started.elapsed() >= give_up_after, "gave up after {:?}", started.elapsed());
        let Error::Disconnected { why } = &e else { panic!("{e}") };
        assert!(why.contains("gave up reconnecting"), "{e}");
        // Given up for good: later requests fail at once, with the same reason.
        assert!(matches!(c.read_owned(0, vec![0; 512]).await, Err(Error::Disconnected { .. })));
    });
}

#[test]
fn an_export_that_changed_size_is_refused_after_reconnecting() {
    run(async {
        let fake = Fake::start(vec![accept(SIZE, Plan::CloseOn(CMD_READ)), accept(2 * SIZE, Plan::Serve)]).await;
        let c = Client::connect_with(&fake.uri, &options(Duration::from_secs(10))).await.unwrap();
        let e = c.read_owned(0, vec![0; 512]).await.unwrap_err();
        let Error::Disconnected { why } = &e else { panic!("{e}") };
        assert!(why.contains("export changed") && why.contains("size"), "{e}");
        assert!(matches!(c.write(0, &[0; 512], false).await, Err(Error::Disconnected { .. })));
    });
}

#[test]
fn a_protocol_error_is_neither_retried_nor_reconnected() {
    run(async {
        let (fake, c) = first_then_serve(Plan::GarbageOn(CMD_READ)).await;
        assert!(matches!(c.read_owned(0, vec![0; 512]).await, Err(Error::Protocol(_))));
        assert!(matches!(c.read_owned(0, vec![0; 512]).await, Err(Error::Protocol(_))));
        assert_eq!(fake.accepted.load(Ordering::SeqCst), 1);
    });
}

#[test]
fn disconnect_stops_reconnecting() {
    run(async {
        let fake = Fake::start(vec![accept(SIZE, Plan::Serve), accept(SIZE, Plan::Serve)]).await;
        let c = Client::connect_with(&fake.uri, &options(Duration::from_secs(10))).await.unwrap();
        c.disconnect().await;
        assert!(matches!(c.read_owned(0, vec![0; 512]).await, Err(Error::Closed)));
        assert!(matches!(c.flush().await, Err(Error::Closed)));
        assert_eq!(fake.accepted.load(Ordering::SeqCst), 1);
    });
}
