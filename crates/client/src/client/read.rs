//! Reads: into the caller's buffers (one, or several in order), split into requests the
//! export accepts, or into buffers the transport chooses (a pool's pieces as they came).

use super::{join_all, Client, Transport};
use crate::connection::Outcome;
use crate::error::Error;
use sluice_proto::wire::CMD_READ;

impl Client {
    /// Reads `buf.len()` bytes at `offset` into `buf` and hands it back. The data goes from
    /// the socket straight into `buf`; no staging copy. A read succeeds only once the reply
    /// has written every byte of `buf` (data, or zeros for a hole), so whatever `buf` held
    /// before never comes back as data.
    pub async fn read_owned(&self, offset: u64, buf: Vec<u8>) -> Result<Vec<u8>, Error> {
        let mut bufs = self.read_vectored(offset, vec![buf]).await?;
        Ok(bufs.pop().unwrap_or_default())
    }

    /// Reads `len` bytes at `offset` into buffers of the transport's choosing, handed back
    /// in order (their concatenation is the range). A pool hands back its members' own
    /// buffers as they came, rather than gathering them into one (a copy of every byte),
    /// and a cached volume the buffer its core answered with; any other export fills one
    /// new buffer. For a caller that copies the bytes on anyway.
    pub async fn read_pieces(&self, offset: u64, len: usize) -> Result<Vec<Vec<u8>>, Error> {
        let ex = &self.inner.export;
        let one_request = len as u64 <= ex.request_max_bytes() as u64 && ex.aligned(offset, len as u64);
        if !matches!(self.inner.transport, Transport::Conns(_)) && one_request && len > 0 {
            self.check_range(offset, len as u64)?;
            // No buffers: the pool keeps its members', the cache its own.
            return match self.call(CMD_READ, 0, offset, len as u64, &[], Vec::new()).await? {
                Outcome::Read(pieces) => Ok(pieces),
                _ => Err(Error::Protocol("read answered without data".into())),
            };
        }
        self.read_vectored(offset, vec![crate::read_buffers::take(len)]).await
    }

    /// Reads into several buffers in order (scatter): `offset` goes to the start of the
    /// first. Large ranges are split into requests the server accepts and sent together.
    pub async fn read_vectored(&self, offset: u64, mut bufs: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, Error> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        self.check_range(offset, total)?;
        let ex = &self.inner.export;
        let max = ex.request_max_bytes() as u64;
        if total <= max && ex.aligned(offset, total) {
            return self.read_request(offset, bufs).await;
        }
        // Too big for one request, or not on the export's block boundaries: read whole
        // blocks in pieces of at most `max`, each into its own buffer, all in flight
        // together, then copy the wanted bytes into the caller's buffers. (Splitting the
        // caller's buffers in place would need aliasing the borrow checker cannot see.)
        let b = ex.block_min as u64;
        let lo = offset / b * b;
        // `self.size()`, not `ex.size`: a grown pool serves past the size it negotiated,
        // and the range was checked against the former.
        let hi = (offset + total).next_multiple_of(b).min(self.size());
        let pieces = (0..(hi - lo).div_ceil(max)).map(|i| {
            let n = (hi - lo - i * max).min(max);
            self.read_request(lo + i * max, vec![vec![0u8; n as usize]])
        });
        let mut data = Vec::new();
        for r in join_all(pieces).await {
            data.extend(r?);
        }
        let skip = (offset - lo) as usize;
        // Every byte of the caller's buffers must come from this read: they are not zeroed.
        if data.iter().map(|d| d.len() as u64).sum::<u64>() < skip as u64 + total {
            return Err(Error::Protocol(format!("a split read of {total} bytes at {offset} came back short")));
        }
        let mut src = data.iter().flat_map(|d| d.iter()).skip(skip);
        for b in &mut bufs {
            for (d, s) in b.iter_mut().zip(&mut src) {
                *d = *s;
            }
        }
        Ok(bufs)
    }

    /// One READ request; the buffers' lengths add up to at most the request maximum.
    async fn read_request(&self, offset: u64, bufs: Vec<Vec<u8>>) -> Result<Vec<Vec<u8>>, Error> {
        let total: u64 = bufs.iter().map(|b| b.len() as u64).sum();
        if total == 0 {
            return Ok(bufs);
        }
        match self.call(CMD_READ, 0, offset, total, &[], bufs).await? {
            Outcome::Read(b) => Ok(b),
            _ => Err(Error::Protocol("read answered without data".into())),
        }
    }

    /// Reads into a borrowed buffer. This costs one copy from an owned buffer; use
    /// `read_owned` or `read_vectored` on hot paths.
    pub async fn read(&self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        let data = self.read_owned(offset, vec![0u8; buf.len()]).await?;
        buf.copy_from_slice(&data);
        Ok(())
    }
}
