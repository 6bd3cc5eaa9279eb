use std::sync::Arc;

/// Everything a client call can fail with. `Server` is a request the server refused or
/// failed; `Protocol` is a server that broke the protocol (the connection is closed).
#[derive(Clone, Debug)]
pub enum Error {
    /// The URI does not parse or asks for something unsupported.
    Uri(String),
    /// Connecting, or the connection failed.
    Io(Arc<std::io::Error>),
    /// The handshake did not finish in time.
    Timeout,
    /// The server has no export by this name.
    UnknownExport(String),
    /// An option the client needs was refused; the text says which and why.
    Refused(String),
    /// The server broke the protocol; the connection is closed.
    Protocol(String),
    /// The server answered the request with an error.
    Server { errno: u32, message: Option<String> },
    /// A write, trim or zero to a read-only export; nothing was sent.
    ReadOnly,
    /// The export does not support this command; nothing was sent.
    Unsupported(&'static str),
    /// The request reaches past the end of the export; nothing was sent.
    OutOfRange { offset: u64, len: u64, size: u64 },
    /// A write or zero that does not start and end on the export's minimum block size,
    /// which the server asked clients to keep to; nothing was sent.
    Unaligned { offset: u64, len: u64, block: u32 },
    /// The connection is closed (by us, or earlier after an error).
    Closed,
    /// The connection dropped and the client gave it up (see `Reconnect`): it could not be
    /// re-established in time, it came back to a different export, or this request kept
    /// losing its connection. `why` says which.
    Disconnected { why: String },
    /// The connection dropped during a flush, or with writes acknowledged that no flush had
    /// yet covered: those writes may not be durable, since the server may have gone down
    /// with them in its cache. The caller should write them again and flush. Said once per
    /// loss; the next flush is an ordinary one.
    DurabilityLost,
    /// TLS was asked for (`nbds://`) and could not be had: the server does not offer it,
    /// or the TLS handshake failed (a certificate from an unknown CA or for another host,
    /// a wrong key). Also a plaintext connection to a server that requires TLS. Never
    /// followed by a plaintext attempt.
    Tls(String),
    /// The local TLS setup is unusable: a certificates directory or PSK file that is
    /// missing, unreadable or malformed, or no PSK identity. The text names the file.
    TlsConfig(String),
    /// A pool (`pool:PATH`) cannot be opened: its file is bad, or a member cannot be
    /// reached or read. The text names the file or the member.
    Pool(String),
    /// A cached volume (`cache:PATH`) cannot be opened: its file is bad, or its backing
    /// cannot be reached. The text names the file and the key or the backing.
    Cache(String),
    /// The kernel's nbd driver is missing or refused a request (`attach`): the text says
    /// which and why.
    Kernel(String),
}

impl Error {
    pub(crate) fn io(e: std::io::Error) -> Error {
        Error::Io(Arc::new(e))
    }

    /// The errno name for a `Server` error, as the spec numbers them.
    pub fn errno_name(code: u32) -> &'static str {
        match sluice_proto::Errno::from_code(code) {
            Some(e) => e.name(),
            None => "OK",
        }
    }
}

impl std::fmt::Display for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Error::Uri(m) => write!(f, "bad NBD URI: {m}"),
            Error::Io(e) => write!(f, "{e}"),
            Error::Timeout => write!(f, "timed out connecting to the server"),
            Error::UnknownExport(name) => write!(f, "the server has no export named {name:?}"),
            Error::Refused(m) => write!(f, "{m}"),
            Error::Protocol(m) => write!(f, "protocol error from the server: {m}"),
            Error::Server { errno, message: Some(m) } => write!(f, "server error {}: {m}", Error::errno_name(*errno)),
            Error::Server { errno, message: None } => write!(f, "server error {}", Error::errno_name(*errno)),
            Error::ReadOnly => write!(f, "the export is read-only"),
            Error::Unsupported(what) => write!(f, "the export does not support {what}"),
            Error::OutOfRange { offset, len, size } => {
                write!(f, "request at offset {offset} of {len} bytes reaches past the end of the export ({size} bytes)")
            }
            Error::Unaligned { offset, len, block } => {
                write!(f, "request at offset {offset} of {len} bytes is not aligned to the export's {block}-byte blocks")
            }
            Error::Closed => write!(f, "the connection is closed"),
            Error::Disconnected { why } => write!(f, "lost the connection to the server: {why}"),
            Error::DurabilityLost => write!(
                f,
                "the connection to the server was lost before a flush: writes acknowledged before it may not be durable (write them again, then flush)"
            ),
            Error::Tls(m) => write!(f, "TLS: {m}"),
            Error::TlsConfig(m) => write!(f, "TLS setup: {m}"),
            Error::Pool(m) | Error::Cache(m) => write!(f, "{m}"),
            Error::Kernel(m) => write!(f, "{m}"),
        }
    }
}

impl std::error::Error for Error {}

impl From<std::io::Error> for Error {
    fn from(e: std::io::Error) -> Error {
        Error::io(e)
    }
}

impl From<sluice_proto::client::Malformed> for Error {
    fn from(e: sluice_proto::client::Malformed) -> Error {
        Error::Protocol(e.0)
    }
}
