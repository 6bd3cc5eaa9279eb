//! TLS for `nbds://` and `nbds+unix://`, as libnbd does it: X.509 with a directory of
//! certificates (or the system's CA store), or pre-shared keys from a psktool file. The
//! handshake `prepare`s the session (reading its files) before it connects, sends
//! NBD_OPT_STARTTLS first and, once the server agrees, runs TLS over the same socket;
//! everything after goes through it. For `sluice attach`, a session prepared for the
//! kernel records what it exchanges and is then handed to the kernel's TLS (`kernel`).

mod duplex;
mod kernel;
mod psk;
mod recorder;
mod session;
mod settings;
#[cfg(test)]
mod tests;

pub(crate) use duplex::Duplex;
pub(crate) use kernel::hand_to_kernel;
pub(crate) use session::{prepare, prepare_for_kernel, Prepared, TlsStream};
pub use settings::{parse_bool, Tls};
