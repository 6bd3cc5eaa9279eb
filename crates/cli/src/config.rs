//! The TOML configuration file of `sluice serve --config`. Command-line options override
//! or add to what it says.

use serde::Deserialize;
use sluice_server::Limits;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct FileConfig {
    #[serde(default)]
    pub listen: Vec<String>,
    #[serde(default)]
    pub unix: Vec<String>,
    pub threads: Option<usize>,
    pub log_level: Option<String>,
    pub read_only: Option<bool>,
    /// Default data path of exports: copy, direct, splice or splice-direct.
    pub data_path: Option<String>,
    /// Read chunk size, as for --chunk.
    pub chunk: Option<String>,
    /// Address of the Prometheus metrics endpoint, as for --metrics.
    pub metrics: Option<String>,
    #[serde(default)]
    pub limits: Limits,
    #[serde(default, rename = "export")]
    pub exports: Vec<ExportEntry>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "kebab-case")]
pub struct ExportEntry {
    #[serde(default)]
    pub name: String,
    /// A path, `memory:SIZE` or `null:SIZE`, as on the command line.
    pub spec: String,
    #[serde(default)]
    pub read_only: bool,
    pub description: Option<String>,
    pub data_path: Option<String>,
}

pub fn load(path: &std::path::Path) -> Result<FileConfig, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("cannot read {}: {e}", path.display()))?;
    toml::from_str(&text).map_err(|e| format!("{}: {e}", path.display()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn full_config_parses() {
        let c: FileConfig = toml::from_str(
            r#"
            listen = ["127.0.0.1:10809"]
            unix = ["/run/sluice.sock"]
            threads = 2
            log-level = "debug"
            data-path = "copy"
            chunk = "512K"
            metrics = "127.0.0.1:9109"
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
            "#,
        )
        .unwrap();
        assert_eq!(c.exports.len(), 2);
        assert_eq!(c.exports[1].name, "");
        assert_eq!(c.limits.inflight_requests_per_connection, 16);
        assert_eq!(c.limits.connections, Limits::default().connections);
    }

    #[test]
    fn unknown_keys_are_errors() {
        assert!(toml::from_str::<FileConfig>("listne = []").is_err());
    }
}
