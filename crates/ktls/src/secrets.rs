//! The session secrets kTLS needs, taken from OpenSSL. TLS 1.3's application traffic
//! secrets are reachable only through the key-log callback, which reports them as the
//! handshake derives them; they are kept with the session (its ex_data) until it is
//! handed to the kernel. TLS 1.2's master secret and the two randoms are read from the
//! session then. Every copy lives in a `Secret`, which wipes itself on drop.

use std::sync::{Mutex, OnceLock};

use openssl::error::ErrorStack;
use openssl::ex_data::Index;
use openssl::ssl::{Ssl, SslContextBuilder, SslRef};

use crate::sys::wipe;

/// Room for the largest secret handled: a TLS 1.2 key block of ChaCha20-Poly1305
/// (2 × 32-byte keys + 2 × 12-byte IVs = 88 bytes); hash outputs are at most 48.
const SECRET_CAPACITY_BYTES: usize = 128;

/// Key material, wiped when dropped.
pub struct Secret {
    bytes: [u8; SECRET_CAPACITY_BYTES],
    len: usize,
}

impl Secret {
    /// `len` zero bytes, to be filled through `as_mut`.
    pub fn zeroed(len: usize) -> Secret {
        assert!(len <= SECRET_CAPACITY_BYTES, "a secret of {len} bytes");
        Secret { bytes: [0; SECRET_CAPACITY_BYTES], len }
    }

    pub fn from_slice(bytes: &[u8]) -> Secret {
        let mut s = Secret::zeroed(bytes.len());
        s.as_mut().copy_from_slice(bytes);
        s
    }

    /// Decodes hexadecimal, as the key log writes secrets; None if it is not.
    fn from_hex(hex: &str) -> Option<Secret> {
        let digits = hex.as_bytes();
        if !digits.len().is_multiple_of(2) || digits.len() / 2 > SECRET_CAPACITY_BYTES {
            return None;
        }
        let mut s = Secret::zeroed(digits.len() / 2);
        for (out, pair) in s.as_mut().iter_mut().zip(digits.chunks_exact(2)) {
            let nibble = |d: u8| (d as char).to_digit(16).map(|v| v as u8);
            *out = nibble(pair[0])? << 4 | nibble(pair[1])?;
        }
        Some(s)
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl AsRef<[u8]> for Secret {
    fn as_ref(&self) -> &[u8] {
        &self.bytes[..self.len]
    }
}

impl AsMut<[u8]> for Secret {
    fn as_mut(&mut self) -> &mut [u8] {
        &mut self.bytes[..self.len]
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        wipe(&mut self.bytes);
    }
}

/// TLS 1.3's first application traffic secrets, as the key log reported them.
#[derive(Default)]
pub struct Tls13Secrets {
    pub client: Option<Secret>,
    pub server: Option<Secret>,
}

impl Tls13Secrets {
    /// Keeps the two lines kTLS needs from an NSS key-log line: `LABEL client_random
    /// secret`, all hexadecimal but the label. The handshake secrets and the exporter
    /// secret are not kept.
    fn note(&mut self, line: &str) {
        let mut words = line.split(' ');
        let (Some(label), Some(_random), Some(hex)) = (words.next(), words.next(), words.next()) else {
            return;
        };
        let slot = match label {
            "CLIENT_TRAFFIC_SECRET_0" => &mut self.client,
            "SERVER_TRAFFIC_SECRET_0" => &mut self.server,
            _ => return,
        };
        *slot = Secret::from_hex(hex);
    }
}

type Slot = Mutex<Tls13Secrets>;

/// Where a session keeps what the key log reported for it; one index for the process.
fn index() -> Result<Index<Ssl, Slot>, ErrorStack> {
    static INDEX: OnceLock<Index<Ssl, Slot>> = OnceLock::new();
    if let Some(index) = INDEX.get() {
        return Ok(*index);
    }
    let fresh = Ssl::new_ex_index::<Slot>()?;
    Ok(*INDEX.get_or_init(|| fresh))
}

/// Makes the context report secrets to sessions that `watch` asked for them (others, as
/// when kTLS is off, keep none).
pub fn capture(builder: &mut SslContextBuilder) -> Result<(), ErrorStack> {
    let index = index()?;
    builder.set_keylog_callback(move |ssl, line| {
        if let Some(Ok(mut secrets)) = ssl.ex_data(index).map(Mutex::lock) {
            secrets.note(line);
        }
    });
    Ok(())
}

/// Gives a session the place its TLS 1.3 secrets are kept in, before its handshake.
pub fn watch(ssl: &mut SslRef) -> Result<(), ErrorStack> {
    ssl.set_ex_data(index()?, Mutex::new(Tls13Secrets::default()));
    Ok(())
}

/// Takes the TLS 1.3 secrets the session kept, leaving none behind.
pub fn take_tls13(ssl: &SslRef) -> Tls13Secrets {
    let Ok(index) = index() else {
        return Tls13Secrets::default();
    };
    match ssl.ex_data(index).map(Mutex::lock) {
        Some(Ok(mut secrets)) => std::mem::take(&mut *secrets),
        _ => Tls13Secrets::default(),
    }
}

/// TLS 1.2's master secret with the client's and the server's random, in that order.
pub fn tls12_master(ssl: &SslRef) -> Option<(Secret, [u8; 32], [u8; 32])> {
    let session = ssl.session()?;
    let mut master = Secret::zeroed(session.master_key_len());
    if session.master_key(master.as_mut()) != master.len() {
        return None;
    }
    let (mut client, mut server) = ([0; 32], [0; 32]);
    if ssl.client_random(&mut client) != 32 || ssl.server_random(&mut server) != 32 {
        return None;
    }
    Some((master, client, server))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_log_keeps_only_the_application_secrets() {
        let mut s = Tls13Secrets::default();
        s.note("CLIENT_HANDSHAKE_TRAFFIC_SECRET 00 0102");
        s.note("CLIENT_TRAFFIC_SECRET_0 00 0a0B");
        s.note("SERVER_TRAFFIC_SECRET_0 00 ff");
        s.note("EXPORTER_SECRET 00 0102");
        s.note("garbage");
        assert_eq!(s.client.as_ref().map(|c| c.as_ref().to_vec()), Some(vec![0x0a, 0x0b]));
        assert_eq!(s.server.as_ref().map(|c| c.as_ref().to_vec()), Some(vec![0xff]));
    }

    #[test]
    fn hex_that_is_not_hex_is_no_secret() {
        assert!(Secret::from_hex("0g").is_none());
        assert!(Secret::from_hex("abc").is_none());
        assert!(Secret::from_hex(&"00".repeat(SECRET_CAPACITY_BYTES + 1)).is_none());
        assert_eq!(Secret::from_hex("").map(|s| s.len()), Some(0));
    }
}
