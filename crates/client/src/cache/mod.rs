//! Cached volumes (`cache:PATH`): a slower volume (the backing: an NBD export or a pool)
//! with its blocks cached, write-through, in RAM that other nodes lend (the members: RAM
//! exports such as `nbd://node/ram`). sluice-cache's core decides everything (what hits,
//! what to read from the backing, which slot a block goes to, when a member failed); this
//! module carries its decisions out with tokio: one task owns the core (`shell`), and the
//! backing and member operations it asks for run as tasks of their own that report back
//! to it.
//!
//! `Client::connect_with` opens a cached volume like any export, so every user of `Client`
//! (serve, copy, info, bench, mount) can use one.

mod driver;
mod io;
mod open;
mod shell;
mod status;
#[cfg(test)]
mod tests;

pub(crate) use driver::CacheDriver;
pub(crate) use open::open;
pub use open::load;
pub use sluice_cache::{Config, Counters};
pub use status::{MemberStatus, Status};
