//! The handoff to kTLS against real OpenSSL peers, in process. This host's kernel has no
//! `tls` module, so nothing here hands keys to a kernel: each test runs the server's side
//! through the real `accept` (capturing secrets and ciphertext as it would for kTLS) and
//! an OpenSSL client, exchanges records both ways, and then checks what the kernel would
//! have been given: the sequence numbers, keys that open the next record each side sends
//! (read off the socket as the kernel would read it), and a record sealed as the kernel
//! would seal it with what it was given, which the client must take.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::net::UnixStream;
use std::sync::Arc;
use std::time::{Duration, Instant};

use openssl::asn1::Asn1Time;
use openssl::bn::BigNum;
use openssl::ec::{EcGroup, EcKey};
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::ssl::{Ssl, SslContext, SslMethod, SslStream, SslVerifyMode, SslVersion};
use openssl::symm::{decrypt_aead, encrypt_aead, Cipher};
use openssl::x509::{X509NameBuilder, X509};
use sluice_ktls::keys::{Aead, TrafficKeys};
use sluice_ktls::secrets::Secret;
use sluice_ktls::sys::{KernelCipher, KernelKeys};
use sluice_ktls::transcript::{open, read_record, HEADER_BYTES};
use sluice_ktls::{kernel_keys, Plan};
use sluice_proto::TlsMode;

use super::handoff::{hand_off, plan, Encryption};
use super::ktls::{Ktls, KtlsMode};
use super::{accept, TlsServer, TlsSettings, TlsSession};

const PSK_IDENTITY: &str = "alice";
const PSK_KEY: [u8; 16] = *b"0123456789abcdef";

/// A TLS server as `sluice serve --tls=require` loads it, with a fresh self-signed
/// certificate and a PSK file, on a kernel said to offer kTLS.
fn server(test: &str) -> Arc<TlsServer> {
    let dir = std::env::temp_dir().join(format!("sluice-ktls-{test}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_certificate(&dir);
    let psk = dir.join("keys.psk");
    let hex: String = PSK_KEY.iter().map(|b| format!("{b:02x}")).collect();
    std::fs::write(&psk, format!("{PSK_IDENTITY}:{hex}\n")).unwrap();
    let settings = TlsSettings {
        mode: TlsMode::Require,
        certificates: Some(dir.clone()),
        psk: Some(psk),
        verify_peer: false,
        ktls: KtlsMode::Auto,
    };
    let server = TlsServer::load_for(&settings, Ktls::Offered).unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    server
}

fn write_certificate(dir: &std::path::Path) {
    let key = PKey::from_ec_key(EcKey::generate(&EcGroup::from_curve_name(Nid::X9_62_PRIME256V1).unwrap()).unwrap()).unwrap();
    let mut name = X509NameBuilder::new().unwrap();
    name.append_entry_by_text("CN", "localhost").unwrap();
    let name = name.build();
    let mut cert = X509::builder().unwrap();
    cert.set_version(2).unwrap();
    cert.set_serial_number(&BigNum::from_u32(1).unwrap().to_asn1_integer().unwrap()).unwrap();
    cert.set_subject_name(&name).unwrap();
    cert.set_issuer_name(&name).unwrap();
    cert.set_pubkey(&key).unwrap();
    cert.set_not_before(&Asn1Time::days_from_now(0).unwrap()).unwrap();
    cert.set_not_after(&Asn1Time::days_from_now(1).unwrap()).unwrap();
    cert.sign(&key, MessageDigest::sha256()).unwrap();
    std::fs::write(dir.join("server-cert.pem"), cert.build().to_pem().unwrap()).unwrap();
    std::fs::write(dir.join("server-key.pem"), key.private_key_to_pem_pkcs8().unwrap()).unwrap();
}

/// A client limited to one version and one suite (a TLS 1.3 suite name, or a TLS 1.2
/// cipher list), with the PSK when `psk`.
fn client(version: SslVersion, suite: &str, psk: bool) -> SslContext {
    let mut b = SslContext::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    b.set_min_proto_version(Some(version)).unwrap();
    b.set_max_proto_version(Some(version)).unwrap();
    if version == SslVersion::TLS1_3 {
        b.set_ciphersuites(suite).unwrap();
    } else {
        b.set_cipher_list(suite).unwrap();
    }
    if psk {
        b.set_psk_client_callback(|_, _, identity, key| {
            identity[..PSK_IDENTITY.len()].copy_from_slice(PSK_IDENTITY.as_bytes());
            identity[PSK_IDENTITY.len()] = 0;
            key[..PSK_KEY.len()].copy_from_slice(&PSK_KEY);
            Ok(PSK_KEY.len())
        });
    }
    b.build()
}

/// What both sides hold after the exchange: the server's session, the client's stream
/// (the client's last record waits unread in the server's socket), and the server's end
/// of the socket for reading records raw.
struct Exchanged<S> {
    session: TlsSession,
    client: SslStream<S>,
    raw: S,
}

/// Handshake, then as in option haggling: two client records, two server records, and
/// the client's next record (`request`), which only the socket holds.
fn exchange<S>(server: &TlsServer, client_context: SslContext, (ours, theirs): (S, S), request: &[u8]) -> Exchanged<S>
where
    S: Read + Write + AsFd + Send + 'static,
{
    let request = request.to_vec();
    let peer = std::thread::spawn(move || {
        let mut c = SslStream::new(Ssl::new(&client_context).unwrap(), theirs).unwrap();
        c.connect().unwrap();
        c.write_all(b"option one").unwrap();
        c.write_all(b"option two").unwrap();
        let mut replies = [0; 18];
        c.read_exact(&mut replies).unwrap();
        assert_eq!(&replies, b"reply onereply two");
        c.write_all(&request).unwrap();
        c
    });
    let socket: OwnedFd = ours.as_fd().try_clone_to_owned().unwrap();
    let mut session = accept(server, socket, Instant::now() + Duration::from_secs(10)).unwrap();
    let mut options = [0; 20];
    session.read_exact(&mut options).unwrap();
    assert_eq!(&options, b"option oneoption two");
    session.write_all(b"reply one").unwrap();
    session.write_all(b"reply two").unwrap();
    let client = peer.join().unwrap();
    Exchanged { session, client, raw: ours }
}

/// Checks the plan against the records each side sends next: each opens at the planned
/// sequence number and at no other, and not with a key one bit off; and the keys as the
/// kernel would get them work as the kernel would use them, with the real client.
fn check_next_records<S: Read + Write>(plan: &Plan, ex: &mut Exchanged<S>, request: &[u8])
where
    for<'a> &'a S: Read + Write,
{
    let record = read_record(&ex.raw).unwrap();
    assert_eq!(open(&plan.suite, &plan.rx.keys, plan.rx.seq, &record).map(|(_, p)| p), Some(request.to_vec()));
    assert!(open(&plan.suite, &plan.rx.keys, plan.rx.seq + 1, &record).is_none(), "a wrong count is caught");
    let explicit = plan.rx.explicit_nonce.unwrap_or(plan.rx.seq).to_be_bytes();
    assert_eq!(kernel_open(&kernel_keys(&plan.suite, &plan.rx, &explicit), &record), Some(request.to_vec()));
    // The server's next record as OpenSSL would write it, taken off the socket before the
    // client sees it.
    ex.session.write_all(b"reply three").unwrap();
    let record = read_record(ex.client.get_ref()).unwrap();
    assert_eq!(open(&plan.suite, &plan.tx.keys, plan.tx.seq, &record).map(|(_, p)| p), Some(b"reply three".to_vec()));
    assert!(open(&plan.suite, &plan.tx.keys, plan.tx.seq + 1, &record).is_none(), "a wrong count is caught");
    if let Some(nonce) = plan.tx.explicit_nonce {
        // OpenSSL counts its explicit nonces up by one, so the kernel starts where it would.
        assert_eq!(record[HEADER_BYTES..HEADER_BYTES + 8], nonce.to_be_bytes());
    }
    let mut wrong = TrafficKeys { key: Secret::from_slice(plan.tx.keys.key.as_ref()), iv: Secret::from_slice(plan.tx.keys.iv.as_ref()) };
    wrong.key.as_mut()[0] ^= 0x80;
    assert!(open(&plan.suite, &wrong, plan.tx.seq, &record).is_none(), "a wrong key is caught");
    // In its place, the record the kernel would send: the client takes it.
    let explicit = plan.tx.explicit_nonce.unwrap_or(plan.tx.seq).to_be_bytes();
    let tx = kernel_keys(&plan.suite, &plan.tx, &explicit);
    if let Some(nonce) = plan.tx.explicit_nonce {
        assert_eq!(tx.iv, nonce.to_be_bytes(), "the kernel's explicit nonces go on above OpenSSL's");
    }
    (&ex.raw).write_all(&kernel_seal(&tx, b"from the kernel")).unwrap();
    let mut reply = [0; 15];
    ex.client.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"from the kernel");
}

/// The 12-byte nonce of the kernel's next record and whether it goes in the record (the
/// kernel's net/tls: salt | iv, XORed with the sequence number for TLS 1.3 and for
/// ChaCha20-Poly1305; TLS 1.2 AES-GCM sends iv as the explicit nonce instead).
fn kernel_nonce(k: &KernelKeys) -> ([u8; 12], bool) {
    let mut nonce = [0; 12];
    nonce.copy_from_slice(&[k.salt, k.iv].concat());
    let xor = k.version == libc::TLS_1_3_VERSION || k.cipher == KernelCipher::Chacha20Poly1305;
    if xor {
        nonce[4..].iter_mut().zip(k.rec_seq).for_each(|(n, s)| *n ^= s);
    }
    (nonce, !xor)
}

fn kernel_cipher(k: &KernelKeys) -> Cipher {
    match k.cipher {
        KernelCipher::Aes128Gcm => Cipher::aes_128_gcm(),
        KernelCipher::Aes256Gcm => Cipher::aes_256_gcm(),
        KernelCipher::Chacha20Poly1305 => Cipher::chacha20_poly1305(),
    }
}

/// Application data sealed as the kernel's TLS would seal its next record with `k`.
fn kernel_seal(k: &KernelKeys, data: &[u8]) -> Vec<u8> {
    let (nonce, explicit) = kernel_nonce(k);
    let tls13 = k.version == libc::TLS_1_3_VERSION;
    let inner = if tls13 { [data, &[23]].concat() } else { data.to_vec() };
    let explicit = if explicit { k.iv.to_vec() } else { Vec::new() };
    let len = (explicit.len() + inner.len() + 16) as u16;
    let header = [&[23, 3, 3][..], &len.to_be_bytes()].concat();
    let aad = if tls13 { header.clone() } else { [&k.rec_seq[..], &[23, 3, 3], &(data.len() as u16).to_be_bytes()].concat() };
    let mut tag = [0; 16];
    let sealed = encrypt_aead(kernel_cipher(k), k.key, Some(&nonce), &aad, &inner, &mut tag).unwrap();
    [header, explicit, sealed, tag.to_vec()].concat()
}

/// A data record opened as the kernel's TLS would open the next one it receives with `k`.
fn kernel_open(k: &KernelKeys, record: &[u8]) -> Option<Vec<u8>> {
    let (mut nonce, explicit) = kernel_nonce(k);
    let (header, mut body) = record.split_at(HEADER_BYTES);
    if explicit {
        nonce[4..].copy_from_slice(&body[..8]);
        body = &body[8..];
    }
    let (sealed, tag) = body.split_at(body.len() - 16);
    let tls13 = k.version == libc::TLS_1_3_VERSION;
    let aad = if tls13 { header.to_vec() } else { [&k.rec_seq[..], &header[..3], &(sealed.len() as u16).to_be_bytes()].concat() };
    let mut plain = decrypt_aead(kernel_cipher(k), k.key, Some(&nonce), &aad, sealed, tag).ok()?;
    if tls13 {
        assert_eq!(plain.pop(), Some(23), "application data, unpadded");
    }
    Some(plain)
}

fn plan_for(version: SslVersion, suite: &str, psk: bool, aead: Aead) {
    let server = server(&format!("{suite}-{psk}").replace(':', "_"));
    let request = b"the first request";
    let mut ex = exchange(&server, client(version, suite, psk), UnixStream::pair().unwrap(), request);
    let plan = plan(&mut ex.session).unwrap_or_else(|why| panic!("{suite}: {why}"));
    assert_eq!(plan.suite.aead, aead, "{suite}");
    let gcm12 = version == SslVersion::TLS1_2 && aead != Aead::Chacha20Poly1305;
    assert_eq!(plan.tx.explicit_nonce.is_some(), gcm12, "{suite}");
    // TLS 1.2's count starts at each side's Finished.
    let first = if version == SslVersion::TLS1_2 { 1 } else { 0 };
    assert_eq!((plan.rx.seq, plan.tx.seq), (first + 2, first + 2), "{suite}");
    check_next_records(&plan, &mut ex, request);
}

#[test]
fn tls13_aes_128_gcm() {
    plan_for(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256", false, Aead::Aes128Gcm);
}

#[test]
fn tls13_aes_256_gcm() {
    plan_for(SslVersion::TLS1_3, "TLS_AES_256_GCM_SHA384", false, Aead::Aes256Gcm);
}

#[test]
fn tls13_chacha20_poly1305() {
    plan_for(SslVersion::TLS1_3, "TLS_CHACHA20_POLY1305_SHA256", false, Aead::Chacha20Poly1305);
}

#[test]
fn tls13_external_psk() {
    plan_for(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256", true, Aead::Aes128Gcm);
}

#[test]
fn tls12_aes_128_gcm() {
    plan_for(SslVersion::TLS1_2, "ECDHE-ECDSA-AES128-GCM-SHA256", false, Aead::Aes128Gcm);
}

#[test]
fn tls12_aes_256_gcm() {
    plan_for(SslVersion::TLS1_2, "ECDHE-ECDSA-AES256-GCM-SHA384", false, Aead::Aes256Gcm);
}

#[test]
fn tls12_chacha20_poly1305() {
    plan_for(SslVersion::TLS1_2, "ECDHE-ECDSA-CHACHA20-POLY1305", false, Aead::Chacha20Poly1305);
}

#[test]
fn tls12_psk_aes_gcm() {
    plan_for(SslVersion::TLS1_2, "PSK-AES128-GCM-SHA256", true, Aead::Aes128Gcm);
}

#[test]
fn a_suite_the_kernel_does_not_take_stays_in_user_space() {
    let server = server("cbc");
    let client = client(SslVersion::TLS1_2, "ECDHE-PSK-AES128-CBC-SHA256", true);
    let mut ex = exchange(&server, client, UnixStream::pair().unwrap(), b"x");
    let why = plan(&mut ex.session).err().expect("CBC is refused");
    assert!(why.contains("ECDHE-PSK-AES128-CBC-SHA256 is not a suite"), "{why}");
}

#[test]
fn plaintext_waiting_in_openssl_stays_in_user_space() {
    let server = server("pending");
    let client = client(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256", false);
    let mut ex = exchange(&server, client, UnixStream::pair().unwrap(), b"the first request");
    let mut part = [0; 4];
    ex.session.read_exact(&mut part).unwrap();
    let why = plan(&mut ex.session).err().expect("13 bytes wait in OpenSSL");
    assert!(why.contains("13 bytes"), "{why}");
}

#[test]
fn the_transcript_is_kept_only_when_the_kernel_could_take_the_session() {
    let dir = std::env::temp_dir().join(format!("sluice-ktls-off-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    write_certificate(&dir);
    let mut settings =
        TlsSettings { mode: TlsMode::Require, certificates: Some(dir.clone()), psk: None, verify_peer: false, ktls: KtlsMode::Off };
    let off = TlsServer::load_for(&settings, Ktls::Offered).unwrap().unwrap();
    settings.ktls = KtlsMode::Auto;
    let missing = TlsServer::load_for(&settings, Ktls::Missing).unwrap().unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    for server in [off, missing] {
        let client = client(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256", false);
        let mut ex = exchange(&server, client, UnixStream::pair().unwrap(), b"x");
        assert_eq!(plan(&mut ex.session).err().as_deref(), Some("no transcript was kept"));
        let fd = ex.raw.as_fd();
        let session = ex.session;
        assert!(matches!(hand_off(&server, session, fd), Ok(Encryption::User { why: None, .. })), "not even tried");
    }
}

/// A Unix socket has no kTLS: the handoff is not tried, and no reason is logged for it.
#[test]
fn a_unix_socket_stays_in_user_space_without_a_word() {
    let server = server("unix-handoff");
    let client = client(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256", false);
    let ex = exchange(&server, client, UnixStream::pair().unwrap(), b"x");
    let fd = ex.raw.as_fd();
    assert!(matches!(hand_off(&server, ex.session, fd), Ok(Encryption::User { why: None, .. })), "not even tried");
}

/// Over TCP the kernel either takes the session (where it has kTLS: the server's socket
/// then carries plaintext) or refuses it (here: no `tls` module), which leaves the socket
/// untouched and the session going on in user space.
#[test]
fn over_tcp_the_kernel_takes_the_session_or_openssl_keeps_it() {
    let server = server("tcp-handoff");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let theirs = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let ours = listener.accept().unwrap().0;
    let client = client(SslVersion::TLS1_3, "TLS_AES_128_GCM_SHA256", false);
    let mut ex = exchange(&server, client, (ours, theirs), b"the first request");
    let fd = ex.raw.as_fd().try_clone_to_owned().unwrap();
    let mut request = [0; 17];
    match hand_off(&server, ex.session, fd.as_fd()).unwrap() {
        Encryption::User { mut session, why } => {
            let why = why.expect("a reason");
            assert!(why.contains("tls module") || why.contains("tls ULP"), "{why}");
            session.read_exact(&mut request).unwrap();
            session.write_all(b"reply three").unwrap();
        }
        Encryption::Kernel { describe } => {
            assert_eq!(describe, "kTLS, TLSv1.3 TLS_AES_128_GCM_SHA256");
            (&ex.raw).read_exact(&mut request).unwrap();
            (&ex.raw).write_all(b"reply three").unwrap();
        }
    }
    assert_eq!(&request, b"the first request");
    let mut reply = [0; 11];
    ex.client.read_exact(&mut reply).unwrap();
    assert_eq!(&reply, b"reply three");
}

/// The matrix above over loopback TCP instead of a socketpair: the kind of socket changes
/// nothing.
#[test]
fn tcp_gives_the_same_sequence_numbers() {
    let server = server("tcp");
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let theirs = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
    let ours = listener.accept().unwrap().0;
    let client = client(SslVersion::TLS1_2, "ECDHE-ECDSA-AES128-GCM-SHA256", false);
    let mut ex = exchange(&server, client, (ours, theirs), b"the first request");
    let plan = plan(&mut ex.session).unwrap();
    assert_eq!((plan.rx.seq, plan.tx.seq), (3, 3));
    check_next_records(&plan, &mut ex, b"the first request");
}
