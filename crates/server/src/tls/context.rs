//! Loading what TLS needs at start: the certificate directory and the PSK file, checked
//! then so that a mistake is an error at start, never at the first client; and the OpenSSL
//! context every connection's session is made from.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use openssl::pkey::PKey;
use openssl::ssl::{SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions, SslSessionCacheMode, SslVerifyMode, SslVersion};
use openssl::x509::store::X509Lookup;
use openssl::x509::verify::X509VerifyFlags;
use sluice_ktls::secrets;
use sluice_proto::TlsMode;

use super::ktls::{self, Ktls, KtlsMode};

/// TLS as the user configured it (`--tls`, `--tls-certificates`, `--tls-psk`,
/// `--tls-verify-peer`, `--tls-ktls`, and the same keys in the configuration file).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TlsSettings {
    pub mode: TlsMode,
    /// A directory with ca-cert.pem, server-cert.pem, server-key.pem and optionally
    /// ca-crl.pem, as nbdkit and qemu-nbd read it.
    pub certificates: Option<PathBuf>,
    /// A psktool file: one `identity:hexkey` line per client.
    pub psk: Option<PathBuf>,
    /// Require a client certificate signed by the CA in `certificates`.
    pub verify_peer: bool,
    /// Whether sessions are handed to the kernel's TLS when it can take them.
    pub ktls: KtlsMode,
}

/// TLS 1.2 suites: forward-secret AEAD suites for certificates (AES-128 first: as strong
/// as needed, cheapest per byte), then the PSK suites GnuTLS clients offer (nbd-client,
/// qemu and libnbd ask for "+ECDHE-PSK:+DHE-PSK:+PSK"), forward-secret ones first.
const TLS12_CIPHERS: &str = "ECDHE-ECDSA-AES128-GCM-SHA256:ECDHE-RSA-AES128-GCM-SHA256:ECDHE+AESGCM:ECDHE+CHACHA20:\
    ECDHE-PSK-CHACHA20-POLY1305:PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-CHACHA20-POLY1305:\
    ECDHE-PSK-AES128-CBC-SHA256:ECDHE-PSK-AES256-CBC-SHA384";

/// TLS 1.3 suites in the server's order of preference: AES-128-GCM is the cheapest per
/// byte where the CPU has AES instructions, ChaCha20 where it has not. The SHA-256 suites
/// are the ones an external PSK can use.
fn tls13_suites() -> &'static str {
    let aes = std::fs::read_to_string("/proc/cpuinfo")
        .is_ok_and(|c| c.lines().any(|l| l.starts_with("flags") && l.split_whitespace().any(|f| f == "aes")));
    if aes {
        "TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384:TLS_CHACHA20_POLY1305_SHA256"
    } else {
        "TLS_CHACHA20_POLY1305_SHA256:TLS_AES_128_GCM_SHA256:TLS_AES_256_GCM_SHA384"
    }
}

/// The loaded configuration every connection's TLS session is made from.
pub struct TlsServer {
    pub mode: TlsMode,
    pub(super) context: SslContext,
    ktls: KtlsMode,
    kernel: Ktls,
}

impl TlsServer {
    /// Checks the settings and loads every file they name. None when TLS is off.
    pub fn load(settings: &TlsSettings) -> Result<Option<Arc<TlsServer>>, String> {
        TlsServer::load_for(settings, ktls::probe())
    }

    /// `load`, for a kernel that offers kTLS or not (tests pretend it does).
    pub(crate) fn load_for(settings: &TlsSettings, kernel: Ktls) -> Result<Option<Arc<TlsServer>>, String> {
        if !check(settings)? {
            return Ok(None);
        }
        let TlsSettings { mode, certificates, psk, verify_peer, ktls } = settings;
        let fail = |e: openssl::error::ErrorStack| format!("OpenSSL: {e}");
        let mut b = SslContextBuilder::new(SslMethod::tls_server()).map_err(fail)?;
        b.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(fail)?;
        // No renegotiation (a client could make the server redo handshakes at will), no
        // session tickets (NBD connections are long-lived; resumption buys nothing). That
        // this side sends nothing after the handshake is also what lets the kernel take
        // records over from OpenSSL; read_ahead stays off, so OpenSSL reads one record at
        // a time and leaves what follows in the socket for the kernel.
        b.set_options(SslOptions::NO_RENEGOTIATION | SslOptions::NO_TICKET | SslOptions::CIPHER_SERVER_PREFERENCE);
        b.set_num_tickets(0).map_err(fail)?;
        // No session cache either: with no resumption at all, a TLS 1.3 session counts as
        // "reused" only when an external PSK was accepted, which is how the access rules
        // know the PSK identity is proven (identity.rs).
        b.set_session_cache_mode(SslSessionCacheMode::OFF);
        b.set_cipher_list(TLS12_CIPHERS).map_err(fail)?;
        b.set_ciphersuites(tls13_suites()).map_err(fail)?;
        if let Some(dir) = certificates {
            load_certificates(&mut b, dir, *verify_peer)?;
        }
        if let Some(file) = psk {
            set_psk(&mut b, read_psk_file(file)?);
        }
        if offers_ktls(*ktls, kernel) {
            // Only sessions that `accept` watches keep what the key log reports.
            secrets::capture(&mut b).map_err(fail)?;
        }
        Ok(Some(Arc::new(TlsServer { mode: *mode, context: b.build(), ktls: *ktls, kernel })))
    }

    /// Whether sessions are offered to the kernel's TLS at handoff.
    pub(super) fn hands_over(&self) -> bool {
        offers_ktls(self.ktls, self.kernel)
    }

    /// Which kind of TLS connections get, for the log line at start.
    pub fn describe_ktls(&self) -> &'static str {
        ktls::describe(self.ktls, self.kernel)
    }
}

fn offers_ktls(mode: KtlsMode, kernel: Ktls) -> bool {
    mode == KtlsMode::Auto && kernel == Ktls::Offered
}

/// Checks that the settings hang together; false when TLS is off.
fn check(settings: &TlsSettings) -> Result<bool, String> {
    let TlsSettings { mode, certificates, psk, verify_peer, ktls: _ } = settings;
    if *mode == TlsMode::Off {
        return match (certificates, psk, verify_peer) {
            (None, None, false) => Ok(false),
            _ => Err("TLS options given but --tls is off; add --tls=on or --tls=require".into()),
        };
    }
    if certificates.is_none() && psk.is_none() {
        return Err("--tls needs --tls-certificates=DIR or --tls-psk=FILE".into());
    }
    if *verify_peer && certificates.is_none() {
        return Err("--tls-verify-peer needs --tls-certificates=DIR (its ca-cert.pem signs the clients' certificates)".into());
    }
    if *verify_peer && psk.is_some() {
        // A PSK client presents no certificate, so the two cannot both hold.
        return Err("--tls-verify-peer cannot be combined with --tls-psk: PSK clients present no certificate".into());
    }
    Ok(true)
}

/// OpenSSL calls this for TLS 1.2 PSK suites and for TLS 1.3 external PSKs, which it
/// pairs with SHA-256 suites as GnuTLS does.
fn set_psk(b: &mut SslContextBuilder, keys: HashMap<String, Vec<u8>>) {
    b.set_psk_server_callback(move |ssl, identity, out| {
        let id = identity.map(String::from_utf8_lossy).unwrap_or_default();
        match keys.get(id.as_ref()) {
            Some(key) if key.len() <= out.len() => {
                out[..key.len()].copy_from_slice(key);
                super::identity::remember_psk(ssl, &id);
                Ok(key.len())
            }
            _ => {
                log::info!("TLS: unknown PSK identity {id:?}");
                Ok(0)
            }
        }
    });
}

fn load_certificates(b: &mut SslContextBuilder, dir: &Path, verify_peer: bool) -> Result<(), String> {
    let file = |name: &str| -> Result<PathBuf, String> {
        let path = dir.join(name);
        match std::fs::metadata(&path) {
            Ok(m) if m.is_file() => Ok(path),
            Ok(_) => Err(format!("{} is not a file", path.display())),
            Err(e) => Err(format!("cannot read {}: {e}", path.display())),
        }
    };
    let in_dir = |name: &str| format!("{}", dir.join(name).display());
    if !dir.is_dir() {
        return Err(format!("--tls-certificates: {} is not a directory", dir.display()));
    }
    b.set_certificate_chain_file(file("server-cert.pem")?)
        .map_err(|e| format!("{}: not a PEM certificate: {e}", in_dir("server-cert.pem")))?;
    let key_file = file("server-key.pem")?;
    let pem = std::fs::read(&key_file).map_err(|e| format!("cannot read {}: {e}", key_file.display()))?;
    // No passphrase prompt on the terminal: an encrypted key is an error (nbdkit and
    // qemu-nbd want it unencrypted too).
    let key = PKey::private_key_from_pem_callback(&pem, |_| Ok(0))
        .map_err(|e| format!("{}: not an unencrypted PEM private key: {e}", key_file.display()))?;
    b.set_private_key(&key)
        .and_then(|()| b.check_private_key())
        .map_err(|_| format!("{} does not belong to {}", in_dir("server-key.pem"), in_dir("server-cert.pem")))?;
    let ca = dir.join("ca-cert.pem");
    if ca.exists() || verify_peer {
        let ca = file("ca-cert.pem")?;
        b.set_ca_file(&ca).map_err(|e| format!("{}: not a PEM certificate: {e}", ca.display()))?;
    }
    let crl = dir.join("ca-crl.pem");
    if crl.exists() {
        let text = crl.to_str().ok_or_else(|| format!("{}: the path is not UTF-8", crl.display()))?;
        let store = b.cert_store_mut();
        let lookup = store.add_lookup(X509Lookup::file()).map_err(|e| format!("OpenSSL: {e}"))?;
        lookup.load_crl_file(text, SslFiletype::PEM).map_err(|e| format!("{text}: not a PEM CRL: {e}"))?;
        store.set_flags(X509VerifyFlags::CRL_CHECK).map_err(|e| format!("OpenSSL: {e}"))?;
    }
    if verify_peer {
        b.set_verify(SslVerifyMode::PEER | SslVerifyMode::FAIL_IF_NO_PEER_CERT);
    }
    Ok(())
}

/// Reads a psktool file: `identity:hexkey` per line. Errors name the file and the line.
pub fn read_psk_file(path: &Path) -> Result<HashMap<String, Vec<u8>>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read PSK file {}: {e}", path.display()))?;
    let keys = sluice_proto::psk::parse(&text).map_err(|e| format!("PSK file {}, {e}", path.display()))?;
    if keys.is_empty() {
        return Err(format!("PSK file {} holds no keys", path.display()));
    }
    Ok(keys.into_iter().collect())
}
