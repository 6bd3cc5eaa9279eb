//! sluice's NBD server: exports and backends, the handshake, and the io_uring engine that
//! serves transmission. `unsafe` is denied everywhere but the `engine` module.
#![deny(unsafe_code)]

pub mod backend;
mod buddy;
mod connection;
mod engine;
pub mod errors;
pub mod export;
pub mod limits;
mod listen;
pub mod metrics;
pub mod server;
mod worker;

pub use export::{Export, Exports, Spec};
pub use limits::Limits;
pub use server::{Config, Server, StartError, Stopper};
