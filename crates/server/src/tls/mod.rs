//! TLS on the server: the configuration loaded at start (`context`), the STARTTLS upgrade
//! on the handshake thread over the socket itself (`upgrade`), and records encrypted and
//! decrypted on the worker between the connection's core and the ring (`link`, over the
//! two buffers of `channel`). `ktls` says whether the kernel could take the records over.

mod channel;
mod context;
mod ktls;
mod link;
mod upgrade;

pub use context::{read_psk_file, TlsServer, TlsSettings};
pub use ktls::{probe as probe_ktls, Ktls};
pub use link::{Answer, TlsLink, Wire};
pub use upgrade::{accept, TlsSession};
