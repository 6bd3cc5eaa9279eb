//! sluice network memory without I/O (issue 29, first part): a cached volume whose blocks
//! live in RAM lent by other nodes (the members), in front of a slower volume (the
//! backing), write-through.
//!
//! - `config`: the `cache:FILE` file, parsed and checked;
//! - `slot`: the format of a slot on a member (header page + block), verified on every hit;
//! - `directory`: which member slot holds which block, CLOCK eviction per member, and
//!   rendezvous placement;
//! - `core`: the cache itself: `Cache::handle_*` for requests, completions and member
//!   events, `Cache::poll_action` for the backing and member operations and replies to
//!   carry out;
//! - `prefetch`: sequential stream detection; `counters`: what `/metrics` shows;
//!   `limits`: every constant, with why.
//!
//! The guarantee: a read never returns data older than the last write acknowledged before
//! it started, whatever the members do (drop pages, restart empty, answer late or never).
//!
//! The core owns no socket, clock or thread; time comes in as nanoseconds. The seeded
//! simulation in `sim` (tests only) drives it against an in-memory backing and members
//! that fail, and checks every read against the acknowledged writes.
//!
//! Not wired into the server yet: no `cache:FILE` export spec exists, and nothing outside
//! this crate uses it. The I/O shell (a server backend made of the backing backend and
//! NBD connections to the members, like the pool's) is the next step.
#![forbid(unsafe_code)]

pub mod api;
pub mod config;
pub mod core;
pub mod counters;
pub mod directory;
pub mod limits;
pub mod prefetch;
pub mod slot;
#[cfg(test)]
mod sim;

pub use api::{Action, BackingCmd, Failure, MemberCmd, Nanos, OpId, Outcome, Params, ReqId, Request};
pub use config::{CacheFile, Config, Policy, Prefetch};
pub use core::{Cache, Inflight};
pub use counters::Counters;
pub use directory::MemberState;
