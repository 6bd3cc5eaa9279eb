//! Ceph RBD images (`rbd:POOL/IMAGE[@SNAPSHOT]`) through librbd's asynchronous API. Each
//! operation is parked in the worker's ring and handed to librbd; librbd's completion
//! callback posts the result to the ring's mailbox, so a worker never blocks on the
//! cluster. librbd reads into and writes from the worker's buffers directly. Block status,
//! which librbd answers only synchronously, runs on a thread of the export's own.
//!
//! What maps to what: TRIM is rbd discard, WRITE_ZEROES is rbd write_zeroes, FLUSH is rbd
//! flush, and FUA is a write followed by a flush (the emulation layer adds it, as the
//! backend claims no native FUA). Block status comes from the object map
//! (rbd_diff_iterate2, whole objects) when the image has a valid fast-diff map, and says
//! "all data" otherwise. Every connection uses the one image handle, so a flush covers all
//! of them and multi-conn is safe.

use std::io;
use std::sync::mpsc::{self, Sender};
use std::sync::Arc;

use sluice_proto::reply::Extent;
use sluice_proto::wire::{STATE_HOLE, STATE_ZERO};

use super::interface::{Backend, Caps, Outcome, StorageOp};
use super::rbd_spec::{RbdAccess, RbdSpec};
use crate::engine::{Completer, Held, Payload, Rados, RbdImage, RbdIoCtx, Ring, StorageId};
use crate::limits::{EXTENTS_PER_REPLY_MAX, RBD_CONNECT_TIMEOUT_S, RBD_OP_TIMEOUT_S};

/// RBD_FEATURE_OBJECT_MAP | RBD_FEATURE_FAST_DIFF (rbd/features.h).
const FEATURES_FAST_DIFF: u64 = (1 << 3) | (1 << 4);
/// RBD_FLAG_OBJECT_MAP_INVALID | RBD_FLAG_FAST_DIFF_INVALID (rbd/librbd.h).
const FLAGS_MAP_INVALID: u64 = (1 << 0) | (1 << 1);
/// Ceph's own default for client_mount_timeout, in seconds.
const CEPH_MOUNT_TIMEOUT_DEFAULT_S: f64 = 300.0;

pub struct RbdBackend {
    image: Arc<RbdImage>,
    size: u64,
    caps: Caps,
    read_only: bool,
    /// Block status queries, for the thread that runs them; None without a usable map.
    extents: Option<Sender<Query>>,
}

/// One block status request for the extents thread.
struct Query {
    offset: u64,
    len: u64,
    one: bool,
    done: Completer,
}

impl RbdBackend {
    /// Connects to the cluster and opens the image; a snapshot, or `read_only`, opens it
    /// read-only. Errors say which step failed and what to check.
    pub fn open(spec: &RbdSpec, read_only: bool) -> io::Result<RbdBackend> {
        let rados = connect(&spec.access)?;
        let read_only = read_only || spec.snapshot.is_some();
        let image = open_image(&rados, spec, read_only)?;
        let size = image.size()?;
        let map_usable = image.features()? & FEATURES_FAST_DIFF == FEATURES_FAST_DIFF;
        let image = Arc::new(image);
        let extents = if map_usable { Some(spawn_extents(Arc::clone(&image))?) } else { None };
        let caps = Caps {
            // Trimmed ranges read back as zeros where they cover whole discard granules
            // (rbd_discard_granularity_bytes); NBD promises nothing about trimmed data.
            trim: !read_only,
            zero: true,
            fua: false,
            extents: map_usable,
            ..Caps::default()
        };
        log::debug!("{spec}: {size} bytes, object map {}", if map_usable { "in use" } else { "absent" });
        Ok(RbdBackend { image, size, caps, read_only, extents })
    }

    pub fn read_only(&self) -> bool {
        self.read_only
    }
}

/// A connected cluster handle for `access`, with sluice's time limits where the Ceph
/// configuration sets none.
fn connect(access: &RbdAccess) -> io::Result<Arc<Rados>> {
    let mut rados = Rados::create(access.id.as_deref())?;
    let client = format!("client.{}", access.id.as_deref().unwrap_or("admin"));
    rados.read_config(access.conf.as_deref()).map_err(|e| match &access.conf {
        Some(path) => with_context(e, format!("cannot read the Ceph configuration {}", path.display())),
        None if e.kind() == io::ErrorKind::NotFound => io::Error::new(
            e.kind(),
            "no Ceph configuration found ($CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf); name one with --rbd-conf",
        ),
        None => with_context(e, "cannot read the Ceph configuration".into()),
    })?;
    if let Some(keyring) = &access.keyring {
        rados.set("keyring", &keyring.to_string_lossy())?;
    }
    let mount = rados.get("client_mount_timeout")?.parse::<f64>().unwrap_or(CEPH_MOUNT_TIMEOUT_DEFAULT_S);
    if mount == CEPH_MOUNT_TIMEOUT_DEFAULT_S {
        rados.set("client_mount_timeout", &RBD_CONNECT_TIMEOUT_S.to_string())?;
    }
    for option in ["rados_osd_op_timeout", "rados_mon_op_timeout"] {
        if rados.get(option)?.parse::<f64>().unwrap_or(0.0) == 0.0 {
            rados.set(option, &RBD_OP_TIMEOUT_S.to_string())?;
        }
    }
    let waited = rados.get("client_mount_timeout")?;
    rados.connect().map_err(|e| {
        let why = match e.raw_os_error() {
            Some(libc::ETIMEDOUT) => format!("the Ceph monitors did not answer {client} within {waited} s"),
            Some(libc::EACCES | libc::EPERM) => format!("the Ceph cluster refused {client} (check its keyring and caps)"),
            Some(libc::ENOENT) => format!("no keyring for {client} (name one with --rbd-keyring or in the configuration)"),
            _ => format!("cannot connect to the Ceph cluster as {client}"),
        };
        with_context(e, why)
    })
}

fn open_image(rados: &Arc<Rados>, spec: &RbdSpec, read_only: bool) -> io::Result<RbdImage> {
    let pool = || RbdIoCtx::new(rados, &spec.pool, spec.namespace.as_deref());
    let ioctx = pool().map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => io::Error::new(e.kind(), format!("pool {:?} does not exist", spec.pool)),
        _ => with_context(e, format!("cannot open pool {:?}", spec.pool)),
    })?;
    let place = match &spec.namespace {
        Some(ns) => format!("pool {:?}, namespace {ns:?}", spec.pool),
        None => format!("pool {:?}", spec.pool),
    };
    RbdImage::open(ioctx, &spec.image, spec.snapshot.as_deref(), read_only).map_err(|e| match e.raw_os_error() {
        Some(libc::ENOENT) => {
            // Tell a missing snapshot from a missing image.
            let image_exists = spec.snapshot.is_some() && pool().and_then(|c| RbdImage::open(c, &spec.image, None, true)).is_ok();
            let what = match (&spec.snapshot, image_exists) {
                (Some(snap), true) => format!("image {:?} has no snapshot {snap:?}", spec.image),
                _ => format!("no image {:?} in {place}", spec.image),
            };
            io::Error::new(e.kind(), what)
        }
        Some(libc::EACCES | libc::EPERM) => with_context(e, format!("not allowed to open image {:?} in {place}", spec.image)),
        _ => with_context(e, format!("cannot open image {:?} in {place}", spec.image)),
    })
}

fn with_context(e: io::Error, what: String) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// The thread that answers block status queries, for as long as the backend lives.
fn spawn_extents(image: Arc<RbdImage>) -> io::Result<Sender<Query>> {
    let (send, queries) = mpsc::channel::<Query>();
    std::thread::Builder::new().name("sluice-rbd-map".into()).spawn(move || {
        for q in queries {
            let (result, out) = match allocation(&image, q.offset, q.len, q.one) {
                Ok(out) => (0, out),
                Err(e) => (-e.raw_os_error().unwrap_or(libc::EIO), Vec::new()),
            };
            q.done.complete(result, Payload::Extents(out));
        }
    })?;
    Ok(send)
}

/// Descriptors covering a prefix of the range: data where objects exist, holes that read
/// as zeros where they do not. A map librbd has marked invalid is not trusted: all data.
fn allocation(image: &RbdImage, offset: u64, len: u64, one: bool) -> io::Result<Vec<Extent>> {
    let mut map = Descriptors::new(offset, len, if one { 1 } else { EXTENTS_PER_REPLY_MAX });
    if image.flags()? & FLAGS_MAP_INVALID != 0 {
        map.add(offset, len, true);
    } else {
        image.allocated(offset, len, &mut |at, n, exists| map.add(at, n, exists))?;
    }
    Ok(map.finish())
}

/// base:allocation descriptors built from the pieces librbd reports, in order: whole
/// objects, which may begin before the range and end after it. What no piece covers is a
/// hole. Neighbours of one kind merge; at most `max` descriptors.
struct Descriptors {
    /// Where the next descriptor starts.
    at: u64,
    end: u64,
    max: usize,
    out: Vec<Extent>,
    /// A descriptor did not fit: the list covers a prefix and stays as it is.
    full: bool,
}

impl Descriptors {
    fn new(offset: u64, len: u64, max: usize) -> Descriptors {
        Descriptors { at: offset, end: offset + len, max, out: Vec::new(), full: false }
    }

    /// Takes a piece; false once no more descriptors fit.
    fn add(&mut self, offset: u64, len: u64, exists: bool) -> bool {
        let start = offset.clamp(self.at, self.end);
        let stop = offset.saturating_add(len).clamp(self.at, self.end);
        self.extend(start, HOLE);
        self.extend(stop, if exists { 0 } else { HOLE });
        !self.full
    }

    fn finish(mut self) -> Vec<Extent> {
        self.extend(self.end, HOLE);
        self.out
    }

    /// Covers up to `upto` with `flags`, merging with the last descriptor when alike.
    fn extend(&mut self, upto: u64, flags: u32) {
        if upto <= self.at || self.full {
            return;
        }
        let length = upto - self.at;
        let fits = self.out.len() < self.max;
        match self.out.last_mut() {
            Some(last) if last.flags == flags => last.length += length,
            _ if fits => self.out.push(Extent { length, flags }),
            _ => {
                self.full = true;
                return;
            }
        }
        self.at = upto;
    }
}

/// What an unallocated range reads as.
const HOLE: u32 = STATE_HOLE | STATE_ZERO;

impl Backend for RbdBackend {
    fn kind(&self) -> &'static str {
        "rbd"
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn close(&self) {
        self.image.close();
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn start(&self, op: StorageOp, id: StorageId, ring: &mut Ring) -> Option<Outcome> {
        match op {
            StorageOp::Read { offset, len, into: Held::Buf(buf), at, .. } => self.image.read(ring, id, offset, buf, at, len),
            // No splice capability: reads never ask for a pipe.
            StorageOp::Read { into, .. } => return Some(Outcome { result: -libc::EINVAL, held: into }),
            StorageOp::Write { offset, buf, at, len, .. } => self.image.write(ring, id, offset, buf, at, len),
            StorageOp::Flush => self.image.flush(ring.defer(id, Held::Nothing, 0)),
            StorageOp::Trim { offset, len } => self.image.discard(offset, len, ring.defer(id, Held::Nothing, 0)),
            StorageOp::Zero { offset, len, .. } => self.image.write_zeroes(offset, len, ring.defer(id, Held::Nothing, 0)),
            // librbd has no read-ahead hint to give.
            StorageOp::Cache { .. } => return Some(Outcome { result: 0, held: Held::Nothing }),
            StorageOp::Extents { offset, len, one, mut out } => match &self.extents {
                Some(queries) => {
                    // Parked with an empty list, which comes back even if the query is lost.
                    let done = ring.defer(id, Held::Extents(Vec::new()), 0);
                    let _ = queries.send(Query { offset, len, one, done });
                }
                None => {
                    out.push(Extent { length: len, flags: 0 });
                    return Some(Outcome { result: 0, held: Held::Extents(out) });
                }
            },
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map(offset: u64, len: u64, max: usize, pieces: &[(u64, u64, bool)]) -> Vec<(u64, u32)> {
        let mut d = Descriptors::new(offset, len, max);
        for &(at, n, exists) in pieces {
            if !d.add(at, n, exists) {
                break;
            }
        }
        d.finish().iter().map(|e| (e.length, e.flags)).collect()
    }

    #[test]
    fn objects_become_data_and_the_gaps_holes() {
        const M: u64 = 1 << 20;
        // Objects of 4 MiB at 8M and 12M (adjacent: one descriptor) in a 32 MiB range.
        let got = map(0, 32 << 20, 16, &[(8 * M, 4 * M, true), (12 * M, 4 * M, true)]);
        assert_eq!(got, vec![(8 << 20, HOLE), (8 << 20, 0), (16 << 20, HOLE)]);
        // Nothing reported: all hole.
        assert_eq!(map(4096, 8192, 16, &[]), vec![(8192, HOLE)]);
        // A piece reported as gone (exists = false) is a hole too, and merges with holes.
        assert_eq!(map(0, 8 << 20, 16, &[(0, 4 * M, false), (4 * M, 4 * M, true)]), vec![(4 << 20, HOLE), (4 << 20, 0)]);
    }

    #[test]
    fn whole_objects_are_clipped_to_the_range() {
        const M: u64 = 1 << 20;
        // The range 5M..7M lies inside the object 4M..8M.
        assert_eq!(map(5 * M, 2 << 20, 16, &[(4 * M, 4 * M, true)]), vec![(2 << 20, 0)]);
        // 2M..10M: the object 0..4M covers the start, 8M..12M the end.
        assert_eq!(map(2 * M, 8 << 20, 16, &[(0, 4 * M, true), (8 * M, 4 * M, true)]), vec![(2 << 20, 0), (4 << 20, HOLE), (2 << 20, 0)]);
    }

    #[test]
    fn at_most_max_descriptors_covering_a_prefix() {
        const M: u64 = 1 << 20;
        let pieces = [(0, 4 * M, true), (8 * M, 4 * M, true), (16 * M, 4 * M, true)];
        assert_eq!(map(0, 24 << 20, 1, &pieces), vec![(4 << 20, 0)]);
        // Adjacent objects still merge into the one descriptor allowed.
        assert_eq!(map(0, 24 << 20, 1, &[(0, 4 * M, true), (4 * M, 4 * M, true)]), vec![(8 << 20, 0)]);
        assert_eq!(map(0, 24 << 20, 2, &pieces), vec![(4 << 20, 0), (4 << 20, HOLE)]);
        let all = map(0, 24 << 20, 16, &pieces);
        assert_eq!(all.iter().map(|d| d.0).sum::<u64>(), 24 * M);
        assert_eq!(all.len(), 6);
    }
}
