//! Giving memory back from one elastic RAM export: punching holes in its memfd.
//!
//! Which regions: whole chunks (`ELASTIC_CHUNK_BYTES`, 2 MiB, aligned) that hold data,
//! found with SEEK_DATA from a cursor that moves on after every give-back and wraps at the
//! end. Successive give-backs so spread over the whole export rather than emptying its
//! start again and again, and each costs a seek per chunk rather than a scan of the map.
//! Aligned chunks mean that, at rest, a cache laying its slots out within chunks has lost a
//! slot whole or not at all. Not so for a read that races a punch: tmpfs reads take no lock
//! against it, so one read may return some of a chunk's pages as data and the rest as zeros
//! (a test below shows it). Only each page is whole. A cache must therefore check every
//! page it reads on every hit, never take some pages' check for the others'.
//! A punch and a single write(2) to the file are serialised (the inode lock), but the server
//! does not promise that a request is one: a short write is finished with a second.
//! What `given_back_bytes` counts is the data a chunk held when looked at just before its
//! punch; a write that lands in between is dropped too, uncounted.

use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

use rustix::fs::{FallocateFlags, SeekFrom};
use rustix::io::Errno;

use crate::limits::{ELASTIC_CHUNK_BYTES, PAGE_BYTES};

/// An elastic RAM export as the watcher sees it: the memfd, and what it gave back.
#[derive(Debug)]
pub struct ElasticMemory {
    pub export: String,
    fd: OwnedFd,
    size: u64,
    pub floor_bytes: u64,
    /// Where the next give-back starts looking for data (a chunk boundary).
    cursor: AtomicU64,
    given_back_bytes: AtomicU64,
    give_backs: AtomicU64,
}

impl ElasticMemory {
    /// `fd` is the export's memfd (another descriptor of it), of `size` bytes.
    pub fn new(export: &str, fd: OwnedFd, size: u64, floor_bytes: u64) -> ElasticMemory {
        ElasticMemory {
            export: export.to_owned(),
            fd,
            size,
            floor_bytes,
            cursor: AtomicU64::new(0),
            given_back_bytes: AtomicU64::new(0),
            give_backs: AtomicU64::new(0),
        }
    }

    /// Memory the export holds now: the memfd's allocated pages.
    pub fn held_bytes(&self) -> io::Result<u64> {
        Ok(rustix::fs::fstat(&self.fd)?.st_blocks as u64 * 512)
    }

    /// Bytes given back since the export was opened.
    pub fn given_back_bytes(&self) -> u64 {
        self.given_back_bytes.load(Ordering::Relaxed)
    }

    /// Give-backs that freed anything, since the export was opened.
    pub fn give_backs(&self) -> u64 {
        self.give_backs.load(Ordering::Relaxed)
    }

    /// Punches chunks that hold data, from the cursor on, until at least `bytes` of data
    /// are gone or every chunk was visited once; returns the bytes of data punched.
    pub fn give_back(&self, bytes: u64) -> io::Result<u64> {
        let start = self.cursor.load(Ordering::Relaxed).min(self.size);
        let (mut pos, mut wrapped, mut freed) = (start, false, 0);
        while freed < bytes {
            let Some(data) = self.next_data(pos)? else {
                if wrapped || start == 0 {
                    break;
                }
                (pos, wrapped) = (0, true);
                continue;
            };
            let chunk = data / ELASTIC_CHUNK_BYTES * ELASTIC_CHUNK_BYTES;
            if wrapped && chunk >= start {
                break;
            }
            // To the end of the last page, past the size: a punch that ends inside a page
            // zeroes that part and keeps the page.
            let end = (chunk + ELASTIC_CHUNK_BYTES).min(self.size.next_multiple_of(PAGE_BYTES as u64));
            freed += self.data_bytes(chunk, end)?;
            rustix::fs::fallocate(&self.fd, FallocateFlags::PUNCH_HOLE | FallocateFlags::KEEP_SIZE, chunk, end - chunk)?;
            pos = end;
        }
        self.cursor.store(if pos >= self.size { 0 } else { pos }, Ordering::Relaxed);
        if freed > 0 {
            self.given_back_bytes.fetch_add(freed, Ordering::Relaxed);
            self.give_backs.fetch_add(1, Ordering::Relaxed);
        }
        Ok(freed)
    }

    /// The first byte of data at or after `pos`; None when there is none up to the end.
    fn next_data(&self, pos: u64) -> io::Result<Option<u64>> {
        if pos >= self.size {
            return Ok(None);
        }
        match rustix::fs::seek(self.fd.as_fd(), SeekFrom::Data(pos)) {
            Ok(d) if d < self.size => Ok(Some(d)),
            Ok(_) | Err(Errno::NXIO) => Ok(None),
            Err(e) => Err(e.into()),
        }
    }

    /// Bytes of data (allocated pages) in `[from, to)`.
    fn data_bytes(&self, from: u64, to: u64) -> io::Result<u64> {
        let (mut pos, mut total) = (from, 0);
        while let Some(data) = self.next_data(pos)?.filter(|&d| d < to) {
            let hole = rustix::fs::seek(self.fd.as_fd(), SeekFrom::Hole(data))?.min(to);
            total += hole - data;
            pos = hole;
        }
        Ok(total)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIB: u64 = 1 << 20;

    fn memfd(size: u64) -> (OwnedFd, ElasticMemory) {
        let fd = rustix::fs::memfd_create("sluice-test", rustix::fs::MemfdFlags::CLOEXEC).unwrap();
        rustix::fs::ftruncate(&fd, size).unwrap();
        let m = ElasticMemory::new("e", fd.try_clone().unwrap(), size, 0);
        (fd, m)
    }

    fn write(fd: &OwnedFd, offset: u64, len: usize) {
        rustix::io::pwrite(fd, &vec![0xa5u8; len], offset).unwrap();
    }

    fn read(fd: &OwnedFd, offset: u64, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        rustix::io::pread(fd, &mut buf, offset).unwrap();
        buf
    }

    #[test]
    fn whole_chunks_with_data_are_punched_and_read_as_zeros() {
        let (fd, m) = memfd(16 * MIB);
        write(&fd, 0, 16 * MIB as usize);
        assert_eq!(m.held_bytes().unwrap(), 16 * MIB);
        assert_eq!(m.give_back(3 * MIB).unwrap(), 4 * MIB, "whole chunks");
        assert_eq!(m.held_bytes().unwrap(), 12 * MIB);
        assert!(read(&fd, 0, 4 * MIB as usize).iter().all(|&b| b == 0));
        assert!(read(&fd, 4 * MIB, MIB as usize).iter().all(|&b| b == 0xa5));
        assert_eq!((m.given_back_bytes(), m.give_backs()), (4 * MIB, 1));
    }

    #[test]
    fn the_cursor_spreads_give_backs_and_wraps() {
        let (fd, m) = memfd(8 * MIB);
        write(&fd, 0, 8 * MIB as usize);
        assert_eq!(m.give_back(MIB).unwrap(), 2 * MIB);
        assert_eq!(m.give_back(MIB).unwrap(), 2 * MIB);
        assert!(read(&fd, 2 * MIB, 4096).iter().all(|&b| b == 0), "the second took the next chunk");
        write(&fd, 0, 4096);
        assert_eq!(m.give_back(5 * MIB).unwrap(), 4 * MIB + 4096, "to the end, then from the start again");
        assert_eq!(m.held_bytes().unwrap(), 0);
        assert_eq!(m.give_back(MIB).unwrap(), 0, "nothing left to give");
        assert_eq!(m.give_backs(), 3);
    }

    #[test]
    fn holes_are_skipped_and_only_data_is_counted() {
        let (fd, m) = memfd(10 * MIB + 4096);
        write(&fd, 6 * MIB + 8192, 4096);
        write(&fd, 10 * MIB, 4096);
        assert_eq!(m.give_back(1).unwrap(), 4096);
        assert_eq!(m.give_back(1).unwrap(), 4096, "the last chunk is a short one");
        assert_eq!(m.held_bytes().unwrap(), 0);
    }
    /// An export whose size is not a whole number of pages: its last page is punched whole
    /// (a punch that stops at the size only zeroes that page and keeps it, so every step
    /// would "give back" its bytes again and free nothing).
    #[test]
    fn the_last_partial_page_goes_whole_and_once() {
        let (fd, m) = memfd(4096 + 512);
        write(&fd, 0, 4096 + 512);
        assert_eq!(m.held_bytes().unwrap(), 8192);
        assert_eq!(m.give_back(1).unwrap(), 4096 + 512);
        assert_eq!(m.held_bytes().unwrap(), 0, "the partial page is freed too");
        assert_eq!(m.give_back(1).unwrap(), 0, "nothing left to give");
        assert!(read(&fd, 0, 4096 + 512).iter().all(|&b| b == 0));
    }

    /// Reads are not ordered with a punch: one that races a give-back may return the chunk's
    /// first pages as data and the rest as zeros (or the reverse), so a slot inside one chunk
    /// can read with its header intact and zeros after it. What holds is each page: whole
    /// data or all zeros.
    #[test]
    fn a_read_racing_a_give_back_sees_each_page_as_data_or_zeros_not_the_chunk_whole() {
        const ROUNDS: usize = 100;
        let (fd, m) = memfd(2 * MIB);
        let barrier = std::sync::Barrier::new(2);
        let mut torn = 0;
        for _ in 0..ROUNDS {
            write(&fd, 0, 2 * MIB as usize);
            let got = std::thread::scope(|s| {
                s.spawn(|| {
                    barrier.wait();
                    m.give_back(1).unwrap()
                });
                barrier.wait();
                read(&fd, 0, 2 * MIB as usize)
            });
            let pages: Vec<bool> = got.chunks(4096).map(|p| p.iter().all(|&b| b == 0xa5)).collect();
            for (i, p) in got.chunks(4096).enumerate() {
                assert!(pages[i] || p.iter().all(|&b| b == 0), "page {i} is neither its data nor zeros");
            }
            torn += usize::from(pages.iter().any(|&d| d) && pages.iter().any(|&d| !d));
        }
        eprintln!("{torn} of {ROUNDS} reads racing a give-back mixed data and zeros");
    }
}
