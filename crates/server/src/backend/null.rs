//! Reads return zeros and writes vanish: the protocol and network ceiling.

use super::interface::{Backend, Caps, Outcome, StorageOp};
use crate::engine::{Held, Ring, StorageId};
use sluice_proto::reply::Extent;
use sluice_proto::wire::STATE_ZERO;

pub struct NullBackend {
    size: u64,
}

impl NullBackend {
    pub fn new(size: u64) -> NullBackend {
        NullBackend { size }
    }
}

impl Backend for NullBackend {
    fn kind(&self) -> &'static str {
        "null"
    }

    fn size(&self) -> u64 {
        self.size
    }

    fn caps(&self) -> Caps {
        Caps { trim: true, zero: true, fua: true, instant: true, ..Caps::default() }
    }

    fn start(&self, op: StorageOp, _id: StorageId, _ring: &mut Ring) -> Option<Outcome> {
        let (result, held) = match op {
            StorageOp::Read { len, into: Held::Buf(mut buf), at, .. } => {
                buf.as_mut_slice()[at..at + len].fill(0);
                (len, Held::Buf(buf))
            }
            StorageOp::Read { into, .. } => return Some(Outcome { result: -libc::EINVAL, held: into }),
            StorageOp::Write { buf, len, .. } => (len, Held::Buf(buf)),
            StorageOp::Extents { len, mut out, .. } => {
                // Honest about content (all zeros) but claims no holes: nothing is allocated or not.
                out.push(Extent { length: len, flags: STATE_ZERO });
                (0, Held::Extents(out))
            }
            StorageOp::Flush | StorageOp::Trim { .. } | StorageOp::Zero { .. } | StorageOp::Cache { .. } => (0, Held::Nothing),
        };
        Some(Outcome { result: result as i32, held })
    }
}
