//! TLS keys made at test time with GnuTLS's certtool and psktool (Debian's gnutls-bin), in
//! the layouts nbdkit and libnbd read: a server directory holds `ca-cert.pem`,
//! `server-cert.pem` and `server-key.pem`; a client directory holds `ca-cert.pem`,
//! `client-cert.pem` and `client-key.pem`. Tests call `require!("certtool", "psktool")`
//! first, then `Keys::generate()`.

use std::path::{Path, PathBuf};
use std::process::Command;

/// One test's keys, in a temporary directory that goes with it:
/// - a CA, with a server certificate for `localhost` (DNS localhost, IP 127.0.0.1 and ::1)
///   and a client certificate (CN alice);
/// - a second, unrelated CA with its own server certificate for `localhost`, and a client
///   certificate no server here trusts;
/// - a server certificate from the first CA for another host name (`elsewhere.example`);
/// - a PSK file with users alice and bob, and a second one with another key for alice.
pub struct Keys {
    pub dir: tempfile::TempDir,
}

/// The host name `wrong_name_server_dir`'s certificate is made out to.
pub const OTHER_HOST: &str = "elsewhere.example";

const CA_TEMPLATE: &str = "cn = \"sluice test CA\"\nca\ncert_signing_key\ncrl_signing_key\nexpiration_days = 3650\n";

impl Keys {
    pub fn generate() -> Keys {
        let keys = Keys { dir: tempfile::tempdir().expect("tempdir") };
        let (ca, other) = (keys.path("ca"), keys.path("other-ca"));
        make_ca(&ca, "sluice test CA");
        make_ca(&other, "unrelated test CA");
        let localhost = "cn = \"localhost\"\ndns_name = \"localhost\"\nip_address = \"127.0.0.1\"\nip_address = \"::1\"\n";
        server_dir(&keys.server_dir(), &ca, localhost);
        server_dir(&keys.other_ca_server_dir(), &other, localhost);
        server_dir(&keys.wrong_name_server_dir(), &ca, &format!("cn = \"{OTHER_HOST}\"\ndns_name = \"{OTHER_HOST}\"\n"));
        client_dir(&keys.client_dir(), &ca, &ca);
        client_dir(&keys.untrusted_client_dir(), &ca, &other);
        let ca_only = keys.ca_only_client_dir();
        std::fs::create_dir(&ca_only).unwrap();
        std::fs::copy(ca.join("ca-cert.pem"), ca_only.join("ca-cert.pem")).unwrap();
        for user in ["alice", "bob"] {
            tool("psktool", &["-u", user, "-p", path_str(&keys.psk_file())]);
        }
        tool("psktool", &["-u", "alice", "-p", path_str(&keys.wrong_psk_file())]);
        keys
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// The CA: `ca-cert.pem` and its private key `ca-key.pem`, for a test that signs more.
    pub fn ca_dir(&self) -> PathBuf {
        self.path("ca")
    }

    /// For `nbdkit --tls-certificates` (and `--tls-verify-peer`: it checks client
    /// certificates against the same CA).
    pub fn server_dir(&self) -> PathBuf {
        self.path("server")
    }

    /// For libnbd's and sluice's `tls-certificates`: the CA, and a client certificate.
    pub fn client_dir(&self) -> PathBuf {
        self.path("client")
    }

    /// Only the CA: a client that checks the server but has no certificate to show.
    pub fn ca_only_client_dir(&self) -> PathBuf {
        self.path("client-ca-only")
    }

    /// A client directory like `client_dir`, with a certificate from the same CA whose
    /// subject has `template`'s names (certtool's keys: `cn = "bob"`, `organization = ...`).
    /// Its key is RSA: qemu wants a client certificate's key usage to allow key
    /// encipherment, which an ECDSA key cannot have.
    pub fn client_dir_for(&self, name: &str, template: &str) -> PathBuf {
        let dir = self.path(&format!("client-{name}"));
        let ca = self.ca_dir();
        std::fs::create_dir(&dir).unwrap();
        std::fs::copy(ca.join("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
        tool("certtool", &["--generate-privkey", "--key-type=rsa", "--bits=2048", "--outfile", path_str(&dir.join("client-key.pem"))]);
        let template = format!("{template}\ntls_www_client\nsigning_key\nencryption_key\nexpiration_days = 3650\n");
        certificate(&dir.join("client-cert.pem"), &dir.join("client-key.pem"), Some(&ca), &template);
        dir
    }

    /// Trusts the right CA but shows a certificate from the unrelated one, which a server
    /// with verify-peer refuses.
    pub fn untrusted_client_dir(&self) -> PathBuf {
        self.path("client-untrusted")
    }

    /// A server directory whose certificate (and CA) no client here trusts.
    pub fn other_ca_server_dir(&self) -> PathBuf {
        self.path("server-other-ca")
    }

    /// A server directory whose certificate, from the right CA, is for `OTHER_HOST`.
    pub fn wrong_name_server_dir(&self) -> PathBuf {
        self.path("server-wrong-name")
    }

    /// psktool's format, users alice and bob.
    pub fn psk_file(&self) -> PathBuf {
        self.path("keys.psk")
    }

    /// alice with another key than `psk_file`'s.
    pub fn wrong_psk_file(&self) -> PathBuf {
        self.path("wrong.psk")
    }
}

fn path_str(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 path")
}

fn tool(program: &str, args: &[&str]) {
    let out = super::output(Command::new(program).args(args));
    assert!(out.status.success(), "{program} {args:?} failed: {}", String::from_utf8_lossy(&out.stderr));
}

/// A private key (ECDSA: quick to make) at `key`.
fn private_key(key: &Path) {
    tool("certtool", &["--generate-privkey", "--key-type=ecdsa", "--outfile", path_str(key)]);
}

/// Writes `template` beside `out`, then has certtool sign a certificate for `key` with it.
fn certificate(out: &Path, key: &Path, ca: Option<&Path>, template: &str) {
    let info = out.with_extension("info");
    std::fs::write(&info, template).unwrap();
    let mut args = vec!["--load-privkey", path_str(key), "--template", path_str(&info), "--outfile", path_str(out)];
    let (ca_cert, ca_key) = ca.map(|d| (d.join("ca-cert.pem"), d.join("ca-key.pem"))).unzip();
    match (&ca_cert, &ca_key) {
        (Some(cert), Some(key)) => {
            args.extend(["--generate-certificate", "--load-ca-certificate", path_str(cert), "--load-ca-privkey", path_str(key)]);
        }
        _ => args.push("--generate-self-signed"),
    }
    tool("certtool", &args);
}

fn make_ca(dir: &Path, name: &str) {
    std::fs::create_dir(dir).unwrap();
    private_key(&dir.join("ca-key.pem"));
    certificate(&dir.join("ca-cert.pem"), &dir.join("ca-key.pem"), None, &CA_TEMPLATE.replace("sluice test CA", name));
}

/// A directory as nbdkit reads it: a server certificate from the CA in `signer`, with the
/// names in `names`, and that CA's certificate (which nbdkit checks clients against).
fn server_dir(dir: &Path, signer: &Path, names: &str) {
    std::fs::create_dir(dir).unwrap();
    std::fs::copy(signer.join("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
    private_key(&dir.join("server-key.pem"));
    let template = format!("organization = \"sluice tests\"\n{names}tls_www_server\nsigning_key\nencryption_key\nexpiration_days = 3650\n");
    certificate(&dir.join("server-cert.pem"), &dir.join("server-key.pem"), Some(signer), &template);
}

/// A directory as libnbd reads it: the CA `trusted` (for the server's certificate), and
/// a client certificate from `signer`.
fn client_dir(dir: &Path, trusted: &Path, signer: &Path) {
    std::fs::create_dir(dir).unwrap();
    std::fs::copy(trusted.join("ca-cert.pem"), dir.join("ca-cert.pem")).unwrap();
    private_key(&dir.join("client-key.pem"));
    let template = "cn = \"alice\"\ntls_www_client\nsigning_key\nencryption_key\nexpiration_days = 3650\n";
    certificate(&dir.join("client-cert.pem"), &dir.join("client-key.pem"), Some(signer), template);
}
