use super::*;
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncWrite, BufReader, DuplexStream};

/// A write half that keeps each write the connection makes, as it made it; with `room`
/// set, it takes at most that many bytes more and then never finishes another write (a
/// socket that filled up).
#[derive(Clone, Default)]
struct Writes(Arc<Mutex<Vec<Vec<u8>>>>, Arc<Mutex<Option<usize>>>);

impl AsyncWrite for Writes {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, buf: &[u8]) -> Poll<std::io::Result<usize>> {
        let mut room = self.1.lock().unwrap();
        let n = buf.len().min(room.unwrap_or(usize::MAX));
        if n == 0 {
            return Poll::Pending;
        }
        if let Some(r) = room.as_mut() {
            *r -= n;
        }
        self.0.lock().unwrap().push(buf[..n].to_vec());
        Poll::Ready(Ok(n))
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

impl Writes {
    fn count(&self) -> usize {
        self.0.lock().unwrap().len()
    }
    /// Lets the connection's tasks run until `n` reads are written (at most 1,000 turns of
    /// the runtime: nothing here waits on anything outside this thread), and returns them.
    async fn wait_for(&self, n: usize) -> Vec<(u64, u64)> {
        for _ in 0..1000 {
            if self.reads().len() >= n {
                break;
            }
            tokio::task::yield_now().await;
        }
        let reads = self.reads();
        assert_eq!(reads.len(), n, "requests written");
        reads
    }

    fn fill_after(&self, bytes: usize) {
        *self.1.lock().unwrap() = Some(bytes);
    }

    /// The READ requests written so far, in order: (handle, offset).
    fn reads(&self) -> Vec<(u64, u64)> {
        let all: Vec<u8> = self.0.lock().unwrap().concat();
        all.chunks_exact(REQUEST_BYTES)
            .filter(|h| u16::from_be_bytes([h[6], h[7]]) == CMD_READ)
            .map(|h| (u64::from_be_bytes(h[8..16].try_into().unwrap()), u64::from_be_bytes(h[16..24].try_into().unwrap())))
            .collect()
    }
}

/// A connection without structured replies whose requests land in `Writes` and whose
/// replies the test writes into the returned stream.
fn connection() -> (Connection, Writes, DuplexStream) {
    let (ours, theirs) = tokio::io::duplex(1 << 20);
    let writes = Writes::default();
    let reader: Reader = BufReader::new(Box::new(ours));
    (Connection::start(reader, Box::new(writes.clone()), false, false, None), writes, theirs)
}

async fn answer(server: &mut DuplexStream, handle: u64, offset: u64) {
    let mut reply = Vec::new();
    reply.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
    reply.extend_from_slice(&0u32.to_be_bytes());
    reply.extend_from_slice(&handle.to_be_bytes());
    reply.extend(std::iter::repeat_n((offset >> 12) as u8, 4096));
    server.write_all(&reply).await.unwrap();
}

fn read(conn: &Connection, offset: u64) -> impl std::future::Future<Output = Result<Outcome, Failed>> + '_ {
    conn.call(CMD_READ, 0, offset, 4096, &[], vec![vec![0; 4096]])
}

#[tokio::test(flavor = "current_thread")]
async fn requests_issued_together_go_out_in_one_write_and_each_gets_its_reply() {
    let (conn, writes, mut server) = connection();
    let offsets: Vec<u64> = (0..16).map(|i| i * 4096).collect();
    let calls = together(offsets.iter().map(|&o| Box::pin(read(&conn, o))).collect());
    let serve = async {
        // All sixteen written, then answered in reverse order.
        let sent = writes.wait_for(16).await;
        // The first went alone (nothing else was in flight); the other fifteen together.
        assert_eq!(writes.count(), 2, "writes: {:?}", writes.0.lock().unwrap().iter().map(Vec::len).collect::<Vec<_>>());
        for &(handle, offset) in sent.iter().rev() {
            answer(&mut server, handle, offset).await;
        }
    };
    let (results, ()) = tokio::join!(calls, serve);
    for (r, offset) in results.into_iter().zip(offsets) {
        let Ok(Outcome::Read(bufs)) = r else { panic!("read at {offset} failed") };
        assert!(bufs[0].iter().all(|&b| b == (offset >> 12) as u8), "read at {offset} got another's data");
    }
}

#[tokio::test(flavor = "current_thread")]
async fn queued_requests_go_out_even_when_the_caller_that_owed_the_write_gives_up() {
    let (conn, writes, mut server) = connection();
    // One in flight, so the next caller queues and yields rather than writing at once.
    let mut first = Box::pin(read(&conn, 0));
    assert!(futures_poll_once(first.as_mut()).await.is_none());
    let mut owing = Box::pin(read(&conn, 4096));
    let mut other = Box::pin(read(&conn, 8192));
    assert!(futures_poll_once(owing.as_mut()).await.is_none());
    assert!(futures_poll_once(other.as_mut()).await.is_none());
    assert_eq!(writes.reads().len(), 1, "the two later ones wait in the queue");
    drop(owing);
    // The queue is sent without its caller.
    let sent = writes.wait_for(3).await;
    // The given-up request's reply comes too; the connection takes it and goes on.
    for &(handle, offset) in &sent {
        answer(&mut server, handle, offset).await;
    }
    assert!(matches!(first.await, Ok(Outcome::Read(_))));
    let Ok(Outcome::Read(bufs)) = other.await else { panic!("the other queued read failed") };
    assert!(bufs[0].iter().all(|&b| b == 2));
    assert!(conn.failure().is_none(), "the connection is still up");
}

/// Polls the futures together in one task, as a runtime runs a burst, to the end of all.
async fn together<F: std::future::Future + Unpin>(mut futures: Vec<F>) -> Vec<F::Output> {
    let mut out: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        for (f, o) in futures.iter_mut().zip(out.iter_mut()).filter(|(_, o)| o.is_none()) {
            if let Poll::Ready(v) = Pin::new(f).poll(cx) {
                *o = Some(v);
            }
        }
        if out.iter().all(Option::is_some) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    out.into_iter().map(Option::unwrap).collect()
}

type Call<'a> = Pin<Box<dyn std::future::Future<Output = Result<Outcome, Failed>> + 'a>>;

/// One read in flight, then two queued behind a socket that takes `room` bytes more; the
/// caller that owes the queue's write gets stuck in it and is given up on (dropped).
/// Returns the read in flight and the other queued one.
async fn stuck_batch<'a>(conn: &'a Connection, writes: &Writes, room: usize) -> (Call<'a>, Call<'a>) {
    let mut first: Call = Box::pin(read(conn, 0));
    assert!(futures_poll_once(first.as_mut()).await.is_none());
    writes.fill_after(room);
    let mut owing: Call = Box::pin(read(conn, 4096));
    let mut other: Call = Box::pin(read(conn, 8192));
    assert!(futures_poll_once(owing.as_mut()).await.is_none(), "queued, yielding");
    assert!(futures_poll_once(other.as_mut()).await.is_none(), "queued behind it");
    assert!(futures_poll_once(owing.as_mut()).await.is_none(), "stuck in the batch's write");
    drop(owing);
    (first, other)
}

/// Polls once; Some if it finished.
async fn futures_poll_once<F: std::future::Future + ?Sized>(f: Pin<&mut F>) -> Option<F::Output> {
    let mut f = Some(f);
    std::future::poll_fn(|cx| {
        Poll::Ready(match f.take().unwrap().poll(cx) {
            Poll::Ready(v) => Some(v),
            Poll::Pending => None,
        })
    })
    .await
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_cut_short_by_its_writer_giving_up_ends_the_connection_and_fails_its_requests() {
    let (conn, writes, _server) = connection();
    let (first, other) = stuck_batch(&conn, &writes, 10).await;
    // The stream is torn: the other request must fail, not wait for ever, and the
    // connection take no more.
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), other).await.expect("the other request was answered");
    assert!(got.is_err(), "the other request failed");
    assert!(conn.failure().is_some(), "the connection ended");
    assert!(first.await.is_err(), "and so did the request in flight before");
}

#[tokio::test(flavor = "current_thread")]
async fn a_batch_its_writer_gave_up_on_before_any_byte_went_is_sent_by_another() {
    let (conn, writes, mut server) = connection();
    let (first, other) = stuck_batch(&conn, &writes, 0).await;
    // Room again: the batch goes, whole, without the caller that gave up.
    *writes.1.lock().unwrap() = None;
    let sent = writes.wait_for(3).await;
    for &(handle, offset) in &sent {
        answer(&mut server, handle, offset).await;
    }
    assert!(matches!(other.await, Ok(Outcome::Read(_))));
    assert!(matches!(first.await, Ok(Outcome::Read(_))));
    assert!(conn.failure().is_none());
}

#[tokio::test(flavor = "current_thread")]
async fn a_goodbye_on_a_torn_stream_fails_the_requests_left_rather_than_leaving_them_waiting() {
    let (conn, writes, _server) = connection();
    let (first, other) = stuck_batch(&conn, &writes, 10).await;
    // The goodbye comes before anything else takes the lock: no DISC can follow the torn
    // frame, and the other request must not wait for a server that waits for the frame.
    conn.disconnect().await;
    let got = tokio::time::timeout(std::time::Duration::from_secs(10), other).await.expect("the other request was answered");
    assert!(got.is_err());
    let tail: Vec<u8> = writes.0.lock().unwrap().concat();
    assert_eq!(tail.len(), REQUEST_BYTES + 10, "nothing was written after the torn frame");
    assert!(first.await.is_err(), "the request in flight before failed too");
}

/// Requests whose headers were queued just as the write side closed (a goodbye that took
/// the queue a moment before they joined it) fail at once rather than wait for a server
/// that never gets them; with extended headers, the queue holds 32-byte frames.
#[tokio::test(flavor = "current_thread")]
async fn requests_queued_as_the_write_side_closed_fail_at_once_in_either_framing() {
    for extended in [false, true] {
        let (ours, _theirs) = tokio::io::duplex(1 << 20);
        let writes = Writes::default();
        let conn = Connection::start(BufReader::new(Box::new(ours)), Box::new(writes.clone()), extended, extended, None);
        let mut first: Call = Box::pin(read(&conn, 0));
        assert!(futures_poll_once(first.as_mut()).await.is_none());
        let mut owing: Call = Box::pin(read(&conn, 4096));
        let mut other: Call = Box::pin(read(&conn, 8192));
        assert!(futures_poll_once(owing.as_mut()).await.is_none(), "queued, yielding");
        assert!(futures_poll_once(other.as_mut()).await.is_none(), "queued behind it");
        conn.writer.half.lock().await.take();
        let bound = std::time::Duration::from_secs(10);
        let got = tokio::time::timeout(bound, async { (owing.await, other.await) }).await.expect("both queued requests were answered");
        assert!(got.0.is_err() && got.1.is_err(), "extended {extended}: neither was sent, so both failed");
        assert_eq!(writes.0.lock().unwrap().len(), 1, "only the first request went");
        drop(first);
    }
}

/// A large read's data arrives partly with its header (in the reader's buffer) and partly
/// later (read straight from the socket): every byte lands in its place, and the reply
/// after it is read as usual.
#[tokio::test(flavor = "current_thread")]
async fn a_large_reads_data_split_between_the_buffer_and_the_socket_lands_whole() {
    let (conn, writes, mut server) = connection();
    let len = 256 * 1024;
    let big = conn.call(CMD_READ, 0, 0, len as u64, &[], vec![vec![0; len]]);
    let small = read(&conn, 1 << 20);
    let serve = async {
        let sent = writes.wait_for(2).await;
        let pattern: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
        let mut reply = Vec::new();
        reply.extend_from_slice(&SIMPLE_REPLY_MAGIC.to_be_bytes());
        reply.extend_from_slice(&0u32.to_be_bytes());
        reply.extend_from_slice(&sent[0].0.to_be_bytes());
        reply.extend_from_slice(&pattern);
        // The header and a little data first, so the buffer holds some; then the rest, in
        // uneven pieces, then the small read's reply.
        for piece in reply.chunks(70_001) {
            server.write_all(piece).await.unwrap();
            tokio::task::yield_now().await;
        }
        answer(&mut server, sent[1].0, sent[1].1).await;
        pattern
    };
    let (got, small, pattern) = tokio::join!(big, small, serve);
    let Ok(Outcome::Read(bufs)) = got else { panic!("the large read failed") };
    assert!(bufs[0] == pattern, "the large read's bytes are out of place");
    let Ok(Outcome::Read(bufs)) = small else { panic!("the read after it failed") };
    assert!(bufs[0].iter().all(|&b| b == (1 << 20 >> 12) as u8));
}
