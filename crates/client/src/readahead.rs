//! Sequential readahead for one reader. While reads keep following each other, the next
//! `window` bytes are already being fetched in the background, so a reader that asks for a
//! little at a time still keeps a request in flight. Random access turns it off: a read
//! that does not continue the previous one drops the window and goes straight through.

use crate::client::Client;
use crate::error::Error;
use tokio::task::JoinHandle;

/// A fetch in flight: its offset and the task reading there.
type Fetch = (u64, JoinHandle<Result<Vec<u8>, Error>>);

pub struct Readahead {
    client: Client,
    window: usize,
    /// End of the last read, to spot sequential access.
    last_end: Option<u64>,
    /// Data already fetched ahead: it starts at the offset.
    ready: Option<(u64, Vec<u8>)>,
    /// The fetch in flight: offset and the task reading `window` bytes there.
    fetching: Option<Fetch>,
}

impl Readahead {
    /// `window` bytes are read ahead of a sequential reader; 0 disables readahead.
    pub fn new(client: Client, window: usize) -> Readahead {
        let window = window.min(client.export().request_max_bytes() as usize);
        Readahead { client, window, last_end: None, ready: None, fetching: None }
    }

    /// Forgets fetched data overlapping a range that was written, so later reads see it.
    pub fn invalidate(&mut self, offset: u64, len: u64) {
        let overlaps = |start: u64, n: usize| start < offset.saturating_add(len) && offset < start + n as u64;
        if matches!(&self.ready, Some((s, d)) if overlaps(*s, d.len())) {
            self.ready = None;
        }
        if matches!(&self.fetching, Some((s, _)) if overlaps(*s, self.window)) {
            if let Some((_, t)) = self.fetching.take() {
                t.abort();
            }
        }
    }

    pub async fn read(&mut self, offset: u64, buf: &mut [u8]) -> Result<(), Error> {
        let Some(end) = offset.checked_add(buf.len() as u64) else {
            return Err(Error::OutOfRange { offset, len: buf.len() as u64, size: self.client.size() });
        };
        let sequential = self.last_end == Some(offset);
        self.last_end = Some(end);
        if self.window == 0 || !sequential {
            self.drop_window();
            return self.client.read(offset, buf).await;
        }
        let mut filled = 0usize;
        while filled < buf.len() {
            let at = offset + filled as u64;
            if let Some((start, data)) = &self.ready {
                let data_end = *start + data.len() as u64;
                if *start <= at && at < data_end {
                    let from = (at - start) as usize;
                    let n = (data.len() - from).min(buf.len() - filled);
                    buf[filled..filled + n].copy_from_slice(&data[from..from + n]);
                    filled += n;
                    continue;
                }
            }
            match self.fetching.take() {
                Some((start, task)) if start <= at && at < start + self.window as u64 => {
                    let data = task.await.map_err(|e| Error::Protocol(format!("readahead task failed: {e}")))??;
                    self.ready = Some((start, data));
                }
                other => {
                    if let Some((_, t)) = other {
                        t.abort();
                    }
                    // Not fetched yet: read the rest directly, and fetch ahead from its end.
                    self.ready = None;
                    self.client.read(at, &mut buf[filled..]).await?;
                    filled = buf.len();
                }
            }
        }
        self.start_fetch(end);
        Ok(())
    }

    fn drop_window(&mut self) {
        self.ready = None;
        if let Some((_, t)) = self.fetching.take() {
            t.abort();
        }
    }

    /// Starts fetching the window after what is ready (or after `from`), unless one is
    /// already in flight or the export ends.
    fn start_fetch(&mut self, from: u64) {
        if self.fetching.is_some() {
            return;
        }
        let next = match &self.ready {
            Some((s, d)) if s + d.len() as u64 > from => s + d.len() as u64,
            _ => from,
        };
        let n = (self.client.size().saturating_sub(next)).min(self.window as u64) as usize;
        if n == 0 {
            return;
        }
        let c = self.client.clone();
        self.fetching = Some((next, tokio::spawn(async move { c.read_owned(next, vec![0u8; n]).await })));
    }
}

impl Drop for Readahead {
    fn drop(&mut self) {
        self.drop_window();
    }
}
