//! The reader task: parses replies, matches them to requests by handle, reads data straight
//! into each request's buffers, and checks every chunk against its request.

use super::state::{fail_all, send_disc, Outcome, Pending, Session, SharedWriter, State};
use crate::error::Error;
use crate::limits::*;
use crate::socket::Reader;
use sluice_proto::wire::*;
use std::sync::{Arc, Mutex};
use crate::spans::Spans;
use sluice_proto::client as wire_c;
use tokio::io::{AsyncBufRead, AsyncReadExt};

/// Fails every request still in flight when the reader task goes without reaching its end
/// (aborted, or dropped with its runtime): no reply can come for them any more.
struct FailOnDrop(Arc<Mutex<State>>);

impl Drop for FailOnDrop {
    fn drop(&mut self) {
        fail_all(&self.0, Error::Closed);
    }
}

pub(super) async fn read_replies(mut r: Reader, state: Arc<Mutex<State>>, writer: SharedWriter, session: Session) {
    let _fail = FailOnDrop(Arc::clone(&state));
    let e = loop {
        if let Err(e) = read_reply(&mut r, &state, session).await {
            break e;
        }
        let leave = {
            let st = state.lock().unwrap();
            st.server_shutting_down && st.pending.is_empty()
        };
        if leave {
            // The soft disconnect ESHUTDOWN asks for.
            send_disc(&writer, session.extended).await;
            break Error::Closed;
        }
    };
    log::debug!("connection reader stops: {e}");
    fail_all(&state, e);
    // Close our side too: after a protocol error the spec wants a hard disconnect, and
    // after the server closed there is nothing left to say.
    writer.half.lock().await.take();
}

fn protocol<T>(m: impl Into<String>) -> Result<T, Error> {
    Err(Error::Protocol(m.into()))
}

async fn read_exact(r: &mut Reader, buf: &mut [u8]) -> Result<(), Error> {
    r.read_exact(buf).await.map(drop).map_err(read_error)
}

fn read_error(e: std::io::Error) -> Error {
    match e.kind() {
        std::io::ErrorKind::UnexpectedEof => Error::Closed,
        _ => Error::io(e),
    }
}

/// A read's data into its buffer. What the reader's buffer holds already is copied; a
/// large rest comes straight from the socket. Through the buffer, the end of a large
/// payload was received twice over (the socket into the buffer, the buffer into the
/// request's): a gateway's 1 MiB reads spent 7% of its time on that second copy. A small
/// rest still goes through the buffer, whose one receive brings several replies in.
async fn read_data(r: &mut Reader, buf: &mut [u8]) -> Result<(), Error> {
    let have = r.buffer().len().min(buf.len());
    if buf.len() - have < DATA_DIRECT_MIN_BYTES {
        return read_exact(r, buf).await;
    }
    buf[..have].copy_from_slice(&r.buffer()[..have]);
    std::pin::Pin::new(&mut *r).consume(have);
    // The buffer is empty now, so reading its socket directly skips nothing.
    r.get_mut().read_exact(&mut buf[have..]).await.map(drop).map_err(read_error)
}

/// Takes the request a reply names out of the table while its payload is read, so the
/// lock is never held across I/O. A handle we did not send is a protocol error.
fn take(state: &Mutex<State>, handle: u64) -> Result<Pending, Error> {
    match state.lock().unwrap().pending.remove(&handle) {
        Some(p) => Ok(p),
        None => protocol(format!("reply for handle {handle:#x}, which has no request in flight")),
    }
}

/// Hands a request the server's answer. An unforced write counts in `writes_acked`,
/// unless the connection failed meanwhile: then it fails instead (resending a write is
/// safe), so that the count a failed connection ends with is exact.
fn finish(state: &Mutex<State>, p: Pending, result: Result<Outcome, Error>) {
    let result = match result {
        Ok(outcome) if p.unforced_write() => {
            let mut st = state.lock().unwrap();
            match st.failed {
                true => Err(st.dead.clone().unwrap_or(Error::Closed)),
                false => {
                    st.writes_acked += 1;
                    Ok(outcome)
                }
            }
        }
        other => other,
    };
    p.finish(result);
}

/// Notes an ESHUTDOWN answer: no new requests from now on (they get this error).
fn note_shutdown(state: &Mutex<State>, result: &Result<Outcome, Error>) {
    if let Err(e @ Error::Server { errno, .. }) = result {
        if *errno == sluice_proto::Errno::Shutdown.code() {
            let mut st = state.lock().unwrap();
            st.server_shutting_down = true;
            st.dead.get_or_insert_with(|| e.clone());
        }
    }
}

async fn read_reply(r: &mut Reader, state: &Mutex<State>, session: Session) -> Result<(), Error> {
    let mut magic = [0u8; 4];
    read_exact(r, &mut magic).await?;
    match wire_c::reply_magic(&magic) {
        SIMPLE_REPLY_MAGIC | STRUCTURED_REPLY_MAGIC if session.extended => protocol("a compact reply under extended headers"),
        SIMPLE_REPLY_MAGIC => {
            let mut rest = [0u8; SIMPLE_REPLY_BYTES - 4];
            read_exact(r, &mut rest).await?;
            let (code, handle) = wire_c::decode_simple(&rest);
            let mut p = take(state, handle)?;
            if code != 0 {
                let result = Err(Error::Server { errno: code, message: None });
                note_shutdown(state, &result);
                finish(state, p, result);
                return Ok(());
            }
            match p.cmd {
                CMD_READ => {
                    // Simple replies carry the whole range; the buffers are exactly its size.
                    for i in 0..p.bufs.len() {
                        if let Err(e) = read_data(r, &mut p.bufs[i]).await {
                            finish(state, p, Err(e.clone()));
                            return Err(e);
                        }
                    }
                    let bufs = std::mem::take(&mut p.bufs);
                    finish(state, p, Ok(Outcome::Read(bufs)));
                }
                CMD_BLOCK_STATUS => {
                    let e = Error::Protocol("simple reply to BLOCK_STATUS".into());
                    finish(state, p, Err(e.clone()));
                    return Err(e);
                }
                _ => finish(state, p, Ok(Outcome::Done)),
            }
            Ok(())
        }
        EXTENDED_REPLY_MAGIC if session.extended => {
            let mut rest = [0u8; EXTENDED_REPLY_BYTES - 4];
            read_exact(r, &mut rest).await?;
            chunk_reply(r, state, session, wire_c::ChunkHeader::decode_extended(&rest)).await
        }
        STRUCTURED_REPLY_MAGIC if session.structured => {
            let mut rest = [0u8; CHUNK_HEADER_BYTES - 4];
            read_exact(r, &mut rest).await?;
            chunk_reply(r, state, session, wire_c::ChunkHeader::decode(&rest)).await
        }
        STRUCTURED_REPLY_MAGIC => protocol("structured reply chunk without structured replies negotiated"),
        EXTENDED_REPLY_MAGIC => protocol("extended reply chunk without extended headers negotiated"),
        other => protocol(format!("bad reply magic {other:#010x}")),
    }
}

/// One structured or extended chunk, its header read: its payload goes to its request.
async fn chunk_reply(r: &mut Reader, state: &Mutex<State>, session: Session, h: wire_c::ChunkHeader) -> Result<(), Error> {
    let mut p = take(state, h.handle)?;
    if let Err(e) = chunk(r, &mut p, &h, session).await {
        finish(state, p, Err(e.clone()));
        return Err(e);
    }
    if h.done() {
        let result = complete(&mut p);
        match result {
            Err(e @ Error::Protocol(_)) => {
                finish(state, p, Err(e.clone()));
                return Err(e);
            }
            other => {
                note_shutdown(state, &other);
                finish(state, p, other);
            }
        }
    } else {
        let mut st = state.lock().unwrap();
        if st.failed {
            // The connection failed while this chunk was read: fail_all has run and
            // will not see the entry, so finish it here.
            let e = st.dead.clone().unwrap_or(Error::Closed);
            drop(st);
            finish(state, p, Err(e));
        } else {
            st.pending.insert(h.handle, p);
        }
    }
    Ok(())
}

/// Reads and checks one structured chunk's payload into its request.
async fn chunk(r: &mut Reader, p: &mut Pending, h: &wire_c::ChunkHeader, session: Session) -> Result<(), Error> {
    let end = p.offset + p.len;
    match h.kind {
        REPLY_TYPE_OFFSET_DATA => {
            if p.cmd != CMD_READ {
                return protocol("OFFSET_DATA chunk for a request that is not a read");
            }
            if h.len <= 8 || h.len - 8 > p.len {
                return protocol(format!("OFFSET_DATA chunk of {} bytes for a {}-byte read", h.len, p.len));
            }
            let mut o = [0u8; 8];
            read_exact(r, &mut o).await?;
            let at = u64::from_be_bytes(o);
            // At most the read's length, which fits in 32 bits.
            let n = (h.len - 8) as u32;
            let rel = place(p, at, n, end, "OFFSET_DATA")?;
            // Straight from the socket into the caller's buffers.
            let mut spans = Spans::new(rel, n);
            while let Some((i, range)) = spans.next(&p.bufs) {
                read_data(r, &mut p.bufs[i][range]).await?;
            }
            debug_assert_eq!(spans.left, 0, "a chunk reaches past its request's buffers");
        }
        REPLY_TYPE_OFFSET_HOLE => {
            if p.cmd != CMD_READ {
                return protocol("OFFSET_HOLE chunk for a request that is not a read");
            }
            let payload = small_payload(r, h).await?;
            let (at, n) = wire_c::decode_offset_hole(&payload)?;
            if n == 0 {
                return protocol("OFFSET_HOLE chunk of length 0");
            }
            // The buffers may hold anything (they are not zeroed up front), so the hole is
            // written as zeros here, like data.
            let rel = place(p, at, n, end, "OFFSET_HOLE")?;
            let mut spans = Spans::new(rel, n);
            while let Some((i, range)) = spans.next(&p.bufs) {
                p.bufs[i][range].fill(0);
            }
        }
        REPLY_TYPE_BLOCK_STATUS_EXT if !session.extended => return protocol("BLOCK_STATUS_EXT chunk without extended headers"),
        REPLY_TYPE_BLOCK_STATUS | REPLY_TYPE_BLOCK_STATUS_EXT => {
            if p.cmd != CMD_BLOCK_STATUS {
                return protocol("BLOCK_STATUS chunk for a request that is not block status");
            }
            if h.len > BLOCK_STATUS_PAYLOAD_MAX_BYTES as u64 {
                return protocol(format!("BLOCK_STATUS chunk of {} bytes (limit {BLOCK_STATUS_PAYLOAD_MAX_BYTES})", h.len));
            }
            let mut payload = vec![0u8; h.len as usize];
            read_exact(r, &mut payload).await?;
            let (id, extents) = if h.kind == REPLY_TYPE_BLOCK_STATUS_EXT {
                wire_c::decode_block_status_ext(&payload)?
            } else {
                wire_c::decode_block_status(&payload)?
            };
            if Some(id) != session.base_allocation_id {
                return protocol(format!("BLOCK_STATUS for metadata context {id}, which was not negotiated"));
            }
            if p.extents.is_some() {
                return protocol("two BLOCK_STATUS chunks for one context");
            }
            if extents.iter().any(|&(len, _)| len == 0) {
                return protocol("BLOCK_STATUS extent of length 0");
            }
            p.extents = Some(extents);
        }
        REPLY_TYPE_NONE => {
            if h.len != 0 {
                return protocol(format!("NONE chunk with {} bytes of payload", h.len));
            }
            if !h.done() {
                return protocol("NONE chunk without the DONE flag");
            }
        }
        kind if h.is_error() => {
            let payload = small_payload(r, h).await?;
            let e = wire_c::decode_error_chunk(kind, &payload)?;
            if let Some(at) = e.offset {
                if at < p.offset || at >= end {
                    return protocol(format!("ERROR_OFFSET {at} outside the request {}..{end}", p.offset));
                }
            }
            if p.error.is_none() {
                let message = (!e.message.is_empty()).then_some(e.message);
                p.error = Some(Error::Server { errno: e.code, message });
            }
        }
        kind => return protocol(format!("unknown reply chunk type {kind}")),
    }
    Ok(())
}

/// Reads a non-data chunk's payload, refusing sizes no honest server sends.
async fn small_payload(r: &mut Reader, h: &wire_c::ChunkHeader) -> Result<Vec<u8>, Error> {
    if h.len > CHUNK_PAYLOAD_MAX_BYTES as u64 {
        return protocol(format!("reply chunk of {} bytes (limit {CHUNK_PAYLOAD_MAX_BYTES})", h.len));
    }
    let mut payload = vec![0u8; h.len as usize];
    read_exact(r, &mut payload).await?;
    Ok(payload)
}

/// Checks that `n` bytes at `at` lie inside the request and overlap nothing already
/// received, records them, and returns their offset within the request.
fn place(p: &mut Pending, at: u64, n: u32, end: u64, what: &str) -> Result<u32, Error> {
    let Some(chunk_end) = at.checked_add(n as u64) else {
        return protocol(format!("{what} chunk offset overflows"));
    };
    if at < p.offset || chunk_end > end {
        return protocol(format!("{what} chunk {at}..{chunk_end} outside the request {}..{end}", p.offset));
    }
    let rel = (at - p.offset) as u32;
    let rel_end = rel + n;
    let i = p.covered.partition_point(|&(s, _)| s < rel);
    let overlaps_prev = i > 0 && p.covered[i - 1].1 > rel;
    let overlaps_next = i < p.covered.len() && p.covered[i].0 < rel_end;
    if overlaps_prev || overlaps_next {
        return protocol(format!("{what} chunk {at}..{chunk_end} overlaps data already received"));
    }
    // Merged with touching neighbours, so an honest server's chunks (in any order) keep the
    // list short; a server scattering tiny chunks runs into the cap instead of making each
    // insert cost more.
    let joins_prev = i > 0 && p.covered[i - 1].1 == rel;
    let joins_next = i < p.covered.len() && p.covered[i].0 == rel_end;
    match (joins_prev, joins_next) {
        (true, true) => {
            p.covered[i - 1].1 = p.covered[i].1;
            p.covered.remove(i);
        }
        (true, false) => p.covered[i - 1].1 = rel_end,
        (false, true) => p.covered[i].0 = rel,
        (false, false) => {
            if p.covered.len() >= COVERED_RANGES_MAX {
                return protocol(format!("read reply scattered into more than {COVERED_RANGES_MAX} separate pieces"));
            }
            p.covered.insert(i, (rel, rel_end));
        }
    }
    p.covered_bytes += n as u64;
    Ok(rel)
}

/// The request's final result once its DONE chunk arrived.
fn complete(p: &mut Pending) -> Result<Outcome, Error> {
    if let Some(e) = p.error.take() {
        return Err(e);
    }
    match p.cmd {
        CMD_READ if p.covered_bytes != p.len => protocol(format!(
            "read of {} bytes at {} answered with only {} bytes and no error",
            p.len, p.offset, p.covered_bytes
        )),
        CMD_READ => Ok(Outcome::Read(std::mem::take(&mut p.bufs))),
        CMD_BLOCK_STATUS => match p.extents.take() {
            Some(e) => Ok(Outcome::Extents(e)),
            None => protocol("block status finished without a BLOCK_STATUS chunk"),
        },
        _ => Ok(Outcome::Done),
    }
}
