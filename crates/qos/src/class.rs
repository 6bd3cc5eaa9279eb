//! QoS classes as the configuration writes them (`[qos.NAME]` tables) and the server-wide
//! storage limits (`[limits] storage-bps`, `storage-iops`), with the checks that refuse
//! settings that cannot mean anything.

use serde::de::{self, Deserializer, Visitor};
use serde::Deserialize;

use crate::limits::{BURST_DEFAULT_NS, BURST_MAX_NS, NANOS_PER_SEC, RATE_MAX_PER_SEC, WEIGHT_DEFAULT, WEIGHT_MAX};
use crate::request::{Applies, Dim};

/// One QoS class. Limits are per second; sizes (`bps` keys) take suffixes like `200M`
/// (binary, as everywhere in sluice). Absent keys mean no limit and no reservation.
#[derive(Clone, Debug, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Class {
    #[serde(default)]
    pub iops: Option<u64>,
    #[serde(default, deserialize_with = "size_opt")]
    pub bps: Option<u64>,
    #[serde(default)]
    pub read_iops: Option<u64>,
    #[serde(default)]
    pub write_iops: Option<u64>,
    #[serde(default, deserialize_with = "size_opt")]
    pub read_bps: Option<u64>,
    #[serde(default, deserialize_with = "size_opt")]
    pub write_bps: Option<u64>,
    /// Seconds of its limits the class may spend at once (`burst`), in nanoseconds.
    #[serde(rename = "burst", default = "burst_default", deserialize_with = "seconds_ns")]
    pub burst_ns: u64,
    #[serde(default)]
    pub reservation_iops: Option<u64>,
    #[serde(default, deserialize_with = "size_opt")]
    pub reservation_bps: Option<u64>,
    #[serde(default = "weight_default")]
    pub weight: u32,
    /// One set of buckets and one queue for every client in the class (a qemu throttle
    /// group), rather than one per client.
    #[serde(default)]
    pub shared: bool,
}

impl Default for Class {
    fn default() -> Class {
        Class {
            iops: None,
            bps: None,
            read_iops: None,
            write_iops: None,
            read_bps: None,
            write_bps: None,
            burst_ns: BURST_DEFAULT_NS,
            reservation_iops: None,
            reservation_bps: None,
            weight: WEIGHT_DEFAULT,
            shared: false,
        }
    }
}

/// What all exports together may ask of the node's storage, so its own jobs keep the rest.
/// The server builds it from its `[limits]` table; absent fields mean no cap.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct Limits {
    #[serde(default, deserialize_with = "size_opt")]
    pub storage_bps: Option<u64>,
    #[serde(default)]
    pub storage_iops: Option<u64>,
    /// Requests at the storage at once, across all classes (mClock's fixed queue depth).
    /// Without it or a rate cap, nothing is ever contended and weights and reservations
    /// have nothing to share: the device's own queue decides.
    #[serde(default)]
    pub storage_inflight: Option<u32>,
}

impl Class {
    /// The class's limits: what each counts, which requests, and its rate (None: unset).
    pub fn limits(&self) -> [(Dim, Applies, Option<u64>); 6] {
        [
            (Dim::Ops, Applies::All, self.iops),
            (Dim::Bytes, Applies::All, self.bps),
            (Dim::Ops, Applies::Reads, self.read_iops),
            (Dim::Ops, Applies::Writes, self.write_iops),
            (Dim::Bytes, Applies::Reads, self.read_bps),
            (Dim::Bytes, Applies::Writes, self.write_bps),
        ]
    }

    /// Refuses settings that cannot mean anything; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        let names = ["iops", "bps", "read-iops", "write-iops", "read-bps", "write-bps"];
        for (name, (_, _, rate)) in names.iter().zip(self.limits()) {
            check_rate(name, rate)?;
        }
        check_rate("reservation-iops", self.reservation_iops)?;
        check_rate("reservation-bps", self.reservation_bps)?;
        if self.burst_ns == 0 {
            return Err("burst must be more than 0 seconds".into());
        }
        if self.weight == 0 || self.weight > WEIGHT_MAX {
            return Err(format!("weight {} is not from 1 to {WEIGHT_MAX}", self.weight));
        }
        check_reservation("reservation-iops", self.reservation_iops, "iops", self.iops)?;
        check_reservation("reservation-bps", self.reservation_bps, "bps", self.bps)
    }
}

impl Limits {
    /// Refuses a zero or absurd cap; the message names the key.
    pub fn validate(&self) -> Result<(), String> {
        check_rate("storage-bps", self.storage_bps)?;
        check_rate("storage-iops", self.storage_iops)?;
        if self.storage_inflight == Some(0) {
            return Err("storage-inflight = 0 would start nothing; leave it out for no cap".into());
        }
        Ok(())
    }
}

fn check_rate(name: &str, rate: Option<u64>) -> Result<(), String> {
    match rate {
        Some(0) => Err(format!("{name} = 0 allows nothing; leave the key out for none")),
        Some(r) if r > RATE_MAX_PER_SEC => Err(format!("{name} = {r} is above {RATE_MAX_PER_SEC} per second")),
        _ => Ok(()),
    }
}

fn check_reservation(name: &str, reserved: Option<u64>, limit_name: &str, limit: Option<u64>) -> Result<(), String> {
    match (reserved, limit) {
        (Some(r), Some(l)) if r > l => Err(format!("{name} = {r} is above {limit_name} = {l}: a class cannot be promised more than it may use")),
        _ => Ok(()),
    }
}

fn burst_default() -> u64 {
    BURST_DEFAULT_NS
}

fn weight_default() -> u32 {
    WEIGHT_DEFAULT
}

/// A size: a number, or a string with a suffix (`"200M"`). Public for the server's
/// `[limits]` table, which holds the storage caps among its other keys.
pub fn size_opt<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
    struct Size;
    impl Visitor<'_> for Size {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a size: a number or a string such as \"200M\"")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            Ok(v)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            u64::try_from(v).map_err(|_| E::custom(format!("size {v} is negative")))
        }
        fn visit_str<E: de::Error>(self, v: &str) -> Result<u64, E> {
            sluice_proto::size::parse_size(v).map_err(E::custom)
        }
    }
    d.deserialize_any(Size).map(Some)
}

/// Seconds, whole or not, as nanoseconds; negative, not finite or above the maximum is refused.
fn seconds_ns<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    struct Seconds;
    impl Visitor<'_> for Seconds {
        type Value = u64;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            f.write_str("a number of seconds")
        }
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<u64, E> {
            self.visit_f64(v as f64)
        }
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<u64, E> {
            self.visit_f64(v as f64)
        }
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<u64, E> {
            let max = (BURST_MAX_NS / NANOS_PER_SEC) as f64;
            if !v.is_finite() || v < 0.0 {
                return Err(E::custom(format!("burst {v} is not a positive number of seconds")));
            }
            if v > max {
                return Err(E::custom(format!("burst {v} is above {max} seconds")));
            }
            Ok((v * NANOS_PER_SEC as f64).round() as u64)
        }
    }
    d.deserialize_any(Seconds)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(text: &str) -> Result<Class, String> {
        toml::from_str::<Class>(text).map_err(|e| e.to_string())
    }

    fn refused(text: &str, words: &str) {
        let class = parse(text).expect("parses");
        let err = class.validate().expect_err(text);
        assert!(err.contains(words), "{text}: {err}");
    }

    #[test]
    fn every_key_parses() {
        let text = "iops = 5000\nbps = \"200M\"\nread-iops = 4000\nwrite-iops = 1000\nread-bps = 100000000\n\
                    write-bps = \"1.5G\"\nburst = 0.5\nreservation-iops = 1000\nreservation-bps = \"50M\"\nweight = 300\nshared = true\n";
        let c = parse(text).unwrap();
        assert_eq!(c.iops, Some(5000));
        assert_eq!(c.bps, Some(200 << 20));
        assert_eq!((c.read_iops, c.write_iops), (Some(4000), Some(1000)));
        assert_eq!((c.read_bps, c.write_bps), (Some(100_000_000), Some(3 << 29)));
        assert_eq!(c.burst_ns, NANOS_PER_SEC / 2);
        assert_eq!((c.reservation_iops, c.reservation_bps), (Some(1000), Some(50 << 20)));
        assert_eq!((c.weight, c.shared), (300, true));
        c.validate().unwrap();
    }

    #[test]
    fn defaults() {
        let c = parse("").unwrap();
        assert_eq!(c, Class::default());
        assert_eq!((c.burst_ns, c.weight, c.shared), (NANOS_PER_SEC, 100, false));
        assert_eq!(parse("burst = 2").unwrap().burst_ns, 2 * NANOS_PER_SEC);
        c.validate().unwrap();
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused_when_parsed() {
        assert!(parse("iopz = 5").unwrap_err().contains("unknown field"));
        assert!(parse("bps = \"200X\"").unwrap_err().contains("suffix"));
        assert!(parse("bps = -5").unwrap_err().contains("negative"));
        assert!(parse("burst = -1").unwrap_err().contains("positive"));
        assert!(parse("burst = 100000").unwrap_err().contains("above"));
        assert!(parse("iops = \"5k\"").is_err());
    }

    #[test]
    fn every_refusal() {
        refused("iops = 0", "iops = 0 allows nothing");
        refused("write-bps = 0", "write-bps = 0");
        refused("reservation-iops = 0", "reservation-iops = 0");
        refused("bps = \"2P\"", "above");
        refused("weight = 0", "weight 0 is not from 1");
        refused("weight = 10001", "weight 10001");
        refused("burst = 0", "burst must be more than 0");
        refused("iops = 100\nreservation-iops = 200", "reservation-iops = 200 is above iops = 100");
        refused("bps = \"1M\"\nreservation-bps = \"2M\"", "reservation-bps = 2097152 is above bps = 1048576");
    }

    #[test]
    fn storage_limits() {
        let l: Limits = toml::from_str("storage-bps = \"400M\"\nstorage-iops = 20000\nstorage-inflight = 32").unwrap();
        assert_eq!(l, Limits { storage_bps: Some(400 << 20), storage_iops: Some(20000), storage_inflight: Some(32) });
        l.validate().unwrap();
        assert!(Limits { storage_iops: Some(0), ..l }.validate().unwrap_err().contains("storage-iops = 0"));
        assert!(Limits { storage_inflight: Some(0), ..l }.validate().unwrap_err().contains("storage-inflight = 0"));
        assert_eq!(toml::from_str::<Limits>("").unwrap(), Limits::default());
    }
}
