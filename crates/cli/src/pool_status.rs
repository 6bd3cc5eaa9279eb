//! A pool's state as `sluice pool` prints it: text for people, JSON for scripts
//! (docs/pool.md has both).

use indicatif::HumanBytes;
use serde_json::{json, Value};
use sluice_client::pool::{Layout, MemberState, ReshapeStatus, Status};

/// What `pool init` says when it is done.
pub fn initialized(s: &Status) {
    println!(
        "initialized pool {}: {}, {} members, {} ({})",
        s.pool_id,
        layout_text(s),
        s.members.len(),
        s.size,
        HumanBytes(s.size)
    );
}

/// The pool's state, and whether a start (degraded or not, as asked) could assemble it.
pub fn print(s: &Status, assembly: &Result<(), String>, as_json: bool) {
    if as_json {
        let mut v = to_json(s);
        v["assembly"] = json!({"ok": assembly.is_ok(), "refusal": assembly.as_ref().err()});
        let text = serde_json::to_string_pretty(&v).expect("JSON from plain values");
        println!("{text}");
    } else {
        print!("{}", to_text(s));
        match assembly {
            Ok(()) if s.members.iter().any(|m| m.state == MemberState::Missing) => println!("assembly: possible, degraded"),
            Ok(()) => println!("assembly: possible"),
            Err(e) => println!("assembly: refused: {e}"),
        }
    }
}

/// "raid10, stripe unit 512 KiB, 2 copies"; a mirror has no stripe unit, a stripe one copy.
fn layout_text(s: &Status) -> String {
    match s.layout {
        Layout::Stripe => format!("stripe, stripe unit {}", HumanBytes(s.stripe_unit)),
        Layout::Mirror => format!("mirror, {} copies", s.copies),
        Layout::Raid10 => format!(
            "raid10, stripe unit {}, {} copies, {} placement",
            HumanBytes(s.stripe_unit),
            s.copies,
            s.placement.name()
        ),
    }
}

fn state_text(state: MemberState) -> String {
    match state {
        MemberState::Resyncing { done, total } => format!("resyncing {}%", percent(done, total)),
        other => other.name().to_string(),
    }
}

fn percent(done: u64, total: u64) -> u64 {
    match total {
        0 => 0,
        t => (done as u128 * 100 / t as u128).min(100) as u64,
    }
}

pub fn to_text(s: &Status) -> String {
    let mut out = format!("pool:     {}\n", s.pool_id);
    out += &format!("layout:   {}\n", layout_text(s));
    out += &format!("size:     {} ({})\n", s.size, HumanBytes(s.size));
    out += &format!("events:   {}\n", s.events);
    if let Some(owner) = &s.owner {
        out += &format!("owner:    {owner}\n");
    }
    out += &format!(
        "dirty:    {} regions of {}\n",
        s.dirty_regions,
        HumanBytes(s.region_bytes)
    );
    if s.resynced_bytes > 0 {
        out += &format!("resynced: {}\n", HumanBytes(s.resynced_bytes));
    }
    if let Some(r) = &s.scrub {
        out += &scrub_line(r, s.scrubs_completed);
    }
    if let Some(r) = &s.reshape {
        out += &reshape_text(r);
    }
    out += "members:\n";
    let width = s.members.iter().map(|m| m.uri.len()).max().unwrap_or(0);
    for m in &s.members {
        out += &format!("  {:width$}  {}\n", m.uri, state_text(m.state));
    }
    if let Some(r) = &s.replacing {
        let old = s.members.get(r.member).map_or("?", |m| m.uri.as_str());
        out += &format!("replacing: {old} by {}, {}% copied while it serves\n", r.uri, percent(r.done, r.total));
    }
    if !s.spares.is_empty() {
        out += &format!("spares:   {}\n", s.spares.join(", "));
    }
    if s.spares_taken > 0 {
        out += &format!("taken:    {} spare(s) since this coordinator started\n", s.spares_taken);
    }
    out
}

/// "scrub: check running 40%, 1 mismatched region" or the last one's result.
fn scrub_line(r: &sluice_client::pool::ScrubReport, completed: u64) -> String {
    let what = if r.repair { "repair" } else { "check" };
    let state = match (r.running, r.finished_wall_ms) {
        (true, _) => format!("running {}%", percent(r.done_bytes, r.total_bytes)),
        (false, Some(ms)) if ms > 0 => format!("ended at unix time {}", ms / 1000),
        (false, _) => "ended".to_string(),
    };
    let mut line = format!("scrub:    {what} {state}, {} mismatched region(s)", r.mismatched_regions);
    if r.repair {
        line += &format!(", {} repaired", r.repaired_regions);
    }
    if completed > 0 {
        line += &format!(" ({completed} completed by this coordinator)");
    }
    line + "\n"
}

/// "reshape:  2 -> 4 members, 37% (1.2 GiB of 3.0 GiB moved), 95 MiB/s since 12:00:01 UTC".
fn reshape_text(r: &ReshapeStatus) -> String {
    let mut out = format!(
        "reshape:  {} -> {} members, {}% ({} of {} moved)",
        r.from_members,
        r.to_members,
        percent(r.done_bytes, r.total_bytes),
        HumanBytes(r.done_bytes),
        HumanBytes(r.total_bytes)
    );
    if let Some(rate) = reshape_rate(r) {
        out += &format!(", {}/s", HumanBytes(rate));
    }
    if r.started > 0 {
        out += &format!(", started {} s ago", unix_now().saturating_sub(r.started));
    }
    out + "\n"
}

fn unix_now() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// The serving coordinator's rate, or else the average since the start the superblocks
/// record (they hold no rate).
fn reshape_rate(r: &ReshapeStatus) -> Option<u64> {
    let elapsed = unix_now().saturating_sub(r.started);
    r.rate_bytes_per_s.or_else(|| (r.started > 0 && elapsed > 0).then(|| r.done_bytes / elapsed))
}

pub fn to_json(s: &Status) -> Value {
    let members: Vec<Value> = s
        .members
        .iter()
        .map(|m| {
            let resync = match m.state {
                MemberState::Resyncing { done, total } => json!({"done": done, "total": total}),
                _ => Value::Null,
            };
            json!({"uri": m.uri, "state": m.state.name(), "resync": resync})
        })
        .collect();
    let stripe_unit = match s.layout {
        Layout::Mirror => Value::Null,
        _ => json!(s.stripe_unit),
    };
    json!({
        "pool_id": s.pool_id,
        "layout": s.layout.name(),
        "placement": s.placement.name(),
        "stripe_unit": stripe_unit,
        "copies": s.copies,
        "size": s.size,
        "events": s.events,
        "region_bytes": s.region_bytes,
        "dirty_regions": s.dirty_regions,
        "resynced_bytes": s.resynced_bytes,
        "owner": s.owner,
        "members": members,
        "spares": s.spares,
        "replacing": s.replacing.as_ref().map(|r| json!({"member": r.member, "uri": r.uri, "done": r.done, "total": r.total})),
        "spares_taken": s.spares_taken,
        "scrub": s.scrub.as_ref().map(crate::pool_scrub::to_json),
        "scrubs_completed": s.scrubs_completed,
        "reshape": s.reshape.as_ref().map(|r| json!({
            "from_members": r.from_members,
            "to_members": r.to_members,
            "done_bytes": r.done_bytes,
            "total_bytes": r.total_bytes,
            "started": r.started,
            "rate_bytes_per_s": reshape_rate(r),
        })),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_client::pool::MemberStatus;

    fn sample() -> Status {
        let member = |uri: &str, state| MemberStatus {
            uri: uri.into(),
            state,
        };
        Status {
            pool_id: "00112233445566778899aabbccddeeff".into(),
            layout: Layout::Raid10,
            placement: sluice_client::pool::Placement::Near,
            stripe_unit: 512 << 10,
            copies: 2,
            size: 8 << 30,
            events: 7,
            region_bytes: 4 << 20,
            dirty_regions: 3,
            resynced_bytes: 0,
            spares: Vec::new(),
            spares_taken: 0,
            replacing: None,
            owner: None,
            members: vec![
                member("nbd://a/d", MemberState::InSync),
                member("nbd://bb/d", MemberState::Missing),
                member("nbd://c/d", MemberState::Stale),
                member(
                    "nbd://d/d",
                    MemberState::Resyncing {
                        done: 1 << 20,
                        total: 4 << 20,
                    },
                ),
            ],
            scrub: None,
            scrubs_completed: 0,
            reshape: None,
        }
    }

    #[test]
    fn the_last_scrub_has_a_line() {
        let scrub = sluice_client::pool::ScrubReport { repair: true, mismatched_regions: 2, repaired_regions: 2, finished_wall_ms: Some(1_700_000_000_123), ..Default::default() };
        let s = Status { scrub: Some(scrub), scrubs_completed: 1, ..sample() };
        assert!(to_text(&s).contains("scrub:    repair ended at unix time 1700000000, 2 mismatched region(s), 2 repaired (1 completed by this coordinator)\n"), "{}", to_text(&s));
        assert_eq!(to_json(&s)["scrub"]["repaired_regions"], 2);
        assert!(!to_text(&sample()).contains("scrub:"));
    }

    #[test]
    fn a_reshape_shows_its_progress_and_rate() {
        let r = ReshapeStatus { from_members: 2, to_members: 4, done_bytes: 1 << 30, total_bytes: 4 << 30, started: 0, rate_bytes_per_s: Some(100 << 20) };
        let s = Status { reshape: Some(r), ..sample() };
        assert!(to_text(&s).contains("reshape:  2 -> 4 members, 25% (1.00 GiB of 4.00 GiB moved), 100.00 MiB/s\n"), "{}", to_text(&s));
        let v = to_json(&s);
        assert_eq!((v["reshape"]["to_members"].clone(), v["reshape"]["rate_bytes_per_s"].clone()), (json!(4), json!(100 << 20)));
        assert_eq!(to_json(&sample())["reshape"], Value::Null);
        assert_eq!(to_json(&sample())["placement"], "near");
    }

    #[test]
    fn text_has_one_line_per_member() {
        let text = to_text(&sample());
        let expected = "\
pool:     00112233445566778899aabbccddeeff
layout:   raid10, stripe unit 512.00 KiB, 2 copies, near placement
size:     8589934592 (8.00 GiB)
events:   7
dirty:    3 regions of 4.00 MiB
members:
  nbd://a/d   in-sync
  nbd://bb/d  missing
  nbd://c/d   stale
  nbd://d/d   resyncing 25%
";
        assert_eq!(text, expected);
    }

    #[test]
    fn json_names_every_field() {
        let v = to_json(&sample());
        assert_eq!(v["layout"], "raid10");
        assert_eq!(v["stripe_unit"], 512 << 10);
        assert_eq!(v["dirty_regions"], 3);
        assert_eq!(v["members"][1]["state"], "missing");
        assert_eq!(v["members"][1]["resync"], Value::Null);
        assert_eq!(v["members"][3]["state"], "resyncing");
        assert_eq!(v["members"][3]["resync"]["total"], 4 << 20);
        let mirror = Status {
            layout: Layout::Mirror,
            stripe_unit: u64::MAX,
            ..sample()
        };
        assert_eq!(to_json(&mirror)["stripe_unit"], Value::Null);
        assert!(to_text(&mirror).contains("layout:   mirror, 2 copies\n"));
        let replacing = Status { replacing: Some(sluice_client::pool::Replacing { member: 1, uri: "nbd://n/d".into(), done: 1, total: 4 }), ..sample() };
        assert_eq!(to_json(&replacing)["replacing"]["uri"], "nbd://n/d");
        assert!(to_text(&replacing).contains("replacing: nbd://bb/d by nbd://n/d, 25% copied while it serves\n"));
        let spared = Status { spares: vec!["nbd://s/d".into()], spares_taken: 1, ..sample() };
        assert_eq!(to_json(&spared)["spares"][0], "nbd://s/d");
        assert!(to_text(&spared).ends_with("spares:   nbd://s/d\ntaken:    1 spare(s) since this coordinator started\n"));
    }

    #[test]
    fn percent_is_bounded() {
        assert_eq!(
            (
                percent(0, 0),
                percent(1, 3),
                percent(5, 4),
                percent(u64::MAX, u64::MAX)
            ),
            (0, 33, 100, 100)
        );
    }
}
