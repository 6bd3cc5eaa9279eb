//! The byte streams an NBD connection runs on: the socket a URI names, read unbuffered
//! while the handshake may still turn it into TLS, then split into a buffered read half
//! and a write half for the rest of the handshake and for transmission.

use crate::error::Error;
use crate::limits::READ_BUFFER_BYTES;
use crate::tls::{Duplex, TlsStream};
use crate::uri::Address;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};
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
}
