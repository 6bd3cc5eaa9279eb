//! Handing a client's session to the kernel's TLS, against a real OpenSSL server in
//! process (with a pre-shared key, so no certificates are needed). This host's kernel has
//! no `tls` module, so the tests check everything up to the kernel's setsockopt: the
//! planned keys and sequence numbers open the next record each side's OpenSSL writes,
//! read off the socket as the kernel would read it, and a kernel without TLS is named as
//! such. Where the kernel has kTLS, the same tests check that the socket then carries
//! plaintext both ways.

use super::kernel::{detach, hand_to_kernel, plan};
use super::{prepare, prepare_for_kernel, Duplex, Prepared, Tls, TlsStream};
use openssl::ssl::{Ssl, SslContext, SslMethod, SslStream, SslVersion};
use sluice_ktls::keys::Aead;
use sluice_ktls::transcript::{open, read_record, HEADER_BYTES};
use sluice_ktls::{install, Plan, Refusal};
use std::io::{Read, Write};
use std::net::TcpListener;
use std::os::fd::{AsFd, OwnedFd};
use std::thread::JoinHandle;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const IDENTITY: &str = "alice";
const KEY: [u8; 16] = *b"0123456789abcdef";
/// Tickets an OpenSSL server sends after a TLS 1.3 handshake with a pre-shared key (it
/// sends two after others): records under the application keys that the client must
/// count.
const TICKETS: u64 = 1;
/// Far more than any step needs; reaching it is a hang, reported as such.
const PATIENCE: Duration = Duration::from_secs(10);

/// A server limited to one version and one suite (a TLS 1.3 suite name, or a TLS 1.2
/// cipher list), which knows the client's key.
fn server_context(version: SslVersion, suite: &str) -> SslContext {
    let mut b = SslContext::builder(SslMethod::tls_server()).unwrap();
    b.set_min_proto_version(Some(version)).unwrap();
    b.set_max_proto_version(Some(version)).unwrap();
    if version == SslVersion::TLS1_3 {
        b.set_ciphersuites(suite).unwrap();
    } else {
        b.set_cipher_list(suite).unwrap();
    }
    b.set_psk_server_callback(|_, identity, key| {
        assert_eq!(identity, Some(IDENTITY.as_bytes()));
        key[..KEY.len()].copy_from_slice(&KEY);
        Ok(KEY.len())
    });
    b.build()
}

/// The client's side of the key: a psktool file, kept as long as the directory is.
fn client_settings() -> (tempfile::TempDir, Tls) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("keys.psk");
    let hex: String = KEY.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&file, format!("{IDENTITY}:{hex}\n")).unwrap();
    (dir, Tls { psk_file: Some(file), username: Some(IDENTITY.into()), ..Tls::default() })
}

/// The server's part: the TLS handshake, then a round of option haggling.
fn serve<S: Read + Write>(socket: S, context: SslContext) -> SslStream<S> {
    let mut tls = SslStream::new(Ssl::new(&context).unwrap(), socket).unwrap();
    tls.accept().unwrap();
    let mut option = [0; 10];
    tls.read_exact(&mut option).unwrap();
    assert_eq!(&option, b"option one");
    tls.write_all(b"reply one").unwrap();
    tls
}

/// The client's part of `serve`, over `socket`: after it the NBD handshake would be done.
async fn haggle(prepared: Prepared, socket: Box<dyn Duplex>) -> TlsStream {
    let mut stream = prepared.connect(socket).await.unwrap();
    stream.write_all(b"option one").await.unwrap();
    stream.flush().await.unwrap();
    let mut reply = [0; 9];
    stream.read_exact(&mut reply).await.unwrap();
    assert_eq!(&reply, b"reply one");
    stream
}

/// A server over loopback TCP and the client's session with it, at the handoff point.
async fn over_tcp(server: SslContext, prepared: Prepared) -> (TlsStream, JoinHandle<SslStream<std::net::TcpStream>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let address = listener.local_addr().unwrap();
    let peer = std::thread::spawn(move || {
        let socket = listener.accept().unwrap().0;
        socket.set_read_timeout(Some(PATIENCE)).unwrap();
        serve(socket, server)
    });
    let socket = tokio::net::TcpStream::connect(address).await.unwrap();
    (haggle(prepared, Box::new(socket)).await, peer)
}

fn blocking(fd: OwnedFd) -> std::net::TcpStream {
    let socket = std::net::TcpStream::from(fd);
    socket.set_read_timeout(Some(PATIENCE)).unwrap();
    socket
}

/// Plans the handoff over TCP for one version and suite, and checks the plan against the
/// record each side's OpenSSL writes next.
async fn plan_for(version: SslVersion, suite: &str, aead: Aead) {
    let (_dir, tls) = client_settings();
    let (mut stream, peer) = over_tcp(server_context(version, suite), prepare_for_kernel(&tls, None).unwrap()).await;
    let plan = plan(&mut stream).unwrap_or_else(|why| panic!("{suite}: {why}"));
    assert_eq!(plan.suite.aead, aead, "{suite}");
    // TLS 1.2 counts from each side's Finished; TLS 1.3 from the first record under the
    // application keys, the server's tickets among them.
    let (rx, tx) = if version == SslVersion::TLS1_3 { (TICKETS + 1, 1) } else { (2, 2) };
    assert_eq!((plan.rx.seq, plan.tx.seq), (rx, tx), "{suite}");
    let gcm12 = version == SslVersion::TLS1_2 && aead != Aead::Chacha20Poly1305;
    assert_eq!(plan.tx.explicit_nonce.is_some(), gcm12, "{suite}");
    let mut server = peer.join().unwrap();
    check_sent(&plan, &mut stream, &server).await;
    server.write_all(b"after the handoff").unwrap();
    let fd = detach(stream).unwrap();
    check_received(&plan, fd, &mut server);
}

/// The client's next record, written by OpenSSL and read raw on the server's side, opens
/// with the planned send keys at the planned sequence number, and at no other.
async fn check_sent(plan: &Plan, stream: &mut TlsStream, server: &SslStream<std::net::TcpStream>) {
    stream.write_all(b"the request").await.unwrap();
    stream.flush().await.unwrap();
    let record = read_record(server.get_ref()).unwrap();
    let opened = open(&plan.suite, &plan.tx.keys, plan.tx.seq, &record).map(|(_, p)| p);
    assert_eq!(opened.as_deref(), Some(&b"the request"[..]));
    assert!(open(&plan.suite, &plan.tx.keys, plan.tx.seq + 1, &record).is_none(), "a wrong count is caught");
    if let Some(nonce) = plan.tx.explicit_nonce {
        // The record's explicit nonce is the one OpenSSL used last, and the kernel's
        // first comes after it: a GCM nonce never repeats under one key.
        let sent = u64::from_be_bytes(record[HEADER_BYTES..HEADER_BYTES + 8].try_into().unwrap());
        assert_eq!(sent, nonce, "OpenSSL counts its explicit nonces up by one");
    }
}

/// Installs the plan on the socket. A kernel without TLS refuses it, untouched, and the
/// server's next record, raw, opens with the planned receive keys; a kernel with TLS
/// hands over plaintext both ways.
fn check_received(plan: &Plan, fd: OwnedFd, server: &mut SslStream<std::net::TcpStream>) {
    match install(fd.as_fd(), plan) {
        Err(Refusal::Untouched(why)) => {
            assert!(why.contains("no TLS support") && why.contains("modprobe tls"), "{why}");
            let record = read_record(&blocking(fd)).unwrap();
            let opened = open(&plan.suite, &plan.rx.keys, plan.rx.seq, &record).map(|(_, p)| p);
            assert_eq!(opened.as_deref(), Some(&b"after the handoff"[..]));
            assert!(open(&plan.suite, &plan.rx.keys, plan.rx.seq + 1, &record).is_none(), "a wrong count is caught");
        }
        Ok(()) => {
            let mut socket = blocking(fd);
            let mut data = [0; 17];
            socket.read_exact(&mut data).unwrap();
            assert_eq!(&data, b"after the handoff");
            socket.write_all(b"from the kernel").unwrap();
            let mut data = [0; 15];
            server.read_exact(&mut data).unwrap();
            assert_eq!(&data, b"from the kernel");
        }
        Err(refusal) => panic!("the kernel refused halfway: {}", refusal.why()),
    }
}

#[tokio::test]
async fn tls13_aes_128_gcm() {
    plan_for(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256", Aead::Aes128Gcm).await;
}

#[tokio::test]
async fn tls13_chacha20_poly1305() {
    plan_for(SslVersion::TLS1_3, "TLS_CHACHA20_POLY1305_SHA256", Aead::Chacha20Poly1305).await;
}

#[tokio::test]
async fn tls12_aes_128_gcm() {
    plan_for(SslVersion::TLS1_2, "PSK-AES128-GCM-SHA256", Aead::Aes128Gcm).await;
}

#[tokio::test]
async fn tls12_aes_256_gcm_sha384() {
    plan_for(SslVersion::TLS1_2, "PSK-AES256-GCM-SHA384", Aead::Aes256Gcm).await;
}

#[tokio::test]
async fn tls12_chacha20_poly1305() {
    plan_for(SslVersion::TLS1_2, "ECDHE-PSK-CHACHA20-POLY1305", Aead::Chacha20Poly1305).await;
}

/// The whole handoff: the kernel takes the session, or (here) says it has no TLS.
#[tokio::test]
async fn the_kernel_takes_the_session_or_says_it_has_no_tls() {
    let (_dir, tls) = client_settings();
    let context = server_context(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256");
    let (stream, peer) = over_tcp(context, prepare_for_kernel(&tls, None).unwrap()).await;
    let mut server = peer.join().unwrap();
    match hand_to_kernel(stream) {
        Ok(fd) => {
            server.write_all(b"after the handoff").unwrap();
            let mut data = [0; 17];
            blocking(fd).read_exact(&mut data).unwrap();
            assert_eq!(&data, b"after the handoff");
        }
        Err(e) => {
            let e = e.to_string();
            assert!(e.contains("the kernel has no TLS support") && e.contains("modprobe tls"), "{e}");
        }
    }
}

#[tokio::test]
async fn a_unix_socket_is_refused() {
    let (_dir, tls) = client_settings();
    let context = server_context(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256");
    let (ours, theirs) = tokio::net::UnixStream::pair().unwrap();
    let theirs = theirs.into_std().unwrap();
    theirs.set_nonblocking(false).unwrap();
    theirs.set_read_timeout(Some(PATIENCE)).unwrap();
    let peer = std::thread::spawn(move || serve(theirs, context));
    let stream = haggle(prepare_for_kernel(&tls, None).unwrap(), Box::new(ours)).await;
    let _server = peer.join().unwrap();
    let e = hand_to_kernel(stream).unwrap_err().to_string();
    assert!(e.contains("kTLS needs TCP, not a Unix socket"), "{e}");
}

#[tokio::test]
async fn a_suite_the_kernel_does_not_take_is_named() {
    let (_dir, tls) = client_settings();
    let context = server_context(SslVersion::TLS1_2, "ECDHE-PSK-AES128-CBC-SHA256");
    let (stream, _peer) = over_tcp(context, prepare_for_kernel(&tls, None).unwrap()).await;
    let e = hand_to_kernel(stream).unwrap_err().to_string();
    assert!(e.contains("ECDHE-PSK-AES128-CBC-SHA256 is not a suite"), "{e}");
}

#[tokio::test]
async fn plaintext_waiting_in_openssl_is_named() {
    let (_dir, tls) = client_settings();
    let context = server_context(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256");
    let (mut stream, peer) = over_tcp(context, prepare_for_kernel(&tls, None).unwrap()).await;
    peer.join().unwrap().write_all(b"after the handoff").unwrap();
    let mut part = [0; 4];
    stream.read_exact(&mut part).await.unwrap();
    let why = plan(&mut stream).err().expect("13 bytes wait in OpenSSL");
    assert!(why.contains("13 bytes the server sent wait decrypted in OpenSSL"), "{why}");
}

/// A session not prepared for the kernel records nothing.
#[tokio::test]
async fn an_ordinary_session_keeps_no_transcript() {
    let (_dir, tls) = client_settings();
    let context = server_context(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256");
    let (mut stream, _peer) = over_tcp(context, prepare(&tls, None).unwrap()).await;
    assert_eq!(plan(&mut stream).err().as_deref(), Some("no transcript was kept"));
}
