//! Who a TLS client is, as the log (and access rules) name it: the protocol version and
//! the client's PSK identity or certificate subject.

use std::sync::OnceLock;

use openssl::ex_data::Index;
use openssl::nid::Nid;
use openssl::ssl::{Ssl, SslRef, SslVersion};
use openssl::x509::X509NameRef;

use crate::access::Client;
use crate::rfc4514::escape;

/// "TLSv1.3 psk:alice", "TLSv1.3 x509:CN=node7,O=Example", or "TLSv1.3" for a client
/// that showed neither.
pub fn describe(ssl: &SslRef) -> String {
    let version = ssl.version_str();
    if let Some(id) = psk_identity(ssl) {
        return format!("{version} psk:{id}");
    }
    match ssl.peer_certificate() {
        Some(cert) => format!("{version} x509:{}", rfc4514(cert.subject_name())),
        None => version.to_owned(),
    }
}

/// Where the PSK callback leaves the identity whose key it gave: OpenSSL's own record of it
/// (SSL_get_psk_identity) is empty right after a TLS 1.3 handshake, when the rules need it.
/// The callback runs before OpenSSL decides whether to use that key (it drops a PSK whose
/// hash does not fit the suite, without checking that the client holds the key), so what
/// it leaves counts only once the handshake shows the PSK was used (`psk_identity`).
fn psk_index() -> Index<Ssl, String> {
    static INDEX: OnceLock<Index<Ssl, String>> = OnceLock::new();
    *INDEX.get_or_init(|| Ssl::new_ex_index().expect("OpenSSL has room for one more index"))
}

/// Called by the PSK callback with the identity whose key it found.
pub fn remember_psk(ssl: &mut SslRef, identity: &str) {
    ssl.set_ex_data(psk_index(), identity.to_owned());
}

/// The PSK identity the client proved it holds the key of, if it authenticated with one.
/// TLS 1.3: the session was "reused", which (with no tickets and no session cache) only an
/// external PSK whose binder verified makes it; OpenSSL tries the identities a client offers
/// in order and stops at the one it uses, so the callback's last identity is that one.
/// TLS 1.2: OpenSSL records the identity only in a PSK key exchange.
fn psk_identity(ssl: &SslRef) -> Option<String> {
    if ssl.version2() == Some(SslVersion::TLS1_3) {
        return ssl.session_reused().then(|| ssl.ex_data(psk_index()).cloned()).flatten();
    }
    ssl.psk_identity().map(|id| String::from_utf8_lossy(id).into_owned())
}

/// What access rules may know of a TLS client: its PSK identity, or its certificate's
/// subject and common name (the most specific CN when there are several).
pub fn learn(ssl: &SslRef, client: &mut Client) {
    client.psk = psk_identity(ssl);
    if let Some(cert) = ssl.peer_certificate() {
        let subject = cert.subject_name();
        client.x509 = Some(rfc4514(subject));
        client.x509_cn = subject.entries_by_nid(Nid::COMMONNAME).last().and_then(|e| e.data().to_string().ok()).map(|s| s.to_string());
    }
}

/// A distinguished name as RFC 4514 writes it: the last RDN first, `TYPE=value` joined
/// by commas, with the characters that need it escaped.
pub fn rfc4514(name: &X509NameRef) -> String {
    let mut parts: Vec<String> = name
        .entries()
        .map(|e| {
            let key = e.object().nid().short_name().unwrap_or("?");
            let value = e.data().to_string().unwrap_or_default();
            format!("{key}={}", escape(&value))
        })
        .collect();
    parts.reverse();
    parts.join(",")
}

#[cfg(test)]
mod tests {
    use super::*;
    use openssl::x509::X509Name;

    #[test]
    fn names_are_written_last_rdn_first_with_specials_escaped() {
        let mut b = X509Name::builder().unwrap();
        b.append_entry_by_text("O", "Example, Inc.").unwrap();
        b.append_entry_by_text("CN", " node7").unwrap();
        let name = b.build();
        assert_eq!(rfc4514(&name), "CN=\\ node7,O=Example\\, Inc.");
    }
}
