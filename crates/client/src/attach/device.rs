//! Talking to the kernel's nbd driver over generic netlink: connect a device to sockets,
//! give it new ones, disconnect it, ask after it, and hear when its link dies.

use super::netlink::{self as nl, Attrs, Reply};
use crate::error::Error;
use netlink_sys::{protocols::NETLINK_GENERIC, Socket, SocketAddr};
use std::os::fd::{AsRawFd, OwnedFd};

/// What the kernel needs to connect a device, besides its sockets.
#[derive(Clone, Debug)]
pub struct Setup {
    /// None: the kernel picks a free device.
    pub index: Option<u32>,
    pub size: u64,
    pub block_bytes: u64,
    /// The transmission flags as the kernel reads them (read-only, flush, FUA, trim,
    /// multi-conn...).
    pub flags: u16,
    pub timeout_s: u64,
    pub dead_timeout_s: u64,
    /// Shown in /sys/block/nbdN/backend.
    pub backend: String,
}

/// A netlink socket bound to the nbd family.
pub struct Nbd {
    socket: Socket,
    family: u16,
    group: Option<u32>,
    seq: u32,
}

fn kernel(what: &str, e: impl std::fmt::Display) -> Error {
    Error::Kernel(format!("{what}: {e}"))
}

/// The kernel's errno for a request, in words: the nbd driver's own messages go to the
/// kernel log, so point there.
fn refused(what: &str, errno: i32) -> Error {
    let e = std::io::Error::from_raw_os_error(errno);
    let hint = match errno {
        libc::EPERM => " (attaching needs root, or CAP_SYS_ADMIN)",
        libc::EBUSY => " (the device is in use: pick another, or leave it out to get a free one)",
        _ => " (the kernel log says more: dmesg)",
    };
    Error::Kernel(format!("{what}: the kernel refused: {e}{hint}"))
}

fn open_socket() -> Result<Socket, Error> {
    let mut s = Socket::new(NETLINK_GENERIC).map_err(|e| kernel("cannot open a generic netlink socket", e))?;
    s.bind_auto().map_err(|e| kernel("cannot bind a netlink socket", e))?;
    s.connect(&SocketAddr::new(0, 0)).map_err(|e| kernel("cannot address the kernel over netlink", e))?;
    Ok(s)
}

impl Nbd {
    /// Finds the nbd family; its absence means the driver is not loaded.
    pub fn open() -> Result<Nbd, Error> {
        Nbd::open_family(nl::NBD_FAMILY, nl::NBD_MCAST_GROUP)?
            .ok_or_else(|| Error::Kernel("the kernel has no nbd driver loaded (run `modprobe nbd`)".into()))
    }

    /// A socket for family `name` (None: the kernel has no such family) and its multicast
    /// group `group`.
    fn open_family(name: &str, group: &str) -> Result<Option<Nbd>, Error> {
        let mut nbd = Nbd { socket: open_socket()?, family: nl::GENL_ID_CTRL, group: None, seq: 0 };
        let attrs = match nbd.call_raw(nl::GENL_ID_CTRL, nl::CTRL_CMD_GETFAMILY, nl::get_family_attrs(name))? {
            Ok(a) => a,
            Err(libc::ENOENT) => return Ok(None),
            Err(errno) => return Err(refused(&format!("looking up the {name} netlink family"), errno)),
        };
        let (family, group_id) = nl::family_ids(&attrs, group).map_err(|e| kernel("the netlink controller's reply", e))?;
        let kinds: Vec<u16> = attrs.iter().map(|(k, _)| *k).collect();
        log::debug!("netlink family {name}: id {family}, group {group}: {group_id:?} (the controller sent attributes {kinds:?})");
        let group = group_id;
        nbd.family = family;
        nbd.group = group;
        Ok(Some(nbd))
    }

    /// Sends one request and waits for its acknowledgement: the attributes of its reply
    /// message, if it had one, or the errno the kernel refused it with.
    fn call_raw(&mut self, family: u16, command: u8, attrs: Attrs) -> Result<Result<nl::Attributes, i32>, Error> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let msg = nl::request(family, command, seq, attrs);
        self.socket.send(&msg, 0).map_err(|e| kernel("cannot send to the kernel", e))?;
        let mut answer = Vec::new();
        loop {
            let (buf, _) = self.socket.recv_from_full().map_err(|e| kernel("cannot read the kernel's answer", e))?;
            for reply in nl::parse(&buf).map_err(|e| kernel("a malformed answer from the kernel", e))? {
                match reply {
                    Reply::Message { seq: s, attrs, .. } if s == seq => answer = attrs,
                    Reply::Ack { seq: s, errno: 0 } if s == seq => return Ok(Ok(answer)),
                    Reply::Ack { seq: s, errno } if s == seq => return Ok(Err(errno)),
                    _ => {}
                }
            }
        }
    }

    fn call(&mut self, what: &str, command: u8, attrs: Attrs) -> Result<nl::Attributes, Error> {
        let family = self.family;
        self.call_raw(family, command, attrs)?.map_err(|errno| refused(what, errno))
    }

    /// Connects a device to `sockets`; its index.
    pub fn connect(&mut self, setup: &Setup, sockets: &[OwnedFd]) -> Result<u32, Error> {
        let fds: Vec<i32> = sockets.iter().map(|s| s.as_raw_fd()).collect();
        let mut a = Attrs::default()
            .u64(nl::NBD_ATTR_SIZE_BYTES, setup.size)
            .u64(nl::NBD_ATTR_BLOCK_SIZE_BYTES, setup.block_bytes)
            .u64(nl::NBD_ATTR_SERVER_FLAGS, setup.flags as u64)
            .u64(nl::NBD_ATTR_TIMEOUT, setup.timeout_s)
            .u64(nl::NBD_ATTR_DEAD_CONN_TIMEOUT, setup.dead_timeout_s)
            .str(nl::NBD_ATTR_BACKEND_IDENTIFIER, &setup.backend)
            .sockets(&fds);
        if let Some(i) = setup.index {
            a = a.u32(nl::NBD_ATTR_INDEX, i);
        }
        let what = match setup.index {
            Some(i) => format!("connecting /dev/nbd{i}"),
            None => "connecting a free nbd device".to_owned(),
        };
        let reply = self.call(&what, nl::NBD_CMD_CONNECT, a)?;
        match (nl::get_u32(&reply, nl::NBD_ATTR_INDEX), setup.index) {
            (Some(i), _) | (None, Some(i)) => Ok(i),
            (None, None) => Err(Error::Kernel("the kernel connected a device but did not say which".into())),
        }
    }

    /// Gives device `index` new sockets in place of its dead ones; requests waiting for a
    /// connection go out on them. `backend` must be what the device was connected with:
    /// the kernel refuses a reconfiguration that does not name it.
    pub fn reconfigure(&mut self, index: u32, backend: &str, sockets: &[OwnedFd]) -> Result<(), Error> {
        let fds: Vec<i32> = sockets.iter().map(|s| s.as_raw_fd()).collect();
        let a = Attrs::default().u32(nl::NBD_ATTR_INDEX, index).str(nl::NBD_ATTR_BACKEND_IDENTIFIER, backend).sockets(&fds);
        self.call(&format!("reconnecting /dev/nbd{index}"), nl::NBD_CMD_RECONFIGURE, a).map(drop)
    }

    pub fn disconnect(&mut self, index: u32) -> Result<(), Error> {
        let a = Attrs::default().u32(nl::NBD_ATTR_INDEX, index);
        self.call(&format!("disconnecting /dev/nbd{index}"), nl::NBD_CMD_DISCONNECT, a).map(drop)
    }

    /// Whether device `index` is connected (None: there is no such device).
    pub fn connected(&mut self, index: u32) -> Result<Option<bool>, Error> {
        let a = Attrs::default().u32(nl::NBD_ATTR_INDEX, index);
        let reply = self.call(&format!("asking after /dev/nbd{index}"), nl::NBD_CMD_STATUS, a)?;
        let devices = nl::devices(&reply).map_err(|e| kernel("the kernel's device list", e))?;
        Ok(devices.into_iter().find(|(i, _)| *i == index).map(|(_, c)| c))
    }

    /// A socket that hears the driver's link-dead notifications.
    pub fn watch(&self) -> Result<Watch, Error> {
        let group = self.group.ok_or_else(|| Error::Kernel("the nbd driver has no multicast group for link-dead notices".into()))?;
        let s = open_socket()?;
        s.add_membership(group).map_err(|e| kernel("cannot join the nbd driver's multicast group", e))?;
        Ok(Watch(s))
    }
}

/// Hears NBD_CMD_LINK_DEAD.
pub struct Watch(Socket);

impl Watch {
    /// Blocks until a notice arrives; the indexes of the devices whose link died.
    pub fn next(&self) -> Result<Vec<u32>, Error> {
        loop {
            let (buf, _) = self.0.recv_from_full().map_err(|e| kernel("cannot read the nbd driver's notices", e))?;
            let dead: Vec<u32> = nl::parse(&buf)
                .map_err(|e| kernel("a malformed notice from the kernel", e))?
                .into_iter()
                .filter_map(|r| match r {
                    Reply::Message { command: nl::NBD_CMD_LINK_DEAD, attrs, .. } => nl::get_u32(&attrs, nl::NBD_ATTR_INDEX),
                    _ => None,
                })
                .collect();
            if !dead.is_empty() {
                return Ok(dead);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The controller names itself and its one multicast group on any Linux kernel: the
    /// lookup that finds the nbd driver's family and group, checked where there is no nbd.
    #[test]
    fn the_controller_finds_a_family_and_its_group() {
        let ctrl = Nbd::open_family("nlctrl", "notify").unwrap().expect("the nlctrl family");
        assert_eq!(ctrl.family, nl::GENL_ID_CTRL);
        assert!(ctrl.group.is_some(), "no multicast group found for nlctrl");
        assert!(Nbd::open_family("no-such-family", "x").unwrap().is_none());
    }
}
