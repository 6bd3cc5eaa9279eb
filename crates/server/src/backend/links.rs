//! A remote export's links (`link.rs`), one per worker thread that uses the export: opened
//! in the background the first time a worker asks, checked to reach the export the
//! backend's client reached, and kept on the worker's ring until the backend goes.

use std::any::Any;
use std::os::fd::OwnedFd;
use std::rc::Rc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use sluice_client::attach::{open_sockets, Sockets};
use sluice_client::{Address, Export, Uri};
use sluice_proto::wire::{FLAG_CAN_MULTI_CONN, FLAG_READ_ONLY, FLAG_SEND_FLUSH, FLAG_SEND_FUA};
use tokio::runtime::Handle;

use super::link::{Kept, Link};
use crate::engine::Ring;
use crate::limits::{REMOTE_LINK_WORKERS_MAX, SOCKET_SPLICE_PIPE_SHARE_FIRST};

/// A remote export's links, one per worker that uses the export, and how far each got.
pub struct Links {
    /// The backend's key for what it keeps on each worker's ring.
    key: u64,
    uri: Uri,
    spec: Arc<str>,
    /// What a link must find, and what requests over it must respect.
    expect: Arc<Expect>,
    workers: Arc<Vec<Mutex<Stage>>>,
    /// Lives as long as the backend: the workers drop their links once it is gone.
    alive: Arc<()>,
    /// The sockets of the links started, for `cut`.
    opened: Mutex<Vec<std::sync::Weak<OwnedFd>>>,
    /// Set by `cut`; every link shares it.
    cut: Arc<AtomicBool>,
    /// `Link::pipe_share`.
    pipe_share: Arc<AtomicUsize>,
}

/// What the backend's client found, which every link must find too.
struct Expect {
    size: u64,
    flags: u16,
    block_min: u32,
    block_max: u32,
    /// The largest read or write the remote takes.
    request_max_bytes: usize,
    /// What the remote says the export is (sluice servers say), as the first link found it.
    identity: Mutex<Option<Option<String>>>,
}

impl Expect {
    /// Why the export a link reached is not the one the client did, if it is not.
    fn differs(&self, sockets: &Sockets) -> Option<String> {
        let (e, id) = (&sockets.export, &sockets.identity.id);
        if (e.size, e.flags & FLAGS_ALIKE, e.block_min, e.block_max) != (self.size, self.flags, self.block_min, self.block_max) {
            return Some(format!("{} bytes, flags {:#06x}, blocks {}..{}", e.size, e.flags, e.block_min, e.block_max));
        }
        let mut first = self.identity.lock().expect("an identity is only ever set");
        match &*first {
            Some(known) if known != id => Some(format!("identity {id:?}, where an earlier connection found {known:?}")),
            Some(_) => None,
            None => {
                *first = Some(id.clone());
                None
            }
        }
    }

    /// Whether a request the server checked may go to the remote as it is: within the
    /// remote's largest request, and on its minimum block (which the remote's own client,
    /// the other path, would have widened a read to, or refused).
    fn takes(&self, offset: u64, len: usize) -> bool {
        let b = u64::from(self.block_min);
        len <= self.request_max_bytes && offset.is_multiple_of(b) && ((len as u64).is_multiple_of(b) || offset.saturating_add(len as u64) == self.size)
    }
}

/// Where one worker's link stands.
enum Stage {
    /// No request of this worker asked for it yet.
    Idle,
    Connecting,
    /// Negotiated, for the worker to start on its ring.
    Ready(OwnedFd),
    /// Started on the worker's ring (kept there), or never to be: the worker uses the
    /// client.
    Done,
}

/// Flags a link's export must share with the client's: what requests over it rely on.
const FLAGS_ALIKE: u16 = FLAG_READ_ONLY | FLAG_SEND_FLUSH | FLAG_SEND_FUA | FLAG_CAN_MULTI_CONN;

impl Links {
    /// Links to `uri`, or None where they cannot carry its requests: TLS (the session lives
    /// in user space), or a server that does not allow multi-conn (a link is one more
    /// connection, and a flush on the client's must cover writes sent on a link).
    pub fn new(uri: &Uri, spec: &str, export: &Export) -> Option<Links> {
        static KEYS: AtomicU64 = AtomicU64::new(1);
        let plain = matches!(uri.address, Address::Tcp { .. } | Address::Unix(_)) && uri.tls.is_none();
        if !plain || !export.can_multi_conn() {
            return None;
        }
        let expect = Expect {
            size: export.size,
            flags: export.flags & FLAGS_ALIKE,
            block_min: export.block_min.max(1),
            block_max: export.block_max,
            request_max_bytes: export.request_max_bytes() as usize,
            identity: Mutex::new(None),
        };
        let workers = (0..REMOTE_LINK_WORKERS_MAX).map(|_| Mutex::new(Stage::Idle)).collect();
        Some(Links {
            key: KEYS.fetch_add(1, Ordering::Relaxed),
            uri: uri.clone(),
            spec: spec.into(),
            expect: Arc::new(expect),
            workers: Arc::new(workers),
            alive: Arc::new(()),
            opened: Mutex::new(Vec::new()),
            cut: Arc::new(AtomicBool::new(false)),
            pipe_share: Arc::new(AtomicUsize::new(SOCKET_SPLICE_PIPE_SHARE_FIRST)),
        })
    }

    /// A spliced read's chunks fill at most 1/N of a pipe: N.
    pub fn pipe_share(&self) -> usize {
        self.pipe_share.load(Ordering::Relaxed)
    }

    /// Ends every link started, from any thread: what is in flight on them fails, and each
    /// worker's next request finds its link dead. For a pool member the pool has dropped.
    pub fn cut(&self) {
        self.cut.store(true, Ordering::Relaxed);
        for fd in self.opened.lock().expect("the list is only ever pushed to").iter().filter_map(std::sync::Weak::upgrade) {
            let _ = rustix::net::shutdown(&*fd, rustix::net::Shutdown::Both);
        }
    }

    /// The link of the worker whose ring this is, for a request of `len` bytes at `offset`,
    /// if the link is up and takes it. The first time a worker asks, its link is opened on
    /// `runtime`; the worker's requests go through the client until it is up.
    pub fn get(&self, ring: &mut Ring, offset: u64, len: usize, runtime: &Handle) -> Option<Rc<Link>> {
        if !self.expect.takes(offset, len) {
            return None;
        }
        if let Some(kept) = ring.local::<Kept>(self.key) {
            return match &kept.0 {
                Some(link) if !link.is_dead() => Some(Rc::clone(link)),
                Some(_) => {
                    self.keep(ring, None);
                    None
                }
                None => None,
            };
        }
        let worker = ring.owner();
        let Some(stage) = self.workers.get(worker) else {
            self.keep(ring, None);
            return None;
        };
        let mut stage = stage.lock().expect("a stage is only ever replaced");
        match std::mem::replace(&mut *stage, Stage::Done) {
            Stage::Idle => {
                *stage = Stage::Connecting;
                self.connect(worker, runtime);
                None
            }
            Stage::Ready(fd) => {
                let fd = Arc::new(fd);
                let mut opened = self.opened.lock().expect("the list is only ever pushed to");
                opened.retain(|w| w.strong_count() > 0);
                opened.push(Arc::downgrade(&fd));
                drop(opened);
                let link = Link::new(fd, Arc::clone(&self.spec), worker, Arc::clone(&self.cut), Arc::clone(&self.pipe_share));
                link.begin(ring);
                self.keep(ring, Some(Rc::clone(&link)));
                log::debug!("{}: worker {worker} sends reads, writes and flushes over a connection of its own", self.spec);
                Some(link)
            }
            Stage::Connecting => {
                *stage = Stage::Connecting;
                None
            }
            Stage::Done => {
                drop(stage);
                self.keep(ring, None);
                None
            }
        }
    }

    /// Keeps the worker's link on its ring, or that it has none for good.
    fn keep(&self, ring: &mut Ring, link: Option<Rc<Link>>) {
        let kept = Rc::new(Kept(link)) as Rc<dyn Any>;
        ring.set_local(self.key, Some((kept, Arc::downgrade(&self.alive))));
    }

    /// Opens and negotiates `worker`'s link in the background.
    fn connect(&self, worker: usize, runtime: &Handle) {
        let (uri, spec, workers, expect) = (self.uri.clone(), Arc::clone(&self.spec), Arc::clone(&self.workers), Arc::clone(&self.expect));
        runtime.spawn(async move {
            let next = match open_sockets(&uri, 1).await {
                Ok(mut s) => match expect.differs(&s) {
                    None => {
                        let fd = s.fds.pop().expect("one socket was asked for");
                        // The ring waits in the kernel; a blocking socket keeps MSG_WAITALL whole.
                        match rustix::io::ioctl_fionbio(&fd, false) {
                            Ok(()) => Stage::Ready(fd),
                            Err(e) => {
                                log::warn!("{spec}: a connection for worker {worker} could not be set up ({e}); it uses the export's client");
                                Stage::Done
                            }
                        }
                    }
                    Some(why) => {
                        log::warn!("{spec}: a connection for worker {worker} found another export ({why}); it uses the export's client");
                        Stage::Done
                    }
                },
                Err(e) => {
                    log::warn!("{spec}: could not open a connection for worker {worker} ({e}); it uses the export's client");
                    Stage::Done
                }
            };
            *workers[worker].lock().expect("a stage is only ever replaced") = next;
        });
    }
}
