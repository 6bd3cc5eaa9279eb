//! The byte streams TLS runs over. Beyond reading and writing, a socket can give its
//! descriptor up to the kernel, and a stream that records (`Recorder`) can give up the
//! ciphertext it carried: what a handoff to the kernel's TLS needs (kernel.rs).

use sluice_ktls::Transcript;
use std::io;
use std::os::fd::OwnedFd;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::{TcpStream, UnixStream};

/// A byte stream both ways: the socket TLS runs over.
pub(crate) trait Duplex: AsyncRead + AsyncWrite + Send + Unpin {
    /// The socket's descriptor, in blocking mode, for the kernel to read and write once
    /// tokio lets go of it. Only a socket has one.
    fn into_fd(self: Box<Self>) -> io::Result<OwnedFd> {
        Err(io::Error::new(io::ErrorKind::Unsupported, "the stream is not a socket"))
    }

    /// The ciphertext the stream carried, when it kept it (`Recorder`); it keeps no more.
    fn take_transcript(&mut self) -> Option<Transcript> {
        None
    }
}

// tokio made both sockets non-blocking; the kernel's own readers want them blocking.
impl Duplex for TcpStream {
    fn into_fd(self: Box<Self>) -> io::Result<OwnedFd> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        Ok(s.into())
    }
}

impl Duplex for UnixStream {
    fn into_fd(self: Box<Self>) -> io::Result<OwnedFd> {
        let s = self.into_std()?;
        s.set_nonblocking(false)?;
        Ok(s.into())
    }
}
