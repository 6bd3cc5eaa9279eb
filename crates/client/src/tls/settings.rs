//! The settings of a TLS connection, as an `nbds://` URI and the `--tls-*` options give
//! them.

use std::path::PathBuf;

/// How an `nbds://` URI secures its connection. The URI's query sets it the way libnbd's
/// `nbd_connect_uri` reads it: `tls-certificates=DIR`, `tls-psk-file=FILE`,
/// `tls-verify-peer=false`, `tls-hostname=NAME`, and the user (`nbds://alice@host/`) as
/// the PSK identity.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Tls {
    /// X.509: a directory with `ca-cert.pem` (the CA the server's certificate must be
    /// signed by), and optionally `client-cert.pem` with `client-key.pem` (sent to a
    /// server that asks for a client certificate) and `ca-crl.pem`. `None`: the system's
    /// CA store, and no client certificate.
    pub certificates: Option<PathBuf>,
    /// Pre-shared keys instead of certificates: a psktool file of `USERNAME:HEXKEY`
    /// lines. It wins over `certificates`, as in libnbd.
    pub psk_file: Option<PathBuf>,
    /// The PSK identity. `None`: the login name of the user running the client.
    pub username: Option<String>,
    /// Check the server's certificate: signed by a trusted CA and made out to the host
    /// name. On by default; off accepts any server, which only encryption then protects.
    pub verify_peer: bool,
    /// The name the server's certificate must carry, instead of the URI's host. A Unix
    /// socket has no host: there the name is checked only when this is set.
    pub hostname: Option<String>,
}

impl Default for Tls {
    fn default() -> Tls {
        Tls { certificates: None, psk_file: None, username: None, verify_peer: true, hostname: None }
    }
}

/// A boolean as libnbd spells it in URIs: true/false, yes/no, on/off or 1/0, in any case.
pub fn parse_bool(s: &str) -> Option<bool> {
    match s.to_ascii_lowercase().as_str() {
        "true" | "yes" | "on" | "1" => Some(true),
        "false" | "no" | "off" | "0" => Some(false),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn booleans_as_libnbd_spells_them() {
        for t in ["true", "TRUE", "yes", "on", "1"] {
            assert_eq!(parse_bool(t), Some(true), "{t}");
        }
        for f in ["false", "No", "off", "0"] {
            assert_eq!(parse_bool(f), Some(false), "{f}");
        }
        for bad in ["", "2", "y", "truthy"] {
            assert_eq!(parse_bool(bad), None, "{bad}");
        }
        assert!(Tls::default().verify_peer);
    }
}
