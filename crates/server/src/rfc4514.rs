//! Distinguished names as RFC 4514 writes them: escaping a value, and one normal spelling
//! of a DN so that two spellings of the same name compare equal. Pure text: the TLS code
//! writes a certificate's subject with it, the access rules compare subjects with it.

/// Escapes the characters RFC 4514 says a value must escape.
pub fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    let last = value.chars().count().saturating_sub(1);
    for (i, c) in value.chars().enumerate() {
        let edge_space = c == ' ' && (i == 0 || i == last);
        if matches!(c, ',' | '+' | '"' | '\\' | '<' | '>' | ';') || edge_space || (i == 0 && c == '#') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

/// A DN in one spelling for comparison: attribute types upper-case, values with their
/// escapes resolved and compared case-insensitively (X.520's caseIgnoreMatch, which the
/// usual attributes use), spaces around separators dropped, the values of a multi-valued
/// RDN in order. Written back as RFC 4514 text.
pub fn normal_dn(dn: &str) -> Result<String, String> {
    let mut rdns = Vec::new();
    for rdn in split_unescaped(dn, ',')? {
        let mut avas = Vec::new();
        for ava in split_unescaped(&rdn, '+')? {
            let (key, value) = ava.split_once('=').ok_or_else(|| format!("{ava:?} is not TYPE=value"))?;
            let key = key.trim().to_ascii_uppercase();
            if key.is_empty() {
                return Err(format!("{ava:?} has no attribute type"));
            }
            let value = unescape(value.trim())?.to_lowercase();
            avas.push(format!("{key}={}", escape(&value)));
        }
        avas.sort();
        rdns.push(avas.join("+"));
    }
    Ok(rdns.join(","))
}

/// Splits at `sep` where it is not escaped by a backslash; the pieces keep their escapes.
fn split_unescaped(text: &str, sep: char) -> Result<Vec<String>, String> {
    let mut parts = vec![String::new()];
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                let next = chars.next().ok_or_else(|| format!("{text:?} ends with a lone backslash"))?;
                let part = parts.last_mut().expect("never empty");
                part.push('\\');
                part.push(next);
            }
            c if c == sep => parts.push(String::new()),
            c => parts.last_mut().expect("never empty").push(c),
        }
    }
    if parts.iter().any(|p| p.trim().is_empty()) {
        return Err(format!("{text:?} has an empty part"));
    }
    Ok(parts)
}

/// Resolves `\,` style escapes and `\XX` hex pairs (UTF-8 bytes).
fn unescape(value: &str) -> Result<String, String> {
    let mut bytes = Vec::with_capacity(value.len());
    let mut chars = value.chars().peekable();
    while let Some(c) = chars.next() {
        if c != '\\' {
            let mut buf = [0u8; 4];
            bytes.extend_from_slice(c.encode_utf8(&mut buf).as_bytes());
            continue;
        }
        let first = chars.next().ok_or_else(|| format!("{value:?} ends with a lone backslash"))?;
        match (first.to_digit(16), chars.peek().and_then(|c| c.to_digit(16))) {
            (Some(hi), Some(lo)) => {
                chars.next();
                bytes.push((hi * 16 + lo) as u8);
            }
            _ => {
                let mut buf = [0u8; 4];
                bytes.extend_from_slice(first.encode_utf8(&mut buf).as_bytes());
            }
        }
    }
    String::from_utf8(bytes).map_err(|_| format!("{value:?} is not UTF-8 once unescaped"))
}
