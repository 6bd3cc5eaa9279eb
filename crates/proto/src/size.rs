//! Sizes as users write them in export specs, options and files: a number with an optional
//! binary suffix (`512K`, `1.5G`, `4MiB`); and durations, as files write them (`"5s"`).

/// Parses a size; the message says what was wrong.
pub fn parse_size(s: &str) -> Result<u64, String> {
    let bad = || format!("size {s:?} is not a number with an optional K/M/G/T/P suffix");
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix('B')).unwrap_or(t);
    let (num, shift) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let shift = match c.to_ascii_uppercase() {
                'K' => 10,
                'M' => 20,
                'G' => 30,
                'T' => 40,
                'P' => 50,
                _ => return Err(bad()),
            };
            (&t[..i], shift)
        }
        _ => (t, 0),
    };
    if num.is_empty() {
        return Err(bad());
    }
    let value = if num.contains('.') {
        let f: f64 = num.parse().map_err(|_| bad())?;
        let v = f * (1u64 << shift) as f64;
        if !(0.0..1.8e19).contains(&v) {
            return Err(bad());
        }
        v as u64
    } else {
        let n: u64 = num.parse().map_err(|_| bad())?;
        n.checked_mul(1u64 << shift).ok_or_else(bad)?
    };
    // Offsets are u64 but offset + length must not overflow for any valid request.
    if value > i64::MAX as u64 {
        return Err(format!("size {s:?} is too large"));
    }
    Ok(value)
}
/// Parses a duration as users write them in files: `"5s"`, `"500ms"`, `"2m"`, `"1h"`, `"7d"`,
/// or a bare number of seconds, from 1 ms to `max_ms` (`max_text` says it in the message).
pub fn parse_duration_ms(s: &str, max_ms: u64, max_text: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("{s:?} is not a duration such as \"5s\" or \"500ms\"");
    let (num, scale) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600_000)
    } else if let Some(n) = t.strip_suffix('d') {
        (n, 86_400_000)
    } else {
        (t, 1000)
    };
    let v: f64 = num.trim().parse().map_err(|_| bad())?;
    let ms = v * scale as f64;
    if !(1.0..=max_ms as f64).contains(&ms) {
        return Err(format!("{s:?} must be between 1ms and {max_text}"));
    }
    Ok(ms as u64)
}

