//! Access rules: who may connect, and which exports each client may open. Pure: the
//! acceptor and the handshake describe the client (`Client`), the rules answer.
//!
//! A rule is an address or CIDR (`10.1.0.0/16`, `::1`, `fe80::/10`), `uid:N` or `gid:N` (a
//! Unix socket peer, from SO_PEERCRED), `psk:IDENTITY`, `x509:DN` (the client certificate's
//! subject as RFC 4514 text), `x509-cn:NAME`, or `all`. A policy has a deny list and an
//! optional allow list: deny wins, and no allow list lets everyone in.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use crate::rfc4514::normal_dn;

/// Longest rule text taken; a DN longer than this is not a certificate subject.
const RULE_MAX_BYTES: usize = 4096;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    All,
    /// An address and how many leading bits must match (IPv4-mapped IPv6 written as IPv4).
    Net { addr: IpAddr, prefix: u8 },
    Uid(u32),
    Gid(u32),
    Psk(String),
    /// A subject in the normal form `normal_dn` gives.
    X509(String),
    X509Cn(String),
}

/// What is known of a client when a rule is checked. Before STARTTLS the TLS fields are
/// empty, so TLS rules match nobody yet.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Client {
    /// The peer's address, for TCP.
    pub addr: Option<IpAddr>,
    /// The peer's credentials, for a Unix socket.
    pub uid: Option<u32>,
    pub gid: Option<u32>,
    pub psk: Option<String>,
    /// The certificate subject as RFC 4514 text (`tls::identity::rfc4514`).
    pub x509: Option<String>,
    pub x509_cn: Option<String>,
}

impl std::str::FromStr for Rule {
    type Err = String;

    fn from_str(s: &str) -> Result<Rule, String> {
        Rule::parse(s)
    }
}

impl Rule {
    pub fn parse(text: &str) -> Result<Rule, String> {
        if text.len() > RULE_MAX_BYTES {
            return Err(format!("access rule longer than {RULE_MAX_BYTES} bytes"));
        }
        let id = |s: &str, what: &str| s.parse::<u32>().map_err(|_| format!("access rule {text:?}: {what} must be a number"));
        let named = |s: &str| match s {
            "" => Err(format!("access rule {text:?} names no one")),
            s => Ok(s.to_owned()),
        };
        match text.split_once(':') {
            _ if text == "all" => Ok(Rule::All),
            Some(("uid", n)) => id(n, "a uid").map(Rule::Uid),
            Some(("gid", n)) => id(n, "a gid").map(Rule::Gid),
            Some(("psk", name)) => named(name).map(Rule::Psk),
            Some(("x509-cn", name)) => named(name).map(Rule::X509Cn),
            Some(("x509", dn)) => named(dn).and_then(|dn| normal_dn(&dn).map_err(|e| format!("access rule {text:?}: {e}"))).map(Rule::X509),
            _ => parse_net(text),
        }
    }

    /// Whether the rule can be decided when the connection is accepted, before any byte
    /// of the handshake: addresses and Unix credentials.
    pub fn is_for_connections(&self) -> bool {
        matches!(self, Rule::All | Rule::Net { .. } | Rule::Uid(_) | Rule::Gid(_))
    }

    pub fn matches(&self, c: &Client) -> bool {
        match self {
            Rule::All => true,
            Rule::Net { addr, prefix } => c.addr.is_some_and(|a| in_net(a.to_canonical(), *addr, *prefix)),
            Rule::Uid(u) => c.uid == Some(*u),
            Rule::Gid(g) => c.gid == Some(*g),
            Rule::Psk(p) => c.psk.as_deref() == Some(p.as_str()),
            Rule::X509(dn) => c.x509.as_deref().and_then(|d| normal_dn(d).ok()).as_deref() == Some(dn.as_str()),
            Rule::X509Cn(n) => c.x509_cn.as_deref() == Some(n.as_str()),
        }
    }
}

impl fmt::Display for Rule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rule::All => f.write_str("all"),
            Rule::Net { addr, prefix } if *prefix == full_prefix(addr) => write!(f, "{addr}"),
            Rule::Net { addr, prefix } => write!(f, "{addr}/{prefix}"),
            Rule::Uid(u) => write!(f, "uid:{u}"),
            Rule::Gid(g) => write!(f, "gid:{g}"),
            Rule::Psk(p) => write!(f, "psk:{p}"),
            Rule::X509(dn) => write!(f, "x509:{dn}"),
            Rule::X509Cn(n) => write!(f, "x509-cn:{n}"),
        }
    }
}

fn full_prefix(addr: &IpAddr) -> u8 {
    if addr.is_ipv4() {
        32
    } else {
        128
    }
}

/// `ADDR` or `ADDR/BITS`; an IPv4-mapped IPv6 network becomes the IPv4 one. Bits set past
/// the prefix are refused: `10.1.2.3/16` is more likely a typo than a wish.
fn parse_net(text: &str) -> Result<Rule, String> {
    let bad = |why: &str| Err(format!("access rule {text:?}: {why} (expected all, an address or CIDR, uid:N, gid:N, psk:ID, x509:DN or x509-cn:NAME)"));
    let (addr, prefix) = match text.split_once('/') {
        Some((a, p)) => (a, Some(p)),
        None => (text, None),
    };
    let Ok(addr) = addr.trim_start_matches('[').trim_end_matches(']').parse::<IpAddr>() else {
        return bad("not an address");
    };
    let mut prefix = match prefix.map(str::parse::<u8>) {
        None => full_prefix(&addr),
        Some(Ok(p)) if p <= full_prefix(&addr) => p,
        Some(_) => return bad("the prefix length is out of range"),
    };
    let canonical = addr.to_canonical();
    if canonical != addr {
        if prefix < 96 {
            return bad("a prefix shorter than /96 reaches past the IPv4-mapped range");
        }
        prefix -= 96;
    }
    if mask(canonical, prefix) != canonical {
        return bad(&format!("bits are set past the /{prefix} prefix (the network is {})", mask(canonical, prefix)));
    }
    Ok(Rule::Net { addr: canonical, prefix })
}

fn mask(addr: IpAddr, prefix: u8) -> IpAddr {
    match addr {
        IpAddr::V4(a) => {
            let bits = u32::from(a) & u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4(bits.into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a) & u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6(bits.into())
        }
    }
}

fn in_net(client: IpAddr, net: IpAddr, prefix: u8) -> bool {
    client.is_ipv4() == net.is_ipv4() && mask(client, prefix) == net
}

/// Who may use something: deny wins; without an allow list, everyone not denied may.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Policy {
    pub allow: Option<Vec<Rule>>,
    pub deny: Vec<Rule>,
}

impl Policy {
    pub fn permits(&self, c: &Client) -> bool {
        View::of(self).permits(c)
    }

    pub fn is_open(&self) -> bool {
        self.allow.is_none() && self.deny.is_empty()
    }
}

/// An export's own lists: each one given replaces the server's for this export (an export
/// with only `deny` keeps the server's `allow`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ExportRules {
    pub allow: Option<Vec<Rule>>,
    pub deny: Option<Vec<Rule>>,
    /// Clients served this export read-only.
    pub read_only_for: Vec<Rule>,
}

/// What the rules give one client of one export.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Grant {
    Refused,
    ReadOnly,
    ReadWrite,
}

/// Every rule of a server: its own policy and each export's rules, by export name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Access {
    pub server: Policy,
    pub exports: BTreeMap<String, ExportRules>,
}

impl Access {
    /// Whether any rule is set: without one, nobody is refused and nothing is read-only.
    pub fn is_open(&self) -> bool {
        self.server.is_open() && self.exports.values().all(|e| *e == ExportRules::default())
    }

    /// The rules as the log states them: one line for the server's, one per export with
    /// its own ("export \"vm7\": allow psk:node7; read-only for 10.2.0.0/16").
    pub fn describe(&self) -> Vec<String> {
        let list = |rules: &[Rule]| rules.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ");
        let lists = |allow: Option<&[Rule]>, deny: Option<&[Rule]>, ro: &[Rule]| {
            let mut parts = Vec::new();
            if let Some(a) = allow {
                parts.push(if a.is_empty() { "allow no one".to_owned() } else { format!("allow {}", list(a)) });
            }
            if let Some(d) = deny.filter(|d| !d.is_empty()) {
                parts.push(format!("deny {}", list(d)));
            }
            if !ro.is_empty() {
                parts.push(format!("read-only for {}", list(ro)));
            }
            parts.join("; ")
        };
        let mut lines = Vec::new();
        if !self.server.is_open() {
            lines.push(format!("server: {}", lists(self.server.allow.as_deref(), Some(&self.server.deny), &[])));
        }
        for (name, e) in self.exports.iter().filter(|(_, e)| **e != ExportRules::default()) {
            lines.push(format!("export {name:?}: {}", lists(e.allow.as_deref(), e.deny.as_deref(), &e.read_only_for)));
        }
        lines
    }

    fn view(&self, export: &str) -> View<'_> {
        let own = self.exports.get(export);
        View {
            allow: own.and_then(|e| e.allow.as_deref()).or(self.server.allow.as_deref()),
            deny: own.and_then(|e| e.deny.as_deref()).unwrap_or(&self.server.deny),
        }
    }

    pub fn grant(&self, export: &str, c: &Client) -> Grant {
        if !self.view(export).permits(c) {
            return Grant::Refused;
        }
        let read_only = self.exports.get(export).is_some_and(|e| e.read_only_for.iter().any(|r| r.matches(c)));
        if read_only {
            Grant::ReadOnly
        } else {
            Grant::ReadWrite
        }
    }

    /// At accept, knowing only the address or the Unix credentials: false when no export
    /// (none of `exports`, or the server's policy when there are none) could admit this
    /// client whatever it shows later. `tls` says whether TLS rules could still match.
    pub fn may_connect<'a>(&self, exports: impl IntoIterator<Item = &'a str>, c: &Client, tls: bool) -> bool {
        let mut names = exports.into_iter().peekable();
        if names.peek().is_none() {
            return View::of(&self.server).may_permit(c, tls);
        }
        names.any(|name| self.view(name).may_permit(c, tls))
    }
}

/// The two lists that decide one export.
#[derive(Clone, Copy)]
struct View<'a> {
    allow: Option<&'a [Rule]>,
    deny: &'a [Rule],
}

impl<'a> View<'a> {
    fn of(p: &'a Policy) -> View<'a> {
        View { allow: p.allow.as_deref(), deny: &p.deny }
    }

    fn permits(self, c: &Client) -> bool {
        if self.deny.iter().any(|r| r.matches(c)) {
            return false;
        }
        self.allow.is_none_or(|allow| allow.iter().any(|r| r.matches(c)))
    }

    /// `permits` with the TLS fields unknown yet: a TLS deny rule cannot refuse, a TLS
    /// allow rule may still admit (when TLS is offered at all).
    fn may_permit(self, c: &Client, tls: bool) -> bool {
        if self.deny.iter().any(|r| r.is_for_connections() && r.matches(c)) {
            return false;
        }
        let admits = |r: &Rule| if r.is_for_connections() { r.matches(c) } else { tls };
        self.allow.is_none_or(|allow| allow.iter().any(admits))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tcp(addr: &str) -> Client {
        Client { addr: Some(addr.parse().unwrap()), ..Client::default() }
    }

    fn rule(text: &str) -> Rule {
        Rule::parse(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn cidr_edges_match_exactly_the_network() {
        let r = rule("10.1.0.0/16");
        assert!(r.matches(&tcp("10.1.0.0")) && r.matches(&tcp("10.1.255.255")));
        assert!(!r.matches(&tcp("10.0.255.255")) && !r.matches(&tcp("10.2.0.0")));
        assert!(rule("0.0.0.0/0").matches(&tcp("192.0.2.1")));
        assert!(!rule("0.0.0.0/0").matches(&tcp("::1")), "an IPv4 network holds no IPv6 client");
        assert!(rule("fe80::/10").matches(&tcp("febf::1")) && !rule("fe80::/10").matches(&tcp("fec0::1")));
        assert!(rule("::1").matches(&tcp("::1")) && !rule("::1").matches(&tcp("::2")));
        assert!(rule("192.0.2.7").matches(&tcp("192.0.2.7")) && !rule("192.0.2.7").matches(&tcp("192.0.2.8")));
    }

    #[test]
    fn ipv4_mapped_clients_and_rules_are_ipv4() {
        // A dual-stack [::] listener sees IPv4 clients as ::ffff:a.b.c.d.
        assert!(rule("10.1.0.0/16").matches(&tcp("::ffff:10.1.2.3")));
        assert_eq!(rule("::ffff:10.1.0.0/112"), rule("10.1.0.0/16"));
        assert!(Rule::parse("::ffff:0.0.0.0/95").is_err());
    }

    #[test]
    fn bad_rules_say_why() {
        let cases = [
            ("10.1.2.3/16", "bits are set past the /16 prefix (the network is 10.1.0.0)"),
            ("10.0.0.0/33", "prefix length is out of range"),
            ("node7", "not an address"),
            ("uid:root", "a uid must be a number"),
            ("psk:", "names no one"),
            ("x509:CN", "is not TYPE=value"),
            ("x509:CN=a,", "has an empty part"),
        ];
        for (text, why) in cases {
            let e = Rule::parse(text).unwrap_err();
            assert!(e.contains(why), "{text}: {e}");
        }
        assert!(Rule::parse(&"x".repeat(RULE_MAX_BYTES + 1)).is_err());
    }

    #[test]
    fn rules_print_as_written() {
        for text in ["all", "10.1.0.0/16", "::1", "fe80::/10", "uid:0", "gid:6", "psk:alice", "x509-cn:node7"] {
            assert_eq!(rule(text).to_string(), text);
        }
    }

    #[test]
    fn dns_compare_in_one_spelling() {
        let r = rule("x509:cn=Node7, O=Example\\, Inc.");
        let c = |dn: &str| Client { x509: Some(dn.to_owned()), ..Client::default() };
        assert!(r.matches(&c("CN=node7,O=Example\\, Inc.")));
        assert!(r.matches(&c("CN=node7,O=Example\\2C Inc.")), "a hex escape is the same character");
        assert!(!r.matches(&c("CN=node8,O=Example\\, Inc.")));
        assert!(!r.matches(&c("O=Example\\, Inc.,CN=node7")), "the order of RDNs counts");
        assert_eq!(normal_dn("OU=b+CN=a").unwrap(), normal_dn("cn=A + ou=B").unwrap());
    }

    #[test]
    fn unix_and_tls_rules_match_their_fields_only() {
        let unix = Client { uid: Some(1000), gid: Some(100), ..Client::default() };
        assert!(rule("uid:1000").matches(&unix) && rule("gid:100").matches(&unix));
        assert!(!rule("uid:0").matches(&unix) && !rule("127.0.0.1").matches(&unix));
        let tls = Client { psk: Some("alice".into()), x509_cn: Some("node7".into()), ..Client::default() };
        assert!(rule("psk:alice").matches(&tls) && !rule("psk:bob").matches(&tls));
        assert!(rule("x509-cn:node7").matches(&tls));
        // Before STARTTLS nothing is known: a TLS rule matches no one.
        assert!(!rule("psk:alice").matches(&Client::default()));
        assert!(rule("uid:0").is_for_connections() && !rule("psk:a").is_for_connections());
    }

    #[test]
    fn deny_wins_and_no_allow_list_means_everyone() {
        let open = Policy::default();
        assert!(open.permits(&tcp("192.0.2.1")));
        let p = Policy { allow: Some(vec![rule("10.0.0.0/8")]), deny: vec![rule("10.9.0.0/16")] };
        assert!(p.permits(&tcp("10.1.1.1")));
        assert!(!p.permits(&tcp("10.9.1.1")), "deny wins over allow");
        assert!(!p.permits(&tcp("192.0.2.1")), "not on the allow list");
        let nobody = Policy { allow: Some(Vec::new()), deny: Vec::new() };
        assert!(!nobody.permits(&tcp("10.1.1.1")), "an empty allow list lets no one in");
    }

    fn access() -> Access {
        let mut a = Access { server: Policy { allow: Some(vec![rule("10.0.0.0/8")]), deny: vec![rule("10.9.0.0/16")] }, ..Access::default() };
        let own = ExportRules { allow: Some(vec![rule("psk:node7")]), ..ExportRules::default() };
        a.exports.insert("vm7".into(), own);
        let deny_only = ExportRules { deny: Some(vec![rule("10.1.0.0/16")]), read_only_for: vec![rule("10.2.0.0/16")], ..ExportRules::default() };
        a.exports.insert("gold".into(), deny_only);
        a
    }

    #[test]
    fn an_exports_list_replaces_only_the_servers_list_of_that_kind() {
        let a = access();
        assert_eq!(a.grant("other", &tcp("10.1.1.1")), Grant::ReadWrite);
        assert_eq!(a.grant("other", &tcp("10.9.1.1")), Grant::Refused);
        assert_eq!(a.grant("vm7", &tcp("10.1.1.1")), Grant::Refused, "vm7's allow list names only a PSK");
        let node7 = Client { psk: Some("node7".into()), ..tcp("192.0.2.1") };
        assert_eq!(a.grant("vm7", &node7), Grant::ReadWrite);
        // gold replaces the deny list and keeps the server's allow list.
        assert_eq!(a.grant("gold", &tcp("10.1.1.1")), Grant::Refused);
        assert_eq!(a.grant("gold", &tcp("10.9.1.1")), Grant::ReadWrite);
        assert_eq!(a.grant("gold", &tcp("192.0.2.1")), Grant::Refused);
        assert_eq!(a.grant("gold", &tcp("10.2.3.4")), Grant::ReadOnly);
        assert!(!a.is_open() && Access::default().is_open());
        let lines = a.describe();
        assert_eq!(lines, [
            "server: allow 10.0.0.0/8; deny 10.9.0.0/16",
            "export \"gold\": deny 10.1.0.0/16; read-only for 10.2.0.0/16",
            "export \"vm7\": allow psk:node7",
        ]);
    }

    #[test]
    fn a_connection_is_refused_early_only_when_no_export_could_ever_admit_it() {
        let a = access();
        let names = ["other", "vm7", "gold"];
        assert!(a.may_connect(names, &tcp("10.1.1.1"), false));
        // 192.0.2.1 fails every address list, but vm7 admits a PSK it may show later.
        assert!(a.may_connect(names, &tcp("192.0.2.1"), true));
        assert!(!a.may_connect(names, &tcp("192.0.2.1"), false), "without TLS no PSK can ever be shown");
        assert!(!a.may_connect(["other"], &tcp("192.0.2.1"), true));
        // A TLS deny rule cannot refuse a connection before TLS.
        let p = Policy { allow: None, deny: vec![rule("psk:mallory")] };
        assert!(View::of(&p).may_permit(&tcp("192.0.2.1"), true));
        assert!(!a.may_connect(std::iter::empty(), &tcp("10.9.0.1"), true), "no exports: the server's policy decides");
    }
}
