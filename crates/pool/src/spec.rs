//! The pool file: a small TOML description of a pool that `pool:PATH` names.
//!
//! ```toml
//! layout = "raid10"          # "stripe" | "mirror" | "raid10" (stripe of mirrors)
//! stripe-unit = "512K"       # stripe and raid10: power of two, >= 4K
//! copies = 2                 # mirror and raid10 (default 2)
//! placement = "offset"       # raid10: "near" (default) | "offset" (see layout.rs)
//! members = ["nbd://10.0.0.1/disk", "nbd://10.0.0.2/disk"]
//! spares = ["nbd://10.0.0.3/disk"]   # optional: take a missing member's place
//! spare-after = "60s"        # optional: how long a member may be missing first
//! ```

use serde::Deserialize;

use crate::limits::{
    MEMBERS_MAX, MEMBER_TIMEOUT_DEFAULT_MS, SPARE_AFTER_DEFAULT_MS, RESYNC_RATE_DEFAULT_BYTES_PER_S, STRIPE_UNIT_DEFAULT_BYTES, STRIPE_UNIT_MAX_BYTES,
    STRIPE_UNIT_MIN_BYTES,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Layout {
    /// Units spread over every member; no redundancy.
    Stripe,
    /// Every member holds the whole volume.
    Mirror,
    /// Units spread over mirror sets of `copies` consecutive members ("near" layout).
    Raid10,
}

/// Which members of a raid10 hold the copies of a unit (see layout.rs).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Placement {
    /// Fixed mirror sets of `copies` consecutive members.
    Near,
    /// The members of each set change every placement period, so that a lost member's
    /// copies lie on all the others.
    Offset,
}

impl Placement {
    pub fn name(self) -> &'static str {
        match self {
            Placement::Near => "near",
            Placement::Offset => "offset",
        }
    }
}

impl Layout {
    pub fn name(self) -> &'static str {
        match self {
            Layout::Stripe => "stripe",
            Layout::Mirror => "mirror",
            Layout::Raid10 => "raid10",
        }
    }

    pub fn code(self) -> u8 {
        match self {
            Layout::Stripe => 1,
            Layout::Mirror => 2,
            Layout::Raid10 => 3,
        }
    }

    pub fn from_code(c: u8) -> Option<Layout> {
        [Layout::Stripe, Layout::Mirror, Layout::Raid10].into_iter().find(|l| l.code() == c)
    }

    pub fn redundant(self) -> bool {
        self != Layout::Stripe
    }
}

/// A checked pool description.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PoolSpec {
    pub layout: Layout,
    /// Always `Near` but for a raid10 that asks for `offset`.
    pub placement: Placement,
    /// Bytes per stripe unit (the whole member for a mirror).
    pub stripe_unit: u64,
    /// Copies of every byte (1 for a stripe).
    pub copies: usize,
    /// Member URIs, in order: the order fixes each member's place in the layout.
    pub members: Vec<String>,
    /// A member that has not answered an operation for this long is declared missing.
    pub member_timeout_ms: u64,
    /// Upper bound on background resync traffic (and on scrub reads).
    pub resync_rate_bytes_per_s: u64,
    /// Servers that take the place of a member missing for `spare_after_ms`, in order.
    pub spares: Vec<String>,
    pub spare_after_ms: u64,
    /// A serving coordinator starts a check this long after the last completed scrub.
    pub scrub_interval_ms: Option<u64>,
}

/// A pool file's text with the member `old` replaced by `new`, and nothing else changed:
/// comments, spacing, the order of keys and the other members stay as the operator wrote
/// them.
pub fn replace_member_in_text(text: &str, old: &str, new: &str) -> Result<String, String> {
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| e.to_string())?;
    let members = doc.get_mut("members").and_then(|m| m.as_array_mut()).ok_or("the pool file has no members list")?;
    let at = members.iter().position(|v| v.as_str() == Some(old)).ok_or_else(|| format!("{old} is not in the members list"))?;
    members.replace(at, new);
    Ok(doc.to_string())
}

/// A pool file's text with `new` members appended (`sluice pool grow`), and for a mirror
/// `copies` set to the new member count; comments and layout stay as they were.
pub fn append_members_in_text(text: &str, new: &[String]) -> Result<String, String> {
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| e.to_string())?;
    let members = doc.get_mut("members").and_then(|m| m.as_array_mut()).ok_or("the pool file has no members list")?;
    for m in new {
        members.push(m.as_str());
    }
    let count = members.len() as i64;
    if doc.get("layout").and_then(|l| l.as_str()) == Some("mirror") {
        match doc.get_mut("copies").and_then(|c| c.as_value_mut()) {
            // Keeps the comment after the value.
            Some(v) => *v = toml_edit::Value::from(count).decorated(v.decor().prefix().cloned().unwrap_or_default(), v.decor().suffix().cloned().unwrap_or_default()),
            None => doc["copies"] = toml_edit::value(count),
        }
    }
    Ok(doc.to_string())
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
struct File {
    layout: Layout,
    placement: Option<Placement>,
    stripe_unit: Option<String>,
    copies: Option<usize>,
    members: Vec<String>,
    member_timeout: Option<String>,
    resync_rate: Option<String>,
    #[serde(default)]
    spares: Vec<String>,
    spare_after: Option<String>,
    scrub_interval: Option<String>,
}

impl PoolSpec {
    /// Reads and checks a pool file.
    pub fn load(path: &std::path::Path) -> Result<PoolSpec, String> {
        let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read pool file {}: {e}", path.display()))?;
        PoolSpec::parse(&text).map_err(|e| format!("pool file {}: {e}", path.display()))
    }

    pub fn parse(text: &str) -> Result<PoolSpec, String> {
        let de = toml::Deserializer::parse(text).map_err(|e| e.to_string())?;
        let file: File = serde_path_to_error::deserialize(de).map_err(|e| {
            let path = e.path().to_string();
            let inner = e.into_inner().to_string();
            if path == "." { inner } else { format!("{path}: {inner}") }
        })?;
        let copies = match (file.layout, file.copies) {
            (Layout::Stripe, None | Some(1)) => 1,
            (Layout::Stripe, Some(n)) => return Err(format!("copies = {n} makes no sense for a stripe (use mirror or raid10)")),
            (_, None) => 2,
            (_, Some(n)) if n >= 2 => n,
            (_, Some(n)) => return Err(format!("copies must be at least 2 for {}, not {n}", file.layout.name())),
        };
        let n = file.members.len();
        if n == 0 {
            return Err("members is empty".into());
        }
        if n > MEMBERS_MAX {
            return Err(format!("{n} members; at most {MEMBERS_MAX}"));
        }
        match file.layout {
            Layout::Mirror if n != copies => {
                return Err(format!("a mirror with copies = {copies} needs exactly {copies} members, not {n}"));
            }
            Layout::Raid10 if n < copies || !n.is_multiple_of(copies) => {
                return Err(format!("raid10 with copies = {copies} needs a multiple of {copies} members (at least {copies}), not {n}"));
            }
            _ => {}
        }
        for (i, m) in file.members.iter().enumerate() {
            if file.members[..i].contains(m) {
                return Err(format!("member {m:?} is listed twice"));
            }
        }
        let placement = match (file.layout, file.placement) {
            (_, None) => Placement::Near,
            (Layout::Raid10, Some(p)) => p,
            (l, Some(p)) => return Err(format!("placement = {:?} is for raid10 only: a {} has no mirror sets to place", p.name(), l.name())),
        };
        let stripe_unit = match (file.layout, &file.stripe_unit) {
            (Layout::Mirror, Some(_)) => return Err("stripe-unit makes no sense for a mirror".into()),
            (Layout::Mirror, None) => u64::MAX,
            (_, None) => STRIPE_UNIT_DEFAULT_BYTES,
            (_, Some(s)) => {
                let u = sluice_size(s).map_err(|e| format!("stripe-unit: {e}"))?;
                if !u.is_power_of_two() || !(STRIPE_UNIT_MIN_BYTES..=STRIPE_UNIT_MAX_BYTES).contains(&u) {
                    return Err(format!(
                        "stripe-unit {s:?} must be a power of two from {}K to {}M",
                        STRIPE_UNIT_MIN_BYTES >> 10,
                        STRIPE_UNIT_MAX_BYTES >> 20
                    ));
                }
                u
            }
        };
        let member_timeout_ms = match &file.member_timeout {
            None => MEMBER_TIMEOUT_DEFAULT_MS,
            Some(s) => parse_duration_ms(s).map_err(|e| format!("member-timeout: {e}"))?,
        };
        let resync_rate_bytes_per_s = match &file.resync_rate {
            None => RESYNC_RATE_DEFAULT_BYTES_PER_S,
            Some(s) => match sluice_size(s) {
                Ok(0) | Err(_) => return Err(format!("resync-rate {s:?} must be a size per second such as \"100M\"")),
                Ok(v) => v,
            },
        };
        check_spares(file.layout, &file.members, &file.spares)?;
        let spare_after_ms = match &file.spare_after {
            None => SPARE_AFTER_DEFAULT_MS,
            Some(s) => parse_duration_ms(s).map_err(|e| format!("spare-after: {e}"))?,
        };
        let scrub_interval_ms = match &file.scrub_interval {
            None => None,
            Some(s) => Some(parse_interval_ms(s).map_err(|e| format!("scrub-interval: {e}"))?),
        };
        Ok(PoolSpec {
            layout: file.layout,
            placement,
            stripe_unit,
            copies,
            members: file.members,
            member_timeout_ms,
            resync_rate_bytes_per_s,
            spares: file.spares,
            spare_after_ms,
            scrub_interval_ms,
        })
    }

    /// Mirror sets: each is `copies` consecutive members.
    pub fn sets(&self) -> usize {
        self.members.len() / self.copies
    }
}

/// Spares are for layouts that can rebuild a member, each listed once and not a member.
fn check_spares(layout: Layout, members: &[String], spares: &[String]) -> Result<(), String> {
    if !spares.is_empty() && !layout.redundant() {
        return Err("spares make no sense for a stripe: it keeps one copy of every unit, so there is nothing to rebuild a spare from".into());
    }
    if spares.len() > MEMBERS_MAX {
        return Err(format!("{} spares; at most {MEMBERS_MAX}", spares.len()));
    }
    for (i, s) in spares.iter().enumerate() {
        if members.contains(s) {
            return Err(format!("spare {s:?} is also a member"));
        }
        if spares[..i].contains(s) {
            return Err(format!("spare {s:?} is listed twice"));
        }
    }
    Ok(())
}

/// A pool file's text with `uri` added at the end of `spares` (the list is created when
/// the file has none), and nothing else changed.
pub fn add_spare_in_text(text: &str, uri: &str) -> Result<String, String> {
    let mut doc: toml_edit::DocumentMut = text.parse().map_err(|e: toml_edit::TomlError| e.to_string())?;
    if doc.get("spares").is_none() {
        doc["spares"] = toml_edit::value(toml_edit::Array::new());
    }
    let spares = doc.get_mut("spares").and_then(|m| m.as_array_mut()).ok_or("the pool file's spares is not a list")?;
    if spares.iter().any(|v| v.as_str() == Some(uri)) {
        return Err(format!("{uri} is a spare already"));
    }
    spares.push(uri);
    Ok(doc.to_string())
}

/// A pool file's text after spare `spare` took member `old`'s place: it is named in the
/// members list where `old` was, and no longer in `spares`.
pub fn take_spare_in_text(text: &str, old: &str, spare: &str) -> Result<String, String> {
    let replaced = replace_member_in_text(text, old, spare)?;
    let mut doc: toml_edit::DocumentMut = replaced.parse().map_err(|e: toml_edit::TomlError| e.to_string())?;
    if let Some(spares) = doc.get_mut("spares").and_then(|m| m.as_array_mut()) {
        spares.retain(|v| v.as_str() != Some(spare));
    }
    Ok(doc.to_string())
}

fn sluice_size(s: &str) -> Result<u64, String> {
    sluice_proto::size::parse_size(s)
}

/// `"5s"`, `"500ms"`, `"2m"`, `"1h"`, or a bare number of seconds, up to 24h.
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    sluice_proto::size::parse_duration_ms(s, 86_400_000, "24h")
}

/// A scrub interval: a duration such as `"7d"` or `"24h"`, from a minute to a year (a
/// shorter one would keep a pool scrubbing all the time).
pub fn parse_interval_ms(s: &str) -> Result<u64, String> {
    let ms = sluice_proto::size::parse_duration_ms(s, 365 * 86_400_000, "365d")?;
    if ms < 60_000 {
        return Err(format!("{s:?} is shorter than a minute"));
    }
    Ok(ms)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_replaced_member_keeps_the_files_comments_and_layout() {
        let text = "# the volume of rack 2\nlayout = \"mirror\"   # two copies\nmembers = [\n    \"nbd://node1/disk\",  # row A\n    \"nbd://node2/disk\",  # row B\n]\nresync-rate = \"100M\"\n";
        let out = replace_member_in_text(text, "nbd://node2/disk", "nbd://node9/disk").unwrap();
        assert_eq!(out, text.replace("node2", "node9"));
        assert!(PoolSpec::parse(&out).unwrap().members[1] == "nbd://node9/disk");
        let e = replace_member_in_text(text, "nbd://node3/disk", "nbd://node9/disk").unwrap_err();
        assert!(e.contains("not in the members list"), "{e}");
    }

    #[test]
    fn spares_are_added_and_taken_in_the_text() {
        let text = "layout = \"mirror\"  # rack 2\nmembers = [\"nbd://a/d\", \"nbd://b/d\"]\n";
        let one = add_spare_in_text(text, "nbd://s1/d").unwrap();
        let two = add_spare_in_text(&one, "nbd://s2/d").unwrap();
        assert!(two.starts_with("layout = \"mirror\"  # rack 2\n"), "{two}");
        let p = PoolSpec::parse(&two).unwrap();
        assert_eq!((p.spares.clone(), p.spare_after_ms), (vec!["nbd://s1/d".to_string(), "nbd://s2/d".to_string()], 60_000));
        assert!(add_spare_in_text(&two, "nbd://s2/d").unwrap_err().contains("already"));
        let taken = PoolSpec::parse(&take_spare_in_text(&two, "nbd://b/d", "nbd://s1/d").unwrap()).unwrap();
        assert_eq!((taken.members, taken.spares), (vec!["nbd://a/d".to_string(), "nbd://s1/d".to_string()], vec!["nbd://s2/d".to_string()]));
    }

    #[test]
    fn grown_members_are_appended_and_a_mirror_counts_its_copies() {
        let text = "# rack 2\nlayout = \"stripe\"\nmembers = [\n    \"nbd://node1/disk\",  # row A\n    \"nbd://node2/disk\",\n]\n";
        let out = append_members_in_text(text, &["nbd://node3/disk".into(), "nbd://node4/disk".into()]).unwrap();
        assert!(out.starts_with("# rack 2\n") && out.contains("# row A"), "{out}");
        assert_eq!(PoolSpec::parse(&out).unwrap().members.len(), 4);
        let mirror = "layout = \"mirror\"\ncopies = 2  # both racks\nmembers = [\"nbd://a/d\", \"nbd://b/d\"]\n";
        let out = append_members_in_text(mirror, &["nbd://c/d".into()]).unwrap();
        assert!(out.contains("copies = 3  # both racks"), "{out}");
        assert_eq!(PoolSpec::parse(&out).unwrap().copies, 3);
        let bare = append_members_in_text("layout = \"mirror\"\nmembers = [\"nbd://a/d\", \"nbd://b/d\"]\n", &["nbd://c/d".into()]).unwrap();
        assert_eq!(PoolSpec::parse(&bare).unwrap().copies, 3);
    }

    fn members(n: usize) -> String {
        let list: Vec<String> = (0..n).map(|i| format!("\"nbd://h{i}/d\"")).collect();
        format!("members = [{}]", list.join(", "))
    }

    #[test]
    fn good_files() {
        let p = PoolSpec::parse(&format!("layout = \"raid10\"\nstripe-unit = \"64K\"\n{}", members(4))).unwrap();
        assert_eq!((p.layout, p.stripe_unit, p.copies, p.sets()), (Layout::Raid10, 65536, 2, 2));
        let p = PoolSpec::parse(&format!("layout = \"stripe\"\n{}", members(3))).unwrap();
        assert_eq!((p.copies, p.sets(), p.stripe_unit), (1, 3, 512 << 10));
        let p = PoolSpec::parse(&format!("layout = \"mirror\"\ncopies = 3\nmember-timeout = \"250ms\"\n{}", members(3))).unwrap();
        assert_eq!((p.copies, p.sets(), p.member_timeout_ms), (3, 1, 250));
        assert_eq!(p.placement, Placement::Near);
        let p = PoolSpec::parse(&format!("layout = \"raid10\"\nplacement = \"offset\"\n{}", members(4))).unwrap();
        assert_eq!((p.layout, p.placement), (Layout::Raid10, Placement::Offset));
    }

    #[test]
    fn bad_files_say_why() {
        let err = |t: String| PoolSpec::parse(&t).unwrap_err();
        assert!(err(format!("layout = \"raid5\"\n{}", members(3))).contains("raid5"));
        assert!(err(format!("layout = \"stripe\"\nstripe-unit = \"48K\"\n{}", members(2))).contains("power of two"));
        assert!(err(format!("layout = \"stripe\"\nstripe-unit = \"2K\"\n{}", members(2))).contains("power of two"));
        assert!(err(format!("layout = \"raid10\"\n{}", members(3))).contains("multiple of 2"));
        assert!(err(format!("layout = \"mirror\"\nplacement = \"offset\"\n{}", members(2))).contains("raid10 only"));
        assert!(err(format!("layout = \"raid10\"\nplacement = \"far\"\n{}", members(4))).contains("placement"));
        assert!(err(format!("layout = \"mirror\"\ncopies = 3\n{}", members(2))).contains("exactly 3 members"));
        assert!(err(format!("layout = \"mirror\"\ncopies = 1\n{}", members(1))).contains("at least 2"));
        assert!(err(format!("layout = \"stripe\"\nstripes = 2\n{}", members(2))).contains("stripes"));
        assert!(err("layout = \"stripe\"\nmembers = [\"a\", \"a\"]".into()).contains("twice"));
        assert!(err("layout = \"stripe\"\nmembers = []".into()).contains("empty"));
        assert!(err(format!("layout = \"stripe\"\nmember-timeout = \"soon\"\n{}", members(2))).contains("duration"));
        assert!(err(format!("layout = \"stripe\"\nspares = [\"nbd://s/d\"]\n{}", members(2))).contains("stripe"));
        assert!(err(format!("layout = \"mirror\"\nspares = [\"nbd://h0/d\"]\n{}", members(2))).contains("also a member"));
        assert!(err(format!("layout = \"mirror\"\nspares = [\"x\", \"x\"]\n{}", members(2))).contains("twice"));
        assert!(err(format!("layout = \"mirror\"\nspare-after = \"-1s\"\n{}", members(2))).contains("spare-after"));
    }

    #[test]
    fn scrub_intervals_take_days() {
        let p = PoolSpec::parse(&format!("layout = \"mirror\"\nscrub-interval = \"7d\"\n{}", members(2))).unwrap();
        assert_eq!(p.scrub_interval_ms, Some(7 * 86_400_000));
        let p = PoolSpec::parse(&format!("layout = \"mirror\"\nscrub-interval = \"36h\"\n{}", members(2))).unwrap();
        assert_eq!(p.scrub_interval_ms, Some(36 * 3_600_000));
        assert_eq!(PoolSpec::parse(&format!("layout = \"mirror\"\n{}", members(2))).unwrap().scrub_interval_ms, None);
        let err = |t: String| PoolSpec::parse(&t).unwrap_err();
        assert!(err(format!("layout = \"mirror\"\nscrub-interval = \"5s\"\n{}", members(2))).contains("shorter than a minute"));
        assert!(err(format!("layout = \"mirror\"\nscrub-interval = \"400d\"\n{}", members(2))).contains("365d"));
        assert!(err(format!("layout = \"mirror\"\nscrub-interval = \"weekly\"\n{}", members(2))).contains("duration"));
        assert!(err(format!("layout = \"mirror\"\nmember-timeout = \"2d\"\n{}", members(2))).contains("24h"));
    }
}
