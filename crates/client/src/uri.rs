//! NBD URIs as doc/uri.md of NetworkBlockDevice/nbd defines them:
//! `nbd://host[:port][/export]` and `nbd+unix:///[export]?socket=PATH`, and their TLS forms
//! `nbds://[user@]host...` and `nbds+unix://[user@]/...` with libnbd's `tls-*` query keys.
//! `pool:PATH` names a pool file instead of a server (see `crate::pool`), and `cache:PATH`
//! a cached volume's file (see `crate::cache`).

use crate::error::Error;
use crate::tls::{parse_bool, Tls};
use std::path::PathBuf;

/// The IANA port for NBD.
pub const DEFAULT_PORT: u16 = 10809;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Address {
    /// A host name or IP address (IPv6 without brackets) and port.
    Tcp { host: String, port: u16 },
    Unix(PathBuf),
    /// A pool file (`pool:PATH`): one volume over the NBD servers it lists.
    Pool(PathBuf),
    /// A cached volume's file (`cache:PATH`): a volume with its blocks cached in other
    /// nodes' RAM.
    Cache(PathBuf),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Uri {
    pub address: Address,
    /// Export name, percent-decoded; empty means the server's default export.
    pub export: String,
    /// Set for `nbds://` and `nbds+unix://`: the connection must be TLS, set up so.
    pub tls: Option<Tls>,
}

impl Uri {
    pub fn parse(s: &str) -> Result<Uri, Error> {
        let bad = |m: &str| Err(Error::Uri(format!("{m} in {s:?}")));
        if let Some(path) = s.strip_prefix("pool:") {
            if path.is_empty() {
                return bad("pool: needs the path of a pool file");
            }
            return Ok(Uri { address: Address::Pool(PathBuf::from(path)), export: String::new(), tls: None });
        }
        if let Some(path) = s.strip_prefix("cache:") {
            if path.is_empty() {
                return bad("cache: needs the path of a cache file");
            }
            return Ok(Uri { address: Address::Cache(PathBuf::from(path)), export: String::new(), tls: None });
        }
        let Some((scheme, rest)) = s.split_once("://") else {
            return bad("no scheme (expected nbd:// or nbd+unix://)");
        };
        let (tls, unix) = match scheme.to_ascii_lowercase().as_str() {
            "nbd" => (false, false),
            "nbd+unix" => (false, true),
            "nbds" => (true, false),
            "nbds+unix" => (true, true),
            "nbd+vsock" | "nbds+vsock" => return bad("vsock is not supported"),
            _ => return bad("unknown scheme (expected nbd:// or nbd+unix://)"),
        };
        // The fragment goes first: a '?' inside it is not a query.
        let rest = rest.split_once('#').map_or(rest, |(r, _)| r);
        let (rest, q) = match rest.split_once('?') {
            Some((r, q)) => (r, q),
            None => (rest, ""),
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i + 1..]),
            None => (rest, ""),
        };
        let export = percent_decode(path).ok_or_else(|| Error::Uri(format!("bad percent-encoding in the export name of {s:?}")))?;
        if export.contains('\0') || export.len() > sluice_proto::limits::STRING_MAX_BYTES {
            return bad("the export name contains NUL or is longer than 4096 bytes");
        }
        let (socket, mut settings) = query(q, s)?;
        if !tls && settings != Tls::default() {
            log::warn!("the tls-* parameters of {s:?} are ignored without TLS (use nbds://)");
        }
        // The user is the PSK identity; without TLS it means nothing.
        let (user, authority) = match authority.rsplit_once('@') {
            Some((user, host)) => (Some(user), host),
            None => (None, authority),
        };
        if let Some(user) = user.filter(|u| !u.is_empty()) {
            settings.username = Some(percent_decode(user).ok_or_else(|| Error::Uri(format!("bad percent-encoding in the user of {s:?}")))?);
        }
        let address = if unix {
            if !authority.is_empty() {
                return bad("nbd+unix:// takes no host");
            }
            match socket {
                Some(p) if !p.as_os_str().is_empty() => Address::Unix(p),
                _ => return bad("nbd+unix:// needs ?socket=PATH"),
            }
        } else {
            if socket.is_some() {
                return bad("socket= only goes with nbd+unix://");
            }
            let (host, port) = split_host_port(authority).ok_or_else(|| Error::Uri(format!("bad host or port in {s:?}")))?;
            Address::Tcp { host, port }
        };
        Ok(Uri { address, export, tls: tls.then_some(settings) })
    }
}

/// The query of URI `s`: the socket, and the TLS settings its `tls-*` keys make.
fn query(q: &str, s: &str) -> Result<(Option<PathBuf>, Tls), Error> {
    let mut socket = None;
    let mut settings = Tls::default();
    let mut kind = None;
    for pair in q.split('&').filter(|p| !p.is_empty()) {
        let (k, v) = pair.split_once('=').unwrap_or((pair, ""));
        let v = percent_decode(v).ok_or_else(|| Error::Uri(format!("bad percent-encoding in the query of {s:?}")))?;
        let tls_key = match k {
            "socket" => {
                socket = Some(PathBuf::from(v));
                continue;
            }
            "tls-type" => tls_type(&v).map(|psk| kind = Some(psk)),
            k if k.starts_with("tls-") => tls_key(&mut settings, k, &v),
            // Reported, as uri.md asks.
            k => {
                log::warn!("ignoring unknown NBD URI parameter {k:?}");
                continue;
            }
        };
        tls_key.map_err(|m| Error::Uri(format!("{m} in {s:?}")))?;
    }
    match kind {
        Some(true) if settings.psk_file.is_none() => Err(Error::Uri(format!("tls-type=psk needs tls-psk-file=FILE in {s:?}"))),
        Some(false) if settings.psk_file.is_some() => Err(Error::Uri(format!("tls-type=x509 does not go with tls-psk-file in {s:?}"))),
        _ => Ok((socket, settings)),
    }
}

/// uri.md's `tls-type`: whether the URI means pre-shared keys (true) or certificates.
fn tls_type(value: &str) -> Result<bool, String> {
    match value {
        "psk" => Ok(true),
        "x509" => Ok(false),
        "anon" => Err("tls-type=anon (TLS without authentication) is not supported".into()),
        v => Err(format!("tls-type={v:?} is not x509 or psk")),
    }
}

/// One `tls-*` query key, as libnbd reads it.
fn tls_key(t: &mut Tls, key: &str, value: &str) -> Result<(), String> {
    let path = || if value.is_empty() { Err(format!("{key} needs a path")) } else { Ok(Some(PathBuf::from(value))) };
    match key {
        "tls-certificates" => t.certificates = path()?,
        "tls-psk-file" => t.psk_file = path()?,
        "tls-verify-peer" => t.verify_peer = parse_bool(value).ok_or_else(|| format!("tls-verify-peer={value:?} is not true or false"))?,
        "tls-hostname" if value.is_empty() => return Err("tls-hostname needs a name".into()),
        "tls-hostname" => t.hostname = Some(value.to_string()),
        // A key of a later libnbd may loosen or tighten security: better refused than ignored.
        k => return Err(format!("unknown TLS parameter {k:?}")),
    }
    Ok(())
}

impl std::fmt::Display for Uri {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let export = percent_encode(&self.export, PATH_SAFE);
        let s = if self.tls.is_some() { "s" } else { "" };
        let user = match self.tls.as_ref().and_then(|t| t.username.as_deref()) {
            Some(u) => format!("{}@", percent_encode(u, USER_SAFE)),
            None => String::new(),
        };
        let mut sep = '?';
        match &self.address {
            Address::Tcp { host, port } if host.contains(':') => write!(f, "nbd{s}://{user}[{host}]:{port}/{export}")?,
            Address::Tcp { host, port } => write!(f, "nbd{s}://{user}{host}:{port}/{export}")?,
            Address::Unix(p) => {
                write!(f, "nbd{s}+unix://{user}/{export}?socket={}", percent_encode(&p.to_string_lossy(), PATH_SAFE))?;
                sep = '&';
            }
            Address::Pool(p) => return write!(f, "pool:{}", p.display()),
            Address::Cache(p) => return write!(f, "cache:{}", p.display()),
        }
        let Some(t) = &self.tls else { return Ok(()) };
        let path = |p: &PathBuf| percent_encode(&p.to_string_lossy(), PATH_SAFE);
        let keys = [
            t.certificates.as_ref().map(|d| format!("tls-certificates={}", path(d))),
            t.psk_file.as_ref().map(|p| format!("tls-psk-file={}", path(p))),
            (!t.verify_peer).then(|| "tls-verify-peer=false".to_string()),
            t.hostname.as_ref().map(|h| format!("tls-hostname={}", percent_encode(h, USER_SAFE))),
        ];
        for key in keys.into_iter().flatten() {
            write!(f, "{sep}{key}")?;
            sep = '&';
        }
        Ok(())
    }
}

impl std::str::FromStr for Uri {
    type Err = Error;
    fn from_str(s: &str) -> Result<Uri, Error> {
        Uri::parse(s)
    }
}

fn split_host_port(a: &str) -> Option<(String, u16)> {
    let (host, port) = if let Some(v6) = a.strip_prefix('[') {
        let (host, after) = v6.split_once(']')?;
        match after {
            "" => (host, None),
            p => (host, Some(p.strip_prefix(':')?)),
        }
    } else {
        match a.rsplit_once(':') {
            // An IPv6 address must be in brackets; more colons mean one was not.
            Some((h, _)) if h.contains(':') => return None,
            Some((h, p)) => (h, Some(p)),
            None => (a, None),
        }
    };
    let port = match port {
        None | Some("") => DEFAULT_PORT,
        Some(p) if p.bytes().all(|c| c.is_ascii_digit()) => p.parse().ok().filter(|&p| p != 0)?,
        Some(_) => return None,
    };
    let host = percent_decode(host)?;
    let host = if host.is_empty() { "localhost".to_string() } else { host };
    Some((host, port))
}

fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = b.get(i + 1..i + 3)?;
            if !hex.iter().all(u8::is_ascii_hexdigit) {
                return None;
            }
            out.push(u8::from_str_radix(std::str::from_utf8(hex).ok()?, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// What `percent_encode` leaves as it is besides letters and digits: in a path (the export,
/// a socket or file name), and in a user or host name.
const PATH_SAFE: &[u8] = b"-._~/";
const USER_SAFE: &[u8] = b"-._~";

fn percent_encode(s: &str, safe: &[u8]) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.bytes() {
        if c.is_ascii_alphanumeric() || safe.contains(&c) {
            out.push(c as char);
        } else {
            out.push_str(&format!("%{c:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(host: &str, port: u16, export: &str) -> Uri {
        Uri { address: Address::Tcp { host: host.into(), port }, export: export.into(), tls: None }
    }

    #[test]
    fn tcp_forms() {
        assert_eq!(Uri::parse("nbd://example.com").unwrap(), tcp("example.com", 10809, ""));
        assert_eq!(Uri::parse("nbd://example.com/").unwrap(), tcp("example.com", 10809, ""));
        assert_eq!(Uri::parse("nbd://example.com:1234/disk").unwrap(), tcp("example.com", 1234, "disk"));
        assert_eq!(Uri::parse("nbd://[::1]:99/a%20b").unwrap(), tcp("::1", 99, "a b"));
        assert_eq!(Uri::parse("nbd://[::1]").unwrap(), tcp("::1", 10809, ""));
        assert_eq!(Uri::parse("nbd:///x").unwrap(), tcp("localhost", 10809, "x"));
        assert_eq!(Uri::parse("NBD://h//lead").unwrap(), tcp("h", 10809, "/lead"));
        assert_eq!(Uri::parse("nbd://user@h:5/e").unwrap(), tcp("h", 5, "e"));
        assert_eq!(Uri::parse("nbd://h/e#frag?x=1").unwrap(), tcp("h", 10809, "e"));
    }

    #[test]
    fn unix_forms() {
        let u = Uri::parse("nbd+unix:///disk?socket=/tmp/s%20k").unwrap();
        assert_eq!(u, Uri { address: Address::Unix("/tmp/s k".into()), export: "disk".into(), tls: None });
        assert_eq!(Uri::parse(&u.to_string()).unwrap(), u);
        assert!(Uri::parse("nbd+unix:///disk").is_err());
        assert!(Uri::parse("nbd+unix://host/disk?socket=/s").is_err());
    }

    #[test]
    fn pool_files() {
        let u = Uri::parse("pool:/etc/sluice/vol.toml").unwrap();
        assert_eq!(u, Uri { address: Address::Pool("/etc/sluice/vol.toml".into()), export: String::new(), tls: None });
        assert_eq!(Uri::parse(&u.to_string()).unwrap(), u);
        assert_eq!(Uri::parse("pool:rel/p.toml").unwrap().address, Address::Pool("rel/p.toml".into()));
        let c = Uri::parse("cache:/etc/sluice/c.toml").unwrap();
        assert_eq!((c.address.clone(), c.to_string()), (Address::Cache("/etc/sluice/c.toml".into()), "cache:/etc/sluice/c.toml".into()));
        assert!(Uri::parse("cache:").is_err());
        assert!(Uri::parse("pool:").is_err());
    }

    #[test]
    fn refusals() {
        for bad in ["", "disk", "http://x/", "nbd://h:0/", "nbd://h:99999/", "nbd://h:x/", "nbd://h/%zz", "nbd://h/%+f", "nbd://h:+80/", "nbd://::1/", "nbd://h/a%00b", "nbd://h/?socket=/s"] {
            assert!(Uri::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn tls_forms() {
        let u = Uri::parse("nbds://alice@h:99/disk?tls-certificates=/etc/pki/c&tls-verify-peer=no&tls-hostname=srv.example").unwrap();
        assert_eq!((u.address, u.export.as_str()), (Address::Tcp { host: "h".into(), port: 99 }, "disk"));
        let want = Tls {
            certificates: Some("/etc/pki/c".into()),
            username: Some("alice".into()),
            verify_peer: false,
            hostname: Some("srv.example".into()),
            ..Tls::default()
        };
        assert_eq!(u.tls, Some(want));
        let u = Uri::parse("NBDS+UNIX://b%40b@/e?socket=/s&tls-psk-file=/k%20s.psk&tls-type=psk").unwrap();
        assert_eq!(u.address, Address::Unix("/s".into()));
        let t = u.tls.unwrap();
        assert_eq!((t.username.as_deref(), t.psk_file), (Some("b@b"), Some("/k s.psk".into())));
        assert_eq!(Uri::parse("nbds://h").unwrap().tls, Some(Tls::default()));
        // Without TLS the keys and the user mean nothing.
        assert_eq!(Uri::parse("nbd://u@h/?tls-psk-file=/k").unwrap().tls, None);
        for v in ["1", "true", "YES", "on"] {
            assert!(Uri::parse(&format!("nbds://h/?tls-verify-peer={v}")).unwrap().tls.unwrap().verify_peer, "{v}");
        }
    }

    #[test]
    fn tls_refusals_name_the_key() {
        for (bad, key) in [
            ("nbds://h/?tls-verify-peer=maybe", "tls-verify-peer"),
            ("nbds://h/?tls-certificates=", "tls-certificates"),
            ("nbds://h/?tls-psk-file", "tls-psk-file"),
            ("nbds://h/?tls-hostname=", "tls-hostname"),
            ("nbds://h/?tls-priority=NORMAL", "tls-priority"),
            ("nbds://h/?tls-type=anon", "anon"),
            ("nbds://h/?tls-type=psk", "tls-psk-file"),
            ("nbds://h/?tls-type=x509&tls-psk-file=/k", "x509"),
            ("nbds://%zz@h/", "user"),
            ("nbds+vsock://2/", "vsock"),
        ] {
            let e = Uri::parse(bad).unwrap_err();
            assert!(matches!(e, Error::Uri(_)) && e.to_string().contains(key), "{bad}: {e}");
        }
    }

    #[test]
    fn display_round_trips() {
        for s in [
            "nbd://h:1/e%3Fx",
            "nbd://[::1]:10809/",
            "nbd+unix:///?socket=/run/x.sock",
            "nbds://a%2Fb%40c@h:1/e?tls-certificates=/c%26d&tls-hostname=n",
            "nbds://[::1]:10809/?tls-verify-peer=false",
            "nbds+unix://bob@/x?socket=/s&tls-psk-file=/k.psk",
        ] {
            let u = Uri::parse(s).unwrap();
            assert_eq!(Uri::parse(&u.to_string()).unwrap(), u, "{s}");
        }
    }
}
