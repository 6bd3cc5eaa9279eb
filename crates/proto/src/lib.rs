//! The NBD protocol as sluice speaks it, without I/O: bytes in, typed events out; typed
//! replies in, bytes out. Spec: NetworkBlockDevice/nbd, doc/proto.md.
#![forbid(unsafe_code)]

pub mod client;
pub mod errno;
pub mod handshake;
pub mod psk;
pub mod limits;
pub mod link;
pub mod reply;
pub mod request;
pub mod rng;
pub mod size;
pub mod wire;

pub use errno::Errno;
pub use handshake::{Catalog, ExportSummary, Handshake, Negotiated, Next, TlsMode};
pub use request::{validate, BadMagic, Command, Range, RawRequest, Refusal, Rejection, Request, Session};
