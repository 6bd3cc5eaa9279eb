//! The public client: one export over one or more connections. Checks each call against
//! what the export allows before sending and splits ranges larger than one request; the
//! connections (multi-conn, reconnecting) are `Links`. A client of a pool (`pool:PATH`)
//! sends the same requests to the pool's driver instead, and a client of a cached volume
//! (`cache:PATH`) to the cache's driver.

mod admin;
mod read;

use crate::cache::CacheDriver;
use crate::connection::Outcome;
use crate::error::Error;
use crate::export::Export;
use crate::handshake;
use crate::limits::*;
use crate::links::Links;
use crate::options::Options;
use crate::pool::PoolDriver;
use crate::uri::{Address, Uri};
use sluice_proto::wire::*;
use std::io::IoSlice;
use std::sync::Arc;

/// One run of the export with the same allocation state, from base:allocation.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Extent {
    pub offset: u64,
    pub length: u64,
    /// Not allocated on the server (reads as zeros when `zero` is also set).
    pub hole: bool,
    /// Known to read as zeros.
    pub zero: bool,
}

/// A connected export. Cheap to clone; clones share the connections. Every method may be
/// called concurrently: that is how requests get in flight together.
#[derive(Clone)]
pub struct Client {
    inner: Arc<Inner>,
}

struct Inner {
    export: Export,
    transport: Transport,
}

/// Where requests go.
enum Transport {
    /// The export's own connections.
    Conns(Links),
    /// A pool's coordinator, which sends them on to its members.
    Pool(PoolDriver<Client>),
    /// A cached volume's task, which sends them on to the backing and the members.
    Cache(CacheDriver<Client>),
}

impl Client {
    /// Connects to an NBD URI with default options.
    pub async fn connect(uri: &str) -> Result<Client, Error> {
        Client::connect_with(&Uri::parse(uri)?, &Options::default()).await
    }

    /// Connects with `options`: several connections for multi-conn, and reconnecting.
    pub async fn connect_with(uri: &Uri, options: &Options) -> Result<Client, Error> {
        if let Address::Pool(path) = &uri.address {
            let (export, driver) = crate::pool::open(path, options, options.degraded).await?;
            return Ok(Client { inner: Arc::new(Inner { export, transport: Transport::Pool(driver) }) });
        }
        if let Address::Cache(path) = &uri.address {
            let (export, driver) = crate::cache::open(path, options).await?;
            return Ok(Client { inner: Arc::new(Inner { export, transport: Transport::Cache(driver) }) });
        }
        let first = handshake::open(uri, options, options.connect_timeout).await?;
        let export = first.0.clone();
        let mut connections = vec![first.1];
        let wanted = options.connections.clamp(1, CONNECTIONS_MAX);
        if wanted > 1 && export.can_multi_conn() {
            for _ in 1..wanted {
                let (ex, conn) = handshake::open(uri, options, options.connect_timeout).await?;
                // Requests go to any connection, so each must have agreed the same things.
                if ex != export {
                    return Err(Error::Protocol("connections to the same export negotiated different sizes, flags or features".into()));
                }
                connections.push(conn);
            }
        }
        let links = Links::new(connections, uri, options, &export);
        Ok(Client { inner: Arc::new(Inner { export, transport: Transport::Conns(links) }) })
    }

    /// The export as negotiated.
    pub fn export(&self) -> &Export {
        &self.inner.export
    }

    /// The volume's size. A pool's grows when a reshape (`pool grow`) is done: the server
    /// tells clients that connect after that the new size (NBD sends it once, in the
    /// handshake), while `export().size` stays what this client negotiated.
    pub fn size(&self) -> u64 {
        match &self.inner.transport {
            Transport::Pool(pool) => pool.size(),
            Transport::Conns(_) | Transport::Cache(_) => self.inner.export.size,
        }
    }

    /// Connections actually open (1 unless the server allows multi-conn and more were asked;
    /// for a pool, those to all its members).
    pub fn connections(&self) -> usize {
        match &self.inner.transport {
            Transport::Conns(links) => links.len(),
            Transport::Pool(pool) => pool.connections(),
            Transport::Cache(cache) => cache.connections(),
        }
    }

    /// Sends one request, checked and no larger than the export allows, on the least
    /// loaded connection, or to the pool.
    /// `len` passes 32 bits only when the export negotiated extended headers, which a pool
    /// never does.
    async fn call(&self, cmd: u16, flags: u16, offset: u64, len: u64, payload: &[IoSlice<'_>], bufs: Vec<Vec<u8>>) -> Result<Outcome, Error> {
        match &self.inner.transport {
            Transport::Conns(links) => links.call(cmd, flags, offset, len, payload, bufs).await,
            Transport::Pool(pool) => {
                let len = u32::try_from(len).expect("a pool's requests stay within 32 bits");
                pool.call(cmd, flags, offset, len, payload, bufs).await
            }
            Transport::Cache(cache) => {
                let len = u32::try_from(len).expect("a cached volume's requests stay within 32 bits");
                cache.call(cmd, flags, offset, len, payload, bufs).await
            }
        }
    }

    fn check_range(&self, offset: u64, len: u64) -> Result<(), Error> {
        let size = self.size();
        match offset.checked_add(len) {
            Some(end) if end <= size => Ok(()),
            _ => Err(Error::OutOfRange { offset, len, size }),
        }
    }

    /// Writes and zeroes must keep to the minimum block size the server asked for. A
    /// read-modify-write here could lose a concurrent write to the same block, so an
    /// unaligned request is refused instead.
    fn check_aligned(&self, offset: u64, len: u64) -> Result<(), Error> {
        let ex = &self.inner.export;
        match ex.aligned(offset, len) {
            true => Ok(()),
            false => Err(Error::Unaligned { offset, len, block: ex.block_min }),
        }
    }

    fn check_writable(&self) -> Result<(), Error> {
        if self.inner.export.read_only() {
            return Err(Error::ReadOnly);
        }
        Ok(())
    }

    /// Writes `data` at `offset`; with `fua`, the server has it on stable storage before
    /// answering.
    pub async fn write(&self, offset: u64, data: &[u8], fua: bool) -> Result<(), Error> {
        self.write_vectored(offset, &[IoSlice::new(data)], fua).await
    }

    /// Writes `data` at `offset`, as `write` does, handing the buffer over: a pool or a
    /// cached volume sends it to its members as it is, where `write` copies it first (their
    /// member writes outlive a borrow). Other exports write it as `write` does.
    pub async fn write_owned(&self, offset: u64, data: Vec<u8>, fua: bool) -> Result<(), Error> {
        let len = data.len() as u64;
        let one_request = len > 0 && len <= self.inner.export.request_max_bytes() as u64;
        if matches!(self.inner.transport, Transport::Conns(_)) || !one_request {
            return self.write(offset, &data, fua).await;
        }
        self.check_writable()?;
        self.check_range(offset, len)?;
        self.check_aligned(offset, len)?;
        let flags = self.fua_flag(fua)?;
        match &self.inner.transport {
            Transport::Pool(pool) => pool.write_owned(flags, offset, data).await?,
            Transport::Cache(cache) => cache.write_owned(flags, offset, data).await?,
            Transport::Conns(links) => links.call(CMD_WRITE, flags, offset, len, &[IoSlice::new(&data)], Vec::new()).await?,
        };
        Ok(())
    }

    /// Writes several buffers in order (gather) as one range starting at `offset`. The
    /// buffers go to the socket with writev, without staging copies.
    pub async fn write_vectored(&self, offset: u64, data: &[IoSlice<'_>], fua: bool) -> Result<(), Error> {
        self.check_writable()?;
        let total: u64 = data.iter().map(|b| b.len() as u64).sum();
        self.check_range(offset, total)?;
        self.check_aligned(offset, total)?;
        let flags = self.fua_flag(fua)?;
        let max = self.inner.export.request_max_bytes() as u64;
        if total <= max {
            if total == 0 {
                return Ok(());
            }
            self.call(CMD_WRITE, flags, offset, total, data, Vec::new()).await?;
            return Ok(());
        }
        // Split into requests of at most `max` bytes, each a list of sub-slices, all sent at once.
        let mut requests: Vec<(u64, Vec<IoSlice<'_>>)> = Vec::new();
        let mut cur: Vec<IoSlice<'_>> = Vec::new();
        let (mut cur_len, mut cur_off) = (0u64, offset);
        for s in data {
            let mut s: &[u8] = s;
            while !s.is_empty() {
                let n = (s.len() as u64).min(max - cur_len) as usize;
                cur.push(IoSlice::new(&s[..n]));
                cur_len += n as u64;
                s = &s[n..];
                if cur_len == max {
                    requests.push((cur_off, std::mem::take(&mut cur)));
                    cur_off += cur_len;
                    cur_len = 0;
                }
            }
        }
        if cur_len > 0 {
            requests.push((cur_off, cur));
        }
        let calls = requests.iter().map(|(off, slices)| {
            let len: usize = slices.iter().map(|s| s.len()).sum();
            async move { self.call(CMD_WRITE, flags, *off, len as u64, slices, Vec::new()).await }
        });
        for r in join_all(calls).await {
            r?;
        }
        Ok(())
    }

    fn fua_flag(&self, fua: bool) -> Result<u16, Error> {
        match (fua, self.inner.export.can_fua()) {
            (false, _) => Ok(0),
            (true, true) => Ok(CMD_FLAG_FUA),
            (true, false) => Err(Error::Unsupported("FUA")),
        }
    }

    /// Asks the server to make every completed write durable. With multi-conn, a flush on
    /// one connection covers writes completed on all of them (that is what CAN_MULTI_CONN
    /// promises); writes still in flight are never covered by a flush. With reconnecting,
    /// `Error::DurabilityLost` says that a dropped connection may have lost writes.
    pub async fn flush(&self) -> Result<(), Error> {
        if !self.inner.export.can_flush() {
            // The server says writes are durable when answered.
            return Ok(());
        }
        match &self.inner.transport {
            Transport::Conns(links) => links.flush().await,
            Transport::Pool(pool) => pool.call(CMD_FLUSH, 0, 0, 0, &[], Vec::new()).await.map(|_| ()),
            Transport::Cache(cache) => cache.call(CMD_FLUSH, 0, 0, 0, &[], Vec::new()).await.map(|_| ()),
        }
    }

    /// Tells the server the range is no longer needed (it may then read as anything).
    pub async fn trim(&self, offset: u64, len: u64, fua: bool) -> Result<(), Error> {
        self.check_writable()?;
        if !self.inner.export.can_trim() {
            return Err(Error::Unsupported("TRIM"));
        }
        let flags = self.fua_flag(fua)?;
        self.check_range(offset, len)?;
        // Trimming is advisory: only the whole blocks inside the range are sent.
        let b = self.inner.export.block_min as u64;
        let lo = offset.next_multiple_of(b);
        let end = offset + len;
        let hi = if end == self.inner.export.size { end } else { end / b * b };
        if hi <= lo {
            return Ok(());
        }
        self.ranged(CMD_TRIM, flags, lo, hi - lo, self.range_step()).await
    }

    /// Writes zeros over the range. `may_trim` lets the server punch a hole instead of
    /// allocating; `fast` asks it to fail (with `Server { errno: ENOTSUP }`) rather than
    /// write zeros slowly.
    pub async fn write_zeroes(&self, offset: u64, len: u64, fua: bool, may_trim: bool, fast: bool) -> Result<(), Error> {
        self.check_writable()?;
        if !self.inner.export.can_zero() {
            return Err(Error::Unsupported("WRITE_ZEROES"));
        }
        if fast && !self.inner.export.can_fast_zero() {
            return Err(Error::Unsupported("fast zero"));
        }
        let mut flags = self.fua_flag(fua)?;
        if !may_trim {
            flags |= CMD_FLAG_NO_HOLE;
        }
        if fast {
            flags |= CMD_FLAG_FAST_ZERO;
        }
        self.check_range(offset, len)?;
        self.check_aligned(offset, len)?;
        // The maximum block size bounds WRITE_ZEROES too, unless it is a fast zero.
        let step = if fast { self.range_step() } else { self.data_request_step() };
        self.ranged(CMD_WRITE_ZEROES, flags, offset, len, step).await
    }

    /// Asks the server to prefetch the range into its cache.
    pub async fn cache(&self, offset: u64, len: u64) -> Result<(), Error> {
        if !self.inner.export.can_cache() {
            return Err(Error::Unsupported("CACHE"));
        }
        self.check_range(offset, len)?;
        // Prefetching more than asked is harmless: widen to whole blocks.
        let ex = &self.inner.export;
        let b = ex.block_min as u64;
        let (lo, hi) = (offset / b * b, (offset + len).next_multiple_of(b).min(ex.size));
        self.ranged(CMD_CACHE, 0, lo, hi - lo, self.data_request_step()).await
    }

    /// Split size for commands the maximum block size bounds (CACHE, WRITE_ZEROES).
    fn data_request_step(&self) -> u64 {
        self.inner.export.request_max_bytes().min(RANGE_REQUEST_MAX_BYTES) as u64
    }

    /// Split size for commands nothing but the export bounds (TRIM, fast WRITE_ZEROES,
    /// BLOCK_STATUS): one request for any range once extended headers carry 64-bit lengths.
    fn range_step(&self) -> u64 {
        if self.inner.export.extended {
            u64::MAX
        } else {
            RANGE_REQUEST_MAX_BYTES as u64
        }
    }

    /// A command that only names a range, split into requests of at most `step` bytes
    /// (a whole number of minimum blocks), all in flight together.
    async fn ranged(&self, cmd: u16, flags: u16, offset: u64, len: u64, step: u64) -> Result<(), Error> {
        let b = self.inner.export.block_min as u64;
        let step = (step / b * b).max(b);
        let calls = (0..len.div_ceil(step)).map(|i| {
            let at = offset + i * step;
            let n = (len - i * step).min(step);
            async move { self.call(cmd, flags, at, n, &[], Vec::new()).await }
        });
        for r in join_all(calls).await {
            r?;
        }
        Ok(())
    }

    /// The allocation state from `offset` on, as base:allocation reports it. The server
    /// may describe less than `len` (at least one extent); extents never reach past
    /// `offset + len`. Without base:allocation, the whole range is reported as data.
    pub async fn block_status(&self, offset: u64, len: u64) -> Result<Vec<Extent>, Error> {
        self.check_range(offset, len)?;
        let len = len.min(self.range_step());
        if len == 0 {
            return Ok(Vec::new());
        }
        let ex = &self.inner.export;
        if !ex.base_allocation {
            return Ok(vec![Extent { offset, length: len, hole: false, zero: false }]);
        }
        // Asked on whole blocks; the answer is clipped back to the range below.
        let b = ex.block_min as u64;
        let lo = offset / b * b;
        let hi = (offset + len).next_multiple_of(b).min(ex.size);
        let descriptors = match self.call(CMD_BLOCK_STATUS, 0, lo, hi - lo, &[], Vec::new()).await? {
            Outcome::Extents(e) => e,
            _ => return Err(Error::Protocol("block status answered without extents".into())),
        };
        let end = offset + len;
        let mut at = lo;
        let mut out = Vec::with_capacity(descriptors.len());
        for (length, flags) in descriptors {
            if at >= end {
                // A server may describe past the request; what lies beyond is not ours to use.
                break;
            }
            let mut length = length.min(end - at);
            if at < offset {
                // The part of the first block before the range.
                let before = (offset - at).min(length);
                at += before;
                length -= before;
                if length == 0 {
                    continue;
                }
            }
            let (hole, zero) = (flags & STATE_HOLE != 0, flags & STATE_ZERO != 0);
            match out.last_mut() {
                Some(Extent { length: l, hole: h, zero: z, .. }) if *h == hole && *z == zero => *l += length,
                _ => out.push(Extent { offset: at, length, hole, zero }),
            }
            at += length;
        }
        if out.is_empty() {
            // Everything described lay before `offset`, within its block: say "data" (always
            // safe to assume) up to the block's end, so a caller's loop moves on.
            out.push(Extent { offset, length: (lo + b).min(end) - offset, hole: false, zero: false });
        }
        Ok(out)
    }

    /// Sends NBD_CMD_DISC on every connection, and stops reconnecting. Requests in flight
    /// may still complete; new ones fail with `Error::Closed`. A pool first stops cleanly:
    /// requests in flight finish and the members' superblocks are released.
    pub async fn disconnect(&self) {
        match &self.inner.transport {
            Transport::Conns(links) => links.disconnect().await,
            Transport::Pool(pool) => pool.disconnect().await,
            Transport::Cache(cache) => cache.disconnect().await,
        }
    }
}

/// Polls all futures together (they share the connections, so this is what puts their
/// requests in flight at once) and returns their results in order.
async fn join_all<F: std::future::Future>(futures: impl IntoIterator<Item = F>) -> Vec<F::Output> {
    let mut futures: Vec<_> = futures.into_iter().map(Box::pin).collect();
    let mut results: Vec<Option<F::Output>> = futures.iter().map(|_| None).collect();
    std::future::poll_fn(|cx| {
        let mut all = true;
        for (f, r) in futures.iter_mut().zip(results.iter_mut()) {
            if r.is_none() {
                match f.as_mut().poll(cx) {
                    std::task::Poll::Ready(v) => *r = Some(v),
                    std::task::Poll::Pending => all = false,
                }
            }
        }
        if all {
            std::task::Poll::Ready(())
        } else {
            std::task::Poll::Pending
        }
    })
    .await;
    results.into_iter().map(|r| r.unwrap()).collect()
}
