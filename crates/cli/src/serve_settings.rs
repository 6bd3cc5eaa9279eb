//! The settings `sluice serve` takes both as a command-line option and as a key of the
//! configuration file, as types that are parsed and checked once, where they are read:
//! clap parses the options through `FromStr`, serde the keys through the same `FromStr`.
//! Each error names the value; clap adds the option, config.rs the key.

use std::fmt::Display;
use std::net::{SocketAddr, ToSocketAddrs};
use std::num::NonZeroUsize;
use std::str::FromStr;

use log::LevelFilter;
use serde::{de, Deserialize, Deserializer};
use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;
use sluice_proto::TlsMode;
use sluice_server::export::{parse_size, Chunking};
use sluice_server::limits::BUSY_POLL_MAX_US;
use sluice_server::tls::KtlsMode;

/// Deserializes a string through `T::from_str`, so that a key and the option that mirrors
/// it accept the same text and say the same thing about bad text.
fn parsed<'de, D, T>(d: D) -> Result<T, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: Display,
{
    let text = String::deserialize(d)?;
    text.parse().map_err(de::Error::custom)
}

/// `parsed` for an optional key (with `#[serde(default)]`, which covers its absence).
pub fn parsed_some<'de, D, T>(d: D) -> Result<Option<T>, D::Error>
where
    D: Deserializer<'de>,
    T: FromStr,
    T::Err: Display,
{
    parsed(d).map(Some)
}

/// Implements `Deserialize` through `FromStr` for a settings type.
macro_rules! deserialize_from_str {
    ($type:ty) => {
        impl<'de> Deserialize<'de> for $type {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$type, D::Error> {
                parsed(d)
            }
        }
    };
}

/// How reads are split into chunks sent as each is read (`--chunk`, `chunk`): `auto` (the
/// default: chunk size and window from the measured storage and network rates), a SIZE
/// (reads longer than SIZE are split into SIZE chunks, all read at once), or 0 (a read is
/// sent only once all of it is read).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChunkChoice(pub Chunking);

impl FromStr for ChunkChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<ChunkChoice, String> {
        if s == "auto" {
            return Ok(ChunkChoice(Chunking::Auto));
        }
        let bytes = parse_size(s).map_err(|e| format!("{e} (or auto)"))?;
        // Each chunk is one piece of one reply, so it can be no larger than a request.
        if bytes > REQUEST_PAYLOAD_MAX_BYTES as u64 {
            return Err(format!("chunk size {s:?} is more than {REQUEST_PAYLOAD_MAX_BYTES} bytes (the largest request)"));
        }
        Ok(ChunkChoice(if bytes == 0 { Chunking::Off } else { Chunking::Fixed(bytes as u32) }))
    }
}

deserialize_from_str!(ChunkChoice);

/// A TCP address to listen on (`--listen`, `listen`, `--metrics`, `metrics`): ADDR:PORT,
/// or HOST:PORT standing for every address the host name resolves to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ListenAddr(pub Vec<SocketAddr>);

impl ListenAddr {
    /// The one address an endpoint that binds once (the metrics endpoint) uses.
    pub fn first(&self) -> SocketAddr {
        self.0[0]
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<ListenAddr, String> {
        let addrs: Vec<SocketAddr> = s
            .to_socket_addrs()
            .map_err(|e| format!("address {s:?} is not ADDR:PORT such as 127.0.0.1:10809 or [::1]:10809 ({e})"))?
            .collect();
        if addrs.is_empty() {
            return Err(format!("address {s:?} resolves to no address"));
        }
        Ok(ListenAddr(addrs))
    }
}

deserialize_from_str!(ListenAddr);

/// How much sluice logs (`--log-level`, `log-level`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogLevel(pub LevelFilter);

impl Default for LogLevel {
    fn default() -> LogLevel {
        LogLevel(LevelFilter::Info)
    }
}

impl FromStr for LogLevel {
    type Err = String;

    fn from_str(s: &str) -> Result<LogLevel, String> {
        s.parse().map(LogLevel).map_err(|_| format!("unknown log level {s:?} (use error, warn, info, debug or trace)"))
    }
}

deserialize_from_str!(LogLevel);

/// Whether the server offers TLS (`--tls`, `tls`): off, on (offered, plaintext still
/// served) or require.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TlsChoice(pub TlsMode);

impl FromStr for TlsChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<TlsChoice, String> {
        match s {
            "off" => Ok(TlsChoice(TlsMode::Off)),
            "on" => Ok(TlsChoice(TlsMode::On)),
            "require" => Ok(TlsChoice(TlsMode::Require)),
            _ => Err(format!("unknown TLS mode {s:?} (use off, on or require)")),
        }
    }
}

deserialize_from_str!(TlsChoice);

/// Whether TLS sessions are handed to the kernel (`--tls-ktls`, `tls-ktls`): auto or off.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KtlsChoice(pub KtlsMode);

impl FromStr for KtlsChoice {
    type Err = String;

    fn from_str(s: &str) -> Result<KtlsChoice, String> {
        s.parse().map(KtlsChoice)
    }
}

deserialize_from_str!(KtlsChoice);

/// `--threads N`: at least one worker, as the `threads` key's `NonZeroUsize` requires.
pub fn parse_threads(s: &str) -> Result<NonZeroUsize, String> {
    match s.parse::<usize>() {
        Ok(n) => NonZeroUsize::new(n).ok_or_else(|| "there must be at least 1 thread".to_owned()),
        Err(_) => Err(format!("{s:?} is not a number of threads")),
    }
}

/// `--busy-poll USEC` and the `busy-poll` key: microseconds a worker spins before it
/// sleeps, from 0 (never) to the server's maximum.
pub fn parse_busy_poll(s: &str) -> Result<u64, String> {
    let us = s.parse::<u64>().map_err(|_| format!("{s:?} is not a number of microseconds"))?;
    check_busy_poll(us)
}

pub fn check_busy_poll(us: u64) -> Result<u64, String> {
    if us > BUSY_POLL_MAX_US {
        return Err(format!("busy-poll of {us} µs is more than the {BUSY_POLL_MAX_US} µs allowed"));
    }
    Ok(us)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_are_auto_off_or_a_size_up_to_the_largest_request() {
        assert_eq!("auto".parse::<ChunkChoice>(), Ok(ChunkChoice(Chunking::Auto)));
        assert_eq!(ChunkChoice::default(), ChunkChoice(Chunking::Auto));
        assert_eq!("512K".parse::<ChunkChoice>(), Ok(ChunkChoice(Chunking::Fixed(512 << 10))));
        assert_eq!("0".parse::<ChunkChoice>(), Ok(ChunkChoice(Chunking::Off)));
        assert_eq!("32M".parse::<ChunkChoice>(), Ok(ChunkChoice(Chunking::Fixed(REQUEST_PAYLOAD_MAX_BYTES))));
        assert!("64M".parse::<ChunkChoice>().unwrap_err().contains("the largest request"));
        let e = "12Q".parse::<ChunkChoice>().unwrap_err();
        assert!(e.contains("\"12Q\"") && e.contains("auto"), "{e}");
        assert!("Auto".parse::<ChunkChoice>().is_err(), "names are lower case, as the other settings'");
    }

    #[test]
    fn listen_addresses_need_a_port() {
        let a: ListenAddr = "[::1]:10809".parse().unwrap();
        assert_eq!(a.first(), SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, 10809)));
        assert!("nowhere".parse::<ListenAddr>().unwrap_err().contains("\"nowhere\""));
    }

    #[test]
    fn log_levels_and_threads_name_the_bad_value() {
        assert_eq!("debug".parse::<LogLevel>(), Ok(LogLevel(LevelFilter::Debug)));
        assert!("loud".parse::<LogLevel>().unwrap_err().contains("\"loud\""));
        assert_eq!(parse_threads("3"), Ok(NonZeroUsize::new(3).unwrap()));
        assert!(parse_threads("0").is_err());
        assert!(parse_threads("many").unwrap_err().contains("\"many\""));
        assert_eq!(parse_busy_poll("0"), Ok(0));
        assert_eq!(parse_busy_poll("1000"), Ok(1000));
        assert!(parse_busy_poll("1001").unwrap_err().contains("1001"));
        assert!(parse_busy_poll("-1").unwrap_err().contains("\"-1\""));
    }

    #[test]
    fn tls_modes_are_off_on_and_require() {
        assert_eq!("require".parse::<TlsChoice>(), Ok(TlsChoice(TlsMode::Require)));
        assert_eq!("on".parse::<TlsChoice>(), Ok(TlsChoice(TlsMode::On)));
        assert_eq!("off".parse::<TlsChoice>(), Ok(TlsChoice(TlsMode::Off)));
        assert!("yes".parse::<TlsChoice>().unwrap_err().contains("\"yes\""));
    }

    #[test]
    fn ktls_modes_are_auto_and_off() {
        assert_eq!("auto".parse::<KtlsChoice>(), Ok(KtlsChoice(KtlsMode::Auto)));
        assert_eq!("off".parse::<KtlsChoice>(), Ok(KtlsChoice(KtlsMode::Off)));
        assert!("on".parse::<KtlsChoice>().unwrap_err().contains("\"on\""));
    }
}
