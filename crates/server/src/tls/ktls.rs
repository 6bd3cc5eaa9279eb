//! Whether the kernel offers kTLS (`setsockopt(TCP_ULP, "tls")`), which lets the kernel
//! encrypt and decrypt records so that splice and O_DIRECT stay copy-free under TLS, and
//! whether sluice is to use it (`--tls-ktls`). The kernel is asked once, without touching
//! any connection: the ULP is listed in /proc/sys/net/ipv4/tcp_available_ulp once the
//! `tls` module is loaded, and the module is loadable when it is built for the running
//! kernel. Whether a given connection gets kTLS is decided at its handoff (handoff.rs).

use std::str::FromStr;
use std::sync::OnceLock;

/// What the kernel offers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ktls {
    /// No TLS ULP: records are encrypted in user space.
    Missing,
    /// The `tls` module is loaded or can be.
    Offered,
}

/// `--tls-ktls` and the `tls-ktls` key.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum KtlsMode {
    /// Hand sessions to the kernel when it offers kTLS and takes the suite.
    #[default]
    Auto,
    /// Always encrypt in user space.
    Off,
}

impl FromStr for KtlsMode {
    type Err = String;

    fn from_str(s: &str) -> Result<KtlsMode, String> {
        match s {
            "auto" => Ok(KtlsMode::Auto),
            "off" => Ok(KtlsMode::Off),
            _ => Err(format!("unknown kTLS mode {s:?} (use auto or off)")),
        }
    }
}

/// What TLS connections get, for the log line at start.
pub fn describe(mode: KtlsMode, kernel: Ktls) -> &'static str {
    match (mode, kernel) {
        (KtlsMode::Off, _) => "user-space TLS (kTLS is turned off by --tls-ktls=off)",
        (KtlsMode::Auto, Ktls::Missing) => "user-space TLS (the kernel has no kTLS: no tls module)",
        (KtlsMode::Auto, Ktls::Offered) => {
            "kTLS where the kernel takes a session's keys (TLS 1.2 or 1.3 with AES-GCM or ChaCha20-Poly1305), \
             user-space TLS otherwise"
        }
    }
}

pub fn probe() -> Ktls {
    static PROBED: OnceLock<Ktls> = OnceLock::new();
    *PROBED.get_or_init(|| {
        let listed = std::fs::read_to_string("/proc/sys/net/ipv4/tcp_available_ulp")
            .is_ok_and(|ulps| ulps.split_whitespace().any(|u| u == "tls"));
        let loadable = std::fs::metadata("/sys/module/tls").is_ok()
            || std::fs::read_to_string("/proc/sys/kernel/osrelease").is_ok_and(|r| {
                ["tls.ko", "tls.ko.xz", "tls.ko.zst", "tls.ko.gz"]
                    .iter()
                    .any(|f| std::path::Path::new(&format!("/lib/modules/{}/kernel/net/tls/{f}", r.trim())).exists())
            });
        if listed || loadable {
            Ktls::Offered
        } else {
            Ktls::Missing
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn modes_are_auto_and_off() {
        assert_eq!("auto".parse(), Ok(KtlsMode::Auto));
        assert_eq!("off".parse(), Ok(KtlsMode::Off));
        assert!("on".parse::<KtlsMode>().unwrap_err().contains("\"on\""));
        assert_eq!(KtlsMode::default(), KtlsMode::Auto);
    }

    #[test]
    fn the_start_line_says_which_tls_connections_get() {
        assert!(describe(KtlsMode::Auto, Ktls::Offered).starts_with("kTLS where"));
        assert!(describe(KtlsMode::Auto, Ktls::Missing).starts_with("user-space TLS"));
        assert!(describe(KtlsMode::Off, Ktls::Offered).contains("--tls-ktls=off"));
    }
}
