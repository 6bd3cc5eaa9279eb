//! Who a TLS client is, as the log (and access rules) name it: the protocol version and
//! the client's PSK identity or certificate subject.

use openssl::ssl::SslRef;
use openssl::x509::X509NameRef;

/// "TLSv1.3 psk:alice", "TLSv1.3 x509:CN=node7,O=Example", or "TLSv1.3" for a client
/// that showed neither.
pub fn describe(ssl: &SslRef) -> String {
    let version = ssl.version_str();
    if let Some(id) = ssl.psk_identity() {
        return format!("{version} psk:{}", String::from_utf8_lossy(id));
    }
    match ssl.peer_certificate() {
        Some(cert) => format!("{version} x509:{}", rfc4514(cert.subject_name())),
        None => version.to_owned(),
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

/// Escapes the characters RFC 4514 says a value must escape.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let edge_space = c == ' ' && (i == 0 || i == last);
        if matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') || edge_space || (i == 0 && c == '#') {
            out.push('\\');
        }
        out.push(c);
    }
    out
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
