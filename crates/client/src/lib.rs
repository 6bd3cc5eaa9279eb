//! An async NBD client (tokio). Connects by NBD URI, negotiates fixed newstyle with
//! structured replies and base:allocation, keeps many requests in flight on each connection
//! with replies matched by handle in any order, and spreads requests over several
//! connections when the server allows multi-conn. With `Options::reconnect`, a connection
//! that drops is re-established with backoff and the requests it cut off are sent again.
//!
//! ```no_run
//! # async fn demo() -> Result<(), sluice_client::Error> {
//! let client = sluice_client::Client::connect("nbd://localhost/disk").await?;
//! let data = client.read_owned(0, vec![0; 4096]).await?;
//! client.write(4096, &data, false).await?;
//! client.flush().await?;
//! # Ok(()) }
//! ```
//!
//! The server is not trusted: every reply chunk is checked against the request it answers
//! (inside its range, no overlap, the whole range covered, sane sizes), and a server that
//! breaks the protocol ends the connection with `Error::Protocol`, never a panic.
//!
//! `nbds://` and `nbds+unix://` connect over TLS (X.509 certificates or pre-shared keys,
//! with libnbd's `tls-*` URI keys; see `Tls`): NBD_OPT_STARTTLS first, and never a
//! plaintext fallback.
//!
//! `pool:PATH` opens a pool (see `pool`): one volume striped and mirrored over the NBD
//! servers a pool file lists, used through the same `Client`; `cache:PATH` opens a cached
//! volume (see `cache`): a volume whose blocks are cached in other nodes' RAM.
#![forbid(unsafe_code)]

pub mod attach;
pub mod cache;
pub mod carry;
mod client;
mod connection;
mod error;
mod export;
mod handshake;
pub mod limits;
mod links;
mod options;
pub mod pool;
pub mod read_buffers;
mod readahead;
mod reconnect;
mod socket;
mod spans;
mod tls;
mod uri;

pub use client::{Client, Extent};
pub use error::Error;
pub use export::Export;
pub use handshake::{list_exports, ExportEntry};
pub use options::{Options, Reconnect};
pub use readahead::Readahead;
pub use tls::{parse_bool, Tls};
pub use uri::{Address, Uri};
