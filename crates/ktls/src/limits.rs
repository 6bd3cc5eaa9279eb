//! Bounds on what a peer controls before a session is handed to the kernel. Units last.

/// Ciphertext kept per direction of a TLS connection's handshake and option haggling, so
/// that the sequence numbers handed to kTLS can be checked against the records that went
/// by (transcript.rs). A handshake with a certificate chain is a few KiB and options
/// after STARTTLS rarely more; a peer that sends more only loses kTLS for its connection.
pub const TRANSCRIPT_MAX_BYTES: usize = 256 * 1024;
// Room for several records of the largest size TLS allows (16 KiB of plaintext plus
// 256 bytes of expansion, RFC 8446 §5.2): a long certificate chain still fits.
const _: () = assert!(TRANSCRIPT_MAX_BYTES >= 8 * (16 * 1024 + 256));
