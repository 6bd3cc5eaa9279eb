//! One member operation, carried out on a member, with what the member lacks made up here
//! (nbdkit's filter layer, in small): FUA without FUA is a write then a flush, WRITE_ZEROES
//! without it is zeros written, and TRIM without it succeeds, since trimming is advisory.

use super::member::Member;
use crate::error::Error;
use crate::limits::POOL_ZERO_CHUNK_BYTES;
use sluice_pool::MemberCmd;
use std::ops::Range;
use std::sync::Arc;

/// The bytes a member write sends.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Payload {
    None,
    /// A range of a buffer the driver keeps (a request's write data, a resync buffer).
    Shared(Arc<Vec<u8>>, Range<usize>),
    Owned(Vec<u8>),
}

impl Payload {
    fn bytes(&self) -> &[u8] {
        match self {
            Payload::None => &[],
            Payload::Shared(b, r) => &b[r.clone()],
            Payload::Owned(v) => v,
        }
    }
}

/// How a durable (FUA) change reaches a member: with its own FUA, or followed by a flush.
/// Returns (send FUA, flush after).
pub(crate) fn durability(fua: bool, can_fua: bool) -> (bool, bool) {
    (fua && can_fua, fua && !can_fua)
}

/// Carries out `cmd` on `m`; a read hands back its bytes.
pub(crate) async fn run<M: Member>(m: &M, cmd: MemberCmd, payload: Payload) -> Result<Option<Vec<u8>>, Error> {
    let ex = m.export();
    let (can_fua, can_zero, can_trim) = (ex.can_fua(), ex.can_zero(), ex.can_trim());
    let flush_after = match cmd {
        MemberCmd::Read { offset, len } => return m.read(offset, len as usize).await.map(Some),
        MemberCmd::Flush => return m.flush().await.map(|()| None),
        MemberCmd::Write { offset, len, fua } => {
            let data = payload.bytes();
            if data.len() as u64 != len {
                // The coordinator and the driver disagree about a buffer: a bug, never
                // the member's fault, but failing the operation is all that is safe here.
                debug_assert!(false, "write of {len} bytes with {} bytes of data", data.len());
                return Err(Error::Protocol(format!("pool driver: write of {len} bytes with {} bytes of data", data.len())));
            }
            let (fua, flush) = durability(fua, can_fua);
            m.write(offset, data, fua).await?;
            flush
        }
        MemberCmd::Zero { offset, len, fua, may_trim } if can_zero => {
            let (fua, flush) = durability(fua, can_fua);
            m.write_zeroes(offset, len, fua, may_trim).await?;
            flush
        }
        MemberCmd::Zero { offset, len, fua, .. } => {
            write_zeros(m, offset, len).await?;
            fua
        }
        MemberCmd::Trim { offset, len, fua } if can_trim => {
            let (fua, flush) = durability(fua, can_fua);
            m.trim(offset, len, fua).await?;
            flush
        }
        MemberCmd::Trim { .. } => false,
    };
    if flush_after {
        m.flush().await?;
    }
    Ok(None)
}

/// Zeros as plain writes, one chunk at a time from one buffer.
async fn write_zeros<M: Member>(m: &M, offset: u64, len: u64) -> Result<(), Error> {
    let zeros = vec![0u8; (len as usize).min(POOL_ZERO_CHUNK_BYTES)];
    let mut at = 0;
    while at < len {
        let n = (len - at).min(zeros.len() as u64);
        m.write(offset + at, &zeros[..n as usize], false).await?;
        at += n;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::super::fake::{Call, Fake};
    use super::*;

    fn run_on(m: &Fake, cmd: MemberCmd, payload: Payload) -> Result<Option<Vec<u8>>, Error> {
        tokio::runtime::Builder::new_current_thread().build().unwrap().block_on(run(m, cmd, payload))
    }

    #[test]
    fn fua_without_fua_is_write_then_flush() {
        let m = Fake::new(1 << 20, false, true, true);
        let data = Arc::new((0..=255u8).cycle().take(8192).collect::<Vec<u8>>());
        let payload = Payload::Shared(data.clone(), 4096..8192);
        run_on(&m, MemberCmd::Write { offset: 512, len: 4096, fua: true }, payload).unwrap();
        assert_eq!(m.calls(), vec![Call::Write { offset: 512, len: 4096, fua: false }, Call::Flush]);
        assert_eq!(m.bytes(512, 4096), data[4096..]);
    }

    #[test]
    fn fua_with_fua_goes_through() {
        let m = Fake::new(1 << 20, true, true, true);
        run_on(&m, MemberCmd::Write { offset: 0, len: 3, fua: true }, Payload::Owned(vec![1, 2, 3])).unwrap();
        run_on(&m, MemberCmd::Zero { offset: 0, len: 4096, fua: true, may_trim: true }, Payload::None).unwrap();
        let calls = m.calls();
        assert_eq!(calls[0], Call::Write { offset: 0, len: 3, fua: true });
        assert_eq!(calls[1], Call::Zero { offset: 0, len: 4096, fua: true, may_trim: true });
        assert_eq!(calls.len(), 2);
    }

    #[test]
    fn zero_without_write_zeroes_writes_zeros() {
        let m = Fake::new(4 << 20, true, false, false);
        m.fill(0xaa);
        let len = POOL_ZERO_CHUNK_BYTES as u64 * 2 + 4096;
        run_on(&m, MemberCmd::Zero { offset: 4096, len, fua: true, may_trim: false }, Payload::None).unwrap();
        assert!(m.bytes(4096, len as usize).iter().all(|&b| b == 0));
        assert_eq!(m.bytes(0, 4096), vec![0xaa; 4096]);
        let calls = m.calls();
        assert_eq!(calls.len(), 4, "{calls:?}");
        assert_eq!(calls[3], Call::Flush);
    }

    #[test]
    fn trim_without_trim_succeeds_untouched() {
        let m = Fake::new(1 << 20, true, true, false);
        m.fill(7);
        run_on(&m, MemberCmd::Trim { offset: 0, len: 1 << 20, fua: true }, Payload::None).unwrap();
        assert_eq!(m.calls(), vec![]);
        assert_eq!(m.bytes(0, 16), vec![7; 16]);
    }

    #[test]
    fn reads_hand_back_bytes_and_errors_pass_through() {
        let m = Fake::new(1 << 20, true, true, true);
        run_on(&m, MemberCmd::Write { offset: 10, len: 2, fua: false }, Payload::Owned(vec![9, 8])).unwrap();
        assert_eq!(run_on(&m, MemberCmd::Read { offset: 9, len: 4 }, Payload::None).unwrap(), Some(vec![0, 9, 8, 0]));
        m.fail_next();
        assert!(run_on(&m, MemberCmd::Flush, Payload::None).is_err());
    }

    #[test]
    fn durability_plans() {
        assert_eq!(durability(false, false), (false, false));
        assert_eq!(durability(false, true), (false, false));
        assert_eq!(durability(true, true), (true, false));
        assert_eq!(durability(true, false), (false, true));
    }
}
