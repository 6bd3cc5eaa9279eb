//! Listening sockets and the accept loops. Each accepted connection takes a permit and gets
//! a short-lived thread for its handshake, so a slow or silent client holds only that
//! thread; the connection then moves to a worker's ring for transmission.

use std::io::{self, Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;

use rustix::net::{AddressFamily, SocketAddrUnix};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use crate::access::{Access, Client};
use crate::admission::{ClientKey, Connections, Permit, Refusal};
use crate::export::Exports;
use crate::handshake::{negotiate, Negotiation, Timeouts, Visible};
use crate::limits::{Limits, ACCEPT_RETRY_DELAY_MS};
use crate::metrics::{Metrics, Refused};
use crate::tls::TlsServer;
use crate::worker::{NewConnection, WorkerHandle};

pub struct Listener {
    socket: Socket,
    /// Written at the stop to wake the accept loop. The socket itself is left alone: an
    /// inherited one is shared with the service manager, which keeps it listening for the
    /// next process (a shutdown(2) would end it for everyone).
    wake: OwnedFd,
}

enum Socket {
    Tcp(TcpListener),
    /// A Unix socket, and its path when this process made it (and removes it at the end):
    /// an inherited socket's file belongs to whoever made it.
    Unix(UnixListener, PathBuf, Option<PathBuf>),
}

/// Whether the first client on this machine has been looked at for `bbr`.
static PACING_LOOKED: AtomicBool = AtomicBool::new(false);

/// Says once, for whoever compares servers on one machine, that such a client's socket runs
/// `bbr`: without an fq qdisc on lo, TCP then paces each socket by a timer of its own, and
/// spliced replies at several reads in flight ran at half the rate of copied ones
/// (docs/serve.md, DATA PATHS). The first client on this machine decides; later ones cost
/// nothing.
fn hint_loopback_pacing(s: &TcpStream, peer: IpAddr) {
    if PACING_LOOKED.load(Ordering::Relaxed) {
        return;
    }
    let local = s.local_addr().map(|a| a.ip()).ok();
    if !on_this_machine(peer, local) || PACING_LOOKED.swap(true, Ordering::Relaxed) {
        return;
    }
    if let Some(cc) = rustix::net::sockopt::tcp_congestion(s).ok().filter(|cc| cc.starts_with("bbr")) {
        log::info!(
            "{peer}: a client on this machine, over TCP with {cc}: unless lo has an fq qdisc, each such socket is paced by a timer \
             of its own, and large reads several at a time may run at half the rate; sluice-serve(1), DATA PATHS, says how to \
             give loopback its own congestion control"
        );
    }
}

/// Whether a TCP peer is this machine: a loopback address, or the address it reached us at
/// (which goes over lo as well). IPv4-mapped addresses count as the IPv4 ones.
fn on_this_machine(peer: IpAddr, local: Option<IpAddr>) -> bool {
    let peer = peer.to_canonical();
    peer.is_loopback() || local.is_some_and(|l| l.to_canonical() == peer)
}

impl Listener {
    fn new(socket: Socket) -> io::Result<Listener> {
        let wake = rustix::event::eventfd(0, rustix::event::EventfdFlags::CLOEXEC)?;
        Ok(Listener { socket, wake })
    }

    pub fn bind_tcp(addr: SocketAddr) -> io::Result<Listener> {
        Listener::new(Socket::Tcp(TcpListener::bind(addr)?))
    }

    /// Binds a Unix socket, replacing a stale socket file but never any other file.
    pub fn bind_unix(path: &Path) -> io::Result<Listener> {
        use std::os::unix::fs::FileTypeExt;
        if let Ok(meta) = std::fs::symlink_metadata(path) {
            if !meta.file_type().is_socket() {
                return Err(io::Error::new(io::ErrorKind::AlreadyExists, "exists and is not a socket"));
            }
            if UnixStream::connect(path).is_ok() {
                return Err(io::Error::new(io::ErrorKind::AddrInUse, "another server is listening there"));
            }
            std::fs::remove_file(path)?;
        }
        let socket = UnixListener::bind(path)?;
        Listener::new(Socket::Unix(socket, path.to_owned(), Some(path.to_owned())))
    }

    /// Takes a listening socket made by someone else (systemd's socket activation): a TCP
    /// or Unix stream socket that is already listening. It is closed on exec from here on,
    /// so that a command sluice runs does not hold it.
    fn inherit(fd: OwnedFd) -> io::Result<Listener> {
        use rustix::net::{sockopt, SocketType};
        if sockopt::socket_type(&fd)? != SocketType::STREAM || !sockopt::socket_acceptconn(&fd)? {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "not a listening stream socket"));
        }
        rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::CLOEXEC)?;
        let address = rustix::net::getsockname(&fd)?;
        let socket = match address.address_family() {
            AddressFamily::INET | AddressFamily::INET6 => Socket::Tcp(TcpListener::from(fd)),
            AddressFamily::UNIX => {
                let unix = SocketAddrUnix::try_from(address)?;
                let path = match unix.path_bytes() {
                    Some(bytes) => PathBuf::from(std::ffi::OsStr::from_bytes(bytes)),
                    None => PathBuf::from("(unnamed)"),
                };
                Socket::Unix(UnixListener::from(fd), path, None)
            }
            _ => return Err(io::Error::new(io::ErrorKind::InvalidInput, "neither a TCP nor a Unix socket")),
        };
        Listener::new(socket)
    }

    /// The sockets a service manager passed down (socket activation), each with its name
    /// from `LISTEN_FDNAMES` ("" when unnamed); none when this process was not given any.
    pub fn inherited() -> io::Result<Vec<(Listener, String)>> {
        let mut out = Vec::new();
        for (i, (fd, name)) in crate::engine::inherited_listen_fds()?.into_iter().enumerate() {
            let listener = Listener::inherit(fd)
                .map_err(|e| io::Error::new(e.kind(), format!("inherited descriptor {} ({name:?}): {e}", 3 + i)))?;
            out.push((listener, name));
        }
        Ok(out)
    }

    /// Where clients reach it.
    pub fn endpoint(&self) -> Endpoint {
        match &self.socket {
            Socket::Tcp(l) => l.local_addr().map_or(Endpoint::Unknown, Endpoint::Tcp),
            Socket::Unix(_, p, _) => Endpoint::Unix(p.clone()),
        }
    }

    pub fn describe(&self) -> String {
        match &self.socket {
            Socket::Tcp(l) => l.local_addr().map_or_else(|_| "tcp".into(), |a| a.to_string()),
            Socket::Unix(_, p, _) => format!("unix:{}", p.display()),
        }
    }

    /// Wakes the thread waiting to accept, for good; used at shutdown.
    pub fn stop(&self) {
        let _ = rustix::io::write(&self.wake, &1u64.to_ne_bytes());
    }

    fn socket_fd(&self) -> BorrowedFd<'_> {
        match &self.socket {
            Socket::Tcp(l) => l.as_fd(),
            Socket::Unix(l, ..) => l.as_fd(),
        }
    }

    /// Waits for a client or the stop: None once stopped. A client that left the queue
    /// before it was taken (or a socket the manager made non-blocking) is `WouldBlock`.
    fn accept(&self) -> io::Result<Option<Accepted>> {
        use rustix::event::{PollFd, PollFlags};
        let socket = self.socket_fd();
        let mut fds = [PollFd::new(&socket, PollFlags::IN), PollFd::new(&self.wake, PollFlags::IN)];
        rustix::event::poll(&mut fds, None)?;
        if !fds[1].revents().is_empty() {
            return Ok(None);
        }
        match &self.socket {
            Socket::Tcp(l) => {
                let (s, addr) = l.accept()?;
                s.set_nodelay(true)?;
                hint_loopback_pacing(&s, addr.ip().to_canonical());
                let client = Client { addr: Some(addr.ip().to_canonical()), ..Client::default() };
                Ok(Some(Accepted { stream: Stream::Tcp(s), peer: addr.to_string(), client }))
            }
            Socket::Unix(l, p, _) => {
                let (s, _) = l.accept()?;
                // Who is at the other end: the only name a Unix peer has, for the log and
                // for the access rules (a peer whose credentials are unknown matches none).
                let (peer, client) = match rustix::net::sockopt::socket_peercred(&s) {
                    Ok(c) => (
                        format!("unix:{} uid={} pid={}", p.display(), c.uid.as_raw(), c.pid.as_raw_nonzero()),
                        Client { uid: Some(c.uid.as_raw()), gid: Some(c.gid.as_raw()), ..Client::default() },
                    ),
                    Err(_) => (format!("unix:{}", p.display()), Client::default()),
                };
                Ok(Some(Accepted { stream: Stream::Unix(s), peer, client }))
            }
        }
    }
}

/// A listener's address, for those who tell clients where to connect.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Endpoint {
    Tcp(SocketAddr),
    Unix(PathBuf),
    Unknown,
}

impl Drop for Listener {
    fn drop(&mut self) {
        if let Socket::Unix(_, _, Some(path)) = &self.socket {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// A connection just accepted: its socket, its name for the log, and what the access
/// rules can know of it before the handshake.
struct Accepted {
    stream: Stream,
    peer: String,
    client: Client,
}

impl Accepted {
    fn key(&self) -> Option<ClientKey> {
        self.client.addr.map(ClientKey::Addr).or(self.client.uid.map(ClientKey::Uid))
    }
}

enum Stream {
    Tcp(TcpStream),
    Unix(UnixStream),
}

impl Timeouts for Stream {
    fn set_read_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_read_timeout(Some(t)),
            Stream::Unix(s) => s.set_read_timeout(Some(t)),
        }
    }

    fn set_write_timeout(&self, t: Duration) -> io::Result<()> {
        match self {
            Stream::Tcp(s) => s.set_write_timeout(Some(t)),
            Stream::Unix(s) => s.set_write_timeout(Some(t)),
        }
    }
}

impl AsFd for Stream {
    fn as_fd(&self) -> BorrowedFd<'_> {
        match self {
            Stream::Tcp(s) => s.as_fd(),
            Stream::Unix(s) => s.as_fd(),
        }
    }
}

impl Stream {
    fn into_fd(self) -> io::Result<OwnedFd> {
        // The worker's ring expects blocking sockets; clear the handshake timeouts.
        let fd: OwnedFd = match self {
            Stream::Tcp(s) => {
                s.set_read_timeout(None)?;
                s.set_write_timeout(None)?;
                s.into()
            }
            Stream::Unix(s) => {
                s.set_read_timeout(None)?;
                s.set_write_timeout(None)?;
                s.into()
            }
        };
        Ok(fd)
    }
}

impl Read for Stream {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.read(buf),
            Stream::Unix(s) => s.read(buf),
        }
    }
}

impl Write for Stream {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        match self {
            Stream::Tcp(s) => s.write(buf),
            Stream::Unix(s) => s.write(buf),
        }
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

/// What new connections are served: the exports, who may use them, TLS and the acceptor's
/// limits. A reload swaps it whole; a connection keeps the export it opened, so one that
/// was removed drains.
pub struct Served {
    pub exports: Arc<Exports>,
    pub access: Arc<Access>,
    pub tls: Option<Arc<TlsServer>>,
    pub limits: Limits,
}

/// Shared by every accept loop.
pub struct Acceptor {
    served: RwLock<Arc<Served>>,
    pub workers: Vec<WorkerHandle>,
    pub shutdown: Arc<AtomicBool>,
    next_worker: AtomicUsize,
    connections: Arc<Connections>,
    metrics: Arc<Metrics>,
}

impl Acceptor {
    pub fn new(served: Served, workers: Vec<WorkerHandle>, shutdown: Arc<AtomicBool>, metrics: Arc<Metrics>) -> Acceptor {
        Acceptor {
            served: RwLock::new(Arc::new(served)),
            workers,
            shutdown,
            next_worker: AtomicUsize::new(0),
            connections: Arc::default(),
            metrics,
        }
    }

    /// What a connection accepted now is served.
    pub fn served(&self) -> Arc<Served> {
        Arc::clone(&self.served.read().unwrap_or_else(|e| e.into_inner()))
    }

    /// Serves `next` to connections accepted from now on; returns what was served before.
    pub fn swap(&self, next: Served) -> Arc<Served> {
        std::mem::replace(&mut *self.served.write().unwrap_or_else(|e| e.into_inner()), Arc::new(next))
    }

    /// Connections open now, including those still in their handshake.
    pub fn connections(&self) -> &Connections {
        &self.connections
    }

    /// Accepts until shutdown.
    pub fn accept_loop(self: Arc<Self>, listener: Arc<Listener>) {
        while !self.shutdown.load(Ordering::Relaxed) {
            let accepted = match listener.accept() {
                Ok(Some(a)) => a,
                Ok(None) => return,
                Err(e) if matches!(e.kind(), io::ErrorKind::WouldBlock | io::ErrorKind::Interrupted) => continue,
                Err(e) => {
                    if self.shutdown.load(Ordering::Relaxed) {
                        return;
                    }
                    // EMFILE and friends: back off instead of spinning.
                    log::warn!("accept on {} failed: {e}", listener.describe());
                    std::thread::sleep(Duration::from_millis(ACCEPT_RETRY_DELAY_MS));
                    continue;
                }
            };
            let served = self.served();
            let Some(permit) = self.admit(&accepted, &served) else { continue };
            let me = Arc::clone(&self);
            let spawned = std::thread::Builder::new()
                .name("sluice-handshake".into())
                .spawn(move || me.handshake(accepted, permit, &served));
            if let Err(e) = spawned {
                log::warn!("cannot start a handshake thread: {e}");
            }
        }
    }

    /// A permit for this connection, or None (logged and counted) when the rules admit the
    /// client to no export or a connection limit is reached; the socket then just closes.
    fn admit(&self, accepted: &Accepted, served: &Served) -> Option<Permit> {
        let Accepted { peer, client, .. } = accepted;
        let names = served.exports.iter().map(|e| e.name.as_str());
        if !served.access.may_connect(names, client, served.tls.is_some()) {
            log::info!("{peer}: refused by the access rules");
            self.metrics.refused.count(Refused::Access);
            return None;
        }
        let limits = &served.limits;
        match Permit::take(&self.connections, limits.connections, accepted.key(), limits.connections_per_client) {
            Ok(permit) => Some(permit),
            Err(Refusal::Full) => {
                log::warn!("{peer}: refused, {} connections already open", limits.connections);
                self.metrics.refused.count(Refused::Connections);
                None
            }
            Err(Refusal::ClientFull) => {
                log::warn!("{peer}: refused, this client has {} connections open already (connections-per-client)", limits.connections_per_client);
                self.metrics.refused.count(Refused::ConnectionsPerClient);
                None
            }
        }
    }

    fn handshake(&self, accepted: Accepted, permit: Permit, served: &Served) {
        let Accepted { mut stream, peer, client } = accepted;
        let visible = Visible::new(&served.exports, &served.access, client);
        let negotiated = negotiate(&mut stream, &visible, served.tls.as_deref(), served.limits.handshake_timeout_ms);
        if let (Some(name), false) = (visible.refused(), matches!(negotiated, Ok(Some(_)))) {
            log::info!("{peer}: refused export {name:?} by the access rules");
            self.metrics.refused.count(Refused::Export);
        }
        match negotiated {
            Ok(Some(Negotiation { session, export, tls, tls_client })) => {
                let fd = match stream.into_fd() {
                    Ok(fd) => fd,
                    Err(e) => return log::warn!("{peer}: {e}"),
                };
                let n = self.next_worker.fetch_add(1, Ordering::Relaxed) % self.workers.len();
                let client = visible.client();
                self.workers[n].hand_over(NewConnection { fd, peer, export, session, tls, tls_client, permit, client });
            }
            Ok(None) => {}
            Err(e) => log::info!("{peer}: handshake ended: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_peer_on_this_machine_is_a_loopback_address_or_our_own() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let ours = Some(ip("192.0.2.2"));
        for local in ["127.0.0.1", "127.9.9.9", "::1", "::ffff:127.0.0.1", "192.0.2.2", "::ffff:192.0.2.2"] {
            assert!(on_this_machine(ip(local), ours), "{local}");
        }
        for remote in ["192.0.2.3", "::ffff:192.0.2.3", "2001:db8::1"] {
            assert!(!on_this_machine(ip(remote), ours), "{remote}");
        }
        assert!(!on_this_machine(ip("192.0.2.2"), None), "our own address unknown");
    }
}
