//! sluice load restriction without I/O (issue 27): QoS classes, token buckets, and a
//! scheduler in the mClock family that decides which held request may go to storage now.
//!
//! - `class`: the `[qos.NAME]` tables and the server-wide `[limits]` storage caps, parsed
//!   and checked;
//! - `bucket`: exact-integer token buckets (limits) and reservation credit;
//! - `sched`: the scheduler itself: `attach` a connection to its class instance, `submit`
//!   requests (start now, or held), `poll` for held ones that may start, `next_wake` for
//!   the caller's timer, `finished`, `remove`, `reconfigure`.
//!
//! What the classes get, under contention: first each class's reservation (mClock's
//! reservation phase, most-behind first), then shares of the rest by weight, never past a
//! class's limits or the server-wide caps. As in mClock (and Ceph's dmClock), requests
//! served for a reservation count towards the class's share too, and requests served by
//! weight do not use up its reservation: a class gets about the larger of the two.
//!
//! Cost: limits count what they name (operations or bytes, each its own bucket). Weights
//! share one number per request, one operation plus its bytes in operations of
//! `storage-bps / storage-iops` bytes (the device the operator described), else of 64 KiB:
//! a 1 MiB request then costs 17 and a 4 KiB one 1.06, so a tenant of large requests and
//! one of small ones share the device's time rather than its request count or its bytes.
//!
//! The scheduler owns no socket, clock or thread: time comes in as nanoseconds since an
//! origin of the caller's choosing. The seeded simulation in `sim` (tests only) drives it
//! against simulated storage and checks its promises after every step.
//!
//! The server uses it through `sluice_server::qos` (one scheduler for all workers, with
//! their mailboxes) and its connection core's `conn/hold.rs`: requests are held after
//! validation and before storage, and held requests still count against the
//! connection's budgets.
#![forbid(unsafe_code)]

pub mod bucket;
pub mod class;
pub mod limits;
pub mod request;
pub mod sched;
#[cfg(test)]
mod sim;

pub use class::{Class, Limits};
pub use request::{Id, Nanos, Op, Verdict};
pub use sched::{ConfigError, Handle, InstanceStats, Scheduler};
