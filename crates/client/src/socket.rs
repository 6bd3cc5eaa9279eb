//! The byte streams an NBD connection runs on: the socket a URI names, split into a
//! buffered read half and a write half, used first by the handshake and then by
//! transmission.

use crate::error::Error;
use crate::limits::READ_BUFFER_BYTES;
use crate::uri::Address;
use tokio::io::{AsyncRead, AsyncWrite, BufReader};

pub(crate) type Reader = BufReader<Box<dyn AsyncRead + Send + Unpin>>;
pub(crate) type Writer = Box<dyn AsyncWrite + Send + Unpin>;

/// Opens the socket a URI names.
pub(crate) async fn open(address: &Address) -> Result<(Reader, Writer), Error> {
    let (r, w): (Box<dyn AsyncRead + Send + Unpin>, Writer) = match address {
        Address::Tcp { host, port } => {
            let s = tokio::net::TcpStream::connect((host.as_str(), *port))
                .await
                .map_err(|e| Error::io(std::io::Error::new(e.kind(), format!("cannot connect to {host}:{port}: {e}"))))?;
            // Requests are written whole; Nagle would only hold small ones back.
            s.set_nodelay(true)?;
            let (r, w) = s.into_split();
            (Box::new(r), Box::new(w))
        }
        Address::Unix(path) => {
            let s = tokio::net::UnixStream::connect(path)
                .await
                .map_err(|e| Error::io(std::io::Error::new(e.kind(), format!("cannot connect to {}: {e}", path.display()))))?;
            let (r, w) = s.into_split();
            (Box::new(r), Box::new(w))
        }
        Address::Pool(path) => {
            return Err(Error::Uri(format!("pool:{} names a pool, not a server", path.display())));
        }
    };
    Ok((BufReader::with_capacity(READ_BUFFER_BYTES, r), w))
}
