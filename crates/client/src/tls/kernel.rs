//! Handing a client's TLS session to the kernel's TLS (kTLS), for `sluice attach`: the NBD
//! handshake runs over OpenSSL in user space, then the kernel's nbd driver takes the
//! socket and speaks TLS through the kernel. sluice-ktls plans the handoff (keys from the
//! session's secrets, sequence numbers checked against the records the `Recorder` kept)
//! and installs it. OpenSSL lets go of the socket first, so nothing it does afterwards
//! (not even a close_notify as the session is dropped) can reach it.

use super::duplex::Duplex;
use super::session::TlsStream;
use crate::error::Error;
use sluice_ktls::{Plan, Side};
use std::io;
use std::os::fd::{AsFd, OwnedFd};
use std::pin::Pin;
use std::task::{Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

/// Gives the kernel both directions' keys for `stream`, a session from
/// `prepare_for_kernel` whose NBD handshake is done (NBD_OPT_GO acknowledged, nothing
/// left unread), and returns its socket in blocking mode. On an error the socket is
/// closed: the session cannot go on in user space either.
pub(crate) fn hand_to_kernel(mut stream: TlsStream) -> Result<OwnedFd, Error> {
    let plan = plan(&mut stream);
    let fd = detach(stream).map_err(|e| refused(format!("cannot take the socket from OpenSSL: {e}")))?;
    if !sluice_ktls::over_tcp(fd.as_fd()) {
        return Err(refused("kTLS needs TCP, not a Unix socket".into()));
    }
    let plan = plan.map_err(refused)?;
    sluice_ktls::install(fd.as_fd(), &plan).map_err(|r| refused(r.why().to_owned()))?;
    Ok(fd)
}

/// The keys and sequence numbers the kernel would be given, checked against the records
/// that went by. Takes the secrets and the transcript out of the session.
pub(crate) fn plan(stream: &mut TlsStream) -> Result<Plan, String> {
    let transcript = stream.get_mut().take_transcript();
    sluice_ktls::plan(stream.ssl(), transcript, Side::Client)
}

/// Takes the socket out from under OpenSSL, which is left with a stream that goes nowhere,
/// and drops the session.
pub(crate) fn detach(mut stream: TlsStream) -> io::Result<OwnedFd> {
    let socket = std::mem::replace(stream.get_mut(), Box::new(Detached));
    drop(stream);
    socket.into_fd()
}

fn refused(why: String) -> Error {
    Error::Tls(format!("cannot hand the session to the kernel's TLS: {why}"))
}

/// What a session holds once its socket went to the kernel: every read and write fails.
struct Detached;

fn gone() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "the socket was handed to the kernel")
}

impl AsyncRead for Detached {
    fn poll_read(self: Pin<&mut Self>, _: &mut Context<'_>, _: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(gone()))
    }
}

impl AsyncWrite for Detached {
    fn poll_write(self: Pin<&mut Self>, _: &mut Context<'_>, _: &[u8]) -> Poll<io::Result<usize>> {
        Poll::Ready(Err(gone()))
    }

    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(gone()))
    }

    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<io::Result<()>> {
        Poll::Ready(Err(gone()))
    }
}

impl Duplex for Detached {}
