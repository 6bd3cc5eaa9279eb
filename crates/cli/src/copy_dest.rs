//! Where `sluice copy` writes to, and how each kind of destination is made to read as
//! zeros where the source does: WRITE_ZEROES on an export, a hole left alone or punched
//! in a file, zero bytes where nothing better exists.

use super::copy_source::blocking;
use super::failure::Failure;
use super::os;
use sluice_client::Client;
use std::fs::File;
use std::io::Write;
use std::ops::Range;
use std::os::unix::fs::FileExt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

/// Granularity of all-zero detection in data read from the source: small enough to find
/// zero runs inside a request, large enough that a request splits into few writes.
const ZERO_DETECT_BYTES: usize = 64 * 1024;

/// How a file destination gets its zero ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FileZeros {
    /// A new or empty regular file, already extended with ftruncate: zero ranges are
    /// holes already, so nothing is written.
    Leave,
    /// A file with old data, or a block device: punch a hole (which reads as zeros),
    /// or write zeros where that is impossible.
    Punch,
    /// Write zero bytes (--no-sparse).
    Write,
}

pub enum Target {
    Nbd(Client),
    /// A regular file (`regular`) or block device, written with pwrite.
    File {
        file: Arc<File>,
        zeros: FileZeros,
        regular: bool,
    },
    /// Standard output, a pipe or a character device: written in order.
    Stream(Arc<File>),
}

pub struct Dest {
    pub target: Target,
    /// How error messages name it: the argument, or "standard output".
    pub name: String,
    /// Leave holes where the source reads as zeros (no --no-sparse).
    pub sparse: bool,
    /// Zeros to write from, one request long.
    zeros: Vec<u8>,
    /// Cleared when the file system or device refused to punch holes: stop asking.
    punch_works: AtomicBool,
    /// One buffered write to a file at a time. Concurrent pwrites to one file serialize on
    /// its inode lock anyway, and the waiters spin: measured, 16 writers to a tmpfs file
    /// spent 13% of the copy's CPU in rwsem_spin_on_owner. The network, not one writer
    /// thread, is what limits a copy.
    file_writer: tokio::sync::Semaphore,
}

impl Dest {
    pub fn new(target: Target, name: String, sparse: bool, request_bytes: usize) -> Dest {
        Dest {
            target,
            name,
            sparse,
            zeros: vec![0u8; request_bytes],
            punch_works: AtomicBool::new(true),
            file_writer: tokio::sync::Semaphore::new(1),
        }
    }

    /// Whether making a range read as zeros costs next to nothing whatever its length, so
    /// zero ranges can go out as large items.
    pub fn zeroing_is_cheap(&self) -> bool {
        match &self.target {
            Target::Nbd(c) => c.export().can_zero(),
            Target::File { zeros, .. } => *zeros != FileZeros::Write,
            Target::Stream(_) => false,
        }
    }

    /// Writes `buf`, which belongs at `offset`, and hands the buffer back. Where zeroing is
    /// cheap, blocks of it that are all zeros are treated as zero ranges; elsewhere the
    /// buffer is written as it is.
    pub async fn put(self: &Arc<Self>, offset: u64, buf: Vec<u8>) -> Result<Vec<u8>, Failure> {
        let detect = self.zeroing_is_cheap();
        match &self.target {
            Target::Nbd(client) => {
                for (range, zero) in ZeroRuns::new(offset, &buf, detect) {
                    let at = offset + range.start as u64;
                    if zero {
                        self.zero(at, range.len() as u64).await?;
                    } else {
                        client
                            .write(at, &buf[range], false)
                            .await
                            .map_err(|e| self.write_error(at, &e))?;
                    }
                }
                Ok(buf)
            }
            Target::File { file, .. } => {
                let (me, file) = (self.clone(), file.clone());
                let _turn = self.file_writer.acquire().await.expect("the semaphore is never closed");
                let (buf, r) = blocking(move || {
                    let r = ZeroRuns::new(offset, &buf, detect).try_for_each(|(range, zero)| {
                        let at = offset + range.start as u64;
                        if zero {
                            me.zero_file(&file, at, range.len() as u64)
                        } else {
                            file.write_all_at(&buf[range], at).map_err(|e| {
                                Failure::io(&format!("writing {} at offset {at}", me.name), e)
                            })
                        }
                    });
                    (buf, r)
                })
                .await?;
                r.map(|()| buf)
            }
            Target::Stream(file) => {
                let file = file.clone();
                let (buf, r) = blocking(move || {
                    let r = (&*file).write_all(&buf);
                    (buf, r)
                })
                .await?;
                r.map_err(|e| Failure::io(&format!("writing {}", self.name), e))?;
                Ok(buf)
            }
        }
    }

    /// Makes `len` bytes at `offset` read as zeros.
    pub async fn zero(self: &Arc<Self>, offset: u64, len: u64) -> Result<(), Failure> {
        match &self.target {
            Target::Nbd(client) if client.export().can_zero() => client
                .write_zeroes(offset, len, false, self.sparse, false)
                .await
                .map_err(|e| self.write_error(offset, &e)),
            Target::Nbd(client) => {
                let mut done = 0u64;
                while done < len {
                    let n = (len - done).min(self.zeros.len() as u64) as usize;
                    let at = offset + done;
                    client
                        .write(at, &self.zeros[..n], false)
                        .await
                        .map_err(|e| self.write_error(at, &e))?;
                    done += n as u64;
                }
                Ok(())
            }
            Target::File { file, .. } => {
                let (me, file) = (self.clone(), file.clone());
                blocking(move || me.zero_file(&file, offset, len)).await?
            }
            Target::Stream(file) => {
                let (me, file) = (self.clone(), file.clone());
                blocking(move || {
                    let mut left = len;
                    while left > 0 {
                        let n = left.min(me.zeros.len() as u64) as usize;
                        (&*file)
                            .write_all(&me.zeros[..n])
                            .map_err(|e| Failure::io(&format!("writing {}", me.name), e))?;
                        left -= n as u64;
                    }
                    Ok(())
                })
                .await?
            }
        }
    }

    fn write_error(&self, at: u64, e: &sluice_client::Error) -> Failure {
        Failure::client(&format!("writing {} at offset {at}", self.name), e)
    }

    /// Blocking: makes a file range read as zeros the way `FileZeros` says.
    fn zero_file(&self, file: &File, offset: u64, len: u64) -> Result<(), Failure> {
        let Target::File { zeros, .. } = &self.target else {
            unreachable!("zero_file on a file")
        };
        match zeros {
            FileZeros::Leave => return Ok(()),
            FileZeros::Punch if self.punch_works.load(Ordering::Relaxed) => {
                match os::punch_hole(file, offset, len) {
                    Ok(()) => return Ok(()),
                    Err(e) if os::punch_unsupported(&e) => {
                        // EINVAL may be only this range (a block device wants aligned ones);
                        // the others mean the file system or device never punches.
                        if e.raw_os_error() != Some(libc::EINVAL) {
                            log::debug!(
                                "{}: cannot punch holes ({e}); writing zeros instead",
                                self.name
                            );
                            self.punch_works.store(false, Ordering::Relaxed);
                        }
                    }
                    Err(e) => {
                        return Err(Failure::io(
                            &format!("punching a hole in {} at offset {offset}", self.name),
                            e,
                        ))
                    }
                }
            }
            FileZeros::Punch | FileZeros::Write => {}
        }
        let mut done = 0u64;
        while done < len {
            let n = (len - done).min(self.zeros.len() as u64) as usize;
            let at = offset + done;
            file.write_all_at(&self.zeros[..n], at)
                .map_err(|e| Failure::io(&format!("writing {} at offset {at}", self.name), e))?;
            done += n as u64;
        }
        Ok(())
    }

    /// After the last write: sets a regular file's final length when the source's size was
    /// not known in advance, then makes everything durable (FLUSH, fsync).
    pub async fn finish(self: &Arc<Self>, copied: u64, size_known: bool) -> Result<(), Failure> {
        let ctx = |what: &str| format!("{what} {}", self.name);
        match &self.target {
            Target::Nbd(client) => {
                client
                    .flush()
                    .await
                    .map_err(|e| Failure::client(&ctx("flushing"), &e))?;
                client.disconnect().await;
                Ok(())
            }
            Target::File { file, regular, .. } => {
                let (file, regular) = (file.clone(), *regular);
                let name = self.name.clone();
                blocking(move || {
                    if regular && !size_known {
                        file.set_len(copied)
                            .map_err(|e| Failure::io(&format!("setting the size of {name}"), e))?;
                    }
                    file.sync_all()
                        .map_err(|e| Failure::io(&format!("syncing {name}"), e))
                })
                .await?
            }
            Target::Stream(file) => {
                // Redirected to a file or a device, standard output is synced too; a pipe
                // or terminal has nothing to sync.
                let file = file.clone();
                let name = self.name.clone();
                blocking(move || {
                    let kind = file.metadata().map(|m| m.file_type());
                    let durable = kind.is_ok_and(|t| {
                        use std::os::unix::fs::FileTypeExt;
                        t.is_file() || t.is_block_device()
                    });
                    if durable {
                        file.sync_all()
                            .map_err(|e| Failure::io(&format!("syncing {name}"), e))?;
                    }
                    Ok(())
                })
                .await?
            }
        }
    }
}

/// Splits a buffer that belongs at `offset` into alternating runs of data and zeros,
/// judging blocks of ZERO_DETECT_BYTES aligned to the absolute offset (so runs line up with
/// the destination's blocks). Without `detect`, the whole buffer is one run of data.
pub struct ZeroRuns<'a> {
    buf: &'a [u8],
    offset: u64,
    at: usize,
    detect: bool,
}

impl<'a> ZeroRuns<'a> {
    pub fn new(offset: u64, buf: &'a [u8], detect: bool) -> ZeroRuns<'a> {
        ZeroRuns {
            buf,
            offset,
            at: 0,
            detect,
        }
    }

    /// The block starting at `at` and whether it is all zeros.
    fn block(&self, at: usize) -> (usize, bool) {
        if !self.detect {
            return (self.buf.len(), false);
        }
        let abs = self.offset + at as u64;
        let to_boundary = ZERO_DETECT_BYTES - (abs % ZERO_DETECT_BYTES as u64) as usize;
        let end = (at + to_boundary).min(self.buf.len());
        (end, is_zero(&self.buf[at..end]))
    }
}

impl Iterator for ZeroRuns<'_> {
    type Item = (Range<usize>, bool);

    fn next(&mut self) -> Option<Self::Item> {
        if self.at >= self.buf.len() {
            return None;
        }
        let start = self.at;
        let (mut end, zero) = self.block(start);
        while end < self.buf.len() {
            let (next_end, next_zero) = self.block(end);
            if next_zero != zero {
                break;
            }
            end = next_end;
        }
        self.at = end;
        Some((start..end, zero))
    }
}

/// Whether every byte is zero. Folds without an early exit inside each 4 KiB, which the
/// compiler turns into wide OR instructions.
pub fn is_zero(b: &[u8]) -> bool {
    b.chunks(4096)
        .all(|c| c.iter().fold(0u8, |acc, &x| acc | x) == 0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_runs_follow_absolute_blocks() {
        let block = ZERO_DETECT_BYTES;
        let mut buf = vec![0u8; 4 * block];
        // The buffer starts half a block in; one byte of data in the absolute block
        // [2 * block, 3 * block), so that whole block, and only it, is a data run.
        let offset = (block / 2) as u64;
        buf[block + block / 2 + 10] = 1;
        let runs: Vec<_> = ZeroRuns::new(offset, &buf, true).collect();
        assert_eq!(
            runs,
            vec![
                (0..block / 2 + block, true),
                (block / 2 + block..block / 2 + 2 * block, false),
                (block / 2 + 2 * block..4 * block, true)
            ]
        );
        assert_eq!(ZeroRuns::new(0, &[], true).count(), 0);
        assert_eq!(
            ZeroRuns::new(7, &[1, 2, 3], true).collect::<Vec<_>>(),
            vec![(0..3, false)]
        );
        assert_eq!(
            ZeroRuns::new(0, &buf, false).collect::<Vec<_>>(),
            vec![(0..4 * block, false)]
        );
    }

    #[test]
    fn is_zero_sees_the_last_byte() {
        let mut b = vec![0u8; 10_000];
        assert!(is_zero(&b));
        b[9_999] = 1;
        assert!(!is_zero(&b));
    }
}
