//! What OpenSSL reads ciphertext from and writes it to. During the handshake (on the
//! handshake thread) that is the socket itself, blocking under the handshake's deadline;
//! when the session may go to kTLS, a copy of the ciphertext is kept there too, for the
//! handoff to be checked against (sluice-ktls's transcript).
//! Once the connection moves to a worker it is two buffers: ciphertext the worker's ring
//! received, and ciphertext waiting for the ring to send it. OpenSSL never touches the
//! socket there, so every socket operation stays on the ring.

use std::io::{self, Read, Write};
use std::os::fd::OwnedFd;
use std::time::Instant;

use rustix::net::sockopt::{set_socket_timeout, Timeout};

use sluice_ktls::Transcript;

pub struct Channel {
    /// A duplicate of the connection's socket while the handshake thread owns it, and the
    /// handshake's deadline, which every read and write on it must meet.
    socket: Option<(OwnedFd, Instant)>,
    /// Received ciphertext: `input[read..filled]` is what OpenSSL has not taken yet. None
    /// while the ring receives into it.
    pub(super) input: Option<Vec<u8>>,
    pub(super) read: usize,
    pub(super) filled: usize,
    /// The peer closed its side (or the receive failed) once `input` is used up.
    pub(super) input_ended: bool,
    /// Ciphertext OpenSSL wrote that no send has taken yet.
    pub(super) output: Vec<u8>,
    /// What went over the socket, kept when the session may be handed to kTLS.
    transcript: Option<Transcript>,
}

impl Channel {
    pub fn over_socket(socket: OwnedFd, deadline: Instant) -> Channel {
        Channel {
            socket: Some((socket, deadline)),
            input: None,
            read: 0,
            filled: 0,
            input_ended: false,
            output: Vec::new(),
            transcript: None,
        }
    }

    /// Keeps the ciphertext the socket carries from now on, so that a handoff to kTLS can
    /// be checked against it.
    pub fn keep_transcript(&mut self) {
        self.transcript = Some(Transcript::default());
    }

    pub fn take_transcript(&mut self) -> Option<Transcript> {
        self.transcript.take()
    }

    /// From now on OpenSSL reads and writes the buffers; the socket belongs to the ring
    /// (or, under kTLS, to the kernel's TLS: nothing OpenSSL writes reaches it).
    pub fn detach(&mut self) {
        self.socket = None;
        self.transcript = None;
    }

    pub fn is_detached(&self) -> bool {
        self.socket.is_none()
    }

    /// Ciphertext received and not yet taken by OpenSSL.
    pub(super) fn unread(&self) -> usize {
        self.filled - self.read
    }
}

fn too_long() -> io::Error {
    io::Error::new(io::ErrorKind::TimedOut, "TLS handshake took too long")
}

/// The socket's timeout reads as EAGAIN; OpenSSL would take that for "try again" and the
/// handshake thread would spin, so it is reported as the timeout it is.
fn timed_out(e: rustix::io::Errno) -> io::Error {
    if e == rustix::io::Errno::AGAIN {
        too_long()
    } else {
        e.into()
    }
}

/// Bounds the next blocking call on `fd` by what is left until `deadline`: a client that
/// trickles bytes must not earn a fresh timeout with each one.
fn bound(fd: &OwnedFd, deadline: Instant, which: Timeout) -> io::Result<()> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(too_long());
    }
    set_socket_timeout(fd, which, Some(left)).map_err(io::Error::from)
}

impl Read for Channel {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if let Some((s, deadline)) = &self.socket {
            bound(s, *deadline, Timeout::Recv)?;
            let n = rustix::io::read(s, &mut *buf).map_err(timed_out)?;
            if let Some(t) = &mut self.transcript {
                t.received(&buf[..n]);
            }
            return Ok(n);
        }
        let n = self.unread().min(buf.len());
        let Some(input) = self.input.as_ref().filter(|_| n > 0) else {
            if self.input_ended {
                return Ok(0);
            }
            return Err(io::ErrorKind::WouldBlock.into());
        };
        buf[..n].copy_from_slice(&input[self.read..self.read + n]);
        self.read += n;
        if self.read == self.filled {
            self.read = 0;
            self.filled = 0;
        }
        Ok(n)
    }
}

impl Write for Channel {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if let Some((s, deadline)) = &self.socket {
            bound(s, *deadline, Timeout::Send)?;
            let n = rustix::net::send(s, buf, rustix::net::SendFlags::NOSIGNAL).map_err(timed_out)?;
            if let Some(t) = &mut self.transcript {
                t.sent(&buf[..n]);
            }
            return Ok(n);
        }
        self.output.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}
