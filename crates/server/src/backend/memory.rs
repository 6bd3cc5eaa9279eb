//! RAM exports: a sparse memfd on tmpfs, whose holes read as zeros without using memory.
//! It is a file to the kernel, so the file backend serves it; only what tmpfs can do differs.
//! An elastic one (`memory:SIZE,elastic`) also hands a second descriptor of the same memfd to
//! the elastic watcher (`crate::elastic`), which punches holes in it when the node runs short.

use std::fmt;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;

use super::file::FileBackend;
use super::interface::Caps;

/// `memory:SIZE[,elastic[,floor=SIZE]]`: the export's size, and whether the node may take
/// memory back from it (and how much it always keeps).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemorySpec {
    pub size: u64,
    /// Under memory pressure the server gives pages back: they read as zeros afterwards.
    pub elastic: bool,
    /// Bytes an elastic export keeps however short the node is (within one give-back chunk).
    pub floor_bytes: u64,
}

impl MemorySpec {
    /// A RAM export the server never takes memory back from.
    pub fn plain(size: u64) -> MemorySpec {
        MemorySpec { size, elastic: false, floor_bytes: 0 }
    }

    /// Parses what follows `memory:`: the size, then options after commas.
    pub fn parse(s: &str) -> Result<MemorySpec, String> {
        let mut parts = s.split(',');
        let size = sluice_proto::size::parse_size(parts.next().unwrap_or_default())?;
        let mut spec = MemorySpec::plain(size);
        for option in parts {
            if !spec.take_option(option)? {
                return Err(format!("memory:{s}: unknown option {option:?} (known: elastic, floor=SIZE)"));
            }
        }
        spec.check()?;
        Ok(spec)
    }

    /// Applies `option` when it is one of a RAM export's (`elastic`, `floor=SIZE`); false
    /// when it is not, so that `--export NAME=SPEC,OPTION` can try its own options next.
    /// Options may come in any order: `check` judges them together once all are taken.
    pub fn take_option(&mut self, option: &str) -> Result<bool, String> {
        if option == "elastic" {
            if self.elastic {
                return Err("elastic is given twice".into());
            }
            self.elastic = true;
            return Ok(true);
        }
        let Some(floor) = option.strip_prefix("floor=") else { return Ok(false) };
        if self.floor_bytes > 0 {
            return Err("floor= is given twice".into());
        }
        let floor = sluice_proto::size::parse_size(floor)?;
        if floor > self.size {
            return Err(format!("floor={floor} is more than the export's {} bytes", self.size));
        }
        self.floor_bytes = floor;
        Ok(true)
    }

    /// Whether the options taken make sense together: a floor is for an elastic export.
    pub fn check(&self) -> Result<(), String> {
        if self.floor_bytes > 0 && !self.elastic {
            return Err("floor= is for elastic RAM exports only: write memory:SIZE,elastic,floor=SIZE".into());
        }
        Ok(())
    }
}

impl fmt::Display for MemorySpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "memory:{}", self.size)?;
        if self.elastic {
            f.write_str(",elastic")?;
        }
        if self.floor_bytes > 0 {
            write!(f, ",floor={}", self.floor_bytes)?;
        }
        Ok(())
    }
}

pub fn memory(size: u64) -> io::Result<FileBackend> {
    let (backend, _) = memory_shared(size)?;
    Ok(backend)
}

/// A RAM export's backend and another descriptor of its memfd, for the elastic watcher.
pub fn memory_shared(size: u64) -> io::Result<(FileBackend, OwnedFd)> {
    let fd = rustix::fs::memfd_create("sluice-memory", rustix::fs::MemfdFlags::CLOEXEC)?;
    rustix::fs::ftruncate(&fd, size)?;
    let other = fd.try_clone()?;
    // tmpfs punches holes but has no ZERO_RANGE; punching is how it zeroes. Nothing below
    // the page cache needs syncing, so FUA costs nothing.
    let caps = Caps { trim: true, zero: false, fua: true, extents: true, splice: true, ..Caps::default() };
    Ok((FileBackend::from_file("memory", File::from(fd), caps)?, other))
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_proto::reply::Extent;
    use sluice_proto::wire::{STATE_HOLE, STATE_ZERO};

    #[test]
    fn memory_backend_reports_written_regions_as_data() {
        let b = memory(1 << 20).unwrap();
        b.write_at_once(&[7u8; 4096], 65536).unwrap();
        let mut out = Vec::new();
        b.extents(0, 1 << 20, false, &mut out).unwrap();
        let total: u64 = out.iter().map(|e| e.length).sum();
        assert_eq!(total, 1 << 20);
        assert_eq!(out[0], Extent { length: 65536, flags: STATE_HOLE | STATE_ZERO });
        assert_eq!(out[1].flags, 0);
        assert!(out[1].length >= 4096);
        let mut one = Vec::new();
        b.extents(0, 1 << 20, true, &mut one).unwrap();
        assert_eq!(one.len(), 1);
    }

    #[test]
    fn memory_specs_parse_and_display_as_written() {
        assert_eq!(MemorySpec::parse("1M").unwrap(), MemorySpec::plain(1 << 20));
        let e = MemorySpec::parse("64M,elastic").unwrap();
        assert_eq!((e.size, e.elastic, e.floor_bytes), (64 << 20, true, 0));
        let f = MemorySpec::parse("64M,elastic,floor=8M").unwrap();
        assert_eq!(f.floor_bytes, 8 << 20);
        assert_eq!(MemorySpec::parse("64M,floor=8M,elastic").unwrap(), f, "options in any order");
        for s in ["memory:4096", "memory:67108864,elastic", "memory:67108864,elastic,floor=8388608"] {
            assert_eq!(MemorySpec::parse(&s["memory:".len()..]).unwrap().to_string(), s);
        }
    }

    #[test]
    fn memory_options_are_refused_with_a_reason() {
        let refused = |s: &str| MemorySpec::parse(s).unwrap_err();
        assert!(refused("1G,elastc").contains("unknown option \"elastc\""), "{}", refused("1G,elastc"));
        assert!(refused("1G,floor=1M").contains("elastic RAM exports only"));
        assert!(refused("1G,elastic,elastic").contains("twice"));
        assert!(refused("1M,elastic,floor=2M").contains("more than"));
        assert!(refused("1G,elastic,floor=lots").contains("lots"));
        assert!(refused("1G,").contains("unknown option \"\""));
        assert!(refused("1G,elastic,floor=1M,floor=2M").contains("twice"));
        let mut plain = MemorySpec::plain(1 << 20);
        assert_eq!(plain.take_option("ro"), Ok(false), "not a RAM export's option: left to the caller");
    }
}
