//! sluice pools without I/O. A pool is one volume striped and/or mirrored over several NBD
//! servers (its members). This crate holds everything about a pool that is not I/O:
//!
//! - `spec`: the pool file that `pool:PATH` names;
//! - `layout`: where each volume byte lives on the members;
//! - `meta`: the superblock and write-intent bitmap kept on every member;
//! - `coordinator`: the state machine that fans requests out to members, keeps the
//!   write-intent bitmap, declares members missing, and resyncs them when they return.
//!
//! The coordinator owns no socket, buffer or clock: requests and member completions come
//! in through `submit` and `handle`, time through `now` arguments, and what to do next comes
//! out of `poll` as `Action`s. A driver (sluice-client's pool) carries the actions out; the
//! seeded simulation in `sim` carries them out against simulated members.
#![forbid(unsafe_code)]

pub mod coordinator;
pub mod layout;
pub mod limits;
pub mod meta;
pub mod scrub_record;
pub mod spec;
#[cfg(any(test, feature = "sim"))]
pub mod sim;

pub use coordinator::{
    Action, Command, Coordinator, CopyId, Data, Failure, Found, MemberCmd, MemberState, MemberStatus, OpId, OpOutcome, Replacing,
    ReqId, ReshapeStatus, Session, Status,
};
pub use layout::Map;
pub use meta::{Owner, Role, Superblock};
pub use spec::{Layout, Placement, PoolSpec};
