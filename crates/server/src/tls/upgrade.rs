//! The server's side of the TLS handshake after STARTTLS, run on the handshake thread over
//! a duplicate of the connection's socket, whose receive and send timeouts (the
//! handshake's deadline) bound every step. The session that comes out carries on with
//! option haggling and then moves to a worker, or is handed to the kernel (handoff.rs).

use std::io;
use std::os::fd::OwnedFd;
use std::time::Instant;

use openssl::ssl::{Ssl, SslStream};
use openssl::x509::X509VerifyResult;
use sluice_ktls::secrets;

use super::channel::Channel;
use super::context::TlsServer;

pub type TlsSession = SslStream<Channel>;

/// Runs the TLS handshake as the server. `socket` is a duplicate of the connection's
/// socket, used until `deadline` at the latest; it is let go when the session moves to a
/// worker.
pub fn accept(server: &TlsServer, socket: OwnedFd, deadline: Instant) -> io::Result<TlsSession> {
    let mut ssl = Ssl::new(&server.context).map_err(io::Error::other)?;
    let mut channel = Channel::over_socket(socket, deadline);
    if server.hands_over() {
        // What the kernel would need at handoff, and the records to check it against.
        secrets::watch(&mut ssl).map_err(io::Error::other)?;
        channel.keep_transcript();
    }
    let mut stream = SslStream::new(ssl, channel).map_err(io::Error::other)?;
    if let Err(e) = stream.accept() {
        let verify = stream.ssl().verify_result();
        let why = match e.io_error() {
            Some(io) => io.to_string(),
            None if verify != X509VerifyResult::OK => format!("client certificate refused: {}", verify.error_string()),
            None => e.ssl_error().map_or_else(|| e.to_string(), |s| s.to_string()),
        };
        let kind = e.io_error().map_or(io::ErrorKind::InvalidData, io::Error::kind);
        return Err(io::Error::new(kind, format!("TLS handshake failed: {why}")));
    }
    Ok(stream)
}
