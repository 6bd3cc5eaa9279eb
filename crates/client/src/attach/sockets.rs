//! What attaching asks of the server and tells the kernel: sockets negotiated for the
//! kernel's driver, the export's identity that every later connection must match, and the
//! device's setup.

use super::device::Setup;
use crate::error::Error;
use crate::export::Export;
use crate::handshake::open_for_kernel;
use crate::limits::{CONNECTIONS_MAX, CONNECT_TIMEOUT_MS};
use crate::socket::Socket;
use crate::uri::Uri;
use sluice_proto::wire::{FLAG_CAN_MULTI_CONN, FLAG_READ_ONLY, FLAG_SEND_FLUSH, FLAG_SEND_FUA, FLAG_SEND_TRIM};
use std::os::fd::OwnedFd;
use std::time::Duration;

/// The kernel's logical block size bounds: a sector, and a page.
const KERNEL_BLOCK_MIN_BYTES: u64 = 512;
const KERNEL_BLOCK_MAX_BYTES: u64 = 4096;

/// What `sluice attach` was asked for.
#[derive(Clone, Debug)]
pub struct AttachOptions {
    pub uri: Uri,
    /// /dev/nbdN's N, or None for any free device.
    pub device: Option<u32>,
    /// Connections asked for; more than one only when the export allows multi-conn.
    pub connections: usize,
    /// The kernel's per-request timeout: a request unanswered this long is sent again on
    /// a live connection (or waits for one).
    pub timeout_s: u64,
    /// How long I/O waits for a reconnection before it fails.
    pub dead_timeout_s: u64,
    pub read_only: bool,
}

/// What the first handshake found: later ones must find the same.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Identity {
    pub size: u64,
    /// What the server says the export is (sluice servers), if it says.
    pub id: Option<String>,
    pub read_only: bool,
    /// The transmission flags: the kernel goes on sending what they allowed.
    pub flags: u16,
}

impl Identity {
    fn of(export: &Export, id: Option<String>) -> Identity {
        Identity { size: export.size, id, read_only: export.read_only(), flags: export.flags }
    }

    /// Why `now` is not the export attached first, if it is not.
    pub fn differs(&self, now: &Identity) -> Option<String> {
        if now.size != self.size {
            return Some(format!("the export's size changed from {} to {} bytes", self.size, now.size));
        }
        match (&self.id, &now.id) {
            (Some(a), Some(b)) if a != b => return Some(format!("the server serves another disk under this name now (identity {b}, was {a})")),
            (Some(_), None) => return Some("the server no longer says which disk it serves under this name (it is not the sluice that was attached)".into()),
            _ => {}
        }
        if now.read_only && !self.read_only {
            return Some("the export is read-only now".into());
        }
        for (flag, what) in [(FLAG_SEND_FLUSH, "flush"), (FLAG_SEND_FUA, "FUA"), (FLAG_SEND_TRIM, "trim")] {
            if self.flags & flag != 0 && now.flags & flag == 0 {
                return Some(format!("the export no longer takes {what}, which the kernel goes on sending"));
            }
        }
        None
    }
}

/// Negotiated sockets for the kernel, and what they lead to.
pub struct Sockets {
    pub export: Export,
    pub identity: Identity,
    pub fds: Vec<OwnedFd>,
}

/// Opens `wanted` connections to the export (one when the server does not allow
/// multi-conn), each ready for the kernel.
pub async fn open_sockets(uri: &Uri, wanted: usize) -> Result<Sockets, Error> {
    let timeout = Duration::from_millis(CONNECT_TIMEOUT_MS);
    let first = open_for_kernel(uri, timeout).await?;
    let identity = Identity::of(&first.export, first.identity);
    let export = first.export;
    let n = if export.flags & FLAG_CAN_MULTI_CONN != 0 { wanted.clamp(1, CONNECTIONS_MAX) } else { 1 };
    let mut fds = vec![into_fd(first.socket)?];
    while fds.len() < n {
        let more = open_for_kernel(uri, timeout).await?;
        let theirs = Identity::of(&more.export, more.identity);
        if let Some(why) = identity.differs(&theirs) {
            return Err(Error::Refused(format!("connection {} reached another export than the first: {why}", fds.len() + 1)));
        }
        fds.push(into_fd(more.socket)?);
    }
    Ok(Sockets { export, identity, fds })
}

/// The socket's descriptor, with a TLS session's keys handed to the kernel first.
fn into_fd(socket: Socket) -> Result<OwnedFd, Error> {
    match socket {
        Socket::Tls(stream) => crate::tls::hand_to_kernel(*stream),
        plain => Ok(plain.into_plain_fd()?),
    }
}

/// The kernel's view of the export: its size, block size and flags.
pub fn setup(options: &AttachOptions, export: &Export) -> Result<Setup, Error> {
    let block = (export.block_min as u64).max(KERNEL_BLOCK_MIN_BYTES).next_power_of_two();
    if block > KERNEL_BLOCK_MAX_BYTES {
        return Err(Error::Refused(format!(
            "the export wants blocks of at least {} bytes; the kernel's nbd driver takes at most {KERNEL_BLOCK_MAX_BYTES}",
            export.block_min
        )));
    }
    if export.size < block {
        return Err(Error::Refused(format!("the export has {} bytes, less than one {block}-byte block", export.size)));
    }
    let mut flags = export.flags;
    if options.read_only {
        flags |= FLAG_READ_ONLY;
    }
    Ok(Setup {
        index: options.device,
        size: export.size,
        block_bytes: block,
        flags,
        timeout_s: options.timeout_s,
        dead_timeout_s: options.dead_timeout_s,
        backend: backend(options),
    })
}

/// The kernel sends requests up to the device's `max_sectors_kb` (128 KiB unless raised,
/// 32 MiB at most): kept within the export's largest request, as the server asked.
pub fn cap_request_size(index: u32, block_max: u32) -> Result<(), Error> {
    let path = format!("/sys/block/nbd{index}/queue/max_sectors_kb");
    let current: u64 = std::fs::read_to_string(&path).ok().and_then(|s| s.trim().parse().ok()).unwrap_or(u64::MAX);
    let allowed = (block_max as u64 / 1024).max(KERNEL_BLOCK_MAX_BYTES / 1024);
    if current <= allowed {
        return Ok(());
    }
    std::fs::write(&path, allowed.to_string())
        .map_err(|e| Error::Kernel(format!("cannot keep /dev/nbd{index}'s requests within the export's {block_max} bytes ({path}: {e})")))
}

/// What names the device's backend to the kernel (/sys/block/nbdN/backend): the URI.
pub(super) fn backend(options: &AttachOptions) -> String {
    options.uri.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(size: u64, id: Option<&str>, read_only: bool) -> Identity {
        Identity { size, id: id.map(str::to_owned), read_only, flags: FLAG_SEND_FLUSH | FLAG_SEND_TRIM }
    }

    #[test]
    fn the_same_disk_is_the_same_size_identity_and_writability() {
        let first = id(1 << 30, Some("ab"), false);
        assert_eq!(first.differs(&first.clone()), None);
        assert!(first.differs(&id(1 << 29, Some("ab"), false)).unwrap().contains("size changed"));
        assert!(first.differs(&id(1 << 30, Some("cd"), false)).unwrap().contains("another disk"));
        assert!(first.differs(&id(1 << 30, None, false)).unwrap().contains("no longer says"));
        assert!(first.differs(&id(1 << 30, Some("ab"), true)).unwrap().contains("read-only now"));
        let no_trim = Identity { flags: FLAG_SEND_FLUSH, ..first.clone() };
        assert!(first.differs(&no_trim).unwrap().contains("no longer takes trim"));
        assert_eq!(no_trim.differs(&first), None, "gaining a command is no danger");
        // A server that never named its disk is judged by size alone; one that turns
        // writable is no danger.
        assert_eq!(id(4096, None, true).differs(&id(4096, Some("x"), false)), None);
    }
}
