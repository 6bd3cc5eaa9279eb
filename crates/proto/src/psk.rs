//! psktool files, as nbdkit, qemu-nbd, libnbd and sluice read them: one `identity:hexkey`
//! line per client. Shared by the server (every identity) and the client (its own).

/// The longest identity and key OpenSSL's PSK callbacks have room for (PSK_MAX_IDENTITY_LEN
/// less the NUL, PSK_MAX_PSK_LEN); psktool makes 32-byte keys.
pub const PSK_IDENTITY_MAX_BYTES: usize = 255;
pub const PSK_KEY_MAX_BYTES: usize = 512;

/// Every (identity, key) in the file's text, in order. Empty lines are skipped; any other
/// line that is not `identity:hexkey` is an error that names it ("line 3: ...").
pub fn parse(text: &str) -> Result<Vec<(String, Vec<u8>)>, String> {
    let mut keys = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if line.trim().is_empty() {
            continue;
        }
        let Some((user, hex)) = line.split_once(':') else {
            return Err(format!("line {n} is not USERNAME:HEXKEY"));
        };
        if user.is_empty() || user.len() > PSK_IDENTITY_MAX_BYTES {
            return Err(format!("line {n}: the user name must be 1 to {PSK_IDENTITY_MAX_BYTES} bytes"));
        }
        let key = decode_hex(hex.trim_end()).ok_or_else(|| format!("line {n}: the key of {user:?} is not an even number of hex digits"))?;
        if key.is_empty() || key.len() > PSK_KEY_MAX_BYTES {
            return Err(format!("line {n}: the key of {user:?} must be 1 to {PSK_KEY_MAX_BYTES} bytes"));
        }
        keys.push((user.to_owned(), key));
    }
    Ok(keys)
}

fn decode_hex(s: &str) -> Option<Vec<u8>> {
    if !s.len().is_multiple_of(2) || !s.bytes().all(|c| c.is_ascii_hexdigit()) {
        return None;
    }
    (0..s.len()).step_by(2).map(|i| u8::from_str_radix(&s[i..i + 2], 16).ok()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_every_identity_and_names_the_bad_line() {
        let keys = parse("alice:00ff10\nbob:abcd\n\n").unwrap();
        assert_eq!(keys, vec![("alice".to_owned(), vec![0, 0xff, 0x10]), ("bob".to_owned(), vec![0xab, 0xcd])]);
        for (text, line) in [("alice:00\nbob\n", "line 2"), ("alice:0g\n", "line 1"), ("a:\n", "line 1"), (":00\n", "line 1"), ("x:0\n", "line 1"), ("x:+1\n", "line 1")] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with(line), "{text:?}: {e}");
        }
        assert!(parse(&format!("{}:00\n", "u".repeat(PSK_IDENTITY_MAX_BYTES + 1))).is_err());
    }
}
