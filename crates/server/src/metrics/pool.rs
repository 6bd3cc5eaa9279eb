//! The state of pools that the server serves, as Prometheus families: each member's state
//! and resync progress, and the pool's event counter, dirty regions, resynced bytes, scrub
//! results and reshape progress.
//! Read from the pool's coordinator at scrape time.

use prometheus::proto::{self, MetricFamily, MetricType};

use sluice_client::pool::{MemberState, Status};

/// Asks a pool for its state now (`None` once it is gone).
pub type PoolProbe = Box<dyn Fn() -> Option<Status> + Send + Sync>;

/// A served pool: the export's name and how to read its state.
pub struct PoolSource {
    pub export: String,
    pub probe: PoolProbe,
}

const STATES: [&str; 4] = ["in-sync", "missing", "stale", "resyncing"];

/// The families for every pool that answers; none when no pool is served.
pub fn families(pools: &[PoolSource]) -> Vec<MetricFamily> {
    let statuses: Vec<(&str, Status)> = pools.iter().filter_map(|p| (p.probe)().map(|s| (p.export.as_str(), s))).collect();
    if statuses.is_empty() {
        return Vec::new();
    }
    let mut state = Family::new("sluice_pool_member_state", "1 for the state each pool member is in, 0 for the others.", MetricType::GAUGE);
    let mut done = Family::new("sluice_pool_member_resync_done_bytes", "Bytes copied to a resyncing member so far.", MetricType::GAUGE);
    let mut total = Family::new("sluice_pool_member_resync_total_bytes", "Bytes a resyncing member needs in all.", MetricType::GAUGE);
    let mut events = Family::new("sluice_pool_events", "The pool's event counter: it moves when a member leaves or returns.", MetricType::GAUGE);
    let mut dirty = Family::new("sluice_pool_dirty_regions", "Regions the write-intent bitmap marks dirty.", MetricType::GAUGE);
    let mut resynced = Family::new("sluice_pool_resynced_bytes_total", "Bytes copied by resync since the server started.", MetricType::COUNTER);
    let mut spares = Family::new("sluice_pool_spares", "Spares waiting to take a missing member's place.", MetricType::GAUGE);
    let mut copied = Family::new("sluice_pool_replace_copied_bytes", "Bytes copied so far to a server replacing a live member.", MetricType::GAUGE);
    let mut copy_total = Family::new("sluice_pool_replace_total_bytes", "Bytes that copy takes in all.", MetricType::GAUGE);
    let mut taken = Family::new("sluice_pool_spares_taken_total", "Spares put in a missing member's place since the server started.", MetricType::COUNTER);
    let mut scrub = scrub_families();
    let mut moved = Family::new("sluice_pool_reshape_done_bytes", "Volume bytes a reshape (pool grow) has put in their new place; 0 when none runs.", MetricType::GAUGE);
    let mut to_move = Family::new("sluice_pool_reshape_total_bytes", "Volume bytes a reshape moves in all (the old size); 0 when none runs.", MetricType::GAUGE);
    for (export, s) in &statuses {
        scrub_values(&mut scrub, export, s);
        for (i, m) in s.members.iter().enumerate() {
            let index = i.to_string();
            let member = [("export", *export), ("member", index.as_str()), ("uri", m.uri.as_str())];
            for name in STATES {
                let value = (m.state.name() == name) as u64;
                state.gauge(&[member[0], member[1], member[2], ("state", name)], value);
            }
            let (d, t) = match m.state {
                MemberState::Resyncing { done, total } => (done, total),
                _ => (0, 0),
            };
            done.gauge(&member, d);
            total.gauge(&member, t);
        }
        events.gauge(&[("export", export)], s.events);
        dirty.gauge(&[("export", export)], s.dirty_regions);
        resynced.counter(&[("export", export)], s.resynced_bytes);
        spares.gauge(&[("export", export)], s.spares.len() as u64);
        taken.counter(&[("export", export)], s.spares_taken);
        if let Some(r) = &s.replacing {
            let index = r.member.to_string();
            let labels = [("export", *export), ("member", index.as_str()), ("uri", r.uri.as_str())];
            copied.gauge(&labels, r.done);
            copy_total.gauge(&labels, r.total);
        }
        let (d, t) = s.reshape.map_or((0, 0), |r| (r.done_bytes, r.total_bytes));
        moved.gauge(&[("export", export)], d);
        to_move.gauge(&[("export", export)], t);
    }
    // A family with no series (no live replacement, say) is left out: the encoder refuses
    // one, and would stop the whole exposition there.
    let all = [state, done, total, events, dirty, resynced, spares, taken, copied, copy_total, moved, to_move].into_iter().chain(scrub);
    all.map(|f| f.0).filter(|f| !f.get_metric().is_empty()).collect()
}

/// Scrub: mismatches found by the running or last scrub, its progress, and scrubs done.
fn scrub_families() -> [Family; 4] {
    [
        Family::new("sluice_pool_scrub_mismatched_regions", "Regions in which the running or last scrub found the copies of a set to differ.", MetricType::GAUGE),
        Family::new("sluice_pool_scrub_done_bytes", "Member data bytes the running or last scrub has gone through.", MetricType::GAUGE),
        Family::new("sluice_pool_scrub_total_bytes", "Member data bytes the running or last scrub goes through in all.", MetricType::GAUGE),
        Family::new("sluice_pool_scrubs_completed_total", "Scrubs (checks and repairs) the serving coordinator completed.", MetricType::COUNTER),
    ]
}

fn scrub_values(f: &mut [Family; 4], export: &str, s: &Status) {
    let labels = [("export", export)];
    let r = s.scrub.clone().unwrap_or_default();
    f[0].gauge(&labels, r.mismatched_regions);
    f[1].gauge(&labels, r.done_bytes);
    f[2].gauge(&labels, r.total_bytes);
    f[3].counter(&labels, s.scrubs_completed);
}

/// A family built at scrape time; also used for the buffer pools' (`buffers`).
pub(super) struct Family(pub(super) MetricFamily);

impl Family {
    pub(super) fn new(name: &str, help: &str, kind: MetricType) -> Family {
        let mut f = MetricFamily::default();
        f.set_name(name.to_string());
        f.set_help(help.to_string());
        f.set_field_type(kind);
        Family(f)
    }

    fn labelled(labels: &[(&str, &str)]) -> proto::Metric {
        let pairs = labels
            .iter()
            .map(|(n, v)| {
                let mut pair = proto::LabelPair::default();
                pair.set_name(n.to_string());
                pair.set_value(v.to_string());
                pair
            })
            .collect();
        proto::Metric::from_label(pairs)
    }

    pub(super) fn gauge(&mut self, labels: &[(&str, &str)], value: u64) {
        self.gauge_f64(labels, value as f64);
    }

    pub(super) fn gauge_f64(&mut self, labels: &[(&str, &str)], value: f64) {
        let mut g = proto::Gauge::default();
        g.set_value(value);
        let mut m = Family::labelled(labels);
        m.set_gauge(g);
        self.0.mut_metric().push(m);
    }

    pub(super) fn counter(&mut self, labels: &[(&str, &str)], value: u64) {
        let mut c = proto::Counter::default();
        c.set_value(value as f64);
        let mut m = Family::labelled(labels);
        m.set_counter(c);
        self.0.mut_metric().push(m);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_client::pool::{Layout, MemberStatus};

    fn sample() -> Status {
        Status {
            pool_id: "00".repeat(16),
            layout: Layout::Mirror,
            placement: sluice_client::pool::Placement::Near,
            stripe_unit: u64::MAX,
            copies: 2,
            size: 1 << 30,
            events: 9,
            region_bytes: 4 << 20,
            dirty_regions: 3,
            resynced_bytes: 12345,
            spares: vec!["nbd://s/d".into()],
            spares_taken: 2,
            replacing: Some(sluice_client::pool::Replacing { member: 0, uri: "nbd://n/d".into(), done: 7, total: 8 }),
            owner: None,
            reshape: None,
            members: vec![
                MemberStatus { uri: "nbd://a/d".into(), state: MemberState::InSync },
                MemberStatus { uri: "nbd://b/d".into(), state: MemberState::Resyncing { done: 5, total: 10 } },
            ],
            scrub: Some(sluice_client::pool::ScrubReport { mismatched_regions: 2, done_bytes: 7, total_bytes: 8, ..Default::default() }),
            scrubs_completed: 4,
        }
    }

    #[test]
    fn a_pool_shows_each_members_state_and_progress() {
        let pools = vec![PoolSource { export: "vol".into(), probe: Box::new(|| Some(sample())) }];
        let mut out = String::new();
        prometheus::TextEncoder::new().encode_utf8(&families(&pools), &mut out).unwrap();
        assert!(out.contains(r#"sluice_pool_member_state{export="vol",member="1",uri="nbd://b/d",state="resyncing"} 1"#), "{out}");
        assert!(out.contains(r#"sluice_pool_member_state{export="vol",member="1",uri="nbd://b/d",state="in-sync"} 0"#), "{out}");
        assert!(out.contains(r#"sluice_pool_member_resync_done_bytes{export="vol",member="1",uri="nbd://b/d"} 5"#), "{out}");
        assert!(out.contains(r#"sluice_pool_events{export="vol"} 9"#), "{out}");
        assert!(out.contains(r#"sluice_pool_resynced_bytes_total{export="vol"} 12345"#), "{out}");
        assert!(out.contains(r#"sluice_pool_replace_copied_bytes{export="vol",member="0",uri="nbd://n/d"} 7"#), "{out}");
        assert!(out.contains(r#"sluice_pool_spares{export="vol"} 1"#) && out.contains(r#"sluice_pool_spares_taken_total{export="vol"} 2"#), "{out}");
        assert!(out.contains(r#"sluice_pool_scrub_mismatched_regions{export="vol"} 2"#), "{out}");
        assert!(out.contains(r#"sluice_pool_scrub_done_bytes{export="vol"} 7"#), "{out}");
        assert!(out.contains(r#"sluice_pool_scrubs_completed_total{export="vol"} 4"#), "{out}");
        assert!(out.contains(r#"sluice_pool_reshape_total_bytes{export="vol"} 0"#), "{out}");
    }

    /// No replacement runs: its families have no series and must not stop the exposition
    /// before the families after them.
    #[test]
    fn a_pool_without_a_replacement_still_shows_every_other_family() {
        let pools = vec![PoolSource { export: "vol".into(), probe: Box::new(|| Some(Status { replacing: None, ..sample() })) }];
        let mut out = String::new();
        prometheus::TextEncoder::new().encode_utf8(&families(&pools), &mut out).expect("every family has series");
        assert!(!out.contains("sluice_pool_replace_copied_bytes"), "{out}");
        assert!(out.contains(r#"sluice_pool_reshape_done_bytes{export="vol"} 0"#), "{out}");
        assert!(out.contains(r#"sluice_pool_scrubs_completed_total{export="vol"} 4"#), "{out}");
    }

    #[test]
    fn no_pool_no_families() {
        let gone = vec![PoolSource { export: "vol".into(), probe: Box::new(|| None) }];
        assert!(families(&gone).is_empty() && families(&[]).is_empty());
    }
}
