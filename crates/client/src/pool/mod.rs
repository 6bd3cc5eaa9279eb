//! Pools: one volume striped and/or mirrored over several NBD servers, named by a pool file
//! (`pool:PATH`). sluice-pool's coordinator decides everything (where each byte goes, dirty
//! tracking, failure, resync); this module carries its decisions out with tokio: it
//! connects the members, reads their metadata, takes the pool over from a dead
//! coordinator, runs member I/O, wakes the coordinator on time, and reconnects dropped
//! members with backoff.
//!
//! `Client::connect_with` opens a pool like any export, so every user of `Client` can use
//! one; `init`, `status`, `replace` and `grow` are what `sluice pool` does.

mod admin;
mod background;
mod carry;
mod control;
mod control_ask;
mod driver;
mod file;
#[cfg(test)]
mod driver_tests;
#[cfg(test)]
pub(crate) mod fake;
mod found;
mod grow;
mod lease;
pub(crate) mod member;
mod member_client;
mod member_io;
mod open;
mod pump;
mod replace;
pub(crate) mod requests;
mod scrub;
mod scrub_json;
mod session;

pub use admin::{init, load, status, status_and_assembly};
pub use grow::{grow, GrowWhere, Grown};
pub use replace::{add_spare, replace, Copying, Replaced};
pub use control_ask::with_live_scrub;
pub use scrub::scrub;
pub use scrub_json::{report_from_json, report_to_json};
pub(crate) use driver::PoolDriver;
pub(crate) use open::open;
pub use sluice_pool::coordinator::{ScrubRange, ScrubReport};
pub use sluice_pool::{Failure, Layout, MemberState, MemberStatus, Placement, PoolSpec, Replacing, ReshapeStatus, Status};
