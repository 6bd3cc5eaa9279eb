//! Handing a session to the kernel's TLS (kTLS) as the connection leaves the handshake
//! thread. The keys come from the session's secrets (secrets.rs, keys.rs), the sequence
//! numbers from the records the socket carried, each one checked by decrypting it
//! (transcript.rs). Whatever does not check out, and a kernel that refuses the keys, leave
//! the session to OpenSSL on the worker as before. Only a kernel that takes one
//! direction's keys and refuses the other's ends the connection: its socket is then
//! neither plain nor wholly the kernel's.

use std::io;
use std::os::fd::BorrowedFd;
use std::sync::OnceLock;

use openssl::error::ErrorStack;
use openssl::ssl::SslRef;

use super::context::TlsServer;
use super::keys::{tls12_keys, tls13_keys, Aead, Suite, TrafficKeys, Version};
use super::secrets::{self, Tls13Secrets};
use super::transcript::{next_seq, Writer};
use super::upgrade::TlsSession;
use crate::engine::{ktls_attach, ktls_set_keys, KernelKeys, KtlsDirection};

/// Who encrypts a TLS connection's records once it is on a worker.
pub enum Encryption {
    /// The kernel: the worker uses the socket as a plain one. `describe` names the
    /// version and cipher for the log.
    Kernel { describe: String },
    /// OpenSSL, on the worker (`TlsLink`). `why` says why the kernel does not, when it
    /// was asked to.
    User { session: TlsSession, why: Option<String> },
}

/// One direction's keys and where its count stands.
pub struct Half {
    pub keys: TrafficKeys,
    /// The sequence number of the next record.
    pub seq: u64,
    /// TLS 1.2 AES-GCM, the server's side: the explicit nonce the kernel is to start from.
    pub explicit_nonce: Option<u64>,
}

/// What the kernel would be given, checked against the records that went by.
pub struct Plan {
    pub suite: Suite,
    /// The server's records.
    pub tx: Half,
    /// The client's records.
    pub rx: Half,
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
    let ssl = session.ssl();
    let tls13 = secrets::take_tls13(ssl);
    let transcript = transcript.ok_or("no transcript was kept")?;
    let (received, sent) = transcript.ways()?;
    if ssl.pending() > 0 {
        return Err(format!("{} bytes the client sent wait decrypted in OpenSSL", ssl.pending()));
    }
    let suite = Suite::of(ssl)?;
    let (client, server) = traffic_keys(ssl, &suite, tls13)?;
    let rx = next_seq(&suite, &client, received, Writer::Client).map_err(|e| format!("the client's records: {e}"))?;
    let tx = next_seq(&suite, &server, sent, Writer::Server).map_err(|e| format!("the server's records: {e}"))?;
    Ok(Plan {
        suite,
        tx: Half { keys: server, seq: tx.seq, explicit_nonce: tx.explicit_nonce },
        rx: Half { keys: client, seq: rx.seq, explicit_nonce: rx.explicit_nonce },
    })
}

/// The client's and the server's keys, in that order.
fn traffic_keys(ssl: &SslRef, suite: &Suite, tls13: Tls13Secrets) -> Result<(TrafficKeys, TrafficKeys), String> {
    let failed = |e: ErrorStack| format!("deriving the keys failed: {e}");
    match suite.version {
        Version::Tls13 => {
            let (Some(client), Some(server)) = (&tls13.client, &tls13.server) else {
                return Err("the key log did not report both traffic secrets".into());
            };
            let client = tls13_keys(suite, client.as_ref()).map_err(failed)?;
            Ok((client, tls13_keys(suite, server.as_ref()).map_err(failed)?))
        }
        Version::Tls12 => {
            let (master, client_random, server_random) = secrets::tls12_master(ssl).ok_or("the session has no master secret")?;
            tls12_keys(suite, master.as_ref(), &client_random, &server_random).map_err(failed)
        }
    }
}

enum Refusal {
    /// The socket is as it was (or passes bytes through unchanged): user space goes on.
    Untouched(String),
    /// The kernel holds one direction's keys and not the other's.
    HalfWay(String),
}

fn install(fd: BorrowedFd<'_>, plan: &Plan) -> Result<(), Refusal> {
    ktls_attach(fd).map_err(|e| Refusal::Untouched(ulp_refused(&e)))?;
    set_keys(fd, KtlsDirection::Tx, &plan.suite, &plan.tx).map_err(|e| {
        // The kernel asks its crypto layer for the cipher when the keys arrive; ENOENT is
        // that layer finding no implementation (a module that was not loaded).
        let hint = if e.raw_os_error() == Some(libc::ENOENT) { " (the kernel's crypto has no such cipher loaded)" } else { "" };
        Refusal::Untouched(format!("the kernel refused the {} send keys: {e}{hint}", plan.suite.name))
    })?;
    set_keys(fd, KtlsDirection::Rx, &plan.suite, &plan.rx).map_err(|e| {
        Refusal::HalfWay(format!(
            "kTLS: the kernel took the send keys but refused the receive keys ({e}); the connection cannot go on"
        ))
    })
}

fn set_keys(fd: BorrowedFd<'_>, direction: KtlsDirection, suite: &Suite, half: &Half) -> io::Result<()> {
    let explicit = half.explicit_nonce.unwrap_or(half.seq).to_be_bytes();
    ktls_set_keys(fd, direction, &kernel_keys(suite, half, &explicit))
}

/// One direction's keys as the kernel takes them. `explicit` is TLS 1.2 AES-GCM's explicit
/// nonce the kernel sends first and counts up from: above every one OpenSSL sent under
/// these keys (receiving, the kernel reads it from each record instead).
pub fn kernel_keys<'a>(suite: &Suite, half: &'a Half, explicit: &'a [u8; 8]) -> KernelKeys<'a> {
    let iv = half.keys.iv.as_ref();
    let (iv, salt) = match (suite.version, suite.aead) {
        (_, Aead::Chacha20Poly1305) => (iv, &[][..]),
        (Version::Tls13, _) => (&iv[4..], &iv[..4]),
        (Version::Tls12, _) => (&explicit[..], iv),
    };
    let version = match suite.version {
        Version::Tls12 => libc::TLS_1_2_VERSION,
        Version::Tls13 => libc::TLS_1_3_VERSION,
    };
    KernelKeys { version, cipher: suite.aead.kernel(), key: half.keys.key.as_ref(), iv, salt, rec_seq: half.seq.to_be_bytes() }
}

fn over_tcp(fd: BorrowedFd<'_>) -> bool {
    rustix::net::getsockname(fd)
        .is_ok_and(|a| matches!(a.address_family(), rustix::net::AddressFamily::INET | rustix::net::AddressFamily::INET6))
}

fn ulp_refused(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOENT) => "the kernel's tls module is not loaded (modprobe tls)".into(),
        Some(libc::EOPNOTSUPP | libc::ENOPROTOOPT) => "the connection is not over TCP".into(),
        _ => format!("the kernel refused the tls ULP: {e}"),
    }
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
