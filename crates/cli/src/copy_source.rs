//! Where `sluice copy` reads from, and the plan of the copy: the source cut into numbered
//! work items of data to read or zeros to write, in offset order, mapped lazily from
//! base:allocation (an export) or SEEK_DATA / SEEK_HOLE (a file).

use super::failure::Failure;
use super::os;
use sluice_client::Client;
use std::collections::VecDeque;
use std::fs::File;
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::sync::Arc;

/// What can be read from, cheap to clone so every worker holds one.
#[derive(Clone)]
pub enum SourceKind {
    Nbd(Client),
    /// A regular file or block device of known size, read with pread. `map` is whether
    /// to ask SEEK_DATA / SEEK_HOLE for holes (regular files).
    File {
        file: Arc<File>,
        map: bool,
    },
    /// Standard input, a pipe or a character device: read in order until end of file.
    Stream(Arc<File>),
}

#[derive(Clone)]
pub struct Source {
    pub kind: SourceKind,
    /// How error messages name it: the argument, or "standard input".
    pub name: String,
    /// None for a stream.
    pub size: Option<u64>,
}

/// What a work item asks of a worker.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum What {
    /// Read the range from the source, then write it.
    Read,
    /// The range is already in the worker's buffer (read from a stream); write it.
    Filled,
    /// The source says the range reads as zeros; make the destination read as zeros.
    Zero,
}

#[derive(Clone, Copy, Debug)]
pub struct Item {
    /// Position in offset order, for destinations that must be written in order.
    pub seq: u64,
    pub offset: u64,
    pub len: u64,
    pub what: What,
}

impl Source {
    /// Reads `len` bytes at `offset` into `buf` (whose capacity is reused) and hands it back.
    pub async fn read(
        &self,
        offset: u64,
        mut buf: Vec<u8>,
        len: usize,
    ) -> Result<Vec<u8>, Failure> {
        buf.resize(len, 0);
        match &self.kind {
            SourceKind::Nbd(client) => client.read_owned(offset, buf).await.map_err(|e| {
                Failure::client(&format!("reading {} at offset {offset}", self.name), &e)
            }),
            SourceKind::File { file, .. } => {
                let file = file.clone();
                let (buf, r) = blocking(move || {
                    let r = file.read_exact_at(&mut buf, offset);
                    (buf, r)
                })
                .await?;
                match r {
                    Ok(()) => Ok(buf),
                    Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(Failure::new(format!(
                        "{} ended before offset {} although its size is {} bytes (did it shrink during the copy?)",
                        self.name,
                        offset + len as u64,
                        self.size.unwrap_or(0)
                    ))),
                    Err(e) => Err(Failure::io(&format!("reading {} at offset {offset}", self.name), e)),
                }
            }
            SourceKind::Stream(_) => unreachable!("stream data is read in order by the planner"),
        }
    }
}

/// Runs blocking file I/O off the async workers.
pub async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> Result<T, Failure> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Failure::new(format!("internal error: an I/O task failed: {e}")))
}

/// Hands out the copy's work items in offset order. Workers take turns calling `next`
/// under a lock; stream data is read inside that call, so it stays in order.
pub struct Planner {
    source: Source,
    /// Extents mapped but not yet handed out: (offset, length, reads as zeros).
    mapped: VecDeque<(u64, u64, bool)>,
    /// End of what has been mapped (or, for a stream, read).
    mapped_to: u64,
    next_seq: u64,
    request_bytes: u64,
    zero_item_bytes: u64,
    /// For a stream source: how many bytes the destination can take.
    capacity: Option<u64>,
    /// A stream reached end of file.
    ended: bool,
}

impl Planner {
    pub fn new(
        source: Source,
        request_bytes: usize,
        zero_item_bytes: u64,
        capacity: Option<u64>,
    ) -> Planner {
        Planner {
            source,
            mapped: VecDeque::new(),
            mapped_to: 0,
            next_seq: 0,
            request_bytes: request_bytes as u64,
            zero_item_bytes,
            capacity,
            ended: false,
        }
    }

    /// Bytes handed out so far; once `next` returned None, the source's whole length.
    pub fn planned_bytes(&self) -> u64 {
        self.mapped_to - self.mapped.iter().map(|&(_, len, _)| len).sum::<u64>()
    }

    /// The next item, or None when the source is used up. For a stream the data is read
    /// into `buf` here.
    pub async fn next(&mut self, buf: &mut Vec<u8>) -> Result<Option<Item>, Failure> {
        let Some(size) = self.source.size else {
            return self.next_from_stream(buf).await;
        };
        if self.mapped.is_empty() {
            if self.mapped_to >= size {
                return Ok(None);
            }
            self.map_more(size).await?;
        }
        let (offset, len, zero) = self
            .mapped
            .front_mut()
            .expect("map_more maps at least one extent");
        let take = (*len).min(if *zero {
            self.zero_item_bytes
        } else {
            self.request_bytes
        });
        let item = Item {
            seq: self.next_seq,
            offset: *offset,
            len: take,
            what: if *zero { What::Zero } else { What::Read },
        };
        *offset += take;
        *len -= take;
        if *len == 0 {
            self.mapped.pop_front();
        }
        self.next_seq += 1;
        Ok(Some(item))
    }

    /// Maps the next stretch of the source after `mapped_to`, at least one extent.
    async fn map_more(&mut self, size: u64) -> Result<(), Failure> {
        let at = self.mapped_to;
        let left = size - at;
        match self.source.kind.clone() {
            SourceKind::Nbd(client) => {
                let extents = client.block_status(at, left).await.map_err(|e| {
                    Failure::client(
                        &format!("block status of {} at offset {at}", self.source.name),
                        &e,
                    )
                })?;
                if extents.is_empty() {
                    return Err(Failure::new(format!(
                        "{}: block status at offset {at} described nothing",
                        self.source.name
                    )));
                }
                for x in extents {
                    // Only ranges the server promises are zero may be skipped; an allocated
                    // or unallocated range without the zero bit holds data.
                    self.push(x.offset, x.length, x.zero);
                }
            }
            SourceKind::File { file, map } => {
                if !map {
                    self.push(at, left, false);
                    return Ok(());
                }
                let f = file.clone();
                let found = blocking(move || -> std::io::Result<(Option<u64>, u64)> {
                    let Some(data) = os::seek_data(&f, at)? else {
                        return Ok((None, 0));
                    };
                    let hole = os::seek_hole(&f, data)?;
                    Ok((Some(data), hole))
                })
                .await?;
                match found {
                    Ok((None, _)) => self.push(at, left, true),
                    Ok((Some(data), hole)) => {
                        let data = data.clamp(at, size);
                        // A file that grew or shrank since it was opened: believe its size.
                        let hole = if hole <= data { size } else { hole.min(size) };
                        self.push(at, data - at, true);
                        self.push(data, hole - data, false);
                    }
                    Err(e) => {
                        log::debug!(
                            "{}: SEEK_DATA failed ({e}); copying it all as data",
                            self.source.name
                        );
                        self.source.kind = SourceKind::File { file, map: false };
                        self.push(at, left, false);
                    }
                }
            }
            SourceKind::Stream(_) => unreachable!("streams are not mapped"),
        }
        Ok(())
    }

    fn push(&mut self, offset: u64, len: u64, zero: bool) {
        if len == 0 {
            return;
        }
        debug_assert_eq!(offset, self.mapped_to, "extents must follow each other");
        match self.mapped.back_mut() {
            Some((_, l, z)) if *z == zero => *l += len,
            _ => self.mapped.push_back((offset, len, zero)),
        }
        self.mapped_to = offset + len;
    }

    async fn next_from_stream(&mut self, buf: &mut Vec<u8>) -> Result<Option<Item>, Failure> {
        let SourceKind::Stream(file) = &self.source.kind else {
            unreachable!("only streams have no size")
        };
        if self.ended {
            return Ok(None);
        }
        let file = file.clone();
        let mut b = std::mem::take(buf);
        b.resize(self.request_bytes as usize, 0);
        let (b, r) = blocking(move || {
            let r = fill(&file, &mut b);
            (b, r)
        })
        .await?;
        *buf = b;
        let n = r.map_err(|e| Failure::io(&format!("reading {}", self.source.name), e))?;
        buf.truncate(n);
        if n == 0 {
            self.ended = true;
            return Ok(None);
        }
        let offset = self.mapped_to;
        if let Some(cap) = self.capacity {
            if offset + n as u64 > cap {
                return Err(Failure::new(format!(
                    "{} is longer than the destination ({cap} bytes)",
                    self.source.name
                )));
            }
        }
        self.mapped_to += n as u64;
        let item = Item {
            seq: self.next_seq,
            offset,
            len: n as u64,
            what: What::Filled,
        };
        self.next_seq += 1;
        Ok(Some(item))
    }
}

/// Reads until `buf` is full or the stream ends (pipes return less than asked).
fn fill(mut f: &File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match f.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}
