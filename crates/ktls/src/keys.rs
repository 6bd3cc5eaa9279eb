//! Record keys from session secrets, for the suites the kernel's TLS takes: TLS 1.3 write
//! keys and IVs by HKDF-Expand-Label (RFC 8446 §7.1, §7.3), TLS 1.2 by the PRF's key block
//! (RFC 5246 §5, §6.3), split as RFC 5288 (AES-GCM: a 4-byte implicit IV) and RFC 7905
//! (ChaCha20-Poly1305: a 12-byte IV) say. HMAC is OpenSSL's; every intermediate value is
//! held in a `Secret` and wiped.

use openssl::error::ErrorStack;
use openssl::hash::MessageDigest;
use openssl::nid::Nid;
use openssl::pkey::PKey;
use openssl::sign::Signer;
use openssl::ssl::{SslRef, SslVersion};
use openssl::symm::Cipher;

use crate::secrets::Secret;
use crate::sys::KernelCipher;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Version {
    Tls12,
    Tls13,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Aead {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Aead {
    pub fn key_bytes(self) -> usize {
        match self {
            Aead::Aes128Gcm => 16,
            Aead::Aes256Gcm | Aead::Chacha20Poly1305 => 32,
        }
    }

    pub fn cipher(self) -> Cipher {
        match self {
            Aead::Aes128Gcm => Cipher::aes_128_gcm(),
            Aead::Aes256Gcm => Cipher::aes_256_gcm(),
            Aead::Chacha20Poly1305 => Cipher::chacha20_poly1305(),
        }
    }

    pub fn kernel(self) -> KernelCipher {
        match self {
            Aead::Aes128Gcm => KernelCipher::Aes128Gcm,
            Aead::Aes256Gcm => KernelCipher::Aes256Gcm,
            Aead::Chacha20Poly1305 => KernelCipher::Chacha20Poly1305,
        }
    }

    /// The IV bytes a TLS 1.2 key block holds per direction: AES-GCM's implicit salt
    /// (the explicit 8 bytes travel in each record), ChaCha20's whole nonce base.
    fn tls12_iv_bytes(self) -> usize {
        match self {
            Aead::Aes128Gcm | Aead::Aes256Gcm => 4,
            Aead::Chacha20Poly1305 => NONCE_BYTES,
        }
    }
}

/// Every AEAD here takes a 96-bit nonce; TLS 1.3 derives a 12-byte IV for each.
pub const NONCE_BYTES: usize = 12;

/// The HMAC hash of the suite: TLS 1.3's HKDF hash, TLS 1.2's PRF hash.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hash {
    Sha256,
    Sha384,
}

impl Hash {
    fn digest(self) -> MessageDigest {
        match self {
            Hash::Sha256 => MessageDigest::sha256(),
            Hash::Sha384 => MessageDigest::sha384(),
        }
    }
}

/// What a session negotiated, as far as record protection goes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Suite {
    pub version: Version,
    pub aead: Aead,
    pub hash: Hash,
    /// Version and cipher as OpenSSL names them, for the log.
    pub name: String,
}

impl Suite {
    /// The session's suite, or why the kernel cannot take it.
    pub fn of(ssl: &SslRef) -> Result<Suite, String> {
        let cipher = ssl.current_cipher().ok_or("the session has no cipher")?;
        let name = format!("{} {}", ssl.version_str(), cipher.name());
        let version = match ssl.version2() {
            Some(v) if v == SslVersion::TLS1_3 => Version::Tls13,
            Some(v) if v == SslVersion::TLS1_2 => Version::Tls12,
            _ => return Err(format!("{name}: the kernel takes TLS 1.2 and 1.3 only")),
        };
        let aead = match cipher.cipher_nid() {
            Some(Nid::AES_128_GCM) => Aead::Aes128Gcm,
            Some(Nid::AES_256_GCM) => Aead::Aes256Gcm,
            Some(Nid::CHACHA20_POLY1305) => Aead::Chacha20Poly1305,
            _ => return Err(format!("{name} is not a suite sluice hands the kernel (AES-GCM or ChaCha20-Poly1305)")),
        };
        let hash = match cipher.handshake_digest().map(|d| d.type_()) {
            Some(Nid::SHA256) => Hash::Sha256,
            Some(Nid::SHA384) => Hash::Sha384,
            _ => return Err(format!("{name}: a key schedule hash other than SHA-256 or SHA-384")),
        };
        Ok(Suite { version, aead, hash, name })
    }
}

/// One direction's record protection: the AEAD key, and its IV (TLS 1.3 and ChaCha20:
/// 12 bytes, XORed with the sequence number; TLS 1.2 AES-GCM: the 4-byte implicit salt).
pub struct TrafficKeys {
    pub key: Secret,
    pub iv: Secret,
}

/// TLS 1.3: a direction's keys from its application traffic secret (RFC 8446 §7.3).
pub fn tls13_keys(suite: &Suite, traffic_secret: &[u8]) -> Result<TrafficKeys, ErrorStack> {
    let mut key = Secret::zeroed(suite.aead.key_bytes());
    let mut iv = Secret::zeroed(NONCE_BYTES);
    hkdf_expand_label(suite.hash, traffic_secret, b"key", b"", key.as_mut())?;
    hkdf_expand_label(suite.hash, traffic_secret, b"iv", b"", iv.as_mut())?;
    Ok(TrafficKeys { key, iv })
}

/// TLS 1.2: the client's and the server's keys, in that order, from the master secret
/// (RFC 5246 §6.3: the key block is client MAC, server MAC (none for an AEAD), client key,
/// server key, client IV, server IV).
pub fn tls12_keys(
    suite: &Suite,
    master: &[u8],
    client_random: &[u8; 32],
    server_random: &[u8; 32],
) -> Result<(TrafficKeys, TrafficKeys), ErrorStack> {
    let (k, i) = (suite.aead.key_bytes(), suite.aead.tls12_iv_bytes());
    let mut block = Secret::zeroed(2 * (k + i));
    prf(suite.hash, master, b"key expansion", &[server_random, client_random], block.as_mut())?;
    let b = block.as_ref();
    let client = TrafficKeys { key: Secret::from_slice(&b[..k]), iv: Secret::from_slice(&b[2 * k..2 * k + i]) };
    let server = TrafficKeys { key: Secret::from_slice(&b[k..2 * k]), iv: Secret::from_slice(&b[2 * k + i..]) };
    Ok((client, server))
}

/// HMAC of the concatenated `parts` into `out`, which must hold the hash; its length.
fn hmac(hash: Hash, key: &[u8], parts: &[&[u8]], out: &mut [u8]) -> Result<usize, ErrorStack> {
    let pkey = PKey::hmac(key)?;
    let mut signer = Signer::new(hash.digest(), &pkey)?;
    for part in parts {
        signer.update(part)?;
    }
    signer.sign(out)
}

/// HKDF-Expand (RFC 5869 §2.3): T(n) = HMAC(prk, T(n-1) | info | n), concatenated.
fn hkdf_expand(hash: Hash, prk: &[u8], info: &[u8], out: &mut [u8]) -> Result<(), ErrorStack> {
    let size = hash.digest().size();
    let (mut previous, mut t) = (Secret::zeroed(0), Secret::zeroed(size));
    for (n, chunk) in out.chunks_mut(size).enumerate() {
        hmac(hash, prk, &[previous.as_ref(), info, &[n as u8 + 1]], t.as_mut())?;
        chunk.copy_from_slice(&t.as_ref()[..chunk.len()]);
        previous = Secret::from_slice(t.as_ref());
    }
    Ok(())
}

/// HKDF-Expand-Label (RFC 8446 §7.1): the info is the output length, "tls13 " + label and
/// the context, each with its length prefix.
fn hkdf_expand_label(hash: Hash, secret: &[u8], label: &[u8], context: &[u8], out: &mut [u8]) -> Result<(), ErrorStack> {
    const PREFIX: &[u8] = b"tls13 ";
    let mut info = Vec::with_capacity(4 + PREFIX.len() + label.len() + context.len());
    info.extend_from_slice(&(out.len() as u16).to_be_bytes());
    info.push((PREFIX.len() + label.len()) as u8);
    info.extend_from_slice(PREFIX);
    info.extend_from_slice(label);
    info.push(context.len() as u8);
    info.extend_from_slice(context);
    hkdf_expand(hash, secret, &info, out)
}

/// The TLS 1.2 PRF (RFC 5246 §5): P_hash(secret, label | seed), where A(0) = label | seed,
/// A(i) = HMAC(secret, A(i-1)), and the output is HMAC(secret, A(i) | label | seed), i ≥ 1.
fn prf(hash: Hash, secret: &[u8], label: &[u8], seed: &[&[u8]], out: &mut [u8]) -> Result<(), ErrorStack> {
    let size = hash.digest().size();
    let mut a = Secret::zeroed(size);
    let mut chunk_out = Secret::zeroed(size);
    let mut seed_parts: Vec<&[u8]> = Vec::with_capacity(seed.len() + 2);
    seed_parts.push(label);
    seed_parts.extend_from_slice(seed);
    hmac(hash, secret, &seed_parts, a.as_mut())?;
    for chunk in out.chunks_mut(size) {
        let mut parts: Vec<&[u8]> = vec![a.as_ref()];
        parts.extend_from_slice(&seed_parts);
        hmac(hash, secret, &parts, chunk_out.as_mut())?;
        chunk.copy_from_slice(&chunk_out.as_ref()[..chunk.len()]);
        let next = Secret::from_slice(a.as_ref());
        hmac(hash, secret, &[next.as_ref()], a.as_mut())?;
    }
    Ok(())
}

#[cfg(test)]
pub mod tests {
    use super::*;

    /// Hexadecimal with any spacing, as RFCs print it.
    pub fn hex(text: &str) -> Vec<u8> {
        let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
        digits.chunks(2).map(|p| u8::from_str_radix(std::str::from_utf8(p).unwrap(), 16).unwrap()).collect()
    }

    pub fn suite(version: Version, aead: Aead, hash: Hash) -> Suite {
        Suite { version, aead, hash, name: format!("{version:?} {aead:?}") }
    }

    /// RFC 8448 §3 ("Simple 1-RTT Handshake"), TLS_AES_128_GCM_SHA256.
    pub const RFC8448_CLIENT_AP_SECRET: &str =
        "9e 40 64 6c e7 9a 7f 9d c0 5a f8 88 9b ce 65 52 87 5a fa 0b 06 df 00 87 f7 92 eb b7 c1 75 04 a5";
    pub const RFC8448_SERVER_AP_SECRET: &str =
        "a1 1a f9 f0 55 31 f8 56 ad 47 11 6b 45 a9 50 32 82 04 b4 f4 4b fb 6b 3a 4b 4f 1f 3f cb 63 16 43";

    #[test]
    fn tls13_keys_match_rfc8448() {
        let s = suite(Version::Tls13, Aead::Aes128Gcm, Hash::Sha256);
        let server = tls13_keys(&s, &hex(RFC8448_SERVER_AP_SECRET)).unwrap();
        assert_eq!(server.key.as_ref(), hex("9f 02 28 3b 6c 9c 07 ef c2 6b b9 f2 ac 92 e3 56"));
        assert_eq!(server.iv.as_ref(), hex("cf 78 2b 88 dd 83 54 9a ad f1 e9 84"));
        let client = tls13_keys(&s, &hex(RFC8448_CLIENT_AP_SECRET)).unwrap();
        assert_eq!(client.key.as_ref(), hex("17 42 2d da 59 6e d5 d9 ac d8 90 e3 c6 3f 50 51"));
        assert_eq!(client.iv.as_ref(), hex("5b 78 92 3d ee 08 57 90 33 e5 23 d9"));
    }

    #[test]
    fn hkdf_expand_label_matches_rfc8448_handshake_keys() {
        // RFC 8448 §3: {server} derive write traffic keys for handshake data.
        let secret = hex("b6 7b 7d 69 0c c1 6c 4e 75 e5 42 13 cb 2d 37 b4 e9 c9 12 bc de d9 10 5d 42 be fd 59 d3 91 ad 38");
        let mut key = [0; 16];
        hkdf_expand_label(Hash::Sha256, &secret, b"key", b"", &mut key).unwrap();
        assert_eq!(key.to_vec(), hex("3f ce 51 60 09 c2 17 27 d0 f2 e4 e8 6e e4 03 bc"));
    }

    #[test]
    fn hkdf_expand_spans_several_blocks() {
        // RFC 5869 A.1: OKM of 42 bytes from the PRK (two SHA-256 blocks and a part).
        let prk = hex("077709362c2e32df0ddc3f0dc47bba6390b6c73bb50f9c3122ec844ad7c2b3e5");
        let info = hex("f0f1f2f3f4f5f6f7f8f9");
        let mut okm = [0; 42];
        hkdf_expand(Hash::Sha256, &prk, &info, &mut okm).unwrap();
        let want = "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865";
        assert_eq!(okm.to_vec(), hex(want));
    }

    #[test]
    fn tls12_prf_matches_the_published_vectors() {
        // The P_SHA256 and P_SHA384 vectors posted to the IETF TLS list (also what
        // `openssl kdf TLS1-PRF` gives for them).
        let mut out = [0; 100];
        let seed = hex("a0 ba 9f 93 6c da 31 18 27 a6 f7 96 ff d5 19 8c");
        prf(Hash::Sha256, &hex("9b be 43 6b a9 40 f0 17 b1 76 52 84 9a 71 db 35"), b"test label", &[&seed], &mut out).unwrap();
        let want = "e3f229ba727be17b8d122620557cd453c2aab21d07c3d495329b52d4e61edb5a6b301791e90d35c9c9a46b4e14baf9af0fa0\
                    22f7077def17abfd3797c0564bab4fbc91666e9def9b97fce34f796789baa48082d122ee42c5a72e5a5110fff70187347b66";
        assert_eq!(out.to_vec(), hex(want));
        let mut out = [0; 148];
        let seed = hex("cd 66 5c f6 a8 44 7d d6 ff 8b 27 55 5e db 74 65");
        prf(Hash::Sha384, &hex("b8 0b 73 3d 6c ee fc dc 71 56 6e a4 8e 55 67 df"), b"test label", &[&seed], &mut out).unwrap();
        let want = "7b0c18e9ced410ed1804f2cfa34a336a1c14dffb4900bb5fd7942107e81c83cde9ca0faa60be9fe34f82b1233c9146a0e534\
                    cb400fed2700884f9dc236f80edd8bfa961144c9e8d792eca722a7b32fc3d416d473ebc2c5fd4abfdad05d9184259b5bf8cd4d\
                    90fa0d31e2dec479e4f1a26066f2eea9a69236a3e52655c9e9aee691c8f3a26854308d5eaa3be85e0990703d73e56f";
        assert_eq!(out.to_vec(), hex(want));
    }

    #[test]
    fn tls12_key_block_is_split_client_first_then_server() {
        let s = suite(Version::Tls12, Aead::Aes128Gcm, Hash::Sha256);
        let (master, cr, sr) = ([7u8; 48], [1u8; 32], [2u8; 32]);
        let (client, server) = tls12_keys(&s, &master, &cr, &sr).unwrap();
        let mut block = [0; 40];
        prf(Hash::Sha256, &master, b"key expansion", &[&sr, &cr], &mut block).unwrap();
        assert_eq!((client.key.as_ref(), server.key.as_ref()), (&block[..16], &block[16..32]));
        assert_eq!((client.iv.as_ref(), server.iv.as_ref()), (&block[32..36], &block[36..40]));
        let c = suite(Version::Tls12, Aead::Chacha20Poly1305, Hash::Sha256);
        let (client, server) = tls12_keys(&c, &master, &cr, &sr).unwrap();
        assert_eq!((client.key.len(), client.iv.len(), server.iv.len()), (32, 12, 12));
    }
}
