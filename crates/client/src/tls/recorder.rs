//! A stream that keeps a copy of the ciphertext it carries, for a session that is to be
//! handed to the kernel's TLS: the sequence numbers the kernel starts from are checked
//! against these records (kernel.rs). Only such sessions are wrapped in one.

use super::duplex::Duplex;
use sluice_ktls::Transcript;
use std::io;
use std::os::fd::OwnedFd;
use std::pin::Pin;
use std::task::{ready, Context, Poll};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

pub(crate) struct Recorder {
    inner: Box<dyn Duplex>,
    /// None once taken: from then on nothing is kept.
    transcript: Option<Transcript>,
}

impl Recorder {
    pub(crate) fn new(inner: Box<dyn Duplex>) -> Recorder {
        Recorder { inner, transcript: Some(Transcript::default()) }
    }
}

impl AsyncRead for Recorder {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        ready!(Pin::new(&mut this.inner).poll_read(cx, buf))?;
        if let Some(t) = &mut this.transcript {
            t.received(&buf.filled()[before..]);
        }
        Poll::Ready(Ok(()))
    }
}

impl AsyncWrite for Recorder {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        let this = &mut *self;
        let n = ready!(Pin::new(&mut this.inner).poll_write(cx, buf))?;
        if let Some(t) = &mut this.transcript {
            t.sent(&buf[..n]);
        }
        Poll::Ready(Ok(n))
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

impl Duplex for Recorder {
    fn into_fd(self: Box<Self>) -> io::Result<OwnedFd> {
        self.inner.into_fd()
    }

    fn take_transcript(&mut self) -> Option<Transcript> {
        self.transcript.take()
    }
}
