//! Connections the server turned away, by why: the access rules (before the handshake, or
//! every export the client asked for), or a connection limit.

use std::sync::atomic::{AtomicU64, Ordering};

use prometheus::proto::{MetricFamily, MetricType};

use super::pool::Family;

/// Why a connection was turned away; the label value is the rule or the limit's key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refused {
    /// The access rules admit this address or uid to no export: closed before the handshake.
    Access,
    /// The handshake ended without an export, after the rules refused one it asked for.
    Export,
    /// `[limits] connections` were all taken.
    Connections,
    /// `[limits] connections-per-client` were all taken by this client.
    ConnectionsPerClient,
}

impl Refused {
    const ALL: [Refused; 4] = [Refused::Access, Refused::Export, Refused::Connections, Refused::ConnectionsPerClient];

    pub fn label(self) -> &'static str {
        match self {
            Refused::Access => "access",
            Refused::Export => "export",
            Refused::Connections => "connections",
            Refused::ConnectionsPerClient => "connections-per-client",
        }
    }
}

#[derive(Default)]
pub struct Refusals([AtomicU64; Refused::ALL.len()]);

impl Refusals {
    pub fn count(&self, why: Refused) {
        self.0[why as usize].fetch_add(1, Ordering::Relaxed);
    }
}

pub fn families(refusals: &Refusals) -> Vec<MetricFamily> {
    let mut family = Family::new("sluice_connections_refused_total", "Connections turned away, by reason: the access rules or a connection limit.", MetricType::COUNTER);
    for why in Refused::ALL {
        family.counter(&[("reason", why.label())], refusals.0[why as usize].load(Ordering::Relaxed));
    }
    vec![family.0]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_reason_is_a_series_from_the_start() {
        let r = Refusals::default();
        r.count(Refused::ConnectionsPerClient);
        r.count(Refused::ConnectionsPerClient);
        let mut out = String::new();
        prometheus::TextEncoder::new().encode_utf8(&families(&r), &mut out).unwrap();
        for line in [
            "sluice_connections_refused_total{reason=\"access\"} 0",
            "sluice_connections_refused_total{reason=\"connections-per-client\"} 2",
            "# TYPE sluice_connections_refused_total counter",
        ] {
            assert!(out.lines().any(|l| l == line), "{line} missing from\n{out}");
        }
    }
}
