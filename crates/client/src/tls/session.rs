//! The TLS session itself: an OpenSSL context made from the settings (a certificates
//! directory, the system's CA store, or a pre-shared key), the handshake over the socket
//! the NBD handshake began on, and errors that name the file, key or host name at fault.
//! A session meant for the kernel's TLS (`prepare_for_kernel`) also keeps its secrets and
//! the ciphertext it exchanged, for the handoff to be planned and checked (kernel.rs).

use super::duplex::Duplex;
use super::psk::{self, Psk};
use super::recorder::Recorder;
use super::settings::Tls;
use crate::error::Error;
use openssl::error::ErrorStack;
use openssl::pkey::PKey;
use openssl::ssl::{Ssl, SslContext, SslContextBuilder, SslFiletype, SslMethod, SslOptions, SslRef, SslVerifyMode, SslVersion};
use openssl::x509::store::X509Lookup;
use openssl::x509::verify::X509VerifyFlags;
use openssl::x509::X509;
use sluice_ktls::secrets;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::pin::Pin;
use tokio_openssl::SslStream;

/// The TLS stream the rest of the connection runs on.
pub(crate) type TlsStream = SslStream<Box<dyn Duplex>>;

// TLS over TLS is not done, but the handshake reads the one stream it has through `Duplex`.
impl Duplex for TlsStream {}

/// The files of a certificates directory, named as libnbd and nbdkit name them.
const CA_CERT: &str = "ca-cert.pem";
const CA_CRL: &str = "ca-crl.pem";
const CLIENT_CERT: &str = "client-cert.pem";
const CLIENT_KEY: &str = "client-key.pem";

/// TLS 1.2 suites for pre-shared keys, forward-secret first: what GnuTLS servers (nbdkit,
/// qemu-nbd) offer with their default priority. TLS 1.3 needs no list: OpenSSL hands the
/// key to TLS_AES_128_GCM_SHA256, the SHA-256 suite GnuTLS expects for an external PSK.
const PSK_CIPHERS_TLS12: &str = "ECDHE-PSK-CHACHA20-POLY1305:DHE-PSK-AES256-GCM-SHA384:DHE-PSK-AES128-GCM-SHA256:\
ECDHE-PSK-AES256-CBC-SHA384:ECDHE-PSK-AES128-CBC-SHA256:PSK-AES256-GCM-SHA384:PSK-AES128-GCM-SHA256";

/// TLS 1.2 suites for certificates: OpenSSL's defaults without the unauthenticated, the
/// weak, and the key-based ones.
const X509_CIPHERS_TLS12: &str = "DEFAULT:!aNULL:!eNULL:!MD5:!3DES:!DES:!RC4:!IDEA:!SEED:!aDSS:!SRP:!PSK";

/// X509_V_ERR_HOSTNAME_MISMATCH and X509_V_ERR_IP_ADDRESS_MISMATCH.
const NAME_MISMATCH: [i32; 2] = [62, 64];

/// How the server is to be checked, for the error that says why it was not accepted.
enum Auth {
    Psk { file: PathBuf, identity: String },
    X509 { ca: Option<PathBuf>, name: Option<String> },
    Unverified,
}

/// A TLS session ready to start: its files read and checked before the server is
/// contacted, so that a local mistake costs the server nothing.
pub(crate) struct Prepared {
    ssl: Ssl,
    auth: Auth,
    /// The session is to be handed to the kernel: keep the ciphertext it exchanges.
    record: bool,
}

/// Sets up a session from `tls` for a server at `host` (none for a Unix socket), the name
/// its certificate must carry unless `tls.hostname` names another.
pub(crate) fn prepare(tls: &Tls, host: Option<&str>) -> Result<Prepared, Error> {
    prepare_as(tls, host, false)
}

/// `prepare`, for a session to be handed to the kernel's TLS once the NBD handshake is
/// done (`hand_to_kernel`): it keeps its TLS 1.3 secrets and its ciphertext until then.
/// Other sessions pay for neither.
pub(crate) fn prepare_for_kernel(tls: &Tls, host: Option<&str>) -> Result<Prepared, Error> {
    prepare_as(tls, host, true)
}

fn prepare_as(tls: &Tls, host: Option<&str>, for_kernel: bool) -> Result<Prepared, Error> {
    let psk = match &tls.psk_file {
        Some(file) => Some(psk::load(file, tls.username.as_deref())?),
        None => None,
    };
    let name = tls.hostname.as_deref().or(host);
    let auth = match (&psk, &tls.psk_file) {
        (Some(p), Some(file)) => Auth::Psk { file: file.clone(), identity: p.identity.clone() },
        _ if !tls.verify_peer => Auth::Unverified,
        _ => Auth::X509 { ca: tls.certificates.as_ref().map(|d| d.join(CA_CERT)), name: name.map(str::to_string) },
    };
    let mut b = builder(for_kernel)?;
    match psk {
        Some(psk) => psk_context(&mut b, psk),
        None => x509_context(&mut b, tls),
    }?;
    let setup = |e: ErrorStack| Error::Tls(format!("cannot set up TLS: {e}"));
    let mut ssl = session(&b.build(), name, matches!(auth, Auth::X509 { .. })).map_err(setup)?;
    if for_kernel {
        secrets::watch(&mut ssl).map_err(setup)?;
    }
    Ok(Prepared { ssl, auth, record: for_kernel })
}

impl Prepared {
    /// Whether the session authenticates with a pre-shared key (no certificates).
    pub(crate) fn psk(&self) -> bool {
        matches!(self.auth, Auth::Psk { .. })
    }

    /// Runs the TLS handshake on `plain`, a socket on which the server has just agreed to
    /// NBD_OPT_STARTTLS.
    pub(crate) async fn connect(self, mut plain: Box<dyn Duplex>) -> Result<TlsStream, Error> {
        if self.record {
            plain = Box::new(Recorder::new(plain));
        }
        let mut stream = SslStream::new(self.ssl, plain).map_err(|e| Error::Tls(format!("cannot set up TLS: {e}")))?;
        match Pin::new(&mut stream).connect().await {
            Ok(()) => Ok(stream),
            Err(e) => Err(refused(stream.ssl(), &e, &self.auth)),
        }
    }
}

/// One session of `ctx`, naming `name` to the server (SNI) and, with `verify_name`,
/// requiring it in the server's certificate: as an IP address when it is one.
fn session(ctx: &SslContext, name: Option<&str>, verify_name: bool) -> Result<Ssl, ErrorStack> {
    let mut ssl = Ssl::new(ctx)?;
    let Some(name) = name else { return Ok(ssl) };
    match name.parse::<IpAddr>() {
        Ok(ip) if verify_name => ssl.param_mut().set_ip(ip)?,
        Ok(_) => {}
        Err(_) => {
            ssl.set_hostname(name)?;
            if verify_name {
                ssl.param_mut().set_host(name)?;
            }
        }
    }
    Ok(ssl)
}

fn builder(for_kernel: bool) -> Result<SslContextBuilder, Error> {
    let setup = |e: ErrorStack| Error::Tls(format!("cannot set up TLS: {e}"));
    let mut b = SslContext::builder(SslMethod::tls_client()).map_err(setup)?;
    b.set_min_proto_version(Some(SslVersion::TLS1_2)).map_err(setup)?;
    b.set_options(SslOptions::NO_COMPRESSION | SslOptions::NO_RENEGOTIATION);
    if for_kernel {
        // TLS 1.3's traffic secrets reach us only through the key log.
        secrets::capture(&mut b).map_err(setup)?;
    }
    Ok(b)
}

fn psk_context(b: &mut SslContextBuilder, psk: Psk) -> Result<(), Error> {
    b.set_cipher_list(PSK_CIPHERS_TLS12).map_err(|e| Error::Tls(format!("OpenSSL has no PSK cipher suites: {e}")))?;
    // No CA is loaded: a server that shows a certificate instead of proving the key fails.
    b.set_verify(SslVerifyMode::PEER);
    b.set_psk_client_callback(move |_, _hint, identity, key| {
        // The identity goes as a C string; the buffers are OpenSSL's, sized to its limits.
        let id = psk.identity.as_bytes();
        if id.len() >= identity.len() || psk.key.len() > key.len() {
            return Err(ErrorStack::get());
        }
        identity[..id.len()].copy_from_slice(id);
        identity[id.len()] = 0;
        key[..psk.key.len()].copy_from_slice(&psk.key);
        Ok(psk.key.len())
    });
    Ok(())
}

fn x509_context(b: &mut SslContextBuilder, tls: &Tls) -> Result<(), Error> {
    b.set_cipher_list(X509_CIPHERS_TLS12).map_err(|e| Error::Tls(format!("cannot set up TLS: {e}")))?;
    b.set_verify(if tls.verify_peer { SslVerifyMode::PEER } else { SslVerifyMode::NONE });
    match &tls.certificates {
        Some(dir) => load_dir(b, dir, tls.verify_peer)?,
        None if tls.verify_peer => {
            b.set_default_verify_paths().map_err(|e| Error::TlsConfig(format!("cannot load the system's CA certificates: {e}")))?;
        }
        None => {}
    }
    Ok(())
}

/// Loads a certificates directory: the CA (needed to verify), its CRL and the client's
/// certificate and key (each when present).
fn load_dir(b: &mut SslContextBuilder, dir: &Path, verify: bool) -> Result<(), Error> {
    if !dir.is_dir() {
        return Err(Error::TlsConfig(format!("the TLS certificates directory {} does not exist or is not a directory", dir.display())));
    }
    let ca = dir.join(CA_CERT);
    if ca.exists() {
        for cert in certs(&ca)? {
            b.cert_store_mut().add_cert(cert).map_err(|e| bad_file(&ca, e))?;
        }
    } else if verify {
        return Err(Error::TlsConfig(format!("no {CA_CERT} in {} (the CA that signed the server's certificate)", dir.display())));
    }
    let crl = dir.join(CA_CRL);
    if crl.exists() {
        readable(&crl)?;
        let store = b.cert_store_mut();
        let lookup = store.add_lookup(X509Lookup::file()).map_err(|e| bad_file(&crl, e))?;
        lookup.load_crl_file(&crl, SslFiletype::PEM).map_err(|e| bad_file(&crl, e))?;
        store.set_flags(X509VerifyFlags::CRL_CHECK).map_err(|e| bad_file(&crl, e))?;
    }
    let (cert, key) = (dir.join(CLIENT_CERT), dir.join(CLIENT_KEY));
    match (cert.exists(), key.exists()) {
        (true, true) => client_identity(b, &cert, &key),
        (false, false) => Ok(()),
        (true, false) => Err(Error::TlsConfig(format!("{} has no {CLIENT_KEY} to go with its {CLIENT_CERT}", dir.display()))),
        (false, true) => Err(Error::TlsConfig(format!("{} has no {CLIENT_CERT} to go with its {CLIENT_KEY}", dir.display()))),
    }
}

/// The client's certificate (with the chain after it) and its private key.
fn client_identity(b: &mut SslContextBuilder, cert: &Path, key: &Path) -> Result<(), Error> {
    let mut chain = certs(cert)?.into_iter();
    let leaf = chain.next().ok_or_else(|| Error::TlsConfig(format!("{} holds no certificate", cert.display())))?;
    b.set_certificate(&leaf).map_err(|e| bad_file(cert, e))?;
    for extra in chain {
        b.add_extra_chain_cert(extra).map_err(|e| bad_file(cert, e))?;
    }
    let pkey = PKey::private_key_from_pem(&readable(key)?).map_err(|e| bad_file(key, e))?;
    b.set_private_key(&pkey).map_err(|e| bad_file(key, e))?;
    b.check_private_key().map_err(|_| Error::TlsConfig(format!("{} is not the key of {}", key.display(), cert.display())))
}

fn readable(path: &Path) -> Result<Vec<u8>, Error> {
    std::fs::read(path).map_err(|e| Error::TlsConfig(format!("cannot read {}: {e}", path.display())))
}

fn certs(path: &Path) -> Result<Vec<X509>, Error> {
    let certs = X509::stack_from_pem(&readable(path)?).map_err(|e| bad_file(path, e))?;
    if certs.is_empty() {
        return Err(Error::TlsConfig(format!("{} holds no PEM certificate", path.display())));
    }
    Ok(certs)
}

fn bad_file(path: &Path, e: ErrorStack) -> Error {
    Error::TlsConfig(format!("{}: {}", path.display(), reasons(&e)))
}

/// OpenSSL's reasons, without its file and line numbers.
fn reasons(e: &ErrorStack) -> String {
    let r: Vec<&str> = e.errors().iter().filter_map(|x| x.reason()).collect();
    if r.is_empty() {
        e.to_string()
    } else {
        r.join("; ")
    }
}

/// Why the handshake failed, in terms of what the user set up.
fn refused(ssl: &SslRef, e: &openssl::ssl::Error, auth: &Auth) -> Error {
    let verify = ssl.verify_result();
    let why = match (e.ssl_error(), e.io_error()) {
        (Some(stack), _) => reasons(stack),
        (None, Some(io)) => format!("the connection failed: {io}"),
        (None, None) => "the server closed the connection".to_string(),
    };
    let m = match auth {
        Auth::X509 { name: Some(name), .. } if NAME_MISMATCH.contains(&verify.as_raw()) => {
            format!("the server's certificate is not made out to {name:?} (set the name to check with tls-hostname)")
        }
        Auth::X509 { ca, .. } if verify.as_raw() != 0 => {
            let against = ca.as_ref().map_or("the system's CA certificates".to_string(), |p| p.display().to_string());
            format!("the server's certificate was not accepted: {} (checked against {against})", verify.error_string())
        }
        Auth::Psk { file, identity } => {
            format!("the TLS handshake failed ({why}): does the server have the key {} holds for {identity:?}?", file.display())
        }
        _ => format!("the TLS handshake failed: {why}"),
    };
    Error::Tls(m)
}
