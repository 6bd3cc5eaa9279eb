//! Backends: where an export's bytes live (a file or block device, RAM, nowhere, a remote
//! server or pool, or a Ceph RBD image). A backend says what it can do (`Caps`) and carries out storage
//! operations, either at once or by submitting them to the worker's ring (or parking them
//! there for another thread), whose completion comes back later. It never sees a client:
//! the transmission core turns requests into operations, and `emulate` fills in what a
//! backend cannot do itself.

pub mod emulate;
mod file;
mod interface;
mod link;
mod links;
mod memory;
mod null;
mod member_links;
#[cfg(feature = "rbd")]
mod rbd;
mod rbd_spec;
mod remote;

pub use file::FileBackend;
pub use interface::{Backend, Caps, Outcome, StorageOp};
pub use memory::{memory, memory_shared, MemorySpec};
pub use null::NullBackend;
#[cfg(feature = "rbd")]
pub use rbd::RbdBackend;
pub use rbd_spec::{RbdAccess, RbdSpec};
pub use remote::RemoteBackend;
