//! Handing a TLS session that OpenSSL negotiated to the kernel's TLS (kTLS), from either
//! end of a connection: the server hands its sessions over as they leave the handshake
//! thread, the client (`sluice attach`) before it gives its socket to the kernel's nbd
//! driver. The keys come from the session's secrets (`secrets`, `keys`), each direction's
//! next sequence number from the records the socket carried, each one checked by
//! decrypting it (`transcript`); `plan` puts the two together and installs them through
//! `sys`, the only `unsafe` here.
#![deny(unsafe_code)]

pub mod keys;
mod limits;
mod plan;
pub mod secrets;
#[allow(unsafe_code)]
pub mod sys;
pub mod transcript;

pub use limits::TRANSCRIPT_MAX_BYTES;
pub use plan::{install, kernel_keys, over_tcp, plan, Half, Plan, Refusal, Side};
pub use transcript::Transcript;
