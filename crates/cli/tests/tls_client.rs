//! sluice's client tools over TLS against `nbdkit --tls=require`: X.509 and PSK round trips
//! byte-exact, TLS 1.2 and 1.3, client certificates, and every refusal (wrong key, unknown
//! CA, wrong host name, no TLS on either side) clean, with the right exit status.
mod common;
use common::tls::{Keys, OTHER_HOST};
use common::*;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SIZE: usize = 4 << 20;

/// A GnuTLS configuration that turns TLS 1.3 off in every program that reads it, here
/// nbdkit: a TLS 1.2-only server.
const GNUTLS_TLS12_ONLY: &str = "[overrides]\ndisabled-version = tls1.3\n";

/// Where nbdkit listens.
enum Listen {
    Tcp,
    Unix,
}

/// `nbdkit --exit-with-parent memory 4M` with `tls` arguments on 127.0.0.1 or a Unix socket,
/// killed on drop. With `tls12`, its GnuTLS speaks TLS 1.2 at most.
struct Nbdkit {
    child: Child,
    port: u16,
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Nbdkit {
    fn start(listen: Listen, tls: &[&str], tls12: bool) -> Nbdkit {
        for _attempt in 0..5 {
            let dir = tempfile::tempdir().unwrap();
            let (socket, port) = (dir.path().join("nbdkit.sock"), free_port());
            let mut cmd = Command::new("nbdkit");
            cmd.args(["-f", "--exit-with-parent"]).args(tls).stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null());
            match listen {
                Listen::Tcp => cmd.args(["-i", "127.0.0.1", "-p", &port.to_string()]),
                Listen::Unix => cmd.args(["-U", socket.to_str().unwrap()]),
            };
            if tls12 {
                let config = dir.path().join("gnutls.config");
                std::fs::write(&config, GNUTLS_TLS12_ONLY).unwrap();
                cmd.env("GNUTLS_SYSTEM_PRIORITY_FILE", config);
            }
            let child = cmd.args(["memory", &SIZE.to_string()]).spawn().expect("start nbdkit");
            let mut n = Nbdkit { child, port, socket, _dir: dir };
            if n.wait_listening(&listen) {
                return n;
            }
            // Another test took the port between free_port() and the bind: try another.
        }
        panic!("nbdkit {tls:?} did not start");
    }

    fn wait_listening(&mut self, listen: &Listen) -> bool {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let up = match listen {
                Listen::Tcp => std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok(),
                Listen::Unix => std::os::unix::net::UnixStream::connect(&self.socket).is_ok(),
            };
            if up {
                return true;
            }
            if self.child.try_wait().unwrap().is_some() {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        false
    }

    /// `nbds://HOST:PORT/`.
    fn tcp(&self, host: &str) -> String {
        format!("nbds://{host}:{}/", self.port)
    }

    /// `nbds+unix:///?socket=...`, with `user@` when given.
    fn unix(&self, user: &str) -> String {
        let at = if user.is_empty() { String::new() } else { format!("{user}@") };
        format!("nbds+unix://{at}/?socket={}", self.socket.display())
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn x509_server(dir: PathBuf, listen: Listen, tls12: bool) -> Nbdkit {
    Nbdkit::start(listen, &["--tls=require", "--tls-certificates", dir.to_str().unwrap()], tls12)
}

fn psk_server(keys: &Keys, listen: Listen, tls12: bool) -> Nbdkit {
    Nbdkit::start(listen, &["--tls=require", "--tls-psk", keys.psk_file().to_str().unwrap()], tls12)
}

struct Out {
    code: i32,
    stdout: String,
    stderr: String,
}

/// Runs `sluice ARGS...`, killed after 60 s. Its output goes to files, so that a large
/// one cannot block it while it is waited for.
fn sluice(args: &[&str]) -> Out {
    let dir = tempfile::tempdir().unwrap();
    let (out, err) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let file = |p: &Path| std::fs::File::create(p).unwrap();
    let mut child = Command::new(SLUICE).args(args).stdin(Stdio::null()).stdout(file(&out)).stderr(file(&err)).spawn().unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(60)).unwrap_or_else(|| panic!("sluice {args:?} hangs"));
    let text = |p: &Path| String::from_utf8_lossy(&std::fs::read(p).unwrap()).into_owned();
    Out { code: status.code().unwrap_or(-1), stdout: text(&out), stderr: text(&err) }
}

fn ok(args: &[&str]) -> Out {
    let out = sluice(args);
    assert_eq!(out.code, 0, "sluice {args:?} failed: {}", out.stderr);
    out
}

/// Fails with `code` and a message naming every one of `needles`.
fn fails(args: &[&str], code: i32, needles: &[&str]) -> String {
    let out = sluice(args);
    assert_eq!(out.code, code, "sluice {args:?}: {}{}", out.stdout, out.stderr);
    for n in needles {
        assert!(out.stderr.contains(n), "sluice {args:?}: no {n:?} in {}", out.stderr);
    }
    out.stderr
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// Copies a pattern into `uri` and back out with `tls` options, byte-exact, lists the
/// server's exports, and returns what `sluice info` says of the connection's TLS.
fn round_trip(uri: &str, tls: &[&str], seed: u64) -> String {
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    let data = pattern(SIZE, seed);
    write_file(&src, &data);
    ok(&[&["copy", s(&src), uri], tls].concat());
    ok(&[&["copy", uri, s(&back)], tls].concat());
    assert!(std::fs::read(&back).unwrap() == data, "{uri}: the copy back differs");
    let list = ok(&[&["info", "--list", uri], tls].concat());
    assert!(list.stdout.contains(&SIZE.to_string()), "{uri}: {}", list.stdout);
    let info = ok(&[&["info", "--json", uri], tls].concat());
    let json: serde_json::Value = serde_json::from_str(&info.stdout).unwrap();
    assert_eq!(json["size"], SIZE as u64);
    json["tls"].as_str().unwrap_or_else(|| panic!("{uri}: info reports no TLS: {}", info.stdout)).to_string()
}

#[test]
fn x509_round_trip_over_tls13_by_host_name() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let server = x509_server(keys.server_dir(), Listen::Tcp, false);
    let tls = round_trip(&server.tcp("localhost"), &["--tls-certificates", s(&keys.client_dir())], 1);
    assert!(tls.starts_with("TLSv1.3"), "{tls}");
}

#[test]
fn x509_round_trip_over_tls12_by_ip_address_in_the_uri_query() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let server = x509_server(keys.server_dir(), Listen::Tcp, true);
    let uri = format!("{}?tls-certificates={}", server.tcp("127.0.0.1"), keys.ca_only_client_dir().display());
    let tls = round_trip(&uri, &[], 2);
    assert!(tls.starts_with("TLSv1.2"), "{tls}");
}

#[test]
fn psk_round_trip_over_tls13_and_tls12() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let psk = keys.psk_file();
    // The identity from the URI's user, the file from its query.
    let v13 = psk_server(&keys, Listen::Unix, false);
    let tls = round_trip(&format!("{}&tls-psk-file={}", v13.unix("alice"), psk.display()), &[], 3);
    assert!(tls.starts_with("TLSv1.3"), "{tls}");
    // Both from options, over a TLS 1.2-only server.
    let v12 = psk_server(&keys, Listen::Tcp, true);
    let tls = round_trip(&v12.tcp("127.0.0.1"), &["--tls-psk-file", s(&psk), "--tls-username", "bob"], 4);
    assert!(tls.starts_with("TLSv1.2") && tls.contains("PSK"), "{tls}");
}

#[test]
fn a_server_that_checks_clients_takes_our_certificate() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let dir = keys.server_dir();
    let server = Nbdkit::start(Listen::Tcp, &["--tls=require", "--tls-verify-peer", "--tls-certificates", s(&dir)], false);
    let uri = server.tcp("localhost");
    ok(&["info", "--tls-certificates", s(&keys.client_dir()), &uri]);
    // Without a certificate, or with one from a CA the server does not trust, it refuses.
    fails(&["info", "--tls-certificates", s(&keys.ca_only_client_dir()), &uri], 1, &["TLS"]);
    fails(&["info", "--tls-certificates", s(&keys.untrusted_client_dir()), &uri], 1, &["TLS"]);
}

#[test]
fn a_wrong_key_is_refused() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let server = psk_server(&keys, Listen::Unix, false);
    let wrong = keys.wrong_psk_file();
    fails(&["info", "--tls-psk-file", s(&wrong), &server.unix("alice")], 1, &["TLS", s(&wrong), "\"alice\""]);
    let tls12 = psk_server(&keys, Listen::Unix, true);
    fails(&["info", "--tls-psk-file", s(&wrong), &tls12.unix("alice")], 1, &["TLS", s(&wrong)]);
}

#[test]
fn a_certificate_from_another_ca_is_refused_unless_unchecked() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let server = x509_server(keys.other_ca_server_dir(), Listen::Tcp, false);
    let uri = server.tcp("localhost");
    let ca = keys.client_dir().join("ca-cert.pem");
    fails(&["info", "--tls-certificates", s(&keys.client_dir()), &uri], 1, &["not accepted", s(&ca)]);
    // No directory: the system's CAs, which do not know this one either.
    fails(&["info", &uri], 1, &["not accepted", "system"]);
    let unchecked = format!("{uri}?tls-verify-peer=false");
    ok(&["info", &unchecked]);
    // The option wins over the URI's key, both ways.
    fails(&["info", "--tls-verify-peer", "true", &unchecked], 1, &["not accepted"]);
    ok(&["info", "--tls-verify-peer", "false", &uri]);
}

#[test]
fn a_certificate_for_another_host_is_refused() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let certs = keys.client_dir();
    // By the URI's host...
    let elsewhere = x509_server(keys.wrong_name_server_dir(), Listen::Tcp, false);
    fails(&["info", "--tls-certificates", s(&certs), &elsewhere.tcp("localhost")], 1, &["not made out to \"localhost\""]);
    fails(&["info", "--tls-certificates", s(&certs), &elsewhere.tcp("127.0.0.1")], 1, &["\"127.0.0.1\""]);
    // ...unless tls-hostname names the certificate's.
    ok(&["info", "--tls-certificates", s(&certs), "--tls-hostname", OTHER_HOST, &elsewhere.tcp("localhost")]);
    // tls-hostname is checked instead of the host.
    let local = x509_server(keys.server_dir(), Listen::Tcp, false);
    let uri = format!("{}?tls-hostname={OTHER_HOST}", local.tcp("localhost"));
    fails(&["info", "--tls-certificates", s(&certs), &uri], 1, &[&format!("not made out to \"{OTHER_HOST}\"")]);
}

#[test]
fn over_a_unix_socket_the_name_is_checked_only_when_given() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let certs = keys.client_dir();
    let server = x509_server(keys.server_dir(), Listen::Unix, false);
    let tls = round_trip(&server.unix(""), &["--tls-certificates", s(&certs)], 5);
    assert!(tls.starts_with("TLSv1.3"), "{tls}");
    ok(&["info", "--tls-certificates", s(&certs), "--tls-hostname", "localhost", &server.unix("")]);
    fails(&["info", "--tls-certificates", s(&certs), "--tls-hostname", OTHER_HOST, &server.unix("")], 1, &[OTHER_HOST]);
    // The CA is checked all the same.
    let other = x509_server(keys.other_ca_server_dir(), Listen::Unix, false);
    fails(&["info", "--tls-certificates", s(&certs), &other.unix("")], 1, &["not accepted"]);
}

#[test]
fn no_tls_on_one_side_fails_cleanly() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let plain = Nbdkit::start(Listen::Unix, &[], false);
    let e = fails(&["info", "--tls-psk-file", s(&keys.psk_file()), &plain.unix("alice")], 1, &["does not offer TLS"]);
    assert!(!e.contains("panic"), "{e}");
    let tls = psk_server(&keys, Listen::Unix, false);
    let plain_uri = tls.unix("").replace("nbds+unix", "nbd+unix");
    fails(&["info", &plain_uri], 1, &["requires TLS", "nbds://"]);
    fails(&["info", "--list", &plain_uri], 1, &["requires TLS"]);
    let dir = tempfile::tempdir().unwrap();
    fails(&["copy", &plain_uri, s(&dir.path().join("out.img"))], 1, &["requires TLS"]);
}

#[test]
fn options_and_files_that_cannot_be_used_are_usage_errors() {
    require!("certtool", "psktool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let unix = format!("nbds+unix:///?socket={}", dir.path().join("none.sock").display());
    fails(&["info", "--tls-certificates", "/tmp", "nbd://localhost/"], 2, &["nbds://"]);
    fails(&["copy", "--tls-psk-file", s(&keys.psk_file()), "nbd://localhost/", "out.img"], 2, &["nbds://"]);
    fails(&["info", "--tls-certificates", "/nonexistent/certs", &unix], 2, &["/nonexistent/certs"]);
    fails(&["info", "--tls-certificates", s(dir.path()), &unix], 2, &["no ca-cert.pem", s(dir.path())]);
    let bad = dir.path().join("bad.psk");
    std::fs::write(&bad, "alice:00ff\nbob:xyz\n").unwrap();
    fails(&["info", "--tls-psk-file", s(&bad), &unix.replace(":///", "://alice@/")], 2, &[s(&bad), "line 2"]);
    fails(&["info", "--tls-psk-file", s(&keys.psk_file()), "--tls-username", "carol", &unix], 2, &["\"carol\"", s(&keys.psk_file())]);
    fails(&["info", "--tls-verify-peer", "maybe", &unix], 2, &["maybe"]);
    fails(&["info", &format!("{unix}&tls-verify-peer=maybe")], 2, &["tls-verify-peer"]);
    fails(&["info", &format!("{unix}&tls-bogus=1")], 2, &["tls-bogus"]);
}

#[test]
fn a_pool_reaches_its_members_over_tls() {
    require!("nbdkit", "certtool", "psktool");
    let keys = Keys::generate();
    let (one, two) = (psk_server(&keys, Listen::Unix, false), psk_server(&keys, Listen::Tcp, true));
    let psk = keys.psk_file();
    let members = [format!("{}&tls-psk-file={}", one.unix("alice"), psk.display()), format!("nbds://bob@127.0.0.1:{}/?tls-psk-file={}", two.port, psk.display())];
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("pool.toml");
    std::fs::write(&file, format!("layout = \"mirror\"\nmembers = [\"{}\", \"{}\"]\n", members[0], members[1])).unwrap();
    let pool = format!("pool:{}", file.display());
    ok(&["pool", "init", &pool]);
    let (src, back) = (dir.path().join("src.img"), dir.path().join("back.img"));
    let data = pattern(1 << 20, 6);
    write_file(&src, &data);
    ok(&["copy", s(&src), &pool]);
    ok(&["copy", &pool, s(&back)]);
    assert!(std::fs::read(&back).unwrap()[..data.len()] == data[..], "the pool's copy back differs");
    // Each member holds the data too, read over its own TLS.
    for member in &members {
        let got = ok(&["copy", member, "-"]);
        assert!(got.stdout.len() > data.len(), "{member}");
    }
}

#[test]
fn bench_and_mount_take_the_options_too_and_bench_runs_over_tls() {
    require!("certtool", "psktool");
    let keys = Keys::generate();
    let psk = keys.psk_file();
    let dir = tempfile::tempdir().unwrap();
    fails(&["bench", "--quick", "--tls-psk-file", s(&psk), "nbd://localhost/"], 2, &["nbds://"]);
    // A short sweep over TLS, with several connections.
    require!("nbdkit");
    let server = psk_server(&keys, Listen::Tcp, false);
    let out = dir.path().join("bench");
    let sweep = ["--sizes", "4K,1M", "--depths", "1,8", "--patterns", "seq", "--runtime", "0.1", "--warmup", "0.05", "--connections", "2"];
    let uri = format!("nbds://alice@127.0.0.1:{}/", server.port);
    ok(&[&["bench", "--tls-psk-file", s(&psk), "--out", s(&out)][..], &sweep, &[&uri]].concat());
    assert!(std::fs::read_to_string(out.join("bench.csv")).unwrap().lines().count() >= 5, "four points and a header");
    fails(&["mount", "--tls-psk-file", s(&psk), "nbd://localhost/", s(&dir.path().join("m"))], 2, &["nbds://"]);
}
