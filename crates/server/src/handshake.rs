//! The handshake of one connection, under a deadline: the proto crate's state machine
//! driven over a blocking socket until transmission starts (yielding the session and its
//! export) or the client leaves.

use std::io::{self, Read, Write};
use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::{Handshake, Next, Session};

use crate::export::{Export, Exports};

/// A socket whose blocking reads and writes can be given a time limit.
pub trait Timeouts {
    fn set_read_timeout(&self, t: Duration) -> io::Result<()>;
    fn set_write_timeout(&self, t: Duration) -> io::Result<()>;
}

/// Runs the handshake over `stream` until transmission (Some) or a clean close (None);
/// every read and write must finish within `timeout_ms` of the start.
pub fn negotiate<S: Read + Write + Timeouts>(
    stream: &mut S,
    exports: &Exports,
    timeout_ms: u64,
) -> io::Result<Option<(Session, Arc<Export>)>> {
    let deadline = Instant::now() + Duration::from_millis(timeout_ms);
    let remaining = || {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            Err(io::Error::new(io::ErrorKind::TimedOut, "handshake took too long"))
        } else {
            Ok(left)
        }
    };
    stream.set_write_timeout(remaining()?)?;
    stream.write_all(&Handshake::greeting())?;
    let mut hs = Handshake::new();
    let mut next = Handshake::start();
    let mut input = Vec::new();
    let mut out = Vec::new();
    loop {
        match next {
            Next::Read(n) => {
                input.resize(n, 0);
                stream.set_read_timeout(remaining()?)?;
                stream.read_exact(&mut input)?;
                out.clear();
                next = hs.input(&input, exports, &mut out);
                stream.set_write_timeout(remaining()?)?;
                stream.write_all(&out)?;
            }
            Next::Close { reason } => {
                log::debug!("handshake closed: {reason}");
                return Ok(None);
            }
            Next::Transmission(neg) => {
                let export = Arc::clone(exports.get(&neg.export).expect("the handshake negotiates only exports that exist"));
                let session = Session {
                    size: neg.summary.size,
                    flags: neg.flags,
                    structured: neg.structured,
                    base_allocation: neg.base_allocation,
                    payload_max_bytes: REQUEST_PAYLOAD_MAX_BYTES,
                };
                return Ok(Some((session, export)));
            }
        }
    }
}
