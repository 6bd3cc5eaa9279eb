//! Kernel TLS: attaching the `tls` ULP to a connected TCP socket and giving it one
//! direction's record keys (TLS_TX, TLS_RX), sending an alert record through it, and
//! wiping key material from memory. The layouts are those of linux/tls.h as libc
//! declares them; which bytes go into `iv` and `salt` for a version is the caller's
//! choice (plan.rs), checked here only for length.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The AEADs the kernel's TLS takes that sluice hands it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KernelCipher {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

/// One direction's record protection, as the kernel wants it. The slices are borrowed so
/// that the caller's buffers stay the only long-lived copies (and are wiped by it).
pub struct KernelKeys<'a> {
    /// `libc::TLS_1_2_VERSION` or `libc::TLS_1_3_VERSION`.
    pub version: u16,
    pub cipher: KernelCipher,
    pub key: &'a [u8],
    pub iv: &'a [u8],
    pub salt: &'a [u8],
    /// The sequence number of the next record, big-endian.
    pub rec_seq: [u8; 8],
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KtlsDirection {
    Tx,
    Rx,
}

/// Attaches the `tls` upper-layer protocol. Until a direction gets keys the socket passes
/// bytes through unchanged, so a failure after this leaves it usable as before.
pub fn ktls_attach(fd: BorrowedFd<'_>) -> io::Result<()> {
    const ULP: &[u8] = b"tls";
    // SAFETY: the option value is a live constant of ULP.len() bytes; the kernel copies it
    // during the call and keeps no pointer. The descriptor is borrowed, so open.
    let rc = unsafe {
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_TCP, libc::TCP_ULP, ULP.as_ptr().cast(), ULP.len() as libc::socklen_t)
    };
    if rc == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Gives the kernel one direction's keys. The kernel copies them; the structure that
/// carried them is wiped before this returns, whatever the outcome.
pub fn ktls_set_keys(fd: BorrowedFd<'_>, direction: KtlsDirection, keys: &KernelKeys<'_>) -> io::Result<()> {
    let info = libc::tls_crypto_info { version: keys.version, cipher_type: 0 };
    match keys.cipher {
        KernelCipher::Aes128Gcm => {
            let mut c = libc::tls12_crypto_info_aes_gcm_128 {
                info: libc::tls_crypto_info { cipher_type: libc::TLS_CIPHER_AES_GCM_128, ..info },
                iv: [0; libc::TLS_CIPHER_AES_GCM_128_IV_SIZE],
                key: [0; libc::TLS_CIPHER_AES_GCM_128_KEY_SIZE],
                salt: [0; libc::TLS_CIPHER_AES_GCM_128_SALT_SIZE],
                rec_seq: keys.rec_seq,
            };
            fill(&mut c.key, &mut c.iv, &mut c.salt, keys)?;
            set_and_wipe(fd, direction, &mut c)
        }
        KernelCipher::Aes256Gcm => {
            let mut c = libc::tls12_crypto_info_aes_gcm_256 {
                info: libc::tls_crypto_info { cipher_type: libc::TLS_CIPHER_AES_GCM_256, ..info },
                iv: [0; libc::TLS_CIPHER_AES_GCM_256_IV_SIZE],
                key: [0; libc::TLS_CIPHER_AES_GCM_256_KEY_SIZE],
                salt: [0; libc::TLS_CIPHER_AES_GCM_256_SALT_SIZE],
                rec_seq: keys.rec_seq,
            };
            fill(&mut c.key, &mut c.iv, &mut c.salt, keys)?;
            set_and_wipe(fd, direction, &mut c)
        }
        KernelCipher::Chacha20Poly1305 => {
            let mut c = libc::tls12_crypto_info_chacha20_poly1305 {
                info: libc::tls_crypto_info { cipher_type: libc::TLS_CIPHER_CHACHA20_POLY1305, ..info },
                iv: [0; libc::TLS_CIPHER_CHACHA20_POLY1305_IV_SIZE],
                key: [0; libc::TLS_CIPHER_CHACHA20_POLY1305_KEY_SIZE],
                salt: [0; libc::TLS_CIPHER_CHACHA20_POLY1305_SALT_SIZE],
                rec_seq: keys.rec_seq,
            };
            fill(&mut c.key, &mut c.iv, &mut c.salt, keys)?;
            set_and_wipe(fd, direction, &mut c)
        }
    }
}

/// Copies the caller's bytes into the structure's arrays, which must match them in length:
/// a mismatch is a bug in the caller, reported rather than handed to the kernel.
fn fill(key: &mut [u8], iv: &mut [u8], salt: &mut [u8], keys: &KernelKeys<'_>) -> io::Result<()> {
    if key.len() != keys.key.len() || iv.len() != keys.iv.len() || salt.len() != keys.salt.len() {
        let why = format!("kTLS key material of the wrong length for {:?}", keys.cipher);
        return Err(io::Error::new(io::ErrorKind::InvalidInput, why));
    }
    key.copy_from_slice(keys.key);
    iv.copy_from_slice(keys.iv);
    salt.copy_from_slice(keys.salt);
    Ok(())
}

fn set_and_wipe<T: Copy>(fd: BorrowedFd<'_>, direction: KtlsDirection, info: &mut T) -> io::Result<()> {
    let name = match direction {
        KtlsDirection::Tx => libc::TLS_TX,
        KtlsDirection::Rx => libc::TLS_RX,
    };
    let size = std::mem::size_of::<T>();
    // SAFETY: `info` is one of linux/tls.h's crypto_info structures (the callers above pass
    // nothing else), alive for the whole call and `size` bytes long; the kernel copies it
    // and keeps no pointer. The descriptor is borrowed, so open.
    let rc = unsafe {
        libc::setsockopt(fd.as_raw_fd(), libc::SOL_TLS, name, (info as *const T).cast(), size as libc::socklen_t)
    };
    let result = if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) };
    // SAFETY: `info` is a plain-old-data structure of `size` bytes (integers and byte
    // arrays, no padding the kernel or Rust gives meaning to), exclusively borrowed here,
    // so viewing it as bytes to overwrite them is sound.
    let bytes = unsafe { std::slice::from_raw_parts_mut((info as *mut T).cast::<u8>(), size) };
    wipe(bytes);
    result
}

/// Sends one TLS record of content type `record_type` (21: alert) carrying `payload`
/// through the kernel's TLS, without waiting: the caller is closing the connection and
/// this is best effort.
pub fn ktls_send_record(fd: BorrowedFd<'_>, record_type: u8, payload: &[u8]) -> io::Result<()> {
    // CMSG_SPACE(1) is 24 bytes on 64-bit Linux; u64s keep the buffer aligned for cmsghdr.
    let mut control = [0u64; 4];
    let mut iov = libc::iovec { iov_base: payload.as_ptr().cast_mut().cast(), iov_len: payload.len() };
    // SAFETY: msghdr is plain old data for which all zeros is a valid (empty) value.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr().cast();
    // SAFETY: CMSG_SPACE only computes a size.
    msg.msg_controllen = unsafe { libc::CMSG_SPACE(1) } as usize;
    debug_assert!(msg.msg_controllen <= std::mem::size_of_val(&control));
    // SAFETY: msg_control points at `control`, which is large enough for one header with one
    // byte of data (asserted above) and aligned for cmsghdr, so CMSG_FIRSTHDR returns a
    // pointer into it and CMSG_DATA a pointer to the byte after its header, both in bounds.
    unsafe {
        let cmsg = libc::CMSG_FIRSTHDR(&msg);
        (*cmsg).cmsg_level = libc::SOL_TLS;
        (*cmsg).cmsg_type = libc::TLS_SET_RECORD_TYPE;
        (*cmsg).cmsg_len = libc::CMSG_LEN(1) as usize;
        *libc::CMSG_DATA(cmsg) = record_type;
    }
    // SAFETY: every pointer in `msg` refers to a live local of this frame (`iov`, `control`)
    // or to `payload`, borrowed for the call; the kernel reads them only during it.
    let rc = unsafe { libc::sendmsg(fd.as_raw_fd(), &msg, libc::MSG_DONTWAIT | libc::MSG_NOSIGNAL) };
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Overwrites key material with zeros in a way the compiler may not drop as a dead store,
/// so a secret does not outlive its use in freed memory.
pub fn wipe(bytes: &mut [u8]) {
    for b in bytes.iter_mut() {
        // SAFETY: `b` is a valid, aligned, exclusive reference to one byte.
        unsafe { std::ptr::write_volatile(b, 0) };
    }
    std::sync::atomic::compiler_fence(std::sync::atomic::Ordering::SeqCst);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wipe_zeroes_every_byte() {
        let mut secret = [0xa5u8; 37];
        wipe(&mut secret);
        assert!(secret.iter().all(|&b| b == 0));
    }

    #[test]
    fn keys_of_the_wrong_length_are_refused_before_the_kernel_sees_them() {
        // A socketpair is not TCP, but the length check comes first.
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        let fd = std::os::fd::AsFd::as_fd(&a);
        let keys = KernelKeys {
            version: libc::TLS_1_3_VERSION,
            cipher: KernelCipher::Aes128Gcm,
            key: &[0; 15],
            iv: &[0; 8],
            salt: &[0; 4],
            rec_seq: [0; 8],
        };
        assert_eq!(ktls_set_keys(fd, KtlsDirection::Tx, &keys).unwrap_err().kind(), io::ErrorKind::InvalidInput);
    }

    #[test]
    fn a_unix_socket_refuses_the_tls_ulp() {
        let (a, _b) = std::os::unix::net::UnixStream::pair().unwrap();
        assert!(ktls_attach(std::os::fd::AsFd::as_fd(&a)).is_err(), "TCP_ULP is a TCP option");
    }
}
