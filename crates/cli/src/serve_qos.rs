//! Load restriction as the operator writes it (issue 27): `[qos.NAME]` classes, `qos =
//! "NAME"` in an `[[export]]` (`qos=NAME` after an --export spec), and `[[qos-match]]`
//! rules that put clients in classes by the access rules' forms (an address or CIDR,
//! uid:/gid:, psk:, x509:, x509-cn:). The storage caps are keys of `[limits]`.

use std::collections::BTreeMap;

use serde::{de, Deserialize, Deserializer};
use sluice_qos::Class;
use sluice_server::access::Rule;
use sluice_server::qos::{QosConfig, QosMatch};
use sluice_server::Limits;

use crate::serve_export::ExportEntry;

/// One `[[qos-match]]` table.
#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchEntry {
    /// Who: an access rule (`10.1.0.0/16`, `psk:node7`, `x509-cn:db`...).
    #[serde(deserialize_with = "rule")]
    pub client: Rule,
    pub class: String,
}

fn rule<'de, D: Deserializer<'de>>(d: D) -> Result<Rule, D::Error> {
    String::deserialize(d)?.parse::<Rule>().map_err(de::Error::custom)
}

/// The classes, the exports' choices and the rules, checked against each other and the
/// storage caps: a class name nothing defines is refused, as is a class that cannot mean
/// anything.
pub fn config(classes: &BTreeMap<String, Class>, matches: &[MatchEntry], exports: &[ExportEntry], limits: &Limits) -> Result<QosConfig, String> {
    let config = QosConfig {
        classes: classes.clone(),
        exports: exports.iter().filter_map(|e| Some((e.name.clone(), e.qos.clone()?))).collect(),
        matches: matches.iter().map(|m| QosMatch { rule: m.client.clone(), class: m.class.clone() }).collect(),
    };
    config.check(limits)?;
    Ok(config)
}

/// A `[[qos-match]]` rule of a TLS form (psk:, x509:, x509-cn:) on a server without TLS
/// matches no one.
pub fn doubts(config: &QosConfig, tls: bool) -> Vec<String> {
    match config.matches.iter().find(|m| !m.rule.is_for_connections()) {
        Some(m) if !tls => vec![format!("qos-match {} can match no one: TLS is off (see --tls)", m.rule)],
        _ => Vec::new(),
    }
}

/// What `--check` says of load restriction.
pub fn describe(config: &QosConfig, limits: &Limits) -> Vec<String> {
    if !config.is_on(limits) {
        return Vec::new();
    }
    let mut lines: Vec<String> = config.classes.keys().map(|name| format!("qos: class {name}")).collect();
    let mut exports: Vec<_> = config.exports.iter().collect();
    exports.sort();
    lines.extend(exports.into_iter().map(|(e, c)| format!("qos: export {e:?} in class {c}")));
    lines.extend(config.matches.iter().map(|m| format!("qos: clients matching {} in class {}", m.rule, m.class)));
    let caps = limits.storage();
    let caps = [("storage-bps", caps.storage_bps), ("storage-iops", caps.storage_iops), ("storage-inflight", caps.storage_inflight.map(u64::from))];
    lines.extend(caps.iter().filter_map(|(k, v)| v.map(|v| format!("qos: {k} = {v}"))));
    lines
}
