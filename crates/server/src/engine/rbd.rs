//! librbd and librados, Ceph's C libraries for block images, bound by hand for the functions
//! sluice uses (declarations from Debian's librbd-dev, `rbd/librbd.h` and
//! `rados/librados.h`). They are loaded when the first `rbd:` export opens, not linked: a
//! sluice binary then runs on machines without Ceph, and an idle server that serves no RBD
//! image does not carry Ceph's libraries in its memory.
//!
//! Reads and writes go straight between librbd and the worker's buffer, which is parked in
//! the ring's mailbox as lent (`Ring::defer_lent`): Ceph may finish an operation long after
//! the worker that asked for it has stopped (a cluster that went away), and a lent buffer
//! is then leaked rather than freed. The completion callback, on one of librbd's threads,
//! posts the result through the mailbox.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::io;
use std::path::Path;
use std::ptr;
use std::sync::{Arc, Mutex, OnceLock, PoisonError, RwLock, RwLockReadGuard};
use std::time::Duration;

use libloading::Library;

use super::buffer::Buf;
use super::mailbox::{Completer, Payload};
use super::op::{Held, StorageId};
use super::ring::Ring;
use crate::limits::RBD_CLOSE_TIMEOUT_MS;

type Handle = *mut c_void;
type Callback = unsafe extern "C" fn(Handle, *mut c_void);
type DiffCallback = unsafe extern "C" fn(u64, usize, c_int, *mut c_void) -> c_int;

/// The shared objects, by the names Debian's librados2 and librbd1 install.
const RADOS_LIBRARY: &str = "librados.so.2";
const RBD_LIBRARY: &str = "librbd.so.1";

/// The entry points, resolved once; the libraries stay loaded for the life of the process.
struct Api {
    rados_create: unsafe extern "C" fn(*mut Handle, *const c_char) -> c_int,
    rados_conf_read_file: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    rados_conf_parse_env: unsafe extern "C" fn(Handle, *const c_char) -> c_int,
    rados_conf_set: unsafe extern "C" fn(Handle, *const c_char, *const c_char) -> c_int,
    rados_conf_get: unsafe extern "C" fn(Handle, *const c_char, *mut c_char, usize) -> c_int,
    rados_connect: unsafe extern "C" fn(Handle) -> c_int,
    rados_shutdown: unsafe extern "C" fn(Handle),
    rados_ioctx_create: unsafe extern "C" fn(Handle, *const c_char, *mut Handle) -> c_int,
    rados_ioctx_destroy: unsafe extern "C" fn(Handle),
    rados_ioctx_set_namespace: unsafe extern "C" fn(Handle, *const c_char),
    rbd_open: unsafe extern "C" fn(Handle, *const c_char, *mut Handle, *const c_char) -> c_int,
    rbd_open_read_only: unsafe extern "C" fn(Handle, *const c_char, *mut Handle, *const c_char) -> c_int,
    rbd_close: unsafe extern "C" fn(Handle) -> c_int,
    rbd_get_size: unsafe extern "C" fn(Handle, *mut u64) -> c_int,
    rbd_get_features: unsafe extern "C" fn(Handle, *mut u64) -> c_int,
    rbd_get_flags: unsafe extern "C" fn(Handle, *mut u64) -> c_int,
    rbd_aio_create_completion: unsafe extern "C" fn(*mut c_void, Callback, *mut Handle) -> c_int,
    rbd_aio_get_return_value: unsafe extern "C" fn(Handle) -> isize,
    rbd_aio_release: unsafe extern "C" fn(Handle),
    rbd_aio_read: unsafe extern "C" fn(Handle, u64, usize, *mut c_char, Handle) -> c_int,
    rbd_aio_write: unsafe extern "C" fn(Handle, u64, usize, *const c_char, Handle) -> c_int,
    rbd_aio_discard: unsafe extern "C" fn(Handle, u64, u64, Handle) -> c_int,
    rbd_aio_write_zeroes: unsafe extern "C" fn(Handle, u64, usize, Handle, c_int, c_int) -> c_int,
    rbd_aio_flush: unsafe extern "C" fn(Handle, Handle) -> c_int,
    rbd_diff_iterate2: unsafe extern "C" fn(Handle, *const c_char, u64, u64, u8, u8, DiffCallback, *mut c_void) -> c_int,
}

static API: OnceLock<Result<Api, String>> = OnceLock::new();

/// Loads the libraries on first use; the error says what to install.
fn api() -> io::Result<&'static Api> {
    API.get_or_init(load).as_ref().map_err(|e| io::Error::new(io::ErrorKind::NotFound, e.clone()))
}

fn load() -> Result<Api, String> {
    let open = |name: &str| {
        // SAFETY: loading runs the libraries' initialisers, which only set up Ceph's own
        // globals; neither library has load-time requirements on its host process.
        unsafe { Library::new(name) }.map_err(|e| format!("cannot load {name} (on Debian: apt install librbd1): {e}"))
    };
    let rados = open(RADOS_LIBRARY)?;
    let rbd = open(RBD_LIBRARY)?;
    macro_rules! resolve {
        ($lib:ident . $name:ident) => {{
            let name = concat!(stringify!($name), "\0");
            // SAFETY: the type given for each symbol is its C declaration in librbd-dev's
            // headers (Ceph 16), translated field by field; the pointer copied out stays
            // valid because the library is never unloaded (it is leaked below).
            match unsafe { $lib.get(name.as_bytes()) } {
                Ok(symbol) => *symbol,
                Err(e) => return Err(format!("{} lacks {}: {e}", stringify!($lib), stringify!($name))),
            }
        }};
    }
    let api = Api {
        rados_create: resolve!(rados.rados_create),
        rados_conf_read_file: resolve!(rados.rados_conf_read_file),
        rados_conf_parse_env: resolve!(rados.rados_conf_parse_env),
        rados_conf_set: resolve!(rados.rados_conf_set),
        rados_conf_get: resolve!(rados.rados_conf_get),
        rados_connect: resolve!(rados.rados_connect),
        rados_shutdown: resolve!(rados.rados_shutdown),
        rados_ioctx_create: resolve!(rados.rados_ioctx_create),
        rados_ioctx_destroy: resolve!(rados.rados_ioctx_destroy),
        rados_ioctx_set_namespace: resolve!(rados.rados_ioctx_set_namespace),
        rbd_open: resolve!(rbd.rbd_open),
        rbd_open_read_only: resolve!(rbd.rbd_open_read_only),
        rbd_close: resolve!(rbd.rbd_close),
        rbd_get_size: resolve!(rbd.rbd_get_size),
        rbd_get_features: resolve!(rbd.rbd_get_features),
        rbd_get_flags: resolve!(rbd.rbd_get_flags),
        rbd_aio_create_completion: resolve!(rbd.rbd_aio_create_completion),
        rbd_aio_get_return_value: resolve!(rbd.rbd_aio_get_return_value),
        rbd_aio_release: resolve!(rbd.rbd_aio_release),
        rbd_aio_read: resolve!(rbd.rbd_aio_read),
        rbd_aio_write: resolve!(rbd.rbd_aio_write),
        rbd_aio_discard: resolve!(rbd.rbd_aio_discard),
        rbd_aio_write_zeroes: resolve!(rbd.rbd_aio_write_zeroes),
        rbd_aio_flush: resolve!(rbd.rbd_aio_flush),
        rbd_diff_iterate2: resolve!(rbd.rbd_diff_iterate2),
    };
    // Completions may arrive until the process ends, so the code they run stays mapped.
    std::mem::forget(rbd);
    std::mem::forget(rados);
    Ok(api)
}

/// A negative return from librados or librbd as an io::Error.
fn check(r: c_int) -> io::Result<c_int> {
    if r < 0 {
        Err(io::Error::from_raw_os_error(-r))
    } else {
        Ok(r)
    }
}

fn closed() -> io::Error {
    io::Error::from_raw_os_error(libc::ESHUTDOWN)
}

fn c_string(s: &str) -> io::Result<CString> {
    CString::new(s).map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, format!("{s:?} contains a NUL byte")))
}

/// A connection to a Ceph cluster (`rados_t`), configured before it connects.
pub struct Rados {
    api: &'static Api,
    handle: Handle,
    connected: bool,
}

// SAFETY: a rados_t may be used from any thread; librados serialises its own state. Rados
// is only configured through &mut self (before connecting) and then only shared.
unsafe impl Send for Rados {}
unsafe impl Sync for Rados {}

impl Rados {
    /// A cluster handle for `client.ID` (`client.admin` when `id` is None).
    pub fn create(id: Option<&str>) -> io::Result<Rados> {
        let api = api()?;
        let id = id.map(c_string).transpose()?;
        let mut handle = ptr::null_mut();
        // SAFETY: `handle` is a valid out-pointer; `id` is NUL-terminated or null, and
        // librados copies it.
        check(unsafe { (api.rados_create)(&mut handle, id.as_ref().map_or(ptr::null(), |s| s.as_ptr())) })?;
        Ok(Rados { api, handle, connected: false })
    }

    /// Reads a ceph.conf; None searches where Ceph's tools look ($CEPH_CONF,
    /// /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf). Then applies $CEPH_ARGS.
    pub fn read_config(&mut self, path: Option<&Path>) -> io::Result<()> {
        let path = path.map(|p| c_string(&p.to_string_lossy())).transpose()?;
        // SAFETY: the handle is live and not yet connected; the path is NUL-terminated or
        // null (search the default places).
        check(unsafe { (self.api.rados_conf_read_file)(self.handle, path.as_ref().map_or(ptr::null(), |s| s.as_ptr())) })?;
        // SAFETY: as above; null names the default variable, CEPH_ARGS.
        check(unsafe { (self.api.rados_conf_parse_env)(self.handle, ptr::null()) })?;
        Ok(())
    }

    pub fn set(&mut self, option: &str, value: &str) -> io::Result<()> {
        let (option, value) = (c_string(option)?, c_string(value)?);
        // SAFETY: both strings are NUL-terminated and copied by librados.
        check(unsafe { (self.api.rados_conf_set)(self.handle, option.as_ptr(), value.as_ptr()) }).map(drop)
    }

    pub fn get(&self, option: &str) -> io::Result<String> {
        let option = c_string(option)?;
        let mut buf = [0u8; 256];
        // SAFETY: librados writes at most `len` bytes, NUL included, into `buf`.
        check(unsafe { (self.api.rados_conf_get)(self.handle, option.as_ptr(), buf.as_mut_ptr().cast(), buf.len()) })?;
        let text = CStr::from_bytes_until_nul(&buf).map_err(|_| io::Error::other("unterminated configuration value"))?;
        Ok(text.to_string_lossy().into_owned())
    }

    /// Connects to the monitors; blocks for at most the configured client_mount_timeout.
    pub fn connect(mut self) -> io::Result<Arc<Rados>> {
        // SAFETY: the handle is live and configured.
        check(unsafe { (self.api.rados_connect)(self.handle) })?;
        self.connected = true;
        Ok(Arc::new(self))
    }
}

impl Drop for Rados {
    fn drop(&mut self) {
        // SAFETY: nothing else uses the handle (every IoCtx holds an Arc on it). Shutting
        // down a handle that never connected only frees it.
        unsafe { (self.api.rados_shutdown)(self.handle) }
    }
}

/// An I/O context: one pool (and namespace) of a connected cluster.
pub struct IoCtx {
    rados: Arc<Rados>,
    handle: Handle,
}

impl IoCtx {
    /// The context for `pool` (and `namespace`) of a connected cluster.
    pub fn new(rados: &Arc<Rados>, pool: &str, namespace: Option<&str>) -> io::Result<IoCtx> {
        let api = rados.api;
        let pool = c_string(pool)?;
        let mut handle = ptr::null_mut();
        // SAFETY: the cluster is connected; `pool` is NUL-terminated; `handle` is an
        // out-pointer.
        check(unsafe { (api.rados_ioctx_create)(rados.handle, pool.as_ptr(), &mut handle) })?;
        let ioctx = IoCtx { rados: Arc::clone(rados), handle };
        if let Some(ns) = namespace {
            let ns = c_string(ns)?;
            // SAFETY: the context is live; librados copies the name.
            unsafe { (api.rados_ioctx_set_namespace)(ioctx.handle, ns.as_ptr()) };
        }
        Ok(ioctx)
    }
}

impl Drop for IoCtx {
    fn drop(&mut self) {
        // SAFETY: the images opened on this context are closed before it (Image holds it).
        unsafe { (self.rados.api.rados_ioctx_destroy)(self.handle) }
    }
}

/// An open RBD image (`rbd_image_t`).
pub struct Image {
    handle: Handle,
    /// Some until the image is closed, when it goes to the closing thread.
    ioctx: Mutex<Option<IoCtx>>,
    /// Whether the handle is open. Every call on it holds the read lock; the close holds
    /// the write lock, so no call runs during or after rbd_close.
    open: Arc<RwLock<bool>>,
}

// SAFETY: librbd image handles are thread-safe: qemu and rbd-nbd submit asynchronous I/O on
// one handle from several threads, which is what the workers do here.
unsafe impl Send for Image {}
unsafe impl Sync for Image {}

/// What a finished operation reports besides librbd's return value.
enum Carry {
    /// A read into a lent buffer: librbd returns the bytes read.
    Read,
    /// A write of this many bytes from a lent buffer: librbd reports success as 0.
    Write(usize),
    /// A flush, discard or zeroing.
    Nothing,
}

/// An operation in flight: leaked into librbd as the callback argument, taken back once.
struct Pending {
    done: Completer,
    carry: Carry,
}

/// librbd's completion callback: runs once per operation on one of librbd's threads.
unsafe extern "C" fn completed(completion: Handle, arg: *mut c_void) {
    // SAFETY: `arg` is the Box<Pending> that `Image::submit` leaked for this completion,
    // and librbd calls the callback exactly once.
    let pending = unsafe { Box::from_raw(arg.cast::<Pending>()) };
    let Some(Ok(api)) = API.get() else { return };
    // SAFETY: the completion is live until released, here, after its value is read.
    let r = unsafe { (api.rbd_aio_get_return_value)(completion) };
    // SAFETY: as above; nothing uses the completion afterwards.
    unsafe { (api.rbd_aio_release)(completion) };
    let Pending { done, carry } = *pending;
    let result = r.clamp(i32::MIN as isize, i32::MAX as isize) as i32;
    let result = match carry {
        Carry::Write(len) if result >= 0 => len as i32,
        _ => result,
    };
    done.complete(result, Payload::Nothing);
}

/// One asynchronous call, given the image and the completion.
type Start<'a> = &'a dyn Fn(&Api, Handle, Handle) -> c_int;

impl Image {
    /// Opens `image` (at `snapshot`, if any) in the pool of `ioctx`.
    pub fn open(ioctx: IoCtx, image: &str, snapshot: Option<&str>, read_only: bool) -> io::Result<Image> {
        let api = ioctx.rados.api;
        let (name, snap) = (c_string(image)?, snapshot.map(c_string).transpose()?);
        let open = if read_only { api.rbd_open_read_only } else { api.rbd_open };
        let mut image = ptr::null_mut();
        // SAFETY: the context is live; the strings are NUL-terminated or null; `image` is
        // an out-pointer.
        check(unsafe { open(ioctx.handle, name.as_ptr(), &mut image, snap.as_ref().map_or(ptr::null(), |s| s.as_ptr())) })?;
        Ok(Image { handle: image, ioctx: Mutex::new(Some(ioctx)), open: Arc::new(RwLock::new(true)) })
    }

    fn api(&self) -> &'static Api {
        // The loaded libraries are one per process, so any handle's table is the table.
        match API.get() {
            Some(Ok(api)) => api,
            _ => unreachable!("an image is open, so librbd was loaded"),
        }
    }

    /// The read lock on the handle, if it is still open.
    fn opened(&self) -> Option<RwLockReadGuard<'_, bool>> {
        Some(self.open.read().unwrap_or_else(PoisonError::into_inner)).filter(|open| **open)
    }

    fn get(&self, f: unsafe extern "C" fn(Handle, *mut u64) -> c_int) -> io::Result<u64> {
        let _open = self.opened().ok_or_else(closed)?;
        let mut value = 0;
        // SAFETY: the image is open (and stays so while `_open` is held); `value` is an
        // out-pointer.
        check(unsafe { f(self.handle, &mut value) })?;
        Ok(value)
    }

    pub fn size(&self) -> io::Result<u64> {
        self.get(self.api().rbd_get_size)
    }

    /// The RBD_FEATURE_* bits of the image.
    pub fn features(&self) -> io::Result<u64> {
        self.get(self.api().rbd_get_features)
    }

    /// The RBD_FLAG_* bits: whether the object map or fast-diff is known to be invalid.
    pub fn flags(&self) -> io::Result<u64> {
        self.get(self.api().rbd_get_flags)
    }

    /// Starts an asynchronous call whose completion is posted to `done`; if it cannot
    /// start, `done` gets the error at once.
    fn submit(&self, done: Completer, carry: Carry, start: Start<'_>) {
        let Some(_open) = self.opened() else {
            return done.complete(-libc::ESHUTDOWN, Payload::Nothing);
        };
        let api = self.api();
        let arg = Box::into_raw(Box::new(Pending { done, carry }));
        let mut completion = ptr::null_mut();
        // SAFETY: `arg` stays valid until the callback takes it back (or below, if the
        // completion is never created); `completion` is an out-pointer.
        let r = unsafe { (api.rbd_aio_create_completion)(arg.cast(), completed, &mut completion) };
        let r = if r < 0 { r } else { start(api, self.handle, completion) };
        if r < 0 {
            if !completion.is_null() {
                // SAFETY: the call did not start, so the callback will never run.
                unsafe { (api.rbd_aio_release)(completion) };
            }
            // SAFETY: nothing else holds `arg` now.
            let pending = unsafe { Box::from_raw(arg) };
            pending.done.complete(r, Payload::Nothing);
        }
    }

    /// Reads `len` bytes at `offset` straight into `buf[at..at + len]`; the operation is
    /// parked in `ring` under `id` and comes out of its `wait`.
    pub fn read(&self, ring: &mut Ring, id: StorageId, offset: u64, buf: Buf, at: usize, len: usize) {
        assert!(at + len <= buf.len(), "a read lands inside its buffer");
        // SAFETY: at + len <= len of the buffer, so the pointer and the `len` bytes after
        // it lie inside it.
        let into = unsafe { buf.ptr().add(at) };
        // The buffer is lent: it stays parked (or, if the ring goes first, leaked) until
        // librbd posts the completion, after it has written the data.
        let done = ring.defer_lent(id, Held::Buf(buf), at);
        self.submit(done, Carry::Read, &|api, image, c| {
            // SAFETY: `into` points at `len` writable bytes that outlive the operation
            // (lent above); the image is open.
            unsafe { (api.rbd_aio_read)(image, offset, len, into.cast(), c) }
        });
    }

    /// Writes `buf[at..at + len]` at `offset`, parked in `ring` as for `read`.
    pub fn write(&self, ring: &mut Ring, id: StorageId, offset: u64, buf: Buf, at: usize, len: usize) {
        assert!(at + len <= buf.len(), "a write comes from inside its buffer");
        // SAFETY: as for read.
        let from = unsafe { buf.ptr().add(at) };
        // librbd copies the bytes before it returns, or keeps them until just before it
        // completes (zero-copy writes); the lent buffer outlives either.
        let done = ring.defer_lent(id, Held::Buf(buf), 0);
        self.submit(done, Carry::Write(len), &|api, image, c| {
            // SAFETY: `from` points at `len` bytes that outlive the operation (lent above).
            unsafe { (api.rbd_aio_write)(image, offset, len, from.cast_const().cast(), c) }
        });
    }

    pub fn discard(&self, offset: u64, len: u64, done: Completer) {
        self.submit(done, Carry::Nothing, &|api, image, c| {
            // SAFETY: no memory is passed besides the open image and the completion.
            unsafe { (api.rbd_aio_discard)(image, offset, len, c) }
        });
    }

    pub fn write_zeroes(&self, offset: u64, len: u64, done: Completer) {
        let Ok(len) = usize::try_from(len) else {
            return done.complete(-libc::EINVAL, Payload::Nothing);
        };
        self.submit(done, Carry::Nothing, &|api, image, c| {
            // SAFETY: as for discard; no flags.
            unsafe { (api.rbd_aio_write_zeroes)(image, offset, len, c, 0, 0) }
        });
    }

    pub fn flush(&self, done: Completer) {
        self.submit(done, Carry::Nothing, &|api, image, c| {
            // SAFETY: as for discard.
            unsafe { (api.rbd_aio_flush)(image, c) }
        });
    }

    /// Calls `found(offset, length, exists)` for each allocated piece of the range, in
    /// order, whole objects at a time (fast with the fast-diff feature); `found` returns
    /// false to stop. Blocks: call it off the worker threads.
    pub fn allocated(&self, offset: u64, len: u64, found: &mut dyn FnMut(u64, u64, bool) -> bool) -> io::Result<()> {
        unsafe extern "C" fn each(offset: u64, len: usize, exists: c_int, arg: *mut c_void) -> c_int {
            // SAFETY: `arg` is the `&mut &mut dyn FnMut` below, alive for the whole call.
            let found = unsafe { &mut *arg.cast::<&mut dyn FnMut(u64, u64, bool) -> bool>() };
            if found(offset, len as u64, exists != 0) {
                0
            } else {
                -libc::ECANCELED
            }
        }
        let _open = self.opened().ok_or_else(closed)?;
        let mut found = found;
        let arg: *mut &mut dyn FnMut(u64, u64, bool) -> bool = &mut found;
        // SAFETY: the image is open (and stays so while `_open` is held); from-snapshot
        // null means "since the image was created"; `arg` outlives the synchronous call.
        let r = unsafe { (self.api().rbd_diff_iterate2)(self.handle, ptr::null(), offset, len, 1, 1, each, arg.cast()) };
        match r {
            r if r == -libc::ECANCELED => Ok(()),
            r => check(r).map(drop),
        }
    }
}

/// An image handle on its way to the closing thread.
struct Closing {
    image: Handle,
    /// Destroyed after the image is closed, and the cluster handle with the last one.
    _ioctx: IoCtx,
    open: Arc<RwLock<bool>>,
}

// SAFETY: the handle moves to another thread with sole ownership; librbd handles may be
// used from any thread.
unsafe impl Send for Closing {}

impl Image {
    /// Closes the image, its pool context and, with the last image, the cluster handle, so
    /// that Ceph sees this client go (its watch and any exclusive lock released at once,
    /// not after a timeout). Waits at most RBD_CLOSE_TIMEOUT_MS: rbd_close waits for
    /// operations in flight, which never end while the cluster is unreachable; past the
    /// limit the close goes on alone and the process may end before it does. Once; the
    /// caller submits nothing afterwards (operations submitted anyway fail with ESHUTDOWN).
    pub fn close(&self) {
        // Taking the context is what makes this happen once.
        let Some(ioctx) = self.ioctx.lock().unwrap_or_else(PoisonError::into_inner).take() else { return };
        let api = self.api();
        let closing = Closing { image: self.handle, _ioctx: ioctx, open: Arc::clone(&self.open) };
        let (tell, told) = std::sync::mpsc::channel();
        let closer = std::thread::Builder::new().name("sluice-rbd-close".into()).spawn(move || {
            let closing = closing;
            // Waits for a call in progress (a block status query) to end, then none begins.
            let mut open = closing.open.write().unwrap_or_else(PoisonError::into_inner);
            *open = false;
            // SAFETY: the write lock is held and `open` is false, so no other call on the
            // handle runs now or later; this runs once.
            unsafe { (api.rbd_close)(closing.image) };
            drop(open);
            drop(closing);
            let _ = tell.send(());
        });
        if closer.is_ok() && told.recv_timeout(Duration::from_millis(RBD_CLOSE_TIMEOUT_MS)).is_err() {
            log::warn!("an RBD image did not close within {RBD_CLOSE_TIMEOUT_MS} ms (is the cluster reachable?); not waiting for it");
        }
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        self.close();
    }
}
