//! The TOML configuration file of `sluice serve --config`, typed as it is read: every value
//! is parsed and checked here, and an error names the file, the key and the bad value.
//! Command-line options override or add to what it says.

use std::collections::BTreeMap;
use std::num::NonZeroUsize;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use sluice_qos::Class;
use sluice_server::access::Rule;
use sluice_server::export::DataPath;
use sluice_server::Limits;

use crate::serve_access::{rule_list, some_rule_list};
use crate::serve_export::ExportEntry;
use crate::serve_qos::MatchEntry;
use crate::serve_settings::{parsed_some, ChunkChoice, KtlsChoice, ListenAddr, LogLevel, TlsChoice};

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    #[serde(default)]
    pub listen: Vec<ListenAddr>,
    #[serde(default)]
    pub unix: Vec<PathBuf>,
    pub threads: Option<NonZeroUsize>,
    /// As for --pin-threads.
    pub pin_threads: Option<bool>,
    /// Microseconds, as for --busy-poll.
    pub busy_poll: Option<u64>,
    pub log_level: Option<LogLevel>,
    pub read_only: Option<bool>,
    /// Default data path of exports, as for --data-path.
    #[serde(default, deserialize_with = "parsed_some")]
    pub data_path: Option<DataPath>,
    /// How reads are split into chunks, as for --chunk.
    pub chunk: Option<ChunkChoice>,
    /// Address of the Prometheus metrics endpoint, as for --metrics.
    pub metrics: Option<ListenAddr>,
    /// TLS, as for --tls, --tls-certificates, --tls-psk, --tls-verify-peer and --tls-ktls.
    pub tls: Option<TlsChoice>,
    pub tls_certificates: Option<PathBuf>,
    pub tls_psk: Option<PathBuf>,
    pub tls_verify_peer: Option<bool>,
    pub tls_ktls: Option<KtlsChoice>,
    /// Ceph access for rbd: exports, as for --rbd-conf, --rbd-id and --rbd-keyring.
    pub rbd_conf: Option<PathBuf>,
    pub rbd_id: Option<String>,
    pub rbd_keyring: Option<PathBuf>,
    /// Who may connect and open exports (an export's own lists replace these for it).
    #[serde(default, deserialize_with = "some_rule_list")]
    pub allow: Option<Vec<Rule>>,
    #[serde(default, deserialize_with = "rule_list")]
    pub deny: Vec<Rule>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportEntry>,
    /// Load restriction classes, `[qos.NAME]` (serve_qos.rs).
    #[serde(default)]
    pub qos: BTreeMap<String, Class>,
    /// Clients put in classes, `[[qos-match]]`.
    #[serde(default)]
    pub qos_match: Vec<MatchEntry>,
}

pub fn load(path: &Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// A value that does not parse is reported as `KEY: message` (`export[1].data-path: ...`);
/// TOML that does not parse keeps toml's report, which shows the line.
fn parse(text: &str) -> Result<FileConfig, String> {
    let document = toml::Deserializer::parse(text).map_err(|e| e.to_string())?;
    serde_path_to_error::deserialize(document).map_err(|e| {
        let key = e.path().to_string();
        let error = e.into_inner();
        match key.as_str() {
            "" | "." => error.to_string(),
            _ => format!("{key}: {}", error.message()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_server::export::Chunking;
    use sluice_server::Spec;

    #[test]
    fn full_config_parses() {
        let c = parse(
            r#"
            listen = ["127.0.0.1:10809"]
            unix = ["/run/sluice.sock"]
            threads = 2
            log-level = "debug"
            data-path = "copy"
            chunk = "512K"
            metrics = "127.0.0.1:9109"
            tls = "require"
            tls-certificates = "/etc/sluice/pki"
            tls-psk = "/etc/sluice/keys.psk"
            tls-verify-peer = true
            tls-ktls = "off"
            [limits]
            inflight-requests-per-connection = 16
            [[export]]
            name = "disk"
            spec = "/dev/vdb"
            read-only = true
            description = "the data disk"
            data-path = "direct"
            [[export]]
            spec = "memory:1G"
            [[export]]
            name = "cache"
            spec = "memory:1G,elastic,floor=64M"
            "#,
        )
        .unwrap();
        assert_eq!(c.listen, vec!["127.0.0.1:10809".parse().unwrap()]);
        assert_eq!((c.data_path, c.chunk, c.log_level), (Some(DataPath::Copy), Some(ChunkChoice(Chunking::Fixed(512 << 10))), "debug".parse().ok()));
        assert_eq!(c.metrics.map(|m| m.first()), Some("127.0.0.1:9109".parse().unwrap()));
        assert_eq!(c.exports.len(), 3);
        let elastic = sluice_server::backend::MemorySpec { elastic: true, floor_bytes: 64 << 20, ..sluice_server::backend::MemorySpec::plain(1 << 30) };
        assert_eq!(c.exports[2].spec, Spec::Memory(elastic));
        assert_eq!((c.exports[0].data_path, &c.exports[0].spec), (Some(DataPath::Direct), &Spec::Path("/dev/vdb".into())));
        assert_eq!((c.exports[1].name.as_str(), &c.exports[1].spec), ("", &Spec::Memory(sluice_server::backend::MemorySpec::plain(1 << 30))));
        assert_eq!(c.limits.inflight_requests_per_connection, 16);
        assert_eq!(c.limits.connections, Limits::default().connections);
        assert_eq!(c.tls, Some(TlsChoice(sluice_proto::TlsMode::Require)));
        assert_eq!(c.tls_certificates, Some(PathBuf::from("/etc/sluice/pki")));
        assert_eq!((c.tls_psk, c.tls_verify_peer), (Some(PathBuf::from("/etc/sluice/keys.psk")), Some(true)));
        assert_eq!(c.tls_ktls, Some(KtlsChoice(sluice_server::tls::KtlsMode::Off)));
    }

    #[test]
    fn tls_ktls_is_auto_or_off() {
        assert_eq!(parse("").unwrap().tls_ktls, None, "absent: the default (auto) applies");
        let e = parse("tls-ktls = \"on\"").unwrap_err();
        assert!(e.contains("tls-ktls") && e.contains("\"on\""), "{e}");
    }

    #[test]
    fn rbd_access_keys_parse_at_the_top_and_per_export() {
        let c = parse("rbd-conf = \"/etc/ceph/c.conf\"\nrbd-id = \"sluice\"\n[[export]]\nspec = \"rbd:rbd/vm@s\"\nrbd-keyring = \"/k\"\n").unwrap();
        assert_eq!((c.rbd_conf, c.rbd_id.as_deref(), c.rbd_keyring), (Some(PathBuf::from("/etc/ceph/c.conf")), Some("sluice"), None));
        let e = &c.exports[0];
        assert_eq!((e.rbd_keyring.as_deref(), e.rbd_id.as_deref()), (Some(std::path::Path::new("/k")), None));
        assert!(matches!(&e.spec, Spec::Rbd(r) if r.snapshot.as_deref() == Some("s")));
        assert!(parse("[[export]]\nspec = \"rbd:pool\"").unwrap_err().contains("export[0].spec"), "a bad rbd spec names its key");
    }

    #[test]
    fn chunk_is_auto_zero_or_a_size() {
        assert_eq!(parse("chunk = \"auto\"").unwrap().chunk, Some(ChunkChoice(Chunking::Auto)));
        assert_eq!(parse("chunk = \"0\"").unwrap().chunk, Some(ChunkChoice(Chunking::Off)));
        assert_eq!(parse("").unwrap().chunk, None, "absent: the default (auto) applies");
    }

    #[test]
    fn qos_tables_parse_and_name_their_keys() {
        let c = parse("[qos.gold]\niops = 100\nbps = \"1M\"\n[[qos-match]]\nclient = \"10.0.0.0/8\"\nclass = \"gold\"\n[limits]\nstorage-bps = \"2M\"\n[[export]]\nspec = \"memory:1M\"\nqos = \"gold\"").unwrap();
        assert_eq!((c.qos["gold"].iops, c.qos["gold"].bps), (Some(100), Some(1 << 20)));
        assert_eq!((c.qos_match[0].class.as_str(), c.qos_match[0].client.to_string()), ("gold", "10.0.0.0/8".to_owned()));
        assert_eq!((c.limits.storage_bps, c.exports[0].qos.as_deref()), (Some(2 << 20), Some("gold")));
        assert!(parse("[qos.gold]\nburst = -1").unwrap_err().starts_with("qos.gold.burst: "));
        assert!(parse("[[qos-match]]\nclient = \"nowhere\"\nclass = \"a\"").unwrap_err().starts_with("qos-match[0].client: "));
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(parse("listne = []").unwrap_err().contains("listne"));
    }

    #[test]
    fn bad_values_name_the_key_and_the_value() {
        for (text, error) in [
            ("chunk = \"12Q\"", "chunk: size \"12Q\" is not a number with an optional K/M/G/T/P suffix (or auto)"),
            ("chunk = \"64M\"", "chunk: chunk size \"64M\" is more than"),
            ("data-path = \"fast\"", "data-path: unknown data path \"fast\""),
            ("log-level = \"loud\"", "log-level: unknown log level \"loud\""),
            ("metrics = \"nowhere\"", "metrics: address \"nowhere\" is not ADDR:PORT"),
            ("listen = [\"127.0.0.1:1\", \"x\"]", "listen[1]: address \"x\" is not ADDR:PORT"),
            ("threads = 0", "threads: "),
            ("tls = \"maybe\"", "tls: unknown TLS mode \"maybe\""),
            ("[[export]]\nspec = \"memory:1G\"\n[[export]]\nspec = \"null:lots\"", "export[1].spec: size \"lots\""),
            ("[[export]]\nspec = \"memory:1G,elastic,sometimes\"", "export[0].spec: memory:1G,elastic,sometimes: unknown option \"sometimes\""),
            ("[[export]]\nspec = \"m\"\ndata-path = \"zero-copy\"", "export[0].data-path: unknown data path \"zero-copy\""),
        ] {
            let e = parse(text).unwrap_err();
            assert!(e.starts_with(error), "{text:?}: {e}");
        }
    }

    #[test]
    fn bad_toml_keeps_the_line() {
        assert!(parse("chunk = ").unwrap_err().contains("line 1"));
    }
}
