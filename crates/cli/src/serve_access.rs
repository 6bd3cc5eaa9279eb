//! The access rules of `sluice serve` as the operator writes them: `allow` and `deny` at
//! the top of the configuration file and in each `[[export]]`, `read-only-for` in an
//! export, and `--allow`/`--deny` on the command line (added to the file's top-level lists).
//! Each rule is parsed where it is read, so a bad one names its key and its text.

use serde::{de, Deserialize, Deserializer};
use sluice_server::access::{Access, ExportRules, Policy, Rule};

/// A list of rules as TOML gives it: every string parsed, the first bad one reported with
/// its place in the list.
pub fn rule_list<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<Rule>, D::Error> {
    let texts = Vec::<String>::deserialize(d)?;
    texts
        .iter()
        .enumerate()
        .map(|(i, t)| t.parse::<Rule>().map_err(|e| de::Error::custom(format!("[{i}]: {e}"))))
        .collect()
}

/// `rule_list` for a key whose absence means something (no allow list: everyone).
pub fn some_rule_list<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Vec<Rule>>, D::Error> {
    rule_list(d).map(Some)
}

/// The server's rules: the file's top-level lists with the command line's added, and each
/// export's own (by name).
pub fn access(file_allow: Option<&[Rule]>, file_deny: &[Rule], cli_allow: &[Rule], cli_deny: &[Rule], exports: Vec<(String, ExportRules)>) -> Access {
    let allow = match (file_allow, cli_allow) {
        (None, []) => None,
        (file, cli) => Some(file.unwrap_or_default().iter().chain(cli).cloned().collect()),
    };
    let deny = file_deny.iter().chain(cli_deny).cloned().collect();
    let exports = exports.into_iter().filter(|(_, rules)| *rules != ExportRules::default()).collect();
    Access { server: Policy { allow, deny }, exports }
}

/// What in the rules cannot be what the operator meant: TLS rules on a server without TLS
/// match no one.
pub fn doubts(access: &Access, tls: bool) -> Vec<String> {
    let mut all = access.server.allow.iter().flatten().chain(&access.server.deny);
    let mut all_exports = access.exports.values().flat_map(|e| e.allow.iter().flatten().chain(e.deny.iter().flatten()).chain(&e.read_only_for));
    let tls_rule = |r: &&Rule| !r.is_for_connections();
    match all.find(tls_rule).or_else(|| all_exports.find(tls_rule)) {
        Some(r) if !tls => vec![format!("access rule {r} can match no one: TLS is off (see --tls)")],
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(texts: &[&str]) -> Vec<Rule> {
        texts.iter().map(|t| t.parse().unwrap()).collect()
    }

    #[test]
    fn the_command_line_adds_to_the_files_lists() {
        let a = access(None, &[], &[], &[], Vec::new());
        assert!(a.is_open(), "no rules anywhere: open");
        let a = access(Some(&rules(&["10.0.0.0/8"])), &rules(&["10.9.0.0/16"]), &rules(&["::1"]), &rules(&["uid:1000"]), Vec::new());
        assert_eq!(a.server.allow, Some(rules(&["10.0.0.0/8", "::1"])));
        assert_eq!(a.server.deny, rules(&["10.9.0.0/16", "uid:1000"]));
        let a = access(None, &[], &rules(&["::1"]), &[], Vec::new());
        assert_eq!(a.server.allow, Some(rules(&["::1"])), "--allow alone makes an allow list");
    }

    #[test]
    fn exports_without_rules_are_left_out() {
        let vm7 = ExportRules { read_only_for: rules(&["10.2.0.0/16"]), ..ExportRules::default() };
        let a = access(None, &[], &[], &[], vec![("vm7".into(), vm7), ("scratch".into(), ExportRules::default())]);
        assert_eq!(a.exports.keys().collect::<Vec<_>>(), ["vm7"]);
        assert_eq!(a.exports["vm7"].read_only_for, rules(&["10.2.0.0/16"]));
    }
}
