//! STARTTLS as the client speaks it, seen from a fake server (OpenSSL with a pre-shared
//! key, so no certificates are needed): NBD_OPT_STARTTLS is the first option, everything
//! after it goes over TLS, a refusal is never followed by plaintext, and a disconnect ends
//! with NBD_CMD_DISC and a TLS close_notify.

use openssl::ssl::{ShutdownState, Ssl, SslAcceptor, SslMethod, SslStream};
use sluice_client::{Client, Error, Options, Reconnect, Uri};
use sluice_proto::wire::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

const KEY: [u8; 4] = [0xde, 0xad, 0xbe, 0xef];
const SIZE: u64 = 1 << 20;
/// Far more than any step needs; reaching it is a hang, reported as such.
const PATIENCE: Duration = Duration::from_secs(10);

/// What the fake server saw: every option in order (`TLS` marks where TLS began), the
/// commands of transmission, and whether the client closed TLS with close_notify.
#[derive(Debug, Default, PartialEq, Eq)]
struct Seen {
    options: Vec<u32>,
    commands: Vec<u16>,
    close_notify: bool,
}

/// Stands for the TLS handshake in `Seen::options`.
const TLS: u32 = u32::MAX;

fn option(s: &mut impl Read) -> Option<(u32, Vec<u8>)> {
    let mut h = [0u8; OPTION_HEADER_BYTES];
    s.read_exact(&mut h).ok()?;
    assert_eq!(u64::from_be_bytes(h[..8].try_into().unwrap()), IHAVEOPT);
    let mut payload = vec![0u8; u32::from_be_bytes(h[12..16].try_into().unwrap()) as usize];
    s.read_exact(&mut payload).ok()?;
    Some((u32::from_be_bytes(h[8..12].try_into().unwrap()), payload))
}

fn option_reply(s: &mut impl Write, opt: u32, kind: u32, payload: &[u8]) {
    let mut out = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
    for v in [opt, kind, payload.len() as u32] {
        out.extend_from_slice(&v.to_be_bytes());
    }
    out.extend_from_slice(payload);
    s.write_all(&out).unwrap();
}

fn acceptor() -> Ssl {
    let mut b = SslAcceptor::mozilla_intermediate_v5(SslMethod::tls_server()).unwrap();
    b.set_cipher_list("PSK-AES128-GCM-SHA256:ECDHE-PSK-CHACHA20-POLY1305").unwrap();
    b.set_psk_server_callback(|_, identity, key| {
        assert_eq!(identity, Some(&b"alice"[..]), "the URI's user is the identity");
        key[..KEY.len()].copy_from_slice(&KEY);
        Ok(KEY.len())
    });
    Ssl::new(&b.build().into_context()).unwrap()
}

/// What one connection of the fake server does.
#[derive(Clone, Copy)]
enum Plan {
    /// TLS, then an honest handshake and transmission over it until NBD_CMD_DISC.
    Serve,
    /// TLS and the handshake, then the connection drops (a server restarting).
    DropAfterGo,
    /// STARTTLS answered with this error.
    Refuse(u32),
}

/// Serves one connection: the greeting, then STARTTLS, then as `plan` says.
fn serve(mut s: TcpStream, plan: Plan) -> Seen {
    let mut seen = Seen::default();
    let mut g = NBDMAGIC.to_be_bytes().to_vec();
    g.extend_from_slice(&IHAVEOPT.to_be_bytes());
    g.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&g).unwrap();
    s.read_exact(&mut [0u8; CLIENT_FLAGS_BYTES]).unwrap();
    let (first, _) = option(&mut s).unwrap();
    seen.options.push(first);
    if let Plan::Refuse(refusal) = plan {
        option_reply(&mut s, first, refusal, b"no TLS here");
        // Whatever comes now is plaintext, which the client must not send but to leave.
        while let Some((opt, _)) = option(&mut s) {
            seen.options.push(opt);
            option_reply(&mut s, opt, REP_ACK, &[]);
        }
        return seen;
    }
    option_reply(&mut s, first, REP_ACK, &[]);
    let mut tls = acceptor().accept(s).expect("the TLS handshake");
    seen.options.push(TLS);
    options_over_tls(&mut tls, &mut seen);
    if let Plan::Serve = plan {
        transmission(&mut tls, &mut seen);
    }
    seen
}

fn options_over_tls(tls: &mut SslStream<TcpStream>, seen: &mut Seen) {
    loop {
        let (opt, _) = option(tls).expect("an option over TLS");
        seen.options.push(opt);
        // Without structured replies (or extended headers) every reply is simple, reads
        // included.
        if opt != OPT_GO {
            let refused = matches!(opt, OPT_STRUCTURED_REPLY | OPT_EXTENDED_HEADERS);
            option_reply(tls, opt, if refused { REP_ERR_UNSUP } else { REP_ACK }, &[]);
            continue;
        }
        let mut info = INFO_EXPORT.to_be_bytes().to_vec();
        info.extend_from_slice(&SIZE.to_be_bytes());
        info.extend_from_slice(&(FLAG_HAS_FLAGS | FLAG_SEND_FLUSH).to_be_bytes());
        option_reply(tls, OPT_GO, REP_INFO, &info);
        option_reply(tls, OPT_GO, REP_ACK, &[]);
        return;
    }
}

/// Answers requests until NBD_CMD_DISC, then reads on to the end of the stream, which
/// should be the client's close_notify.
fn transmission(tls: &mut SslStream<TcpStream>, seen: &mut Seen) {
    loop {
        let mut r = [0u8; REQUEST_BYTES];
        tls.read_exact(&mut r).expect("a request");
        let (kind, handle) = (u16::from_be_bytes([r[6], r[7]]), &r[8..16]);
        let len = u32::from_be_bytes(r[24..28].try_into().unwrap()) as usize;
        seen.commands.push(kind);
        if kind == CMD_DISC {
            break;
        }
        let mut reply = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
        reply.extend_from_slice(&0u32.to_be_bytes());
        reply.extend_from_slice(handle);
        if kind == CMD_READ {
            reply.resize(reply.len() + len, 0x5a);
        }
        tls.write_all(&reply).unwrap();
    }
    let end = tls.read(&mut [0u8; 1]);
    seen.close_notify = matches!(end, Ok(0)) && tls.get_shutdown().contains(ShutdownState::RECEIVED);
}

/// A fake server that serves one connection after the other as `plans` say, and the URI
/// to reach it with the key.
fn fake(plans: Vec<Plan>) -> (Uri, tempfile::TempDir, std::thread::JoinHandle<Vec<Seen>>) {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let dir = tempfile::tempdir().unwrap();
    let psk = dir.path().join("keys.psk");
    std::fs::write(&psk, "bob:00\nalice:deadbeef\n").unwrap();
    let server = std::thread::spawn(move || plans.into_iter().map(|plan| serve(listener.accept().unwrap().0, plan)).collect());
    let uri = Uri::parse(&format!("nbds://alice@127.0.0.1:{port}/?tls-psk-file={}", psk.display())).unwrap();
    (uri, dir, server)
}

async fn patiently<T>(what: &str, work: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(PATIENCE, work).await.unwrap_or_else(|_| panic!("{what} hangs"))
}

/// What the fake server saw, once it is done; it never waits long, as every read it makes
/// is answered or ended by the client.
async fn seen(server: std::thread::JoinHandle<Vec<Seen>>) -> Vec<Seen> {
    patiently("the server", tokio::task::spawn_blocking(move || server.join().unwrap())).await.unwrap()
}

#[tokio::test]
async fn starttls_comes_first_and_everything_after_goes_over_tls() {
    let (uri, _dir, server) = fake(vec![Plan::Serve]);
    let client = patiently("connecting", Client::connect_with(&uri, &Options::default())).await.unwrap();
    assert_eq!(client.size(), SIZE);
    let tls = client.export().tls.clone().expect("a TLS export");
    assert!(tls.starts_with("TLSv1.3"), "{tls}");
    client.flush().await.unwrap();
    client.disconnect().await;
    let seen = seen(server).await;
    assert_eq!(seen[0].options, [OPT_STARTTLS, TLS, OPT_EXTENDED_HEADERS, OPT_STRUCTURED_REPLY, OPT_GO]);
    assert_eq!(seen[0].commands, [CMD_FLUSH, CMD_DISC]);
    assert!(seen[0].close_notify, "the client left without close_notify");
}

#[tokio::test]
async fn a_refusal_is_never_followed_by_plaintext() {
    for refusal in [REP_ERR_UNSUP, REP_ERR_POLICY, REP_ERR_INVALID] {
        let (uri, _dir, server) = fake(vec![Plan::Refuse(refusal)]);
        let e = patiently("connecting", Client::connect_with(&uri, &Options::default())).await.err().expect("no TLS, no connection");
        assert!(matches!(&e, Error::Tls(m) if m.contains("does not offer TLS")), "{e}");
        let seen = seen(server).await;
        assert_eq!(seen[0].options, [OPT_STARTTLS, OPT_ABORT], "after refusal {refusal:#x}");
    }
}

#[tokio::test]
async fn reconnecting_starts_tls_again() {
    let (uri, _dir, server) = fake(vec![Plan::DropAfterGo, Plan::Serve]);
    let reconnect = Reconnect { initial_delay: Duration::ZERO, ..Reconnect::default() };
    let options = Options { reconnect: Some(reconnect), ..Options::default() };
    let client = patiently("connecting", Client::connect_with(&uri, &options)).await.unwrap();
    // Sent on the connection that dropped, or on the new one: either way it is answered.
    let data = patiently("the read", client.read_owned(0, vec![0; 4096])).await.unwrap();
    assert!(data.iter().all(|&b| b == 0x5a));
    client.disconnect().await;
    let seen = seen(server).await;
    assert_eq!(seen[1].options, [OPT_STARTTLS, TLS, OPT_EXTENDED_HEADERS, OPT_STRUCTURED_REPLY, OPT_GO], "the second connection is TLS too");
    assert_eq!(seen[1].commands, [CMD_READ, CMD_DISC]);
    assert!(seen[1].close_notify);
}

