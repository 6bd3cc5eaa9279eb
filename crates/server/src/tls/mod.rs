//! TLS on the server: the configuration loaded at start (`context`), the STARTTLS upgrade
//! on the handshake thread over the socket itself (`upgrade`), and then one of two ways to
//! carry records: the kernel's TLS, handed the session's keys as the connection leaves the
//! handshake thread (`handoff`, planned and installed by sluice-ktls from the secrets and
//! the transcript `channel` kept; `ktls` says whether the kernel offers it), or OpenSSL on
//! the worker between the connection's core and the ring (`link`, over the two buffers of
//! `channel`).

mod channel;
mod context;
mod handoff;
pub mod identity;
mod ktls;
mod link;
#[cfg(test)]
mod tests;
mod upgrade;

pub use context::{read_psk_file, TlsServer, TlsSettings};
pub use identity::describe as describe_client;
pub use handoff::{hand_off, Encryption};
pub use ktls::{probe as probe_ktls, Ktls, KtlsMode};
pub use link::{Answer, TlsLink, Wire};
pub use upgrade::{accept, TlsSession};
