//! The generic-netlink messages of the kernel's nbd driver (linux/nbd-netlink.h), and the
//! controller messages that find its family: bytes out, typed replies in, no sockets.
//!
//! A message is a netlink header (length, type = family id, flags, sequence, port), a
//! generic-netlink header (command, version), then attributes: each a 16-bit length and
//! type, its payload, padded to 4 bytes. Nested attributes hold attributes.

/// The controller family, always at this id: it names the others.
pub const GENL_ID_CTRL: u16 = 0x10;
pub const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const CTRL_ATTR_MCAST_GROUPS: u16 = 7;
const CTRL_ATTR_MCAST_GRP_NAME: u16 = 1;
const CTRL_ATTR_MCAST_GRP_ID: u16 = 2;

pub const NBD_FAMILY: &str = "nbd";
pub const NBD_MCAST_GROUP: &str = "nbd_mc_group";
const NBD_GENL_VERSION: u8 = 1;

pub const NBD_CMD_CONNECT: u8 = 1;
pub const NBD_CMD_DISCONNECT: u8 = 2;
pub const NBD_CMD_RECONFIGURE: u8 = 3;
pub const NBD_CMD_LINK_DEAD: u8 = 4;
pub const NBD_CMD_STATUS: u8 = 5;

pub const NBD_ATTR_INDEX: u16 = 1;
pub const NBD_ATTR_SIZE_BYTES: u16 = 2;
pub const NBD_ATTR_BLOCK_SIZE_BYTES: u16 = 3;
pub const NBD_ATTR_TIMEOUT: u16 = 4;
pub const NBD_ATTR_SERVER_FLAGS: u16 = 5;
pub const NBD_ATTR_SOCKETS: u16 = 7;
pub const NBD_ATTR_DEAD_CONN_TIMEOUT: u16 = 8;
pub const NBD_ATTR_DEVICE_LIST: u16 = 9;
pub const NBD_ATTR_BACKEND_IDENTIFIER: u16 = 10;
const NBD_SOCK_ITEM: u16 = 1;
const NBD_SOCK_FD: u16 = 1;
const NBD_DEVICE_ITEM: u16 = 1;
const NBD_DEVICE_INDEX: u16 = 1;
const NBD_DEVICE_CONNECTED: u16 = 2;

const NLMSG_ERROR: u16 = 2;
const NLMSG_DONE: u16 = 3;
pub const NLM_F_REQUEST: u16 = 1;
pub const NLM_F_ACK: u16 = 4;
const NLMSG_HDR_BYTES: usize = 16;
const GENL_HDR_BYTES: usize = 4;
const NLA_HDR_BYTES: usize = 4;
/// Nested attributes carry this bit in their type, as the kernel's own messages do (its
/// strict parsers refuse nesting without it; the nbd family's are lenient either way).
const NLA_F_NESTED: u16 = 0x8000;
/// The type without the flag bits.
const NLA_TYPE_MASK: u16 = 0x3fff;

fn align4(n: usize) -> usize {
    (n + 3) & !3
}

/// Attributes, appended in order.
#[derive(Default)]
pub struct Attrs(Vec<u8>);

impl Attrs {
    pub fn bytes(mut self, kind: u16, payload: &[u8]) -> Attrs {
        let len = NLA_HDR_BYTES + payload.len();
        self.0.extend_from_slice(&(len as u16).to_ne_bytes());
        self.0.extend_from_slice(&kind.to_ne_bytes());
        self.0.extend_from_slice(payload);
        self.0.resize(align4(self.0.len()), 0);
        self
    }

    pub fn u32(self, kind: u16, v: u32) -> Attrs {
        self.bytes(kind, &v.to_ne_bytes())
    }

    pub fn u64(self, kind: u16, v: u64) -> Attrs {
        self.bytes(kind, &v.to_ne_bytes())
    }

    /// A NUL-terminated string, as the kernel's NLA_STRING policy takes it.
    pub fn str(self, kind: u16, s: &str) -> Attrs {
        let mut b = s.as_bytes().to_vec();
        b.push(0);
        self.bytes(kind, &b)
    }

    pub fn nested(self, kind: u16, inner: Attrs) -> Attrs {
        self.bytes(kind | NLA_F_NESTED, &inner.0)
    }

    /// NBD_ATTR_SOCKETS with one item per descriptor.
    pub fn sockets(self, fds: &[i32]) -> Attrs {
        let items = fds.iter().fold(Attrs::default(), |a, &fd| a.nested(NBD_SOCK_ITEM, Attrs::default().u32(NBD_SOCK_FD, fd as u32)));
        self.nested(NBD_ATTR_SOCKETS, items)
    }
}

/// One request to `family`, asking for an acknowledgement.
pub fn request(family: u16, command: u8, seq: u32, attrs: Attrs) -> Vec<u8> {
    let version = if family == GENL_ID_CTRL { 2 } else { NBD_GENL_VERSION };
    let len = NLMSG_HDR_BYTES + GENL_HDR_BYTES + attrs.0.len();
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&(NLM_F_REQUEST | NLM_F_ACK).to_ne_bytes());
    m.extend_from_slice(&seq.to_ne_bytes());
    m.extend_from_slice(&0u32.to_ne_bytes());
    m.extend_from_slice(&[command, version, 0, 0]);
    m.extend_from_slice(&attrs.0);
    m
}

/// The controller's question (CTRL_CMD_GETFAMILY): what is `name`'s family id, and its
/// multicast groups?
pub fn get_family_attrs(name: &str) -> Attrs {
    Attrs::default().str(CTRL_ATTR_FAMILY_NAME, name)
}

/// Attributes as (type, payload), in the order they came.
pub type Attributes = Vec<(u16, Vec<u8>)>;

/// A message the kernel sent.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// An acknowledgement (errno 0) or a refusal (a positive errno), for request `seq`.
    Ack { seq: u32, errno: i32 },
    Done { seq: u32 },
    /// A generic-netlink message: a reply to `seq`, or (seq 0) a notification.
    Message { seq: u32, command: u8, attrs: Attributes },
}

/// Every message in one datagram; an error for a malformed one (the kernel's: a bug).
pub fn parse(mut buf: &[u8]) -> Result<Vec<Reply>, String> {
    let mut out = Vec::new();
    while buf.len() >= NLMSG_HDR_BYTES {
        let len = u32::from_ne_bytes(buf[0..4].try_into().unwrap()) as usize;
        if len < NLMSG_HDR_BYTES || len > buf.len() {
            return Err(format!("a netlink message of {len} bytes in {} bytes", buf.len()));
        }
        let kind = u16::from_ne_bytes(buf[4..6].try_into().unwrap());
        let seq = u32::from_ne_bytes(buf[8..12].try_into().unwrap());
        let body = &buf[NLMSG_HDR_BYTES..len];
        out.push(match kind {
            NLMSG_ERROR if body.len() >= 4 => Reply::Ack { seq, errno: -i32::from_ne_bytes(body[0..4].try_into().unwrap()) },
            NLMSG_DONE => Reply::Done { seq },
            _ if body.len() >= GENL_HDR_BYTES => Reply::Message { seq, command: body[0], attrs: attributes(&body[GENL_HDR_BYTES..])? },
            _ => return Err(format!("a netlink message of type {kind} too short for its header")),
        });
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

/// The attributes in `buf`, as (type, payload).
pub fn attributes(mut buf: &[u8]) -> Result<Attributes, String> {
    let mut out = Vec::new();
    while buf.len() >= NLA_HDR_BYTES {
        let len = u16::from_ne_bytes([buf[0], buf[1]]) as usize;
        if len < NLA_HDR_BYTES || len > buf.len() {
            return Err(format!("an attribute of {len} bytes in {} bytes", buf.len()));
        }
        let kind = u16::from_ne_bytes([buf[2], buf[3]]) & NLA_TYPE_MASK;
        out.push((kind, buf[NLA_HDR_BYTES..len].to_vec()));
        buf = &buf[align4(len).min(buf.len())..];
    }
    Ok(out)
}

fn find(attrs: &[(u16, Vec<u8>)], kind: u16) -> Option<&[u8]> {
    attrs.iter().find(|(k, _)| *k == kind).map(|(_, v)| v.as_slice())
}

pub fn get_u32(attrs: &[(u16, Vec<u8>)], kind: u16) -> Option<u32> {
    find(attrs, kind).and_then(|v| Some(u32::from_ne_bytes(v.get(..4)?.try_into().ok()?)))
}

fn get_u16(attrs: &[(u16, Vec<u8>)], kind: u16) -> Option<u16> {
    find(attrs, kind).and_then(|v| Some(u16::from_ne_bytes(v.get(..2)?.try_into().ok()?)))
}

fn get_str(attrs: &[(u16, Vec<u8>)], kind: u16) -> Option<String> {
    find(attrs, kind).map(|v| String::from_utf8_lossy(v.split(|&b| b == 0).next().unwrap_or(&[])).into_owned())
}

/// From the controller's reply: the family id and the id of multicast group `group`.
pub fn family_ids(attrs: &[(u16, Vec<u8>)], group: &str) -> Result<(u16, Option<u32>), String> {
    let id = get_u16(attrs, CTRL_ATTR_FAMILY_ID).ok_or("the controller's reply names no family id")?;
    let mut mcast = None;
    if let Some(groups) = find(attrs, CTRL_ATTR_MCAST_GROUPS) {
        for (_, g) in attributes(groups)? {
            let g = attributes(&g)?;
            if get_str(&g, CTRL_ATTR_MCAST_GRP_NAME).as_deref() == Some(group) {
                mcast = get_u32(&g, CTRL_ATTR_MCAST_GRP_ID);
            }
        }
    }
    Ok((id, mcast))
}

/// From NBD_CMD_STATUS's reply: each device's index and whether it is connected.
pub fn devices(attrs: &[(u16, Vec<u8>)]) -> Result<Vec<(u32, bool)>, String> {
    let Some(list) = find(attrs, NBD_ATTR_DEVICE_LIST) else { return Ok(Vec::new()) };
    let mut out = Vec::new();
    for (kind, item) in attributes(list)? {
        if kind != NBD_DEVICE_ITEM {
            continue;
        }
        let item = attributes(&item)?;
        let index = get_u32(&item, NBD_DEVICE_INDEX).ok_or("a device item without its index")?;
        let connected = find(&item, NBD_DEVICE_CONNECTED).and_then(|v| v.first()).is_some_and(|&b| b != 0);
        out.push((index, connected));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_is_headers_then_padded_attributes() {
        let m = request(29, NBD_CMD_CONNECT, 7, Attrs::default().u64(NBD_ATTR_SIZE_BYTES, 1 << 30).str(NBD_ATTR_BACKEND_IDENTIFIER, "ab"));
        assert_eq!(m.len(), 16 + 4 + 12 + 8);
        assert_eq!(u32::from_ne_bytes(m[0..4].try_into().unwrap()) as usize, m.len());
        assert_eq!(u16::from_ne_bytes(m[4..6].try_into().unwrap()), 29);
        assert_eq!(u16::from_ne_bytes(m[6..8].try_into().unwrap()), NLM_F_REQUEST | NLM_F_ACK);
        assert_eq!(u32::from_ne_bytes(m[8..12].try_into().unwrap()), 7);
        assert_eq!(&m[16..20], &[NBD_CMD_CONNECT, 1, 0, 0]);
        let attrs = attributes(&m[20..]).unwrap();
        assert_eq!(attrs[0], (NBD_ATTR_SIZE_BYTES, (1u64 << 30).to_ne_bytes().to_vec()));
        assert_eq!(attrs[1], (NBD_ATTR_BACKEND_IDENTIFIER, b"ab\0".to_vec()));
    }

    #[test]
    fn sockets_nest_one_item_per_descriptor() {
        let a = Attrs::default().sockets(&[5, 9]);
        let outer = attributes(&a.0).unwrap();
        assert_eq!(outer.len(), 1);
        assert_eq!(outer[0].0, NBD_ATTR_SOCKETS);
        assert_eq!(u16::from_ne_bytes([a.0[2], a.0[3]]), NBD_ATTR_SOCKETS | NLA_F_NESTED, "nesting is flagged");
        let items = attributes(&outer[0].1).unwrap();
        let fds: Vec<u32> = items.iter().map(|(_, i)| get_u32(&attributes(i).unwrap(), NBD_SOCK_FD).unwrap()).collect();
        assert_eq!(fds, [5, 9]);
    }

    fn message(kind: u16, seq: u32, body: &[u8]) -> Vec<u8> {
        let mut m = ((16 + body.len()) as u32).to_ne_bytes().to_vec();
        m.extend_from_slice(&kind.to_ne_bytes());
        m.extend_from_slice(&[0, 0]);
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&[0; 4]);
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn acks_refusals_and_messages_parse() {
        let mut d = message(NLMSG_ERROR, 3, &(-16i32).to_ne_bytes());
        d.extend(message(NLMSG_ERROR, 4, &0i32.to_ne_bytes()));
        let mut body = vec![NBD_CMD_LINK_DEAD, 1, 0, 0];
        body.extend(Attrs::default().u32(NBD_ATTR_INDEX, 2).0);
        d.extend(message(30, 0, &body));
        let r = parse(&d).unwrap();
        assert_eq!(r[0], Reply::Ack { seq: 3, errno: 16 });
        assert_eq!(r[1], Reply::Ack { seq: 4, errno: 0 });
        let Reply::Message { seq: 0, command: NBD_CMD_LINK_DEAD, attrs } = &r[2] else { panic!("{:?}", r[2]) };
        assert_eq!(get_u32(attrs, NBD_ATTR_INDEX), Some(2));
    }

    #[test]
    fn malformed_lengths_are_errors_not_panics() {
        let mut m = message(NLMSG_DONE, 1, &[]);
        m[0] = 200;
        assert!(parse(&m).is_err());
        assert!(attributes(&[2, 0, 1, 0]).is_err());
        assert!(attributes(&[8, 0, 1, 0, 1]).is_err());
        assert_eq!(parse(&[1, 2, 3]).unwrap(), []);
    }

    #[test]
    fn the_family_and_its_group_come_from_the_controller() {
        let group = Attrs::default().str(CTRL_ATTR_MCAST_GRP_NAME, "nbd_mc").u32(CTRL_ATTR_MCAST_GRP_ID, 12);
        let a = Attrs::default().bytes(CTRL_ATTR_FAMILY_ID, &33u16.to_ne_bytes()).nested(CTRL_ATTR_MCAST_GROUPS, Attrs::default().nested(1, group));
        assert_eq!(family_ids(&attributes(&a.0).unwrap(), "nbd_mc").unwrap(), (33, Some(12)));
        assert_eq!(family_ids(&attributes(&a.0).unwrap(), "other").unwrap(), (33, None));
    }

    #[test]
    fn status_lists_devices() {
        let dev = |i: u32, c: u8| Attrs::default().u32(NBD_DEVICE_INDEX, i).bytes(NBD_DEVICE_CONNECTED, &[c]);
        let a = Attrs::default().nested(NBD_ATTR_DEVICE_LIST, Attrs::default().nested(NBD_DEVICE_ITEM, dev(0, 1)).nested(NBD_DEVICE_ITEM, dev(3, 0)));
        assert_eq!(devices(&attributes(&a.0).unwrap()).unwrap(), [(0, true), (3, false)]);
    }
}
