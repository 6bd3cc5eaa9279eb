//! Whether the kernel offers kTLS (`setsockopt(TCP_ULP, "tls")`), which would let the
//! kernel encrypt and decrypt records so that splice and O_DIRECT stay copy-free under
//! TLS. Asked once, without touching any connection: the ULP is listed in
//! /proc/sys/net/ipv4/tcp_available_ulp once the `tls` module is loaded, and the module
//! is loadable when it is built for the running kernel.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ktls {
    /// The kernel has no TLS ULP: records are encrypted in user space.
    Missing,
    /// The kernel has it; sluice does not hand it keys yet (see docs/tls.md), so records
    /// are still encrypted in user space.
    Unused,
}

impl Ktls {
    pub fn describe(self) -> &'static str {
        match self {
            Ktls::Missing => "user-space TLS (the kernel has no kTLS)",
            Ktls::Unused => "user-space TLS (the kernel offers kTLS; sluice does not use it yet)",
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
            Ktls::Unused
        } else {
            Ktls::Missing
        }
    })
}
