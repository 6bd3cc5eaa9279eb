//! The cached volume's file (`cache:FILE`), as issue 29 fixes its keys:
//!
//! ```toml
//! backing = "pool:/etc/sluice/vol.toml"
//! members = ["nbd://node3/ram", "nbd://node5/ram"]
//! block = "64K"
//! policy = "write-through"
//! prefetch = "auto"
//! member-timeout = "2s"    # optional, as in a pool's file
//! ```

use serde::Deserialize;

use crate::limits::{BLOCK_DEFAULT_BYTES, BLOCK_MAX_BYTES, BLOCK_MIN_BYTES, MEMBERS_MAX, MEMBER_TIMEOUT_DEFAULT_MS, MEMBER_TIMEOUT_MAX_MS};

/// When writes are acknowledged: only write-through (the backing has them) for now.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Policy {
    WriteThrough,
}

/// Whether sequential streams are read ahead into the cache.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Prefetch {
    Off,
    #[default]
    Auto,
}

/// The file as written; `validate` turns it into a `Config`.
#[derive(Clone, Debug, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct CacheFile {
    pub backing: String,
    pub members: Vec<String>,
    pub block: Option<String>,
    pub policy: Option<Policy>,
    #[serde(default)]
    pub prefetch: Prefetch,
    pub member_timeout: Option<String>,
}

/// A checked configuration.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    /// Any export spec or URI sluice takes: the slower volume being cached.
    pub backing: String,
    /// RAM exports lending memory, in the file's order (their index names them).
    pub members: Vec<String>,
    pub block_bytes: u64,
    pub policy: Policy,
    pub prefetch: Prefetch,
    /// A member operation older than this marks its member down.
    pub member_timeout_ms: u64,
}

impl CacheFile {
    pub fn validate(&self) -> Result<Config, String> {
        if self.backing.trim().is_empty() {
            return Err("backing: empty; name the volume to cache (a URI, a pool, a file)".into());
        }
        if self.backing.trim_start().starts_with("cache:") {
            return Err(format!("backing {:?}: a cached volume cannot be the backing of another", self.backing));
        }
        if self.members.is_empty() {
            return Err("members: none; name at least one RAM export (nbd://node/ram)".into());
        }
        if self.members.len() > MEMBERS_MAX {
            return Err(format!("members: {} named, at most {MEMBERS_MAX}", self.members.len()));
        }
        for (i, m) in self.members.iter().enumerate() {
            if m.trim().is_empty() {
                return Err(format!("members[{i}]: empty"));
            }
            if self.members[..i].contains(m) {
                return Err(format!("members[{i}]: {m:?} is named twice"));
            }
            if *m == self.backing {
                return Err(format!("members[{i}]: {m:?} is also the backing"));
            }
        }
        Ok(Config {
            backing: self.backing.clone(),
            members: self.members.clone(),
            block_bytes: self.block_bytes()?,
            policy: self.policy.unwrap_or(Policy::WriteThrough),
            prefetch: self.prefetch,
            member_timeout_ms: match &self.member_timeout {
                None => MEMBER_TIMEOUT_DEFAULT_MS,
                Some(s) => sluice_proto::size::parse_duration_ms(s, MEMBER_TIMEOUT_MAX_MS, "1h").map_err(|e| format!("member-timeout: {e}"))?,
            },
        })
    }

    fn block_bytes(&self) -> Result<u64, String> {
        let Some(spec) = &self.block else { return Ok(BLOCK_DEFAULT_BYTES) };
        let bytes = sluice_proto::size::parse_size(spec).map_err(|e| format!("block: {e}"))?;
        if !bytes.is_power_of_two() || !(BLOCK_MIN_BYTES..=BLOCK_MAX_BYTES).contains(&bytes) {
            return Err(format!("block {spec:?}: must be a power of two from 4K to 4M"));
        }
        Ok(bytes)
    }
}

/// Parses and checks the text of a cache file.
pub fn parse(text: &str) -> Result<Config, String> {
    let file: CacheFile = toml::from_str(text).map_err(|e| e.to_string())?;
    file.validate()
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "backing = \"nbd://disk/vol\"\nmembers = [\"nbd://a/ram\", \"nbd://b/ram\"]\n";

    fn refused(extra: &str, members: &str, needle: &str) {
        let text = format!("backing = \"nbd://disk/vol\"\nmembers = {members}\n{extra}");
        let err = parse(&text).expect_err(&text);
        assert!(err.contains(needle), "{err:?} should mention {needle:?}");
    }

    const TWO: &str = "[\"nbd://a/ram\", \"nbd://b/ram\"]";

    #[test]
    fn defaults_are_64k_write_through_auto() {
        let c = parse(GOOD).unwrap();
        assert_eq!((c.block_bytes, c.policy, c.prefetch), (64 << 10, Policy::WriteThrough, Prefetch::Auto));
        assert_eq!(c.member_timeout_ms, MEMBER_TIMEOUT_DEFAULT_MS);
        assert_eq!(c.members.len(), 2);
    }

    #[test]
    fn every_key_is_read() {
        let c = parse(&format!("{GOOD}block = \"1M\"\npolicy = \"write-through\"\nprefetch = \"off\"\nmember-timeout = \"250ms\"\n")).unwrap();
        assert_eq!((c.block_bytes, c.prefetch, c.member_timeout_ms), (1 << 20, Prefetch::Off, 250));
    }

    #[test]
    fn block_must_be_a_power_of_two_in_range() {
        refused("block = \"2K\"", TWO, "power of two");
        refused("block = \"8M\"", TWO, "power of two");
        refused("block = \"96K\"", TWO, "power of two");
        refused("block = \"lots\"", TWO, "block");
    }

    #[test]
    fn member_timeout_is_a_duration_in_range() {
        refused("member-timeout = \"soon\"", TWO, "member-timeout");
        refused("member-timeout = \"0s\"", TWO, "between 1ms and 1h");
        refused("member-timeout = \"2h\"", TWO, "between 1ms and 1h");
        assert_eq!(parse(&format!("{GOOD}member-timeout = \"5\"\n")).unwrap().member_timeout_ms, 5000);
    }

    #[test]
    fn only_write_through_and_known_prefetch() {
        refused("policy = \"write-back\"", TWO, "write-back");
        refused("prefetch = \"always\"", TWO, "always");
    }

    #[test]
    fn members_are_checked() {
        refused("", "[]", "at least one");
        refused("", "[\"nbd://a/ram\", \"nbd://a/ram\"]", "twice");
        refused("", "[\"\"]", "empty");
        refused("", "[\"nbd://disk/vol\"]", "also the backing");
        let many: Vec<String> = (0..=MEMBERS_MAX).map(|i| format!("\"nbd://m{i}/ram\"")).collect();
        refused("", &format!("[{}]", many.join(",")), "at most");
    }

    #[test]
    fn backing_is_checked_and_keys_are_known() {
        assert!(parse("backing = \"\"\nmembers = [\"nbd://a/ram\"]").unwrap_err().contains("backing"));
        assert!(parse("backing = \"cache:/x\"\nmembers = [\"nbd://a/ram\"]").unwrap_err().contains("cached volume"));
        refused("colour = \"blue\"", TWO, "colour");
        assert!(parse("members = [\"nbd://a/ram\"]").unwrap_err().contains("backing"));
    }
}
