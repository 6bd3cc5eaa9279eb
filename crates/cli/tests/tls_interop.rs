//! TLS with the real clients: libnbd's nbdinfo, nbdcopy and nbdsh, qemu-img and qemu-io,
//! and nbdkit's nbd plugin, each against `sluice serve --tls=require` with certificates
//! and with pre-shared keys, data verified byte-exact; and the refusals each client must
//! meet (plaintext, wrong key, another CA, another host name, no client certificate).
mod common;
use common::tls::{Keys, OTHER_HOST};
use common::*;

fn tls_server(extra: &[&str]) -> Sluice {
    let mut args = vec!["--tls=require", "--export", "disk=memory:8M"];
    args.extend_from_slice(extra);
    Sluice::start(&args)
}

fn cert_server(keys: &Keys) -> Sluice {
    let dir = keys.server_dir();
    tls_server(&["--tls-certificates", dir.to_str().unwrap()])
}

fn psk_server(keys: &Keys) -> Sluice {
    let file = keys.psk_file();
    tls_server(&["--tls-psk", file.to_str().unwrap()])
}

/// nbds:// over TCP to the export "disk", trusting `dir` (which may hold a client cert).
fn cert_uri(s: &Sluice, dir: &std::path::Path) -> String {
    format!("nbds://localhost:{}/disk?tls-certificates={}", s.port, dir.display())
}

fn psk_uri(s: &Sluice, user: &str, file: &std::path::Path) -> String {
    format!("nbds://{user}@localhost:{}/disk?tls-psk-file={}", s.port, file.display())
}

/// Copies a pattern in and out with nbdcopy through `uri` and compares.
fn nbdcopy_round_trip(uri: &str, seed: u64) {
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src"), dir.path().join("back"));
    let data = pattern(8 << 20, seed);
    write_file(&src, &data);
    let (ok, out, err) = run("nbdcopy", &[src.to_str().unwrap(), uri]);
    assert!(ok, "nbdcopy into {uri}: {out}{err}");
    let (ok, out, err) = run("nbdcopy", &[uri, back.to_str().unwrap()]);
    assert!(ok, "nbdcopy out of {uri}: {out}{err}");
    assert!(std::fs::read(&back).unwrap() == data, "bytes read back over TLS differ from those written");
}

fn nbdinfo_fails(uri: &str) -> String {
    let (ok, out, err) = run("nbdinfo", &[uri]);
    assert!(!ok, "nbdinfo {uri} succeeded:\n{out}");
    err
}

#[test]
fn nbdinfo_and_nbdcopy_with_certificates() {
    require!("nbdinfo", "nbdcopy", "certtool");
    let keys = Keys::generate();
    let s = cert_server(&keys);
    let uri = cert_uri(&s, &keys.ca_only_client_dir());
    let (ok, out, err) = run("nbdinfo", &[&uri]);
    assert!(ok && out.contains("with TLS") && out.contains("8388608"), "nbdinfo: {out}{err}");
    nbdcopy_round_trip(&uri, 11);
    // The log says which TLS each connection got.
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn nbdinfo_and_nbdcopy_with_psk_and_over_a_unix_socket() {
    require!("nbdinfo", "nbdcopy", "psktool");
    let keys = Keys::generate();
    let s = psk_server(&keys);
    nbdcopy_round_trip(&psk_uri(&s, "alice", &keys.psk_file()), 12);
    // Another user of the same file, over the Unix socket.
    let unix = format!("nbds+unix://bob@/disk?socket={}&tls-psk-file={}", s.socket.display(), keys.psk_file().display());
    let (ok, out, err) = run("nbdinfo", &[&unix]);
    assert!(ok && out.contains("with TLS"), "nbdinfo over nbds+unix: {out}{err}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn nbdsh_sees_tls_negotiated_and_every_command_works() {
    require!("nbdsh", "certtool");
    let keys = Keys::generate();
    let s = cert_server(&keys);
    let script = format!(
        r#"
import nbd
h = nbd.NBD()
h.set_uri_allow_local_file(True)
h.add_meta_context("base:allocation")
h.connect_uri("{uri}")
assert h.get_tls_negotiated()
assert h.get_structured_replies_negotiated()
buf = bytes(range(256)) * 4096
h.pwrite(buf, 12345)
assert h.pread(len(buf), 12345) == buf
h.flush()
h.trim(65536, 1 << 20)
h.zero(65536, 2 << 20)
assert h.pread(65536, 2 << 20) == bytes(65536)
seen = []
h.block_status(1 << 20, 0, lambda ctx, off, ents, err: seen.extend(ents))
assert seen
h.shutdown()
print("SCRIPT-COMPLETED")
"#,
        uri = cert_uri(&s, &keys.ca_only_client_dir())
    );
    let (ok, out, err) = run("nbdsh", &["-c", &script]);
    assert!(ok && out.contains("SCRIPT-COMPLETED"), "nbdsh failed\n{out}\n{err}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn qemu_img_and_qemu_io_with_x509_and_psk_credentials() {
    require!("qemu-img", "qemu-io", "certtool", "psktool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.raw");
    let back = dir.path().join("back.raw");
    let data = pattern(8 << 20, 13);
    write_file(&src, &data);
    // qemu reads keys.psk from its credentials directory.
    let psk_dir = dir.path().join("psk");
    std::fs::create_dir(&psk_dir).unwrap();
    std::fs::copy(keys.psk_file(), psk_dir.join("keys.psk")).unwrap();
    let x509 = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", keys.ca_only_client_dir().display());
    let psk = format!("tls-creds-psk,id=tls0,endpoint=client,dir={},username=alice", psk_dir.display());
    for (server, object, extra) in [(cert_server(&keys), x509, ",tls-hostname=localhost"), (psk_server(&keys), psk, "")] {
        let image = format!("driver=nbd,host=127.0.0.1,port={},export=disk,tls-creds=tls0{extra}", server.port);
        let (ok, out, err) = run(
            "qemu-img",
            &["convert", "-n", "-f", "raw", src.to_str().unwrap(), "--object", &object, "--target-image-opts", &image],
        );
        assert!(ok, "qemu-img convert into sluice: {out}{err}");
        let (ok, out, err) =
            run("qemu-img", &["convert", "--object", &object, "--image-opts", &image, "-O", "raw", back.to_str().unwrap()]);
        assert!(ok, "qemu-img convert out of sluice: {out}{err}");
        assert!(std::fs::read(&back).unwrap() == data, "qemu-img read back different bytes");
        let (ok, out, err) = run(
            "qemu-io",
            &["--object", &object, "--image-opts", &image, "-c", "write -P 0x5a 1M 64k", "-c", "read -P 0x5a 1M 64k"],
        );
        assert!(ok && !out.contains("fail") && !err.contains("error"), "qemu-io: {out}{err}");
        assert_eq!(server.stop().code(), Some(0));
    }
}

#[test]
fn nbdkits_nbd_plugin_connects_as_a_tls_client() {
    require!("nbdkit", "nbdcopy", "certtool", "psktool");
    let keys = Keys::generate();
    for (server, auth) in [
        (cert_server(&keys), format!("tls-certificates={}", keys.ca_only_client_dir().display())),
        (psk_server(&keys), format!("tls-psk={} tls-username=bob", keys.psk_file().display())),
    ] {
        // nbdkit re-exports sluice's TLS export in plaintext on a private socket.
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("nbdkit.sock");
        let mut args = vec!["-f".to_owned(), "-U".to_owned(), sock.display().to_string(), "nbd".to_owned()];
        args.extend(["hostname=localhost".to_owned(), format!("port={}", server.port), "export=disk".to_owned(), "tls=require".to_owned()]);
        args.extend(auth.split(' ').map(str::to_owned));
        let mut nbdkit = std::process::Command::new("nbdkit").args(&args).stderr(std::process::Stdio::piped()).spawn().unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        // The socket file exists once bound, before nbdkit listens: wait for a connection.
        while std::os::unix::net::UnixStream::connect(&sock).is_err() {
            assert!(std::time::Instant::now() < deadline, "nbdkit did not start");
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
        nbdcopy_round_trip(&format!("nbd+unix:///?socket={}", sock.display()), 14);
        nbdkit.kill().unwrap();
        nbdkit.wait().unwrap();
        assert_eq!(server.stop().code(), Some(0));
    }
}

#[test]
fn a_plaintext_client_gets_nothing_from_a_require_server() {
    require!("nbdinfo", "certtool");
    let keys = Keys::generate();
    let s = cert_server(&keys);
    let err = nbdinfo_fails(&format!("nbd://localhost:{}/disk", s.port));
    assert!(!err.is_empty());
    let (ok, out, _) = run("nbdinfo", &["--list", &format!("nbd://localhost:{}/", s.port)]);
    assert!(!ok || !out.contains("disk"), "the export list leaked in plaintext: {out}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn a_wrong_psk_or_unknown_identity_is_refused() {
    require!("nbdinfo", "psktool");
    let keys = Keys::generate();
    let s = psk_server(&keys);
    nbdinfo_fails(&psk_uri(&s, "alice", &keys.wrong_psk_file()));
    // carol is in no file the server has; libnbd needs her in its own file to try.
    let carol = keys.dir.path().join("carol.psk");
    std::fs::write(&carol, format!("carol:{}\n", "ab".repeat(32))).unwrap();
    nbdinfo_fails(&psk_uri(&s, "carol", &carol));
    let log = s.log_text();
    assert!(log.contains("TLS handshake failed"), "{log}");
    assert!(log.contains("unknown PSK identity \"carol\""), "{log}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn a_certificate_from_another_ca_or_for_another_host_is_refused() {
    require!("nbdinfo", "qemu-img", "certtool");
    let keys = Keys::generate();
    let stranger = tls_server(&["--tls-certificates", keys.other_ca_server_dir().to_str().unwrap()]);
    nbdinfo_fails(&cert_uri(&stranger, &keys.ca_only_client_dir()));
    assert_eq!(stranger.stop().code(), Some(0));

    let elsewhere = tls_server(&["--tls-certificates", keys.wrong_name_server_dir().to_str().unwrap()]);
    nbdinfo_fails(&cert_uri(&elsewhere, &keys.ca_only_client_dir()));
    // The same certificate is accepted under the name it carries, so the refusal was the
    // name (libnbd 1.14 has no tls-hostname; qemu has).
    let object = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", keys.ca_only_client_dir().display());
    for (name, accepted) in [(OTHER_HOST, true), ("localhost", false)] {
        let image = format!("driver=nbd,host=127.0.0.1,port={},export=disk,tls-creds=tls0,tls-hostname={name}", elsewhere.port);
        let (ok, out, err) = run("qemu-img", &["info", "--object", &object, "--image-opts", &image]);
        assert_eq!(ok, accepted, "qemu-img info with tls-hostname={name}: {out}{err}");
    }
    assert_eq!(elsewhere.stop().code(), Some(0));
}

#[test]
fn verify_peer_wants_a_client_certificate_from_the_ca() {
    require!("nbdinfo", "certtool");
    let keys = Keys::generate();
    let s = tls_server(&["--tls-certificates", keys.server_dir().to_str().unwrap(), "--tls-verify-peer"]);
    nbdinfo_fails(&cert_uri(&s, &keys.ca_only_client_dir()));
    // A client certificate from another CA (with our CA to check the server).
    nbdinfo_fails(&cert_uri(&s, &keys.untrusted_client_dir()));
    let (ok, out, err) = run("nbdinfo", &[&cert_uri(&s, &keys.client_dir())]);
    assert!(ok, "nbdinfo with a client certificate: {out}{err}");
    assert!(s.log_text().contains("TLS handshake failed"), "{}", s.log_text());
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn tls_on_serves_plaintext_and_tls_clients_alike() {
    require!("nbdinfo", "certtool");
    let keys = Keys::generate();
    let s = Sluice::start(&["--tls=on", "--tls-certificates", keys.server_dir().to_str().unwrap(), "--export", "disk=memory:1M"]);
    let (ok, out, err) = run("nbdinfo", &[&format!("nbd://localhost:{}/disk", s.port)]);
    assert!(ok && out.contains("without TLS"), "plaintext: {out}{err}");
    let (ok, out, err) = run("nbdinfo", &[&cert_uri(&s, &keys.ca_only_client_dir())]);
    assert!(ok && out.contains("with TLS"), "TLS: {out}{err}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn tls_1_2_clients_are_served_with_certificates_and_with_psk() {
    // nbd-client speaks TLS 1.2 only; GnuTLS's system configuration makes libnbd do the same.
    require!("nbdcopy", "certtool", "psktool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("gnutls.conf");
    std::fs::write(&config, "[overrides]\ndisabled-version = tls1.3\n").unwrap();
    let (src, back) = (dir.path().join("src"), dir.path().join("back"));
    let data = pattern(8 << 20, 15);
    write_file(&src, &data);
    let certs = keys.server_dir();
    let psk = keys.psk_file();
    let s = tls_server(&["--tls-certificates", certs.to_str().unwrap(), "--tls-psk", psk.to_str().unwrap(), "--log-level", "debug"]);
    for uri in [cert_uri(&s, &keys.ca_only_client_dir()), psk_uri(&s, "alice", &keys.psk_file())] {
        for (from, to) in [(src.to_str().unwrap(), uri.as_str()), (uri.as_str(), back.to_str().unwrap())] {
            let path = format!("/usr/bin:/bin:{}", std::env::var("PATH").unwrap_or_default());
            let mut nbdcopy = std::process::Command::new("nbdcopy");
            let out = output(nbdcopy.args([from, to]).env("GNUTLS_SYSTEM_PRIORITY_FILE", &config).env("PATH", path));
            assert!(out.status.success(), "nbdcopy {from} {to}: {}", String::from_utf8_lossy(&out.stderr));
        }
        assert!(std::fs::read(&back).unwrap() == data, "{uri}: bytes differ over TLS 1.2");
    }
    let log = s.log_text();
    assert!(log.matches("TLSv1.2").count() >= 4, "every connection should be TLS 1.2:\n{log}");
    assert!(!log.contains("TLSv1.3"), "{log}");
    // The server prefers AES-128-GCM for certificates (GnuTLS would pick AES-256 or ChaCha).
    assert!(log.contains("TLSv1.2 ECDHE-ECDSA-AES128-GCM-SHA256"), "{log}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn an_export_re_exports_a_tls_server_over_nbds() {
    // The remote backend connects with sluice's client, so a TLS member works as any other.
    require!("nbdcopy", "psktool");
    let keys = Keys::generate();
    let far = psk_server(&keys);
    let remote = format!("near={}", psk_uri(&far, "bob", &keys.psk_file()));
    let near = Sluice::start(&["--export", &remote]);
    let dir = tempfile::tempdir().unwrap();
    let (src, back) = (dir.path().join("src"), dir.path().join("back"));
    let data = pattern(8 << 20, 16);
    write_file(&src, &data);
    let (ok, out, err) = run("nbdcopy", &[src.to_str().unwrap(), &format!("nbd://localhost:{}/near", near.port)]);
    assert!(ok, "nbdcopy into the re-export: {out}{err}");
    // Read back straight from the TLS server: the bytes went through.
    let (ok, out, err) = run("nbdcopy", &[&psk_uri(&far, "alice", &keys.psk_file()), back.to_str().unwrap()]);
    assert!(ok, "{out}{err}");
    assert!(std::fs::read(&back).unwrap() == data, "the re-export did not carry the bytes over TLS");
    assert_eq!(near.stop().code(), Some(0));
    assert_eq!(far.stop().code(), Some(0));
}
