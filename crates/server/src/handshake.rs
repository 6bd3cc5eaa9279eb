//! The handshake of one connection, under a deadline: the proto crate's state machine
//! driven over a blocking socket until transmission starts (yielding the session and its
//! export) or the client leaves. After STARTTLS the same loop runs over TLS; the TLS
//! handshake itself runs under the same deadline, and at the end the session is offered
//! to the kernel's TLS. The client sees only the exports the access rules give it.

use std::cell::RefCell;
use std::io::{self, Read, Write};
use std::os::fd::AsFd;
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::{Catalog, ExportSummary, Handshake, Next, Session, TlsMode};

use crate::access::{Access, Client, Grant};
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

/// The exports as one client may see them: an export the rules refuse it does not exist
/// (UNKNOWN to INFO and GO, absent from LIST), and one they give it read-only is offered
/// read-only. What the client is grows when TLS starts.
pub struct Visible<'a> {
    exports: &'a Exports,
    access: &'a Access,
    client: RefCell<Client>,
    /// The first export this client asked for and was refused, for the log.
    refused: RefCell<Option<String>>,
}

impl<'a> Visible<'a> {
    pub fn new(exports: &'a Exports, access: &'a Access, client: Client) -> Visible<'a> {
        Visible { exports, access, client: RefCell::new(client), refused: RefCell::default() }
    }

    /// The first export the rules refused this client, if any was asked for.
    pub fn refused(&self) -> Option<String> {
        self.refused.borrow().clone()
    }

    /// What is known of the client now (its TLS identity too, once it started TLS).
    pub fn client(&self) -> Client {
        self.client.borrow().clone()
    }

    fn grant(&self, name: &str) -> Grant {
        self.access.grant(name, &self.client.borrow())
    }
}

impl Catalog for Visible<'_> {
    fn lookup(&self, name: &str) -> Option<ExportSummary> {
        let export = self.exports.get(name)?;
        match self.grant(name) {
            Grant::Refused => {
                self.refused.borrow_mut().get_or_insert_with(|| name.to_owned());
                None
            }
            Grant::ReadOnly => Some(export.summary_for(true)),
            Grant::ReadWrite => Some(export.summary()),
        }
    }

    fn list(&self) -> Vec<(String, Option<String>)> {
        let visible = self.exports.iter().filter(|e| self.grant(&e.name) != Grant::Refused);
        visible.map(|e| (e.name.clone(), e.description.clone())).collect()
    }
}

/// Runs the handshake over `stream` until transmission (Some) or a clean close (None);
/// every read and write, the TLS handshake's included, must finish within `timeout_ms` of
/// the start.
pub fn negotiate<S: Read + Write + Timeouts + AsFd>(
    stream: &mut S,
    exports: &Visible,
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
                let started = tls::accept(server, socket, deadline)?;
                tls::identity::learn(started.ssl(), &mut exports.client.borrow_mut());
                session = Some(started);
                next = hs.tls_started();
            }
            Next::Close { reason } => {
                log::debug!("handshake closed: {reason}");
                return Ok(None);
            }
            Next::Transmission(neg) => {
                let export = Arc::clone(exports.exports.get(&neg.export).expect("the handshake negotiates only exports that exist"));
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
