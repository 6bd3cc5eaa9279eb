//! Keys and certificates for the TLS tests, made at test time with GnuTLS's certtool and
//! psktool (Debian's gnutls-bin), in the directory layouts the NBD tools read:
//! a server directory (ca-cert.pem, server-cert.pem, server-key.pem) and a client
//! directory (ca-cert.pem, client-cert.pem, client-key.pem).

use std::path::{Path, PathBuf};
use std::process::Command;

pub struct Keys {
    pub dir: tempfile::TempDir,
}

/// The host name and addresses the test server certificate is made out to.
pub const SERVER_NAME: &str = "localhost";
/// The name of the certificate made out to another host.
pub const OTHER_NAME: &str = "elsewhere.example";

fn certtool(dir: &Path, args: &[&str]) {
    let out = Command::new("certtool").args(args).current_dir(dir).output().expect("run certtool");
    assert!(out.status.success(), "certtool {args:?}: {}", String::from_utf8_lossy(&out.stderr));
}

fn template(dir: &Path, name: &str, text: &str) -> String {
    std::fs::write(dir.join(name), text).unwrap();
    name.to_owned()
}

/// A CA in `dir` (ca-key.pem, ca-cert.pem).
fn make_ca(dir: &Path, cn: &str) {
    std::fs::create_dir_all(dir).unwrap();
    certtool(dir, &["--generate-privkey", "--key-type=ecdsa", "--outfile", "ca-key.pem"]);
    let t = template(dir, "ca.info", &format!("cn = {cn}\nca\ncert_signing_key\nexpiration_days = 30\n"));
    certtool(dir, &["--generate-self-signed", "--load-privkey", "ca-key.pem", "--template", &t, "--outfile", "ca-cert.pem"]);
}

/// A certificate signed by the CA in `ca`, written to `dir` as `{role}-cert.pem` and
/// `{role}-key.pem`, with the CA's certificate beside it.
fn make_cert(ca: &Path, dir: &Path, role: &str, names: &str) {
    std::fs::create_dir_all(dir).unwrap();
    let key = format!("{role}-key.pem");
    let cert = format!("{role}-cert.pem");
    certtool(dir, &["--generate-privkey", "--key-type=ecdsa", "--outfile", &key]);
    let usage = if role == "server" { "tls_www_server" } else { "tls_www_client" };
    let t = template(dir, &format!("{role}.info"), &format!("organization = sluice tests\n{names}{usage}\nsigning_key\nencryption_key\nexpiration_days = 30\n"));
    let ca_cert = ca.join("ca-cert.pem");
    let ca_key = ca.join("ca-key.pem");
    certtool(
        dir,
        &[
            "--generate-certificate",
            "--load-privkey",
            &key,
            "--load-ca-certificate",
            ca_cert.to_str().unwrap(),
            "--load-ca-privkey",
            ca_key.to_str().unwrap(),
            "--template",
            &t,
            "--outfile",
            &cert,
        ],
    );
    std::fs::copy(ca_cert, dir.join("ca-cert.pem")).unwrap();
}

fn psktool(file: &Path, user: &str) {
    let out = Command::new("psktool").args(["-u", user, "-p"]).arg(file).output().expect("run psktool");
    assert!(out.status.success(), "psktool: {}", String::from_utf8_lossy(&out.stderr));
}

impl Keys {
    /// Makes everything (a second or two: ECDSA keys).
    pub fn generate() -> Keys {
        let dir = tempfile::tempdir().expect("tempdir");
        let d = dir.path();
        let local = format!("cn = {SERVER_NAME}\ndns_name = {SERVER_NAME}\nip_address = 127.0.0.1\nip_address = ::1\n");
        make_ca(&d.join("ca"), "sluice test CA");
        make_cert(&d.join("ca"), &d.join("server"), "server", &local);
        make_cert(&d.join("ca"), &d.join("client"), "client", "cn = test client\n");
        make_cert(&d.join("ca"), &d.join("other-host"), "server", &format!("cn = {OTHER_NAME}\ndns_name = {OTHER_NAME}\n"));
        make_ca(&d.join("other-ca"), "another CA");
        make_cert(&d.join("other-ca"), &d.join("other-ca-server"), "server", &local);
        make_cert(&d.join("other-ca"), &d.join("other-ca-client"), "client", "cn = stranger\n");
        // A client directory without a client certificate: only the CA to check the server.
        std::fs::create_dir_all(d.join("ca-only")).unwrap();
        std::fs::copy(d.join("ca/ca-cert.pem"), d.join("ca-only/ca-cert.pem")).unwrap();
        psktool(&d.join("keys.psk"), "alice");
        psktool(&d.join("keys.psk"), "bob");
        psktool(&d.join("wrong.psk"), "alice");
        Keys { dir }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    /// For `--tls-certificates`: the server's certificate for localhost, 127.0.0.1, ::1.
    pub fn server_dir(&self) -> PathBuf {
        self.path("server")
    }
    /// For a client's tls-certificates: the CA and a client certificate it signed.
    pub fn client_dir(&self) -> PathBuf {
        self.path("client")
    }
    /// A client directory with the CA and no client certificate.
    pub fn ca_only_dir(&self) -> PathBuf {
        self.path("ca-only")
    }
    /// A server directory whose certificate (for localhost) another CA signed.
    pub fn other_ca_server_dir(&self) -> PathBuf {
        self.path("other-ca-server")
    }
    /// A client directory whose certificate another CA signed.
    pub fn other_ca_client_dir(&self) -> PathBuf {
        self.path("other-ca-client")
    }
    /// A server directory, same CA, whose certificate names OTHER_NAME only.
    pub fn other_host_server_dir(&self) -> PathBuf {
        self.path("other-host")
    }
    /// psktool file with users alice and bob.
    pub fn psk_file(&self) -> PathBuf {
        self.path("keys.psk")
    }
    /// psktool file with a different key for alice.
    pub fn wrong_psk_file(&self) -> PathBuf {
        self.path("wrong.psk")
    }
}
