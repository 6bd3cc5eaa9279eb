//! Exports: a named backend with its policy (read-only, description), the transmission
//! flags it advertises, and the catalog the handshake looks names up in.

use std::collections::BTreeMap;
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::wire::*;
use sluice_proto::{Catalog, ExportSummary};

use serde::Deserialize;

#[cfg(feature = "rbd")]
use crate::backend::RbdBackend;
use crate::backend::{self, Backend, Caps, FileBackend, MemorySpec, NullBackend, RbdSpec, RemoteBackend};
use crate::elastic::ElasticMemory;
use crate::limits::BLOCK_PREFERRED_BYTES;

/// Where an export's data lives, as written on the command line or in the config file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Spec {
    Path(PathBuf),
    /// RAM: `memory:SIZE`, or `memory:SIZE,elastic` that the node may take memory back from.
    Memory(MemorySpec),
    Null(u64),
    /// Another NBD server's export (`nbd://`, `nbd+unix://`), a sluice pool (`pool:FILE`)
    /// or a cached volume (`cache:FILE`), as written: the client library parses it when
    /// the export opens.
    Remote(String),
    /// A Ceph RBD image (`rbd:POOL/IMAGE[@SNAPSHOT]`).
    Rbd(RbdSpec),
}

#[derive(Debug)]
pub struct SpecError(pub String);

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for SpecError {}

impl Spec {
    /// `memory:SIZE[,elastic[,floor=SIZE]]`, `null:SIZE`, an NBD URI (`nbd://HOST[:PORT]/NAME`,
    /// `nbd+unix:///NAME?socket=PATH`), `pool:FILE`, `cache:FILE`, `rbd:POOL/IMAGE[@SNAPSHOT]`,
    /// or a path (`file:PATH` also works for odd names).
    pub fn parse(s: &str) -> Result<Spec, SpecError> {
        if let Some(rbd) = s.strip_prefix("rbd:") {
            return RbdSpec::parse(rbd).map(Spec::Rbd).map_err(SpecError);
        }
        if is_nbd_uri(s) || s.starts_with("pool:") || s.starts_with("cache:") {
            // Checked now, so a typo is a usage error before anything is opened.
            sluice_client::Uri::parse(s).map_err(|e| SpecError(e.to_string()))?;
            return Ok(Spec::Remote(s.to_owned()));
        }
        if let Some(memory) = s.strip_prefix("memory:") {
            return MemorySpec::parse(memory).map(Spec::Memory).map_err(SpecError);
        }
        if let Some(size) = s.strip_prefix("null:") {
            return Ok(Spec::Null(parse_size(size)?));
        }
        let path = s.strip_prefix("file:").unwrap_or(s);
        if path.is_empty() {
            return Err(SpecError("empty export path".into()));
        }
        Ok(Spec::Path(PathBuf::from(path)))
    }

    /// Applies an option written after the spec that belongs to it rather than to the
    /// export (a RAM export's `elastic`, `floor=SIZE`); false for any other.
    pub fn take_option(&mut self, option: &str) -> Result<bool, SpecError> {
        match self {
            Spec::Memory(m) => m.take_option(option).map_err(SpecError),
            _ => Ok(false),
        }
    }

    /// Whether the options `take_option` took make sense together, once all are taken.
    pub fn check_options(&self) -> Result<(), SpecError> {
        match self {
            Spec::Memory(m) => m.check().map_err(SpecError),
            _ => Ok(()),
        }
    }
}

/// `nbd://`, `nbd+unix://` and the other schemes of the NBD URI specification, whatever
/// their case; the client library says which it supports.
fn is_nbd_uri(s: &str) -> bool {
    s.split_once("://").is_some_and(|(scheme, _)| {
        let scheme = scheme.to_ascii_lowercase();
        scheme == "nbd" || scheme == "nbds" || scheme.starts_with("nbd+") || scheme.starts_with("nbds+")
    })
}

impl fmt::Display for Spec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Spec::Path(p) => write!(f, "{}", p.display()),
            Spec::Memory(m) => write!(f, "{m}"),
            Spec::Null(size) => write!(f, "null:{size}"),
            Spec::Remote(s) => f.write_str(s),
            Spec::Rbd(r) => write!(f, "{r}"),
        }
    }
}

/// The image's backend, and whether it was opened read-only.
#[cfg(feature = "rbd")]
fn open_rbd(spec: &RbdSpec, read_only: bool) -> std::io::Result<(Box<dyn Backend>, bool)> {
    let b = RbdBackend::open(spec, read_only)?;
    let read_only = b.read_only();
    Ok((Box::new(b), read_only))
}

#[cfg(not(feature = "rbd"))]
fn open_rbd(_spec: &RbdSpec, _read_only: bool) -> std::io::Result<(Box<dyn Backend>, bool)> {
    Err(std::io::Error::new(
        std::io::ErrorKind::Unsupported,
        "this sluice was built without RBD support, the `rbd` feature (build it with `cargo build --release --features rbd`)",
    ))
}

/// Parses sizes like `4096`, `64K`, `1G`, `1.5T`, `2GiB` (binary units).
pub fn parse_size(s: &str) -> Result<u64, SpecError> {
    sluice_proto::size::parse_size(s).map_err(SpecError)
}

/// How data moves between storage and the socket.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum DataPath {
    /// Buffered read into a buffer, then send: what every other server does.
    Copy,
    /// O_DIRECT into registered buffers: no page cache on the server.
    Direct,
    /// File -> pipe -> socket through the page cache; the CPU never touches the bytes.
    #[default]
    Splice,
    /// Splice from an O_DIRECT descriptor: storage -> pipe pages -> socket, no page cache.
    SpliceDirect,
}

impl DataPath {
    pub const NAMES: &'static str = "copy, direct, splice or splice-direct";

    pub fn uses_direct(self) -> bool {
        matches!(self, DataPath::Direct | DataPath::SpliceDirect)
    }

    pub fn uses_splice(self) -> bool {
        matches!(self, DataPath::Splice | DataPath::SpliceDirect)
    }
}

impl fmt::Display for DataPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            DataPath::Copy => "copy",
            DataPath::Direct => "direct",
            DataPath::Splice => "splice",
            DataPath::SpliceDirect => "splice-direct",
        })
    }
}

impl std::str::FromStr for DataPath {
    type Err = SpecError;
    fn from_str(s: &str) -> Result<DataPath, SpecError> {
        match s {
            "copy" => Ok(DataPath::Copy),
            "direct" => Ok(DataPath::Direct),
            "splice" => Ok(DataPath::Splice),
            "splice-direct" => Ok(DataPath::SpliceDirect),
            _ => Err(SpecError(format!("unknown data path {s:?} (expected {})", DataPath::NAMES))),
        }
    }
}

/// How reads are split into chunks that are each sent as soon as they are read.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Chunking {
    /// A read is sent only once all of it is read.
    Off,
    /// Reads larger than this many bytes are split into chunks of it, all read at once.
    Fixed(u32),
    /// The chunk size, and how many chunks of a read are read at once, follow the
    /// connection's measured storage and network rates (conn/pace.rs).
    #[default]
    Auto,
}

/// Everything about an export besides where its data lives.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Options {
    pub read_only: bool,
    pub description: Option<String>,
    pub data_path: DataPath,
    pub chunking: Chunking,
    /// A `pool:` export is assembled even with members missing (see the client's
    /// `Options::degraded`).
    pub degraded: bool,
}

pub struct Export {
    pub name: String,
    pub description: Option<String>,
    pub read_only: bool,
    /// The path actually used: a requested direct path falls back when O_DIRECT is refused.
    pub data_path: DataPath,
    pub chunking: Chunking,
    pub backend: Box<dyn Backend>,
    /// See `ExportSummary::identity`.
    pub identity: String,
    /// What the elastic watcher gives memory back through, for an elastic RAM export.
    pub elastic: Option<Arc<ElasticMemory>>,
}

impl Export {
    pub fn open(name: &str, spec: &Spec, options: Options) -> std::io::Result<Export> {
        let Options { mut read_only, description, mut data_path, mut chunking, degraded } = options;
        let mut elastic = None;
        let backend: Box<dyn Backend> = match spec {
            Spec::Path(p) => {
                let mut b = FileBackend::open(p, read_only)?;
                if data_path.uses_direct() {
                    if let Err(e) = b.open_direct(p, read_only) {
                        let fallback = if data_path == DataPath::Direct { DataPath::Copy } else { DataPath::Splice };
                        log::warn!("export {name:?}: no O_DIRECT on {} ({e}); using the {fallback} path", p.display());
                        data_path = fallback;
                    }
                }
                Box::new(b)
            }
            Spec::Memory(m) => {
                if data_path.uses_direct() {
                    // The page cache is the storage; there is nothing to bypass.
                    data_path = if data_path == DataPath::Direct { DataPath::Copy } else { DataPath::Splice };
                    log::info!("export {name:?}: RAM exports have no storage below the page cache; using the {data_path} path");
                }
                let (b, fd) = backend::memory_shared(m.size)?;
                elastic = m.elastic.then(|| Arc::new(ElasticMemory::new(name, fd, m.size, m.floor_bytes)));
                Box::new(b)
            }
            Spec::Null(size) => Box::new(NullBackend::new(*size)),
            Spec::Remote(s) => {
                let b = RemoteBackend::open(s, degraded)?;
                if b.read_only() && !read_only {
                    log::info!("export {name:?}: {s} is read-only, so this export is too");
                    read_only = true;
                }
                // Bytes arrive from a socket: a worker's own connection to a plain remote
                // splices them on (`splice`, the default, and `splice-direct`, as there is
                // nothing to bypass); otherwise they arrive in memory and are copied.
                data_path = if b.caps().splice && data_path.uses_splice() { DataPath::Splice } else { DataPath::Copy };
                Box::new(b)
            }
            Spec::Rbd(r) => {
                let (b, snapshot) = open_rbd(r, read_only)?;
                if snapshot && !read_only {
                    log::info!("export {name:?}: {r} is a snapshot, so this export is read-only");
                    read_only = true;
                }
                // Bytes arrive in memory from librbd: there is no file to splice or bypass.
                data_path = DataPath::Copy;
                if chunking == Chunking::Auto {
                    // librbd splits a read over its objects and reads them at once already;
                    // chunks of ours would only turn one OSD read into several.
                    chunking = Chunking::Off;
                }
                b
            }
        };
        let identity = identity(spec, backend.as_ref())?;
        Ok(Export { name: name.to_owned(), description, read_only, data_path, chunking, backend, identity, elastic })
    }

    pub fn caps(&self) -> Caps {
        self.backend.caps()
    }

    /// The O_DIRECT alignment when this export's data path uses O_DIRECT.
    pub fn direct_align(&self) -> Option<usize> {
        self.caps().direct_align.filter(|_| self.data_path.uses_direct())
    }

    /// Transmission flags, before the handshake adds SEND_DF.
    pub fn flags(&self) -> u16 {
        self.flags_for(self.read_only)
    }

    /// `flags` for a client served this export read-only (or not, where it may write).
    fn flags_for(&self, read_only: bool) -> u16 {
        let caps = self.backend.caps();
        // One descriptor (or none) is shared by every connection, so a flush on one is a
        // flush for all: multi-conn is always safe.
        let mut flags = FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_SEND_CACHE | FLAG_CAN_MULTI_CONN;
        if read_only || self.read_only {
            flags |= FLAG_READ_ONLY;
        } else {
            // Zeroing is always possible (emulated by writing zeros); FAST_ZERO lets a client
            // learn when it would be slow.
            flags |= FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO;
            if caps.trim {
                flags |= FLAG_SEND_TRIM;
            }
        }
        if caps.rotational {
            flags |= FLAG_ROTATIONAL;
        }
        flags
    }

    pub fn summary(&self) -> ExportSummary {
        self.summary_for(self.read_only)
    }

    /// What the handshake tells a client this export is served to read-only when
    /// `read_only` (an access rule's `read-only-for`), or as it is otherwise.
    pub fn summary_for(&self, read_only: bool) -> ExportSummary {
        let caps = self.caps();
        // Unaligned requests work on every local path (bounced or through the page cache),
        // so the minimum is 1 unless the storage itself refuses them (a remote server that
        // asks for more); the preferred size tells clients what avoids the bounce.
        let block_min = caps.block_min.unwrap_or(1);
        ExportSummary {
            size: self.backend.size(),
            flags: self.flags_for(read_only),
            description: self.description.clone(),
            block_min,
            block_preferred: BLOCK_PREFERRED_BYTES.max(caps.direct_align.unwrap_or(0) as u32).max(block_min),
            block_max: REQUEST_PAYLOAD_MAX_BYTES,
            identity: Some(self.identity.clone()),
        }
    }
}

/// What stays the same across restarts of the server exactly while the data behind the
/// export does: a file's device, inode and birth time (a file replaced under the same
/// path is another disk); a block device's number and the serial sysfs gives it (device
/// nodes get new inodes every boot); a pool's id; the text of a remote or RBD spec. A RAM or null
/// disk starts afresh every time, so it gets a new random identity: a client must not take
/// an empty RAM disk for the one it was writing to. Hashed, so that it says nothing of the
/// server's files.
fn identity(spec: &Spec, backend: &dyn Backend) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let what = match spec {
        Spec::Path(p) => {
            let m = std::fs::metadata(p)?;
            if std::os::unix::fs::FileTypeExt::is_block_device(&m.file_type()) {
                block_device_identity(m.rdev())
            } else {
                let born = m.created().ok().and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok()).map_or(0, |d| d.as_nanos());
                format!("file {} {} {born}", m.dev(), m.ino())
            }
        }
        Spec::Memory(_) | Spec::Null(_) => {
            let mut random = [0u8; 16];
            openssl::rand::rand_bytes(&mut random).map_err(std::io::Error::other)?;
            format!("fresh {random:?}")
        }
        Spec::Remote(s) => match backend.pool_status() {
            Some(status) => format!("pool {}", status.pool_id),
            None => format!("remote {s}"),
        },
        Spec::Rbd(r) => format!("rbd {r}"),
    };
    let digest = openssl::sha::sha256(what.as_bytes());
    Ok(digest[..16].iter().map(|b| format!("{b:02x}")).collect())
}

/// A block device by its number and whatever serial sysfs has for it (a device-mapper
/// UUID, a WWID, a serial; for a partition its disk's and its own number), so that disks
/// that trade names across a reboot are told apart.
fn block_device_identity(rdev: u64) -> String {
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    let sys = format!("/sys/dev/block/{major}:{minor}");
    let serials = ["dm/uuid", "wwid", "device/wwid", "serial", "device/serial", "../device/wwid", "../device/serial", "partition"];
    let found: Vec<String> = serials
        .iter()
        .filter_map(|f| std::fs::read_to_string(format!("{sys}/{f}")).ok())
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    format!("block {major}:{minor} {}", found.join(" "))
}

/// Every export the server offers, by name.
#[derive(Default)]
pub struct Exports {
    by_name: BTreeMap<String, Arc<Export>>,
}

impl Exports {
    pub fn insert(&mut self, export: Export) -> Result<(), SpecError> {
        self.insert_shared(Arc::new(export))
    }

    /// Adds an export that another table serves too (a reload keeps what did not change).
    pub fn insert_shared(&mut self, export: Arc<Export>) -> Result<(), SpecError> {
        if self.by_name.contains_key(&export.name) {
            return Err(SpecError(format!("export {:?} is defined twice", export.name)));
        }
        self.by_name.insert(export.name.clone(), export);
        Ok(())
    }

    pub fn len(&self) -> usize {
        self.by_name.len()
    }

    pub fn get(&self, name: &str) -> Option<&Arc<Export>> {
        self.by_name.get(name)
    }

    pub fn iter(&self) -> impl Iterator<Item = &Arc<Export>> {
        self.by_name.values()
    }

    pub fn is_empty(&self) -> bool {
        self.by_name.is_empty()
    }
}

impl Catalog for Exports {
    fn lookup(&self, name: &str) -> Option<ExportSummary> {
        self.get(name).map(|e| e.summary())
    }

    fn list(&self) -> Vec<(String, Option<String>)> {
        self.by_name.values().map(|e| (e.name.clone(), e.description.clone())).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse_with_binary_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size("64K").unwrap(), 64 << 10);
        assert_eq!(parse_size("1G").unwrap(), 1 << 30);
        assert_eq!(parse_size("2GiB").unwrap(), 2 << 30);
        assert_eq!(parse_size("1.5M").unwrap(), 3 << 19);
        assert_eq!(parse_size("1t").unwrap(), 1 << 40);
    }

    #[test]
    fn bad_sizes_are_refused() {
        for s in ["", "G", "x", "1X", "-1", "99999999999P", "1..2G"] {
            assert!(parse_size(s).is_err(), "{s:?} should not parse");
        }
    }

    #[test]
    fn specs_parse() {
        assert_eq!(Spec::parse("memory:1G").unwrap(), Spec::Memory(MemorySpec::plain(1 << 30)));
        let elastic = MemorySpec { elastic: true, ..MemorySpec::plain(64 << 20) };
        assert_eq!(Spec::parse("memory:64M,elastic").unwrap(), Spec::Memory(elastic));
        assert!(Spec::parse("memory:64M,elastic,sometimes").unwrap_err().to_string().contains("unknown option \"sometimes\""));
        assert!(Spec::parse("null:1M,elastic").is_err(), "only RAM exports are elastic");
        assert_eq!(Spec::parse("null:8").unwrap(), Spec::Null(8));
        assert_eq!(Spec::parse("/dev/sda").unwrap(), Spec::Path("/dev/sda".into()));
        assert_eq!(Spec::parse("file:memory:x").unwrap(), Spec::Path("memory:x".into()));
        assert!(Spec::parse("memory:lots").is_err());
        let unix = "nbd+unix:///disk?socket=/run/a.sock";
        assert_eq!(Spec::parse(unix).unwrap(), Spec::Remote(unix.into()));
        assert_eq!(Spec::parse("nbd://h:10809/x").unwrap(), Spec::Remote("nbd://h:10809/x".into()));
        assert_eq!(Spec::parse("pool:/etc/p.toml").unwrap(), Spec::Remote("pool:/etc/p.toml".into()));
        assert_eq!(Spec::parse("cache:/etc/c.toml").unwrap(), Spec::Remote("cache:/etc/c.toml".into()));
        assert!(Spec::parse("nbd+unix:///disk").is_err(), "no socket");
        assert!(Spec::parse("NBD://h:0/").is_err(), "port 0");
        assert!(Spec::parse("pool:").is_err());
        assert_eq!(Spec::parse("file:nbd://x").unwrap(), Spec::Path("nbd://x".into()));
    }

    #[test]
    fn specs_display_as_written() {
        for s in ["memory:4096", "memory:4096,elastic", "memory:8192,elastic,floor=4096", "null:1", "/dev/sda", "nbd://h:1/e", "pool:/p.toml"] {
            assert_eq!(Spec::parse(s).unwrap().to_string(), s);
        }
    }

    #[test]
    fn an_unreachable_remote_is_an_open_error() {
        let dir = std::env::temp_dir().join(format!("sluice-no-server-{}", std::process::id()));
        let spec = Spec::parse(&format!("nbd+unix:///?socket={}", dir.display())).unwrap();
        let e = Export::open("r", &spec, Options::default()).err().expect("nothing listens there");
        assert_eq!(e.kind(), std::io::ErrorKind::NotFound, "{e}");
    }

    #[test]
    fn read_only_exports_advertise_no_writes() {
        let e = Export::open("", &Spec::Null(4096), Options { read_only: true, ..Options::default() }).unwrap();
        let f = e.flags();
        assert_ne!(f & FLAG_READ_ONLY, 0);
        assert_eq!(f & (FLAG_SEND_TRIM | FLAG_SEND_WRITE_ZEROES | FLAG_SEND_FAST_ZERO), 0);
    }
}
