//! Handing a session to the kernel's TLS (kTLS) as the connection leaves the handshake
//! thread. sluice-ktls plans it (keys from the session's secrets, sequence numbers from
//! the records the socket carried, each one checked by decrypting it) and installs it.
//! Whatever does not check out, and a kernel that refuses the keys, leave the session to
//! OpenSSL on the worker as before. Only a kernel that takes one direction's keys and
//! refuses the other's ends the connection: its socket is then neither plain nor wholly
//! the kernel's.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::OnceLock;

use sluice_ktls::{install, over_tcp, secrets, Plan, Refusal, Side};

use super::context::TlsServer;
use super::upgrade::TlsSession;

/// Who encrypts a TLS connection's records once it is on a worker.
pub enum Encryption {
    /// The kernel: the worker uses the socket as a plain one. `describe` names the
    /// version and cipher for the log.
    Kernel { describe: String },
    /// OpenSSL, on the worker (`TlsLink`). `why` says why the kernel does not, when it
    /// was asked to.
    User { session: TlsSession, why: Option<String> },
}

/// Hands `session` to the kernel's TLS on `fd` when the server is set to and everything
/// checks out; otherwise gives it back to be run in user space.
pub fn hand_off(server: &TlsServer, mut session: TlsSession, fd: BorrowedFd<'_>) -> io::Result<Encryption> {
    if !server.hands_over() {
        return Ok(Encryption::User { session, why: None });
    }
    if !over_tcp(fd) {
        // A Unix socket has no kTLS: nothing to try, and nothing to say for every
        // connection. What was kept for the handoff goes now.
        drop(session.get_mut().take_transcript());
        drop(secrets::take_tls13(session.ssl()));
        return Ok(Encryption::User { session, why: None });
    }
    let mut plan = match plan(&mut session) {
        Ok(plan) => plan,
        Err(why) => return Ok(Encryption::User { session, why: Some(why) }),
    };
    if let Some(fault) = test_fault() {
        fault.apply(&mut plan);
    }
    match install(fd, &plan) {
        Ok(()) => {
            // OpenSSL must not write to the socket again: the channel lets go of it, and
            // dropping the session sends nothing (only shutdown() would send close_notify).
            session.get_mut().detach();
            drop(session);
            Ok(Encryption::Kernel { describe: format!("kTLS, {}", plan.suite.name) })
        }
        Err(Refusal::Untouched(why)) => Ok(Encryption::User { session, why: Some(why) }),
        Err(Refusal::HalfWay(why)) => {
            log::warn!("{why}");
            Err(io::Error::other(why))
        }
    }
}

/// Derives both directions' keys and finds their sequence numbers, or says why not. The
/// secrets and the transcript are taken out of the session whatever the outcome, so they
/// do not outlive the handoff.
pub fn plan(session: &mut TlsSession) -> Result<Plan, String> {
    let transcript = session.get_mut().take_transcript();
    sluice_ktls::plan(session.ssl(), transcript, Side::Server)
}

/// A test hook, not a setting: SLUICE_TEST_KTLS_FAULT=tx-seq (or rx-seq) gives the kernel
/// one more than the verified sequence number for the records it sends (receives), so that
/// a test can show that a wrong handoff ends in a failed decryption and a closed
/// connection, never in corrupt data.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    TxSeq,
    RxSeq,
}

impl Fault {
    fn apply(self, plan: &mut Plan) {
        match self {
            Fault::TxSeq => plan.tx.seq += 1,
            Fault::RxSeq => plan.rx.seq += 1,
        }
    }
}

/// The test hook, read once and said in the log.
fn test_fault() -> Option<Fault> {
    static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
    *FAULT.get_or_init(|| {
        let value = std::env::var("SLUICE_TEST_KTLS_FAULT").ok()?;
        let fault = match value.as_str() {
            "tx-seq" => Fault::TxSeq,
            "rx-seq" => Fault::RxSeq,
            _ => {
                log::warn!("SLUICE_TEST_KTLS_FAULT={value:?} is neither tx-seq nor rx-seq; ignored");
                return None;
            }
        };
        log::warn!("SLUICE_TEST_KTLS_FAULT={value}: a test hook gives the kernel wrong sequence numbers");
        Some(fault)
    })
}
