//! The engine: io_uring submission and the buffers the kernel reads and writes. All of
//! sluice's `unsafe` lives under this module; everything outside it uses safe ownership-
//! passing interfaces.
#![allow(unsafe_code)]

mod buffer;
mod pipe;
mod ring;

pub use buffer::{Buf, Pool, BUFFER_ALIGN_BYTES};
pub use pipe::{fully_cached, splice_now, Pipe, Pipes};
pub use ring::{Completion, Part, Ring, SendBatch};
