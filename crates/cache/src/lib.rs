//! sluice network memory without I/O (issue 29, first part): a cached volume whose blocks
//! live in RAM lent by other nodes (the members), in front of a slower volume (the
//! backing), write-through.
//!
//! The I/O shell is the client library's cache driver (crates/client/src/cache): one task
//! that owns this core, with the backing and the members as NBD connections; `sluice serve`
//! serves a `cache:FILE` volume through it (docs/cache.md).
//!
//! - `config`: the `cache:FILE` file, parsed and checked;
//! - `slot`: what a member holds (a slot is just the block), the page sums a fill computes
//!   and the directory keeps, and the check of the pages a hit reads against them;
//! - `directory`: which member slot holds which block, CLOCK eviction per member, and
//!   rendezvous placement;
//! - `core`: the cache itself (below);
//! - `prefetch`: sequential stream detection; `counters`: what `/metrics` shows;
//!   `ranges`: sets of blocks as ranges; `limits`: every constant, with why.
//!
//! The guarantee: a read never returns data older than the last write acknowledged before
//! it started, whatever the members do (drop pages, restart empty, answer late or never).
//!
//! How a shell drives it: `Cache::new(Params::new(&config, backing_size, random_id))`;
//! `handle_member_up(now, m, member_size / slot_bytes())` for each member that connects;
//! `handle_request` for each validated client request; `poll_action` until `None` after
//! every call, carrying out `Action::Backing` and `Action::Member` operations and
//! reporting them with `handle_backing_done` / `handle_member_done`, sending
//! `Action::Reply`, and on `Action::Reconnect` (or a lost connection, reported with
//! `handle_member_down`) reconnecting after `limits::reconnect_backoff_ms`; and
//! `handle_tick` at `next_timeout()`. Buffers travel by value (a read's reply owns its
//! bytes): simple, at the cost of a copy per block.
//!
//! Choices: a read that covers part of a block is served from the cache if the block is
//! there; if not, the whole block is read from the backing (so it can be filled), at most
//! one block of extra reading at each end. A write, zero or trim invalidates every block
//! it touches, wholly or partly, when it starts (no update in place: the written data is
//! not put into the cache). The core owns no socket, clock or thread; time comes in as
//! nanoseconds. The seeded simulation in `sim` (tests only) drives it against an in-memory
//! backing and members that fail, and checks every read against the acknowledged writes.
#![forbid(unsafe_code)]

pub mod api;
pub mod config;
pub mod core;
pub mod counters;
pub mod directory;
pub mod limits;
pub mod prefetch;
pub mod ranges;
pub mod slot;
#[cfg(test)]
mod sim;

pub use api::{Action, BackingCmd, Failure, MemberCmd, Nanos, OpId, Outcome, Params, ReqId, Request};
pub use config::{CacheFile, Config, Policy, Prefetch};
pub use core::{Cache, Inflight};
pub use counters::Counters;
pub use directory::MemberState;
