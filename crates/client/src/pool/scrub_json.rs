//! Scrub reports as JSON: what `sluice pool check --json` prints, `pool status --json`
//! embeds, and a coordinator's control socket sends (docs/pool.md has the schema).

use sluice_pool::coordinator::{ScrubRange, ScrubReport};
use serde_json::{json, Value};

pub fn report_to_json(r: &ScrubReport) -> Value {
    let ranges: Vec<Value> = r.ranges.iter().map(|g| json!({"set": g.set, "start": g.start, "end": g.end})).collect();
    json!({
        "kind": if r.repair { "repair" } else { "check" },
        "running": r.running,
        "done_bytes": r.done_bytes,
        "total_bytes": r.total_bytes,
        "skipped_bytes": r.skipped_bytes,
        "mismatched_regions": r.mismatched_regions,
        "repaired_regions": r.repaired_regions,
        "ranges": ranges,
        "ranges_truncated": r.ranges_truncated,
        "finished_unix_ms": r.finished_wall_ms,
        "error": r.error,
    })
}

/// The report in `v`; None when it is not one.
pub fn report_from_json(v: &Value) -> Option<ScrubReport> {
    let n = |k: &str| v.get(k)?.as_u64();
    let repair = match v.get("kind")?.as_str()? {
        "check" => false,
        "repair" => true,
        _ => return None,
    };
    let ranges = v.get("ranges")?.as_array()?.iter().map(|g| {
        let set = usize::try_from(g.get("set")?.as_u64()?).ok()?;
        let (start, end) = (g.get("start")?.as_u64()?, g.get("end")?.as_u64()?);
        (start < end).then_some(ScrubRange { set, start, end })
    });
    Some(ScrubReport {
        repair,
        running: v.get("running")?.as_bool()?,
        done_bytes: n("done_bytes")?,
        total_bytes: n("total_bytes")?,
        skipped_bytes: n("skipped_bytes")?,
        mismatched_regions: n("mismatched_regions")?,
        repaired_regions: n("repaired_regions")?,
        ranges: ranges.collect::<Option<Vec<_>>>()?,
        ranges_truncated: v.get("ranges_truncated")?.as_bool()?,
        finished_wall_ms: v.get("finished_unix_ms").and_then(Value::as_u64),
        error: v.get("error").and_then(Value::as_str).map(str::to_owned),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_round_trip_and_junk_is_none() {
        let r = ScrubReport {
            repair: true,
            done_bytes: 5,
            total_bytes: 9,
            mismatched_regions: 1,
            repaired_regions: 1,
            ranges: vec![ScrubRange { set: 1, start: 10, end: 11 }],
            finished_wall_ms: Some(77),
            error: Some("cut".into()),
            ..ScrubReport::default()
        };
        assert_eq!(report_from_json(&report_to_json(&r)), Some(r));
        assert_eq!(report_from_json(&json!({"kind": "check"})), None);
        let mut bad = report_to_json(&ScrubReport::default());
        bad["ranges"] = json!([{"set": 0, "start": 5, "end": 5}]);
        assert_eq!(report_from_json(&bad), None);
    }
}
