//! The handshake of one connection, under a deadline: the proto crate's state machine
//! driven over a blocking socket until transmission starts (yielding the session and its
//! export) or the client leaves. After STARTTLS the same loop runs over TLS; the TLS
//! handshake itself runs under the same deadline, and at the end the session is offered
//! to the kernel's TLS.

use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::{Handshake, Next, Session, TlsMode};

use crate::export::{Export, Exports};
use crate::tls::{self, Encryption, TlsServer, TlsSession};

/// A socket whose blocking reads and writes can be given a time limit.
pub trait Timeouts {
    fn set_read_timeout(&self, t: Duration) -> io::Result<()>;
    fn set_write_timeout(&self, t: Duration) -> io::Result<()>;
}

/// What a finished handshake hands to transmission.
pub struct Negotiation {
    pub session: Session,
    pub export: Arc<Export>,
    /// How records are encrypted, when the client started TLS: by the kernel, or by the
    /// TLS session, inside which plaintext the client sent after its last option may
    /// already wait.
    pub tls: Option<Encryption>,
    /// The TLS version and the client's identity, for the log ("TLSv1.3 psk:alice").
    pub tls_client: Option<String>,
}

/// Runs the handshake over `stream` until transmission (Some) or a clean close (None);
/// every read and write, the TLS handshake's included, must finish within `timeout_ms` of
/// the start.
pub fn negotiate<S: Read + Write + Timeouts + AsFd>(
    stream: &mut S,
    exports: &Exports,
    tls: Option<&TlsServer>,
    timeout_ms: u64,
) -> io::Result<Option<Negotiation>> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let mut plain = Bounded { stream, deadline };
    plain.write_all(&Handshake::greeting())?;
    let mut hs = Handshake::with_tls(tls.map_or(TlsMode::Off, |t| t.mode));
    let mut next = Handshake::start();
    // After STARTTLS every byte goes through the session, whose socket reads and writes
    // meet the same deadline.
    let mut session: Option<TlsSession> = None;
    let mut input = Vec::new();
    let mut out = Vec::new();
    loop {
        match next {
            Next::Read(n) => {
                input.resize(n, 0);
                match &mut session {
                    Some(s) => s.read_exact(&mut input)?,
                    None => plain.read_exact(&mut input)?,
                }
                out.clear();
                next = hs.input(&input, exports, &mut out);
                match &mut session {
                    Some(s) => s.write_all(&out)?,
                    None => plain.write_all(&out)?,
                }
            }
            Next::StartTls => {
                let server = tls.expect("the handshake offers STARTTLS only when TLS is configured");
                // The acknowledgement went out in plaintext above; every byte from here on
                // is read by OpenSSL, none by the option parser.
                let socket = plain.stream.as_fd().try_clone_to_owned()?;
                session = Some(tls::accept(server, socket, deadline)?);
                next = hs.tls_started();
            }
            Next::Close { reason } => {
                log::debug!("handshake closed: {reason}");
                return Ok(None);
            }
            Next::Transmission(neg) => {
                let export = Arc::clone(exports.get(&neg.export).expect("the handshake negotiates only exports that exist"));
                let session_state = Session {
                    size: neg.summary.size,
                    flags: neg.flags,
                    structured: neg.structured,
                    extended: neg.extended,
                    base_allocation: neg.base_allocation,
                    payload_max_bytes: REQUEST_PAYLOAD_MAX_BYTES,
                };
                // Before the connection moves on, while nothing else uses its socket.
                let tls_client = session.as_ref().map(|s| tls::describe_client(s.ssl()));
                let tls = match (session, tls) {
                    (Some(s), Some(server)) => Some(tls::hand_off(server, s, plain.stream.as_fd())?),
                    _ => None,
                };
                return Ok(Some(Negotiation { session: session_state, export, tls, tls_client }));
            }
        }
    }
}

/// The plaintext socket, each read and write bounded by what is left until the deadline,
/// so a client that trickles bytes cannot stretch the handshake.
struct Bounded<'a, S> {
    stream: &'a mut S,
    deadline: Instant,
}

impl<S: Timeouts> Bounded<'_, S> {
    fn left(&self) -> io::Result<Duration> {
        let left = self.deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::new(io::ErrorKind::TimedOut, "handshake took too long"))
        } else {
            Ok(left)
        }
    }
}

impl<S: Read + Timeouts> Read for Bounded<'_, S> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        self.stream.set_read_timeout(self.left()?)?;
        self.stream.read(buf)
    }
}

impl<S: Write + Timeouts> Write for Bounded<'_, S> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        self.stream.set_write_timeout(self.left()?)?;
        self.stream.write(buf)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.stream.flush()
    }
}
