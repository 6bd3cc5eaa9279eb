//! TLS for `nbds://` and `nbds+unix://`, as libnbd does it: X.509 with a directory of
//! certificates (or the system's CA store), or pre-shared keys from a psktool file. The
//! handshake `prepare`s the session (reading its files) before it connects, sends
//! NBD_OPT_STARTTLS first and, once the server agrees, runs TLS over the same socket;
//! everything after goes through it.

mod psk;
mod session;
mod settings;

pub(crate) use session::{prepare, Duplex, Prepared, TlsStream};
pub use settings::{parse_bool, Tls};
