//! sluice's NBD server: exports and backends, the handshake, the transmission core, and
//! the io_uring engine that drives it. `unsafe` is denied everywhere but the `engine` module.
#![deny(unsafe_code)]

pub mod access;
mod admission;
pub mod busy_poll;
pub mod backend;
mod conn;
pub mod elastic;
mod engine;
pub mod errors;
pub mod export;
mod handshake;
pub mod limits;
mod listen;
pub mod metrics;
pub mod qos;
pub mod rfc4514;
pub mod server;
#[cfg(any(test, feature = "sim"))]
pub mod sim;
pub mod tls;
mod worker;

pub use export::{Export, Exports, Spec};
pub use limits::Limits;
pub use listen::{Endpoint, Listener};
pub use server::{Config, Reload, Running, Server, StartError, Stopper};
pub use tls::{TlsServer, TlsSettings};
