//! The byte streams an NBD connection runs on: the socket a URI names, read unbuffered
//! while the handshake may still turn it into TLS, then split into a buffered read half
//! and a write half for the rest of the handshake and for transmission.

use crate::error::Error;
use crate::limits::READ_BUFFER_BYTES;
use crate::tls::{Duplex, TlsStream};
use crate::uri::Address;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, BufReader, ReadBuf};
use tokio::net::{TcpStream, UnixStream};

pub(crate) type Reader = BufReader<Box<dyn AsyncRead + Send + Unpin>>;
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// A connected socket, whole: nothing has been read from it beyond what the handshake
/// asked for, so TLS can still start on it.
pub(crate) enum Socket {
    Tcp(TcpStream),
    Unix(UnixStream),
    Tls(Box<TlsStream>),
}

impl Socket {
    /// Opens the socket a URI names.
    pub(crate) async fn open(address: &Address) -> Result<Socket, Error> {
        match address {
            Address::Tcp { host, port } => {
                let s = TcpStream::connect((host.as_str(), *port))
                    .await
                    .map_err(|e| Error::io(std::io::Error::new(e.kind(), format!("cannot connect to {host}:{port}: {e}"))))?;
                // Requests are written whole; Nagle would only hold small ones back.
                s.set_nodelay(true)?;
                Ok(Socket::Tcp(s))
            }
            Address::Unix(path) => {
                let s = UnixStream::connect(path)
                    .await
                    .map_err(|e| Error::io(std::io::Error::new(e.kind(), format!("cannot connect to {}: {e}", path.display()))))?;
                Ok(Socket::Unix(s))
            }
            Address::Pool(path) => Err(Error::Uri(format!("pool:{} names a pool, not a server", path.display()))),
            Address::Cache(path) => Err(Error::Uri(format!("cache:{} names a cached volume, not a server", path.display()))),
        }
    }

    /// The stream itself, for reads of exactly what the handshake expects.
    pub(crate) fn stream(&mut self) -> &mut dyn Duplex {
        match self {
            Socket::Tcp(s) => s,
            Socket::Unix(s) => s,
            Socket::Tls(s) => s.as_mut(),
        }
    }

    /// The stream for TLS to run over.
    pub(crate) fn into_stream(self) -> Box<dyn Duplex> {
        match self {
            Socket::Tcp(s) => Box::new(s),
            Socket::Unix(s) => Box::new(s),
            Socket::Tls(s) => s,
        }
    }

    /// The read and write halves; from here on reads are buffered. A plain socket splits
    /// without a lock between the halves; a TLS session is one state both halves share.
    pub(crate) fn split(self) -> (Reader, Writer) {
        let (r, w): (Box<dyn AsyncRead + Send + Unpin>, Writer) = match self {
            Socket::Tcp(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Socket::Unix(s) => {
                let (r, w) = s.into_split();
                (Box::new(r), Box::new(w))
            }
            Socket::Tls(s) => {
                let (r, w) = tokio::io::split(*s);
                (Box::new(r), Box::new(w))
            }
        };
        (BufReader::with_capacity(READ_BUFFER_BYTES, r), w)
    }

    /// Halves that both lend the one socket, which `Lent::take` gives back whole once they
    /// are dropped: for a handshake whose socket goes on to the kernel. (Tokio's own halves
    /// shut the socket down when dropped.)
    pub(crate) fn lend(self) -> (Reader, Writer, Lent) {
        let shared = Lent(Arc::new(Mutex::new(self)));
        let r: Box<dyn AsyncRead + Send + Unpin> = Box::new(shared.clone());
        (BufReader::with_capacity(READ_BUFFER_BYTES, r), Box::new(shared.clone()), shared)
    }

    /// The descriptor of a plain socket, in blocking mode, for a reader that is not tokio
    /// (the kernel). A TLS session has keys to hand over first (`tls::hand_to_kernel`).
    pub(crate) fn into_plain_fd(self) -> io::Result<OwnedFd> {
        match self {
            Socket::Tls(_) => Err(io::Error::other("a TLS session is not a plain socket")),
            plain => plain.into_stream().into_fd(),
        }
    }
}

/// The socket behind `Socket::lend`'s halves.
#[derive(Clone)]
pub(crate) struct Lent(Arc<Mutex<Socket>>);

impl Lent {
    /// The socket, once every half is gone.
    pub(crate) fn take(self) -> Option<Socket> {
        Arc::try_unwrap(self.0).ok().map(|m| m.into_inner().unwrap_or_else(|p| p.into_inner()))
    }

    fn with<T>(&self, f: impl FnOnce(Pin<&mut dyn Duplex>) -> T) -> T {
        let mut socket = self.0.lock().unwrap_or_else(|p| p.into_inner());
        f(Pin::new(socket.stream()))
    }
}

impl AsyncRead for Lent {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        self.with(|s| s.poll_read(cx, buf))
    }
}

impl AsyncWrite for Lent {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        self.with(|s| s.poll_write(cx, buf))
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|s| s.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.with(|s| s.poll_shutdown(cx))
    }
}
