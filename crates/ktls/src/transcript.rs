//! The ciphertext a TLS connection's socket carried while OpenSSL ran it, and what it
//! proves. Before the kernel takes a session over, each direction's records are
//! decrypted with the keys the kernel would get: the first that opens at sequence number
//! 0 is the first under the application keys, every later one must open at the next
//! number, and the number after the last is the one the kernel starts from. A wrong key
//! or a wrong count shows here, before the kernel is given anything.

use std::io::{self, Read};

use openssl::symm::decrypt_aead;

use crate::keys::{Aead, Suite, TrafficKeys, Version, NONCE_BYTES};
use crate::limits::TRANSCRIPT_MAX_BYTES;

/// Content type, legacy version and length (RFC 8446 §5.1, RFC 5246 §6.2.1).
pub const HEADER_BYTES: usize = 5;
/// Every AEAD here appends a 16-byte tag.
const TAG_BYTES: usize = 16;
/// TLS 1.2 AES-GCM records start with the nonce's explicit 8 bytes (RFC 5288 §3).
const EXPLICIT_NONCE_BYTES: usize = 8;
/// TLS 1.2 AES-GCM: the 4 bytes of the nonce the key block gives (RFC 5288 §3).
const SALT_BYTES: usize = 4;

const HANDSHAKE: u8 = 22;
const APPLICATION_DATA: u8 = 23;
/// The one handshake message allowed under the application keys (RFC 8446 §4.6.1).
const NEW_SESSION_TICKET: u8 = 4;
/// A handshake message's type and 24-bit length (RFC 8446 §4).
const MESSAGE_HEADER_BYTES: usize = 4;

/// Both directions' ciphertext, up to a bound; past it, none is kept.
#[derive(Default)]
pub struct Transcript {
    received: Vec<u8>,
    sent: Vec<u8>,
    overflowed: bool,
}

impl Transcript {
    pub fn received(&mut self, bytes: &[u8]) {
        self.keep(bytes, true);
    }

    pub fn sent(&mut self, bytes: &[u8]) {
        self.keep(bytes, false);
    }

    fn keep(&mut self, bytes: &[u8], received: bool) {
        if self.overflowed {
            return;
        }
        let way = if received { &mut self.received } else { &mut self.sent };
        if way.len() + bytes.len() > TRANSCRIPT_MAX_BYTES {
            *self = Transcript { overflowed: true, ..Transcript::default() };
            return;
        }
        way.extend_from_slice(bytes);
    }

    /// What the peer sent and what we sent, or why they were not kept.
    pub fn ways(&self) -> Result<(&[u8], &[u8]), String> {
        if self.overflowed {
            return Err(format!("more than {TRANSCRIPT_MAX_BYTES} bytes went one way before transmission"));
        }
        Ok((&self.received, &self.sent))
    }
}

/// Whose records a direction carries: what our own TLS 1.2 AES-GCM records used as
/// explicit nonces matters, since the kernel goes on from there and a GCM nonce must
/// never repeat under one key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Writer {
    Peer,
    Us,
}

/// Where one direction's count stands after the records that went by.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Next {
    /// The sequence number of the next record.
    pub seq: u64,
    /// Our TLS 1.2 AES-GCM records: an explicit nonce above every one OpenSSL used (it
    /// starts from a random one and counts up, RFC 5288 §3 leaves it open).
    pub explicit_nonce: Option<u64>,
}

/// The count of one direction, verified against all the records in `bytes`, which must
/// end on a record boundary.
pub fn next_seq(suite: &Suite, keys: &TrafficKeys, bytes: &[u8], writer: Writer) -> Result<Next, String> {
    let records = split(bytes)?;
    let first = records
        .iter()
        .position(|r| open(suite, keys, 0, r).is_some_and(|(kind, plain)| may_stand(suite, 0, kind, &plain).is_ok()))
        .ok_or("no record opens with the application keys")?;
    let mut highest_nonce = None;
    for (seq, record) in (0u64..).zip(&records[first..]) {
        let Some((kind, plain)) = open(suite, keys, seq, record) else {
            return Err(format!("record {seq} under the application keys does not open at that sequence number"));
        };
        may_stand(suite, seq, kind, &plain)?;
        highest_nonce = highest_nonce.max(explicit_nonce(suite, record));
    }
    let explicit_nonce = match (writer, highest_nonce) {
        (Writer::Us, Some(n)) => Some(n.checked_add(1).ok_or("the explicit nonces have run out")?),
        _ => None,
    };
    Ok(Next { seq: (records.len() - first) as u64, explicit_nonce })
}

/// Whether a record may stand at `seq` under the application keys with the kernel going
/// on after it. TLS 1.2's first record under new keys is the Finished message, and only
/// application data follows; TLS 1.3 also carries a server's NewSessionTickets there.
/// Anything else (a key update, an alert, renegotiation) the kernel would not get past.
fn may_stand(suite: &Suite, seq: u64, kind: u8, plain: &[u8]) -> Result<(), String> {
    match (suite.version, kind) {
        (Version::Tls12, HANDSHAKE) if seq == 0 => Ok(()),
        (Version::Tls12, APPLICATION_DATA) if seq > 0 => Ok(()),
        (Version::Tls13, APPLICATION_DATA) => Ok(()),
        (Version::Tls13, HANDSHAKE) if only_tickets(plain) => Ok(()),
        (Version::Tls13, HANDSHAKE) => {
            Err(format!("record {seq} under the application keys holds a handshake message other than a session ticket"))
        }
        _ => Err(format!("record {seq} under the application keys has content type {kind}")),
    }
}

/// Whether a TLS 1.3 handshake record holds whole NewSessionTicket messages and nothing
/// else: tickets leave the keys as they are, a KeyUpdate would change them.
fn only_tickets(plain: &[u8]) -> bool {
    let mut rest = plain;
    while let Some((header, body)) = rest.split_at_checked(MESSAGE_HEADER_BYTES) {
        let len = u32::from_be_bytes([0, header[1], header[2], header[3]]) as usize;
        if header[0] != NEW_SESSION_TICKET || body.len() < len {
            return false;
        }
        rest = &body[len..];
    }
    !plain.is_empty() && rest.is_empty()
}

/// Whole records, header included; an error if the bytes end inside one.
fn split(bytes: &[u8]) -> Result<Vec<&[u8]>, String> {
    let mut records = Vec::new();
    let mut rest = bytes;
    while !rest.is_empty() {
        let Some(header) = rest.get(..HEADER_BYTES) else {
            return Err("the bytes end inside a record header".into());
        };
        let len = HEADER_BYTES + u16::from_be_bytes([header[3], header[4]]) as usize;
        if rest.len() < len {
            return Err("the bytes end inside a record".into());
        }
        let (record, tail) = rest.split_at(len);
        records.push(record);
        rest = tail;
    }
    Ok(records)
}

/// One whole record off a stream, header included, as the kernel's TLS takes it: for
/// checking a plan against the record a peer sends next.
pub fn read_record(mut from: impl Read) -> io::Result<Vec<u8>> {
    let mut record = vec![0; HEADER_BYTES];
    from.read_exact(&mut record)?;
    let len = u16::from_be_bytes([record[3], record[4]]) as usize;
    record.resize(HEADER_BYTES + len, 0);
    from.read_exact(&mut record[HEADER_BYTES..])?;
    Ok(record)
}

/// Whether the suite's records carry part of their nonce (TLS 1.2 AES-GCM).
fn has_explicit_nonce(suite: &Suite) -> bool {
    suite.version == Version::Tls12 && suite.aead != Aead::Chacha20Poly1305
}

fn explicit_nonce(suite: &Suite, record: &[u8]) -> Option<u64> {
    let bytes = record.get(HEADER_BYTES..HEADER_BYTES + EXPLICIT_NONCE_BYTES)?;
    has_explicit_nonce(suite).then(|| u64::from_be_bytes(bytes.try_into().expect("8 bytes")))
}

/// Decrypts one whole record at `seq`: its content type (TLS 1.3: the inner one) and
/// plaintext, or None when it does not authenticate.
pub fn open(suite: &Suite, keys: &TrafficKeys, seq: u64, record: &[u8]) -> Option<(u8, Vec<u8>)> {
    let (header, body) = record.split_at_checked(HEADER_BYTES)?;
    let mut nonce = [0u8; NONCE_BYTES];
    let sealed = if has_explicit_nonce(suite) {
        let (explicit, sealed) = body.split_at_checked(EXPLICIT_NONCE_BYTES)?;
        nonce[..SALT_BYTES].copy_from_slice(keys.iv.as_ref().get(..SALT_BYTES)?);
        nonce[SALT_BYTES..].copy_from_slice(explicit);
        sealed
    } else {
        // The IV XOR the sequence number, left-padded (RFC 8446 §5.3, RFC 7905 §2).
        nonce.copy_from_slice(keys.iv.as_ref().get(..NONCE_BYTES)?);
        for (n, s) in nonce[NONCE_BYTES - 8..].iter_mut().zip(seq.to_be_bytes()) {
            *n ^= s;
        }
        body
    };
    let (ciphertext, tag) = sealed.split_at_checked(sealed.len().checked_sub(TAG_BYTES)?)?;
    let aad = match suite.version {
        Version::Tls13 => header.to_vec(),
        // seq_num, type, version, length of the plaintext (RFC 5246 §6.2.3.3).
        Version::Tls12 => [&seq.to_be_bytes()[..], &header[..3], &(ciphertext.len() as u16).to_be_bytes()].concat(),
    };
    let mut plain = decrypt_aead(suite.aead.cipher(), keys.key.as_ref(), Some(&nonce), &aad, ciphertext, tag).ok()?;
    match suite.version {
        Version::Tls12 => Some((header[0], plain)),
        Version::Tls13 => {
            // The inner type is the last byte that is not padding (RFC 8446 §5.4).
            let at = plain.iter().rposition(|&b| b != 0)?;
            let kind = plain[at];
            plain.truncate(at);
            Some((kind, plain))
        }
    }
}

#[cfg(test)]
mod tests {
    use openssl::symm::{encrypt_aead, Cipher};

    use super::*;
    use crate::keys::tests::{hex, suite, RFC8448_CLIENT_AP_SECRET, RFC8448_SERVER_AP_SECRET};
    use crate::keys::{tls13_keys, Hash};
    use crate::secrets::Secret;

    /// RFC 8448 §3: the client's application data record (seq 0 under its keys) and the
    /// server's (seq 1: a NewSessionTicket went first), each carrying bytes 0 to 49.
    const CLIENT_RECORD: &str = "17 03 03 00 43 a2 3f 70 54 b6 2c 94 d0 af fa fe 82 28 ba 55 cb ef ac ea
        42 f9 14 aa 66 bc ab 3f 2b 98 19 a8 a5 b4 6b 39 5b d5 4a 9a 20 44 1e 2b 62 97 4e 1f 5a 62 92 a2 97
        70 14 bd 1e 3d ea e6 3a ee bb 21 69 49 15 e4";
    const SERVER_RECORD: &str = "17 03 03 00 43 2e 93 7e 11 ef 4a c7 40 e5 38 ad 36 00 5f c4 a4 69 32 fc
        32 25 d0 5f 82 aa 1b 36 e3 0e fa f9 7d 90 e6 df fc 60 2d cb 50 1a 59 a8 fc c4 9c 4b f2 e5 f0 a2 1c
        00 47 c2 ab f3 32 54 0d d0 32 e1 67 c2 95 5d";

    fn rfc8448() -> (Suite, TrafficKeys, TrafficKeys) {
        let s = suite(Version::Tls13, Aead::Aes128Gcm, Hash::Sha256);
        let client = tls13_keys(&s, &hex(RFC8448_CLIENT_AP_SECRET)).unwrap();
        let server = tls13_keys(&s, &hex(RFC8448_SERVER_AP_SECRET)).unwrap();
        (s, client, server)
    }

    #[test]
    fn rfc8448_records_open_at_their_sequence_numbers_only() {
        let (s, client, server) = rfc8448();
        let fifty: Vec<u8> = (0..50).collect();
        assert_eq!(open(&s, &client, 0, &hex(CLIENT_RECORD)), Some((APPLICATION_DATA, fifty.clone())));
        assert_eq!(open(&s, &client, 1, &hex(CLIENT_RECORD)), None);
        assert_eq!(open(&s, &server, 1, &hex(SERVER_RECORD)), Some((APPLICATION_DATA, fifty)));
        assert_eq!(open(&s, &server, 0, &hex(SERVER_RECORD)), None);
    }

    #[test]
    fn the_count_starts_at_the_first_record_under_the_application_keys() {
        let (s, client, _) = rfc8448();
        // A change_cipher_spec and a record under other keys (the handshake's) go first.
        let mut bytes = hex("14 03 03 00 01 01");
        bytes.extend(hex("17 03 03 00 13").into_iter().chain([0x5a; 0x13]));
        bytes.extend(hex(CLIENT_RECORD));
        assert_eq!(next_seq(&s, &client, &bytes, Writer::Peer), Ok(Next { seq: 1, explicit_nonce: None }));
    }

    #[test]
    fn a_wrong_key_or_count_fails_verification() {
        let (s, client, server) = rfc8448();
        let mut wrong = TrafficKeys { key: Secret::from_slice(client.key.as_ref()), iv: Secret::from_slice(client.iv.as_ref()) };
        wrong.key.as_mut()[0] ^= 1;
        assert!(next_seq(&s, &wrong, &hex(CLIENT_RECORD), Writer::Peer).is_err());
        // The server's record is its second: at 0 it opens with no key of the kernel's.
        assert!(next_seq(&s, &server, &hex(SERVER_RECORD), Writer::Us).is_err());
        let mut cut = hex(CLIENT_RECORD);
        cut.pop();
        assert_eq!(next_seq(&s, &client, &cut, Writer::Peer), Err("the bytes end inside a record".into()));
    }

    /// A TLS 1.2 record: AES-GCM with `nonce` as explicit nonce, ChaCha20 with the IV
    /// XORed with the sequence number.
    fn seal12(s: &Suite, keys: &TrafficKeys, seq: u64, kind: u8, plain: &[u8], nonce: u64) -> Vec<u8> {
        let mut iv = [0u8; NONCE_BYTES];
        if has_explicit_nonce(s) {
            iv[..4].copy_from_slice(keys.iv.as_ref());
            iv[4..].copy_from_slice(&nonce.to_be_bytes());
        } else {
            iv.copy_from_slice(keys.iv.as_ref());
            iv[4..].iter_mut().zip(seq.to_be_bytes()).for_each(|(n, s)| *n ^= s);
        }
        let aad = [&seq.to_be_bytes()[..], &[kind, 3, 3], &(plain.len() as u16).to_be_bytes()].concat();
        let mut tag = [0; TAG_BYTES];
        let sealed = encrypt_aead(s.aead.cipher(), keys.key.as_ref(), Some(&iv), &aad, plain, &mut tag).unwrap();
        let explicit = if has_explicit_nonce(s) { nonce.to_be_bytes().to_vec() } else { Vec::new() };
        let body = [explicit, sealed, tag.to_vec()].concat();
        [vec![kind, 3, 3], (body.len() as u16).to_be_bytes().to_vec(), body].concat()
    }

    #[test]
    fn tls12_counts_from_finished_and_continues_above_our_explicit_nonces() {
        for aead in [Aead::Aes128Gcm, Aead::Aes256Gcm, Aead::Chacha20Poly1305] {
            let s = suite(Version::Tls12, aead, Hash::Sha256);
            let iv = if aead == Aead::Chacha20Poly1305 { 12 } else { 4 };
            let keys = TrafficKeys { key: Secret::from_slice(&vec![9; aead.key_bytes()]), iv: Secret::from_slice(&vec![3; iv][..]) };
            let mut bytes = hex("16 03 03 00 04 0e 00 00 00"); // a plaintext ServerHelloDone
            bytes.extend(hex("14 03 03 00 01 01"));
            // OpenSSL's explicit nonces start at a random value and count up.
            bytes.extend(seal12(&s, &keys, 0, HANDSHAKE, b"finished", 0x1234));
            bytes.extend(seal12(&s, &keys, 1, APPLICATION_DATA, b"reply", 0x1235));
            let gcm = aead != Aead::Chacha20Poly1305;
            let want = Next { seq: 2, explicit_nonce: gcm.then_some(0x1236) };
            assert_eq!(next_seq(&s, &keys, &bytes, Writer::Us), Ok(want), "{aead:?}");
            assert_eq!(next_seq(&s, &keys, &bytes, Writer::Peer), Ok(Next { seq: 2, explicit_nonce: None }));
            bytes.extend(seal12(&s, &keys, 3, APPLICATION_DATA, b"skipped a number", 0x1237));
            let want = Err("record 2 under the application keys does not open at that sequence number".into());
            assert_eq!(next_seq(&s, &keys, &bytes, Writer::Us), want, "{aead:?}");
        }
    }

    /// A TLS 1.3 record under `keys` at `seq`: `plain` with its inner content type.
    fn seal13(keys: &TrafficKeys, seq: u64, kind: u8, plain: &[u8]) -> Vec<u8> {
        let mut nonce = [0u8; NONCE_BYTES];
        nonce.copy_from_slice(keys.iv.as_ref());
        nonce[4..].iter_mut().zip(seq.to_be_bytes()).for_each(|(n, s)| *n ^= s);
        let inner = [plain, &[kind]].concat();
        let header = [&[APPLICATION_DATA, 3, 3][..], &((inner.len() + TAG_BYTES) as u16).to_be_bytes()].concat();
        let mut tag = [0; TAG_BYTES];
        let sealed = encrypt_aead(Cipher::aes_128_gcm(), keys.key.as_ref(), Some(&nonce), &header, &inner, &mut tag).unwrap();
        [header, sealed, tag.to_vec()].concat()
    }

    /// A handshake message of `kind` with a body of `len` bytes.
    fn message(kind: u8, len: usize) -> Vec<u8> {
        [&[kind][..], &(len as u32).to_be_bytes()[1..], &vec![7; len]].concat()
    }

    #[test]
    fn tls13_session_tickets_count_and_a_key_update_stops_the_count() {
        let (s, _, server) = rfc8448();
        // OpenSSL's server sends two tickets after the handshake, one record each; two
        // tickets may also share a record.
        let mut bytes = seal13(&server, 0, HANDSHAKE, &message(NEW_SESSION_TICKET, 200));
        let two = [message(NEW_SESSION_TICKET, 10), message(NEW_SESSION_TICKET, 0)].concat();
        bytes.extend(seal13(&server, 1, HANDSHAKE, &two));
        bytes.extend(seal13(&server, 2, APPLICATION_DATA, b"reply"));
        assert_eq!(next_seq(&s, &server, &bytes, Writer::Peer), Ok(Next { seq: 3, explicit_nonce: None }));
        const KEY_UPDATE: u8 = 24;
        bytes.extend(seal13(&server, 3, HANDSHAKE, &message(KEY_UPDATE, 1)));
        let why = next_seq(&s, &server, &bytes, Writer::Peer).unwrap_err();
        assert!(why.contains("record 3") && why.contains("other than a session ticket"), "{why}");
        // A ticket cut short is no ticket either.
        let cut = &message(NEW_SESSION_TICKET, 20)[..12];
        assert!(next_seq(&s, &server, &seal13(&server, 0, HANDSHAKE, cut), Writer::Peer).is_err());
    }

    #[test]
    fn the_transcript_gives_up_past_its_bound() {
        let mut t = Transcript::default();
        t.received(&[1; 10]);
        t.sent(&[2; 3]);
        assert_eq!(t.ways(), Ok((&[1u8; 10][..], &[2u8; 3][..])));
        t.sent(&vec![0; TRANSCRIPT_MAX_BYTES]);
        assert!(t.ways().is_err());
        t.received(&[1]);
        assert!(t.ways().is_err(), "once over, always over");
    }
}
