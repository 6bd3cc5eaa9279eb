//! `sluice attach`: an export as a kernel block device (/dev/nbdN) that rides through
//! server restarts. The handshake runs here, in user space, with this library; the
//! negotiated sockets go to the kernel's nbd driver over netlink; and a guardian stays to
//! give the device fresh sockets (NBD_CMD_RECONFIGURE) whenever its link dies, after
//! checking that the server it reached still serves the same disk. Meanwhile the driver
//! holds I/O for up to the dead-connection timeout instead of failing it.

mod device;
mod guardian;
mod netlink;
mod sockets;
pub mod state;

pub use device::{Nbd, Setup};
pub use guardian::{guard, Event};
pub use sockets::{cap_request_size, open_sockets, setup, AttachOptions, Identity, Sockets};
