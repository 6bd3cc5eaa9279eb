//! What the kernel is given for a session, and giving it. The keys come from the
//! session's secrets (secrets.rs, keys.rs), the sequence numbers from the records the
//! socket carried, each one checked by decrypting it (transcript.rs). Which direction is
//! "ours" depends on the side: the server sends with the server's keys, the client with
//! the client's.

use std::io;
use std::os::fd::BorrowedFd;

use openssl::error::ErrorStack;
use openssl::ssl::SslRef;

use crate::keys::{tls12_keys, tls13_keys, Aead, Suite, TrafficKeys, Version};
use crate::secrets::{self, Tls13Secrets};
use crate::sys::{ktls_attach, ktls_set_keys, KernelKeys, KtlsDirection};
use crate::transcript::{next_seq, Transcript, Writer};

/// Which end of the connection this process is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    Client,
    Server,
}

impl Side {
    fn name(self) -> &'static str {
        match self {
            Side::Client => "client",
            Side::Server => "server",
        }
    }

    fn peer(self) -> Side {
        match self {
            Side::Client => Side::Server,
            Side::Server => Side::Client,
        }
    }
}

/// One direction's keys and where its count stands.
pub struct Half {
    pub keys: TrafficKeys,
    /// The sequence number of the next record.
    pub seq: u64,
    /// TLS 1.2 AES-GCM, our side: the explicit nonce the kernel is to start from.
    pub explicit_nonce: Option<u64>,
}

/// What the kernel would be given, checked against the records that went by.
pub struct Plan {
    pub suite: Suite,
    /// Our records.
    pub tx: Half,
    /// The peer's records.
    pub rx: Half,
}

/// Derives both directions' keys and finds their sequence numbers, or says why not.
/// `transcript` is what the socket carried since the TLS handshake began (None: nothing
/// was kept). The TLS 1.3 secrets are taken out of the session whatever the outcome, so
/// they do not outlive the handoff.
pub fn plan(ssl: &SslRef, transcript: Option<Transcript>, side: Side) -> Result<Plan, String> {
    let tls13 = secrets::take_tls13(ssl);
    let transcript = transcript.ok_or("no transcript was kept")?;
    let (received, sent) = transcript.ways()?;
    if ssl.pending() > 0 {
        return Err(format!("{} bytes the {} sent wait decrypted in OpenSSL", ssl.pending(), side.peer().name()));
    }
    let suite = Suite::of(ssl)?;
    let (client, server) = traffic_keys(ssl, &suite, tls13)?;
    let (ours, theirs) = match side {
        Side::Client => (client, server),
        Side::Server => (server, client),
    };
    let (us, peer) = (side.name(), side.peer().name());
    let rx = next_seq(&suite, &theirs, received, Writer::Peer).map_err(|e| format!("the {peer}'s records: {e}"))?;
    let tx = next_seq(&suite, &ours, sent, Writer::Us).map_err(|e| format!("the {us}'s records: {e}"))?;
    Ok(Plan {
        suite,
        tx: Half { keys: ours, seq: tx.seq, explicit_nonce: tx.explicit_nonce },
        rx: Half { keys: theirs, seq: rx.seq, explicit_nonce: rx.explicit_nonce },
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

/// Why the kernel did not take a plan.
#[derive(Debug, PartialEq, Eq)]
pub enum Refusal {
    /// The socket is as it was (or passes bytes through unchanged): user space may go on.
    Untouched(String),
    /// The kernel holds one direction's keys and not the other's: the connection is lost.
    HalfWay(String),
}

impl Refusal {
    pub fn why(&self) -> &str {
        match self {
            Refusal::Untouched(why) | Refusal::HalfWay(why) => why,
        }
    }
}

/// Attaches the kernel's TLS to `fd` and gives it both directions' keys, ours first.
pub fn install(fd: BorrowedFd<'_>, plan: &Plan) -> Result<(), Refusal> {
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

/// Whether `fd` is a TCP socket, the only kind the kernel's TLS attaches to.
pub fn over_tcp(fd: BorrowedFd<'_>) -> bool {
    rustix::net::getsockname(fd)
        .is_ok_and(|a| matches!(a.address_family(), rustix::net::AddressFamily::INET | rustix::net::AddressFamily::INET6))
}

fn ulp_refused(e: &io::Error) -> String {
    match e.raw_os_error() {
        Some(libc::ENOENT) => "the kernel has no TLS support: its tls module is not loaded (modprobe tls)".into(),
        Some(libc::EOPNOTSUPP | libc::ENOPROTOOPT) => "the connection is not over TCP".into(),
        _ => format!("the kernel refused the tls ULP: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_kernel_without_tls_is_named_as_such() {
        let why = ulp_refused(&io::Error::from_raw_os_error(libc::ENOENT));
        assert!(why.contains("no TLS support") && why.contains("modprobe tls"), "{why}");
        assert_eq!(ulp_refused(&io::Error::from_raw_os_error(libc::ENOPROTOOPT)), "the connection is not over TCP");
    }

    #[test]
    fn only_inet_sockets_count_as_tcp() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = std::os::fd::AsFd::as_fd(&a);
        assert!(!over_tcp(fd));
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let tcp = std::net::TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert!(over_tcp(std::os::fd::AsFd::as_fd(&tcp)));
    }
}
