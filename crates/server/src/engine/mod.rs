//! The engine: io_uring submission, typed operation ids, the buffers and pipes the kernel
//! reads and writes, the mailbox through which other threads complete operations
//! parked in the ring, and the socket options that hand TLS keys to the kernel. All of
//! sluice's `unsafe` lives under this module; everything outside it uses safe
//! ownership-passing interfaces.
#![allow(unsafe_code)]

mod buddy;
mod buffer;
mod mailbox;
mod op;
mod pipe;
#[cfg(feature = "rbd")]
mod rbd;
mod ring;
mod ring_links;
mod send;
mod socket;

pub use buffer::{Buf, BufferStats, Pool, BUFFER_ALIGN_BYTES};
pub use mailbox::{Completer, Payload};
pub use op::{CarriedEnd, Completion, ConnId, Held, LinkEnd, LinkIo, LinkOp, StorageId, Tag, Token};
pub use pipe::{drain_into, fully_cached, splice_in_now, splice_now, splice_out_now, write_into, Pipe, Pipes, SpliceIn};
#[cfg(feature = "rbd")]
pub use rbd::{Image as RbdImage, IoCtx as RbdIoCtx, Rados};
pub use ring::Ring;
pub use send::{Part, SendBatch};
pub use socket::{inherited_listen_fds, unacked_bytes};
