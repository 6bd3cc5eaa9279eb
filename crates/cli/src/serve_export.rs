//! An export as the operator describes it, before it is opened: an `[[export]]` table of
//! the configuration file or an `--export NAME=SPEC[,ro][,degraded][,data-path=PATH]
//! [,rbd-conf=FILE][,rbd-id=ID][,rbd-keyring=FILE][,qos=NAME][,description=TEXT]` option, both parsed into the same type.

use std::path::PathBuf;
use std::str::FromStr;

use serde::{de, Deserialize, Deserializer};
use sluice_server::access::{ExportRules, Rule};
use sluice_server::backend::{RbdAccess, RbdSpec};
use sluice_server::export::{DataPath, Options};
use sluice_server::Spec;

use crate::serve_access::{rule_list, some_rule_list};
use crate::serve_settings::parsed_some;

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ExportEntry {
    /// `""` is the default export.
    #[serde(default)]
    pub name: String,
    /// A path, `memory:SIZE[,elastic[,floor=SIZE]]`, `null:SIZE`, an NBD URI, `pool:FILE` or `rbd:POOL/IMAGE`.
    #[serde(deserialize_with = "spec")]
    pub spec: Spec,
    #[serde(default)]
    pub read_only: bool,
    pub description: Option<String>,
    /// This export's own data path; without one it takes the server's.
    #[serde(default, deserialize_with = "parsed_some")]
    pub data_path: Option<DataPath>,
    /// For an `rbd:` export: its Ceph configuration file, client id and keyring, over the
    /// server-wide --rbd-conf, --rbd-id and --rbd-keyring.
    pub rbd_conf: Option<PathBuf>,
    pub rbd_id: Option<String>,
    pub rbd_keyring: Option<PathBuf>,
    /// For a `pool:` export: assemble it even with members missing.
    #[serde(default)]
    pub degraded: bool,
    /// Who may open this export, replacing the server's `allow` (serve_access.rs).
    #[serde(default, deserialize_with = "some_rule_list")]
    pub allow: Option<Vec<Rule>>,
    /// Who may not, replacing the server's `deny`.
    #[serde(default, deserialize_with = "some_rule_list")]
    pub deny: Option<Vec<Rule>>,
    /// Clients served this export read-only.
    #[serde(default, deserialize_with = "rule_list")]
    pub read_only_for: Vec<Rule>,
    /// The QoS class of this export's connections (`[qos.NAME]`).
    pub qos: Option<String>,
}

impl ExportEntry {
    /// An export with nothing but a name and a spec (PATH, and the default RAM export).
    pub fn plain(name: &str, spec: Spec) -> ExportEntry {
        ExportEntry {
            name: name.to_owned(),
            spec,
            read_only: false,
            description: None,
            data_path: None,
            rbd_conf: None,
            rbd_id: None,
            rbd_keyring: None,
            degraded: false,
            allow: None,
            deny: None,
            read_only_for: Vec::new(),
            qos: None,
        }
    }

    /// The spec to open: an RBD image's access settings are this entry's, then `defaults`.
    /// Access settings on any other kind of export are an error, as is `degraded` on
    /// anything but a pool.
    pub fn spec(&self, defaults: &RbdAccess) -> Result<Spec, String> {
        if self.degraded && !matches!(&self.spec, Spec::Remote(s) if s.starts_with("pool:")) {
            return Err(format!("export {:?}: degraded applies to pool: exports only", self.name));
        }
        let own = RbdAccess { conf: self.rbd_conf.clone(), id: self.rbd_id.clone(), keyring: self.rbd_keyring.clone() };
        match &self.spec {
            Spec::Rbd(r) => Ok(Spec::Rbd(RbdSpec { access: own.or(defaults), ..r.clone() })),
            _ if !own.is_empty() => Err(format!("export {:?}: rbd-conf, rbd-id and rbd-keyring apply to rbd: exports only", self.name)),
            spec => Ok(spec.clone()),
        }
    }

    /// This export's own access rules.
    pub fn rules(&self) -> ExportRules {
        ExportRules { allow: self.allow.clone(), deny: self.deny.clone(), read_only_for: self.read_only_for.clone() }
    }

    /// This export's options: its own choices over the server-wide `defaults`.
    pub fn options(&self, defaults: &Options) -> Options {
        Options {
            read_only: defaults.read_only || self.read_only,
            description: self.description.clone(),
            data_path: self.data_path.unwrap_or(defaults.data_path),
            chunking: defaults.chunking,
            degraded: self.degraded || (defaults.degraded && matches!(&self.spec, Spec::Remote(s) if s.starts_with("pool:"))),
        }
    }
}

fn spec<'de, D: Deserializer<'de>>(d: D) -> Result<Spec, D::Error> {
    let text = String::deserialize(d)?;
    Spec::parse(&text).map_err(de::Error::custom)
}

/// `NAME=SPEC[,OPTION]...[,description=TEXT]`: NAME is everything before the
/// first `=`; `description=` comes last so that TEXT may hold commas.
impl FromStr for ExportEntry {
    type Err = String;

    fn from_str(s: &str) -> Result<ExportEntry, String> {
        let Some((name, rest)) = s.split_once('=') else {
            return Err("expected NAME=SPEC".into());
        };
        let (body, description) = match rest.split_once(",description=") {
            Some((b, d)) => (b, Some(d.to_owned())),
            None => (rest, None),
        };
        let mut parts = body.split(',');
        let spec = Spec::parse(parts.next().unwrap_or_default()).map_err(|e| e.to_string())?;
        let mut entry = ExportEntry { description, ..ExportEntry::plain(name, spec) };
        for option in parts {
            if entry.spec.take_option(option).map_err(|e| e.to_string())? {
                continue;
            }
            match option {
                "ro" | "read-only" => entry.read_only = true,
                "degraded" => entry.degraded = true,
                "" => {}
                other => match other.split_once('=') {
                    Some(("data-path", p)) => entry.data_path = Some(p.parse::<DataPath>().map_err(|e| e.to_string())?),
                    Some(("rbd-conf", p)) if !p.is_empty() => entry.rbd_conf = Some(PathBuf::from(p)),
                    Some(("rbd-id", id)) if !id.is_empty() => entry.rbd_id = Some(id.to_owned()),
                    Some(("rbd-keyring", p)) if !p.is_empty() => entry.rbd_keyring = Some(PathBuf::from(p)),
                    Some(("qos", class)) if !class.is_empty() => entry.qos = Some(class.to_owned()),
                    _ => {
                        let known = "ro, degraded, data-path=, rbd-conf=, rbd-id=, rbd-keyring=, qos=, description=; for memory: elastic, floor=";
                        return Err(format!("unknown or empty option {other:?} (known: {known})"));
                    }
                },
            }
        }
        entry.spec.check_options().map_err(|e| e.to_string())?;
        Ok(entry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_server::export::Chunking;

    #[test]
    fn export_options_parse() {
        let e: ExportEntry = "vm=/dev/vdb,ro,data-path=direct,description=a, b".parse().unwrap();
        assert_eq!((e.name.as_str(), e.read_only, e.description.as_deref()), ("vm", true, Some("a, b")));
        assert_eq!(e.data_path, Some(DataPath::Direct));
        assert_eq!(e.spec, Spec::Path("/dev/vdb".into()));
        assert!("novalue".parse::<ExportEntry>().is_err());
        assert!("x=memory:1G,rw".parse::<ExportEntry>().is_err());
        assert!("x=memory:1G,data-path=fast".parse::<ExportEntry>().unwrap_err().contains("\"fast\""));
        assert!("x=memory:12Q".parse::<ExportEntry>().unwrap_err().contains("\"12Q\""));
        assert_eq!("x=memory:1M,qos=gold".parse::<ExportEntry>().unwrap().qos.as_deref(), Some("gold"));
        assert!("x=memory:1M,qos=".parse::<ExportEntry>().unwrap_err().contains("qos="));
        let elastic: ExportEntry = "x=memory:64M,elastic,ro,floor=8M".parse().unwrap();
        assert_eq!(elastic.spec, Spec::parse("memory:64M,elastic,floor=8M").unwrap());
        assert!(elastic.read_only);
        assert!("x=/dev/vdb,elastic".parse::<ExportEntry>().unwrap_err().contains("unknown or empty option \"elastic\""));
        assert!("x=memory:1M,floor=1K".parse::<ExportEntry>().unwrap_err().contains("elastic RAM exports only"));
        let any_order: ExportEntry = "x=memory:64M,floor=8M,ro,elastic".parse().unwrap();
        assert_eq!(any_order.spec, elastic.spec, "a RAM export's options in any order, among the export's");
    }

    #[test]
    fn degraded_is_for_pools_only() {
        let defaults = Options { degraded: true, ..Options::default() };
        let pool: ExportEntry = "vol=pool:/etc/sluice/vol.toml,degraded".parse().unwrap();
        assert!(pool.degraded && pool.spec(&RbdAccess::default()).is_ok() && pool.options(&Options::default()).degraded);
        let plain: ExportEntry = "vol=pool:/etc/sluice/vol.toml".parse().unwrap();
        assert!(plain.options(&defaults).degraded, "--degraded reaches every pool export");
        let file: ExportEntry = "disk=/dev/vdb".parse().unwrap();
        assert!(!file.options(&defaults).degraded, "--degraded does not touch other exports");
        let bad: ExportEntry = "disk=/dev/vdb,degraded".parse().unwrap();
        assert!(bad.spec(&RbdAccess::default()).unwrap_err().contains("pool: exports only"));
    }

    #[test]
    fn rbd_options_ride_with_the_spec_over_the_server_wide_ones() {
        let e: ExportEntry = "vm=rbd:rbd/vm1,ro,rbd-id=vm,rbd-keyring=/k".parse().unwrap();
        let defaults = RbdAccess { conf: Some("/etc/ceph/c.conf".into()), id: Some("admin".into()), keyring: None };
        let Spec::Rbd(r) = e.spec(&defaults).unwrap() else { panic!("not an rbd spec") };
        assert_eq!((r.access.conf, r.access.id.as_deref(), r.access.keyring), (Some("/etc/ceph/c.conf".into()), Some("vm"), Some("/k".into())));
        assert!(e.read_only);
        assert!("vm=rbd:rbd/vm1,rbd-id=".parse::<ExportEntry>().unwrap_err().contains("rbd-id="));
        let file: ExportEntry = "f=/dev/vdb,rbd-conf=/c".parse().unwrap();
        assert!(file.spec(&RbdAccess::default()).unwrap_err().contains("rbd: exports only"));
    }

    #[test]
    fn an_exports_own_choices_win_over_the_defaults() {
        let defaults = Options { read_only: false, description: None, data_path: DataPath::Splice, chunking: Chunking::Fixed(4096), degraded: false };
        let own: ExportEntry = "a=memory:1M,ro,data-path=copy".parse().unwrap();
        let o = own.options(&defaults);
        assert_eq!((o.read_only, o.data_path, o.chunking), (true, DataPath::Copy, Chunking::Fixed(4096)));
        let o = ExportEntry::plain("b", Spec::Memory(sluice_server::backend::MemorySpec::plain(1 << 20))).options(&Options { read_only: true, ..defaults });
        assert_eq!((o.read_only, o.data_path), (true, DataPath::Splice));
    }
}
