//! Pre-shared keys from a psktool file: one `USERNAME:HEXKEY` line per identity, the
//! format nbdkit, qemu-nbd and libnbd read.

use crate::error::Error;
use std::path::Path;

/// What the client proves itself with.
pub(crate) struct Psk {
    pub identity: String,
    pub key: Vec<u8>,
}

impl std::fmt::Debug for Psk {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key, not even in a debug print.
        write!(f, "Psk {{ identity: {:?}, key: {} bytes }}", self.identity, self.key.len())
    }
}

/// The key `file` holds for `identity`, or, when that is `None`, for the login name of the
/// user running the client (libnbd's default).
pub(crate) fn load(file: &Path, identity: Option<&str>) -> Result<Psk, Error> {
    let identity = match identity {
        Some(name) => name.to_string(),
        None => login_name()?,
    };
    let text = std::fs::read_to_string(file).map_err(|e| Error::TlsConfig(format!("cannot read the PSK file {}: {e}", file.display())))?;
    find(&text, &identity).map_err(|m| Error::TlsConfig(format!("PSK file {}: {m}", file.display())))
}

/// Checks every line, so that a damaged file is reported whichever identity is asked for,
/// and returns the key of `identity`.
fn find(text: &str, identity: &str) -> Result<Psk, String> {
    let keys = sluice_proto::psk::parse(text)?;
    keys.into_iter()
        .find(|(user, _)| user == identity)
        .map(|(identity, key)| Psk { identity, key })
        .ok_or_else(|| format!("no key for the identity {identity:?} (set the identity with nbds://NAME@host/ or --tls-username)"))
}

/// The login name, as the environment gives it (POSIX sets LOGNAME at login).
fn login_name() -> Result<String, Error> {
    ["LOGNAME", "USER"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|n| !n.is_empty()))
        .ok_or_else(|| Error::TlsConfig("no PSK identity: LOGNAME and USER are unset (set it with nbds://NAME@host/ or --tls-username)".into()))
}

#[cfg(test)]
mod tests {
    use super::*;

    const FILE: &str = "alice:00ff10\nbob:abcd\n\n";

    #[test]
    fn finds_the_identity() {
        let p = find(FILE, "bob").unwrap();
        assert_eq!((p.identity.as_str(), p.key.as_slice()), ("bob", &[0xab, 0xcd][..]));
        assert_eq!(find(FILE, "alice").unwrap().key, [0, 0xff, 0x10]);
        assert!(!format!("{p:?}").contains("abcd"), "the key stays out of debug prints");
    }

    #[test]
    fn names_the_bad_line() {
        let e = find(FILE, "carol").unwrap_err();
        assert!(e.contains("\"carol\"") && e.contains("--tls-username"), "{e}");
        for (text, line) in [("alice:00\nbob\n", "line 2"), ("alice:0g\n", "line 1"), ("a:\n", "line 1"), (":00\n", "line 1"), ("x:0\n", "line 1")] {
            let e = find(text, "alice").unwrap_err();
            assert!(e.starts_with(line), "{text:?}: {e}");
        }
    }

    #[test]
    fn missing_file_is_named() {
        let e = load(Path::new("/nonexistent/keys.psk"), Some("alice")).unwrap_err().to_string();
        assert!(e.contains("/nonexistent/keys.psk"), "{e}");
    }
}
