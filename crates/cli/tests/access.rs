//! Access rules with the real clients and raw bytes: exports opened by PSK identity
//! (nbdinfo) and certificate subject (qemu-img), connections refused by address and by
//! Unix uid before the handshake, filtered lists, read-only-for, the per-client connection
//! limit, the audit lines and counters, and rules changed by a reload.
mod common;
mod raw;

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::tls::Keys;
use common::*;
use raw::*;

/// Writes `text` as sluice.toml in `dir` and returns its path.
fn config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("sluice.toml");
    std::fs::write(&path, text).unwrap();
    path
}

fn start_with(file: &Path, extra: &[&str]) -> Sluice {
    let mut args = vec!["--config", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    Sluice::start(&args)
}

fn psk_uri(s: &Sluice, user: &str, export: &str, keys: &Keys) -> String {
    format!("nbds://{user}@localhost:{}/{export}?tls-psk-file={}", s.port, keys.psk_file().display())
}

/// The names `nbdinfo --list` shows at `uri`.
fn listed(uri: &str) -> Vec<String> {
    let (ok, out, err) = run("nbdinfo", &["--list", "--json", uri]);
    assert!(ok, "nbdinfo --list {uri}: {out}{err}");
    let json: serde_json::Value = serde_json::from_str(&out).unwrap_or_else(|e| panic!("{e}: {out}"));
    let mut names: Vec<String> = json["exports"].as_array().unwrap().iter().map(|e| e["export-name"].as_str().unwrap().to_owned()).collect();
    names.sort();
    names
}

fn refused_total(port: u16, reason: &str) -> f64 {
    let (_, body) = http_get(port, "/metrics");
    sample(&body, &format!("sluice_connections_refused_total{{reason=\"{reason}\"}}"))
}

const PSK_EXPORTS: &str = r#"
tls = "require"
[[export]]
name = "vm7"
spec = "memory:1M"
allow = ["psk:alice"]
[[export]]
name = "shared"
spec = "memory:1M"
[[export]]
name = "gold"
spec = "memory:1M"
read-only-for = ["psk:bob"]
"#;

#[test]
fn psk_identities_see_and_open_only_their_exports() {
    require!("nbdinfo", "nbdsh", "psktool", "certtool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), PSK_EXPORTS);
    let metrics = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let s = start_with(&file, &["--tls-psk", keys.psk_file().to_str().unwrap(), "--metrics", &metrics_addr]);

    let (ok, out, err) = run("nbdinfo", &[&psk_uri(&s, "alice", "vm7", &keys)]);
    assert!(ok && out.contains("1048576"), "alice opens vm7: {out}{err}");
    let (ok, out, err) = run("nbdinfo", &[&psk_uri(&s, "bob", "vm7", &keys)]);
    assert!(!ok, "bob opened vm7: {out}");
    // Refused looks exactly like absent: the same reply as for a name that does not exist.
    let (_, _, missing) = run("nbdinfo", &[&psk_uri(&s, "bob", "vm8", &keys)]);
    assert_eq!(err.replace("vm7", "NAME"), missing.replace("vm8", "NAME"), "a refused export must read as a missing one");

    assert_eq!(listed(&psk_uri(&s, "alice", "", &keys)), ["gold", "shared", "vm7"]);
    assert_eq!(listed(&psk_uri(&s, "bob", "", &keys)), ["gold", "shared"], "bob must not learn that vm7 exists");

    // gold is read-only for bob: the flags say so, and a write sent anyway (libnbd's own
    // check turned off) is refused by the server with EPERM ("command failed" is libnbd
    // reporting the server's error reply). alice may write.
    let script = |user: &str| {
        format!(
            "import errno\nh.set_strict_mode(0)\nh.set_uri_allow_local_file(True)\nh.connect_uri({:?})\nprint('ro', h.is_read_only())\n\
             try:\n    h.pwrite(b'x' * 512, 0)\n    print('write ok')\nexcept nbd.Error as e:\n    print('write refused', e.errno in ('EPERM', errno.EPERM), 'command failed' in e.string, e.string)\n",
            psk_uri(&s, user, "gold", &keys)
        )
    };
    let (ok, out, err) = run("nbdsh", &["-c", &script("bob")]);
    assert!(ok && out.contains("ro True") && out.contains("write refused True True"), "bob on gold: {out}{err}");
    let (ok, out, err) = run("nbdsh", &["-c", &script("alice")]);
    assert!(ok && out.contains("ro False") && out.contains("write ok"), "alice on gold: {out}{err}");

    let log = s.log_text();
    assert!(log.contains("opened export \"gold\" (read-only) over TLSv1.3 psk:bob"), "audit line for bob:\n{log}");
    assert!(log.contains("opened export \"gold\" over TLSv1.3 psk:alice"), "audit line for alice:\n{log}");
    assert!(log.contains("refused export \"vm7\" by the access rules"), "{log}");
    assert!(log.contains("access: export \"vm7\": allow psk:alice"), "the rules are logged at start:\n{log}");
    assert_eq!(refused_total(metrics, "export"), 1.0, "bob's one try at vm7");
    assert_eq!(refused_total(metrics, "access"), 0.0);
}

#[test]
fn certificate_subjects_decide_through_qemu() {
    require!("qemu-img", "certtool", "psktool");
    let keys = Keys::generate();
    let bob = keys.client_dir_for("bob", "cn = \"bob\"\norganization = \"Example, Inc.\"");
    let alice = keys.client_dir_for("alice", "cn = \"alice\"");
    let dir = tempfile::tempdir().unwrap();
    let file = config(
        dir.path(),
        r#"
tls = "require"
tls-verify-peer = true
[[export]]
name = "vm7"
spec = "memory:1M"
allow = ['x509:cn=Bob, o=Example\, Inc.']
[[export]]
name = "alice-only"
spec = "memory:2M"
allow = ["x509-cn:alice"]
"#,
    );
    let s = start_with(&file, &["--tls-certificates", keys.server_dir().to_str().unwrap()]);
    let info = |client: &Path, export: &str| {
        let object = format!("tls-creds-x509,id=tls0,endpoint=client,dir={}", client.display());
        let image = format!("driver=nbd,host=127.0.0.1,port={},export={export},tls-creds=tls0,tls-hostname=localhost", s.port);
        run("qemu-img", &["info", "--object", &object, "--image-opts", &image])
    };
    let (ok, out, err) = info(&bob, "vm7");
    assert!(ok && out.contains("1 MiB"), "bob's certificate opens vm7: {out}{err}");
    let (ok, out, _) = info(&bob, "alice-only");
    assert!(!ok, "bob opened alice-only: {out}");
    let (ok, out, err) = info(&alice, "alice-only");
    assert!(ok && out.contains("2 MiB"), "alice's certificate opens alice-only: {out}{err}");
    let (ok, out, _) = info(&alice, "vm7");
    assert!(!ok, "alice opened vm7: {out}");
    let log = s.log_text();
    assert!(log.contains("x509:CN=bob,O=Example\\, Inc.") && log.contains("refused export \"alice-only\""), "{log}");
}

#[test]
fn addresses_are_refused_before_the_handshake_and_say_nothing_more() {
    let second = free_port();
    let second_addr = format!("127.0.0.2:{second}");
    let metrics = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let s = Sluice::start(&["memory:1M", "--listen", &second_addr, "--allow", "127.0.0.0/8", "--deny", "127.0.0.2", "--metrics", &metrics_addr]);
    let from = |source: &str, dest: SocketAddr| Client::tcp_from(source.parse::<IpAddr>().unwrap(), dest).unwrap();
    let (one, two) = (SocketAddr::from(([127, 0, 0, 1], s.port)), SocketAddr::from(([127, 0, 0, 2], second)));

    // 127.0.0.1 is served on either listener.
    for dest in [one, two] {
        let mut c = from("127.0.0.1", dest);
        c.start();
        let e = c.go("", true, false);
        assert_eq!(e.size, 1 << 20);
    }
    // 127.0.0.2 is closed before the greeting, on either listener, and its options go
    // nowhere: the server sends not one byte. (The start's readiness probe over the Unix
    // socket was refused too: no address rule admits a Unix peer.)
    let before = refused_total(metrics, "access");
    for dest in [one, two] {
        let mut c = from("127.0.0.2", dest);
        let mut hello = (FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES).to_be_bytes().to_vec();
        hello.extend_from_slice(&IHAVEOPT);
        hello.extend_from_slice(&OPT_LIST.to_be_bytes());
        hello.extend_from_slice(&0u32.to_be_bytes());
        let _ = std::io::Write::write_all(&mut c.stream, &hello);
        let got = c.expect_close();
        assert!(got.is_empty(), "a refused client got {} bytes", got.len());
    }
    wait_until("two refusals counted", Duration::from_secs(10), || refused_total(metrics, "access") == before + 2.0, || s.log_text());
    let log = s.log_text();
    let lines = log.lines().filter(|l| l.contains("127.0.0.2:") && l.contains("refused by the access rules"));
    assert_eq!(lines.count(), 2, "one line per refused connection:\n{log}");
    // Unix peers match no address rule: with an allow list of addresses, they are out too.
    let mut c = Client::unix(&s.socket);
    assert!(c.expect_close().is_empty());
}

#[test]
fn unix_peers_are_told_apart_by_uid() {
    require!("nbdinfo", "setpriv");
    if rustix::process::geteuid().as_raw() != 0 {
        eprintln!("SKIPPED: running as another uid needs root");
        assert!(std::env::var_os("CI").is_none(), "CI runs as root");
        return;
    }
    let s = Sluice::start(&["memory:1M", "--deny", "uid:65534"]);
    // Let the other user reach the socket.
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(s.dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&s.socket, std::fs::Permissions::from_mode(0o777)).unwrap();
    let uri = format!("nbd+unix:///?socket={}", s.socket.display());
    let (ok, out, err) = run("nbdinfo", &[&uri]);
    assert!(ok, "root may: {out}{err}");
    let (ok, out, err) = run("setpriv", &["--reuid=65534", "--regid=65534", "--clear-groups", "nbdinfo", &uri]);
    assert!(!ok, "uid 65534 was served: {out}{err}");
    let log = s.log_text();
    assert!(log.lines().any(|l| l.contains("uid=65534") && l.contains("refused by the access rules")), "{log}");
}

#[test]
fn read_only_for_refuses_writes_with_eperm() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "[[export]]\nname = \"gold\"\nspec = \"memory:1M\"\nread-only-for = [\"uid:0\", \"127.0.0.1\"]\n[[export]]\nname = \"scratch\"\nspec = \"memory:1M\"\n");
    let s = start_with(&file, &[]);
    let mut c = Client::tcp(s.port);
    c.start();
    let e = c.go("gold", true, false);
    assert_ne!(e.flags & READ_ONLY, 0, "gold is read-only to 127.0.0.1");
    let h = c.req_write(0, 0, &[7u8; 4096]);
    c.reply(h).assert_structured_error(EPERM);
    c.call(0, CMD_TRIM, 0, 4096).assert_structured_error(EPERM);
    assert_eq!(c.read(0, 4096), vec![0u8; 4096], "reads still work, and nothing was written");
    c.disconnect();
    // The same client may write to an export without the rule.
    let mut c = Client::tcp(s.port);
    c.start();
    let e = c.go("scratch", true, false);
    assert_eq!(e.flags & READ_ONLY, 0);
    c.write(0, &[1u8; 4096]);
    c.disconnect();
    let log = s.log_text();
    assert!(log.contains("opened export \"gold\" (read-only)") && log.contains("opened export \"scratch\"\n"), "{log}");
}

#[test]
fn a_refused_export_stays_unknown_whatever_the_client_asks() {
    let s = Sluice::start(&["--export", "vm7=memory:1M", "--export", "open=memory:1M", "--deny", "uid:0"]);
    // Over TCP the client is 127.0.0.1, which no rule names: it may open both. Over the
    // Unix socket it is uid 0, denied everything: closed at once.
    let mut c = Client::unix(&s.socket);
    assert!(c.expect_close().is_empty(), "uid 0 is denied");
    let file_dir = tempfile::tempdir().unwrap();
    let file = config(file_dir.path(), "[[export]]\nname = \"vm7\"\nspec = \"memory:1M\"\ndeny = [\"127.0.0.1\"]\n[[export]]\nname = \"open\"\nspec = \"memory:1M\"\n");
    let s = start_with(&file, &[]);
    let mut c = Client::tcp(s.port);
    c.start();
    let unknown = |c: &mut Client, option: u32, data: &[u8]| {
        let r = c.ask(option, data);
        assert_eq!(r.len(), 1, "nothing but the error: {r:?}");
        assert_eq!(r[0].kind, REP_ERR_UNKNOWN, "option {option}: {r:?}");
        String::from_utf8_lossy(&r[0].data).into_owned()
    };
    let refused = unknown(&mut c, OPT_INFO, &info_data("vm7", &[INFO_NAME, INFO_DESCRIPTION]));
    let missing = unknown(&mut c, OPT_INFO, &info_data("vm8", &[]));
    assert_eq!(refused.replace("vm7", "X"), missing.replace("vm8", "X"));
    unknown(&mut c, OPT_GO, &info_data("vm7", &[]));
    assert!(c.ask(OPT_STRUCTURED_REPLY, &[]).last().unwrap().kind == REP_ACK);
    unknown(&mut c, OPT_LIST_META_CONTEXT, &meta_data("vm7", &[]));
    unknown(&mut c, OPT_SET_META_CONTEXT, &meta_data("vm7", &["base:allocation"]));
    let list = c.ask(OPT_LIST, &[]);
    let names: Vec<String> = list.iter().filter(|r| r.kind == REP_SERVER).map(|r| String::from_utf8_lossy(&r.data[4..]).into_owned()).collect();
    assert_eq!(names, ["open"]);
    // EXPORT_NAME has no error reply: the server hangs up, as for a name it lacks.
    c.option(OPT_EXPORT_NAME, b"vm7");
    assert!(c.expect_close().is_empty(), "EXPORT_NAME of a refused export must get nothing");
}

#[test]
fn one_client_cannot_take_every_connection() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "[[export]]\nspec = \"memory:1M\"\n[limits]\nconnections-per-client = 2\n");
    let metrics = free_port();
    let metrics_addr = format!("127.0.0.1:{metrics}");
    let s = start_with(&file, &["--metrics", &metrics_addr]);
    // The start's readiness probe over TCP holds a slot until the server sees it go, so
    // connect until two connections hold their greeting.
    let greeted = |c: &mut Client| c.close_within(Duration::from_millis(200)).is_err_and(|got| got.len() == 18);
    let mut held = Vec::new();
    wait_until(
        "two connections from 127.0.0.1",
        Duration::from_secs(10),
        || {
            let mut c = Client::tcp(s.port);
            if greeted(&mut c) {
                held.push(c);
            }
            held.len() == 2
        },
        || s.log_text(),
    );
    let before = refused_total(metrics, "connections-per-client");
    let mut third = Client::tcp(s.port);
    assert!(third.expect_close().is_empty(), "a third connection from 127.0.0.1 was served");
    // Another client (a Unix peer, counted by its uid) still gets in.
    let mut other = Client::unix(&s.socket);
    other.greeting();
    assert_eq!(refused_total(metrics, "connections-per-client"), before + 1.0);
    assert!(s.log_text().contains("(connections-per-client)"), "{}", s.log_text());
    // A connection given back makes room, once the server has seen it go.
    held.pop();
    wait_until("a slot to come back", Duration::from_secs(10), || greeted(&mut Client::tcp(s.port)), || s.log_text());
}

#[test]
fn a_reload_changes_who_may_connect() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "[[export]]\nspec = \"memory:1M\"\nallow = [\"uid:12345\"]\n");
    let s = start_with(&file, &[]);
    let uri = format!("nbd+unix:///?socket={}", s.socket.display());
    let (ok, out, _) = run("nbdinfo", &[&uri]);
    assert!(!ok, "uid 0 was served before the reload: {out}");
    config(dir.path(), "[[export]]\nspec = \"memory:1M\"\nallow = [\"uid:0\"]\n");
    signal(s.pid(), libc::SIGHUP);
    wait_until("the reload", Duration::from_secs(10), || s.log_text().contains("reloaded"), || s.log_text());
    let (ok, out, err) = run("nbdinfo", &[&uri]);
    assert!(ok, "uid 0 refused after the reload: {out}{err}");
    assert!(s.log_text().contains("access: export \"\": allow uid:0"), "{}", s.log_text());
}

#[test]
fn check_shows_the_rules_and_doubts_tls_rules_without_tls() {
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "allow = [\"10.0.0.0/8\"]\n[[export]]\nname = \"vm7\"\nspec = \"memory:1M\"\nallow = [\"psk:node7\"]\n");
    let out = output(std::process::Command::new(env!("CARGO_BIN_EXE_sluice")).args(["serve", "--check", "--config", file.to_str().unwrap(), "--deny", "10.9.0.0/16"]));
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("access: server: allow 10.0.0.0/8; deny 10.9.0.0/16"), "{text}");
    assert!(text.contains("access: export \"vm7\": allow psk:node7"), "{text}");
    assert!(text.contains("warning: access rule psk:node7 can match no one: TLS is off"), "{text}");
    // A bad rule names its key and says why.
    let file = config(dir.path(), "[[export]]\nspec = \"memory:1M\"\nread-only-for = [\"all\", \"10.1.2.3/16\"]\n");
    let out = output(std::process::Command::new(env!("CARGO_BIN_EXE_sluice")).args(["serve", "--check", "--config", file.to_str().unwrap()]));
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("export[0].read-only-for") && err.contains("[1]") && err.contains("bits are set past the /16 prefix"), "{err}");
    let out = output(std::process::Command::new(env!("CARGO_BIN_EXE_sluice")).args(["serve", "--check", "--allow", "node7"]));
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not an address"), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn with_tls_offered_a_plaintext_client_matches_no_tls_rule() {
    require!("certtool", "psktool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "tls = \"on\"\n[[export]]\nname = \"vm7\"\nspec = \"memory:1M\"\nallow = [\"x509-cn:alice\", \"psk:alice\"]\n[[export]]\nname = \"open\"\nspec = \"memory:1M\"\n");
    let s = start_with(&file, &["--tls-certificates", keys.server_dir().to_str().unwrap()]);
    let names = |c: &mut Client| -> Vec<String> {
        let list = c.ask(OPT_LIST, &[]);
        list.iter().filter(|r| r.kind == REP_SERVER).map(|r| String::from_utf8_lossy(&r.data[4..]).into_owned()).collect()
    };
    let mut c = Client::tcp(s.port);
    c.start();
    assert_eq!(names(&mut c), ["open"], "plaintext: vm7 is not listed");
    assert_eq!(c.ask(OPT_INFO, &info_data("vm7", &[])).last().unwrap().kind, REP_ERR_UNKNOWN);
    // Under TLS without a client certificate, still nobody the rules name.
    assert_eq!(c.ask(OPT_STARTTLS, &[]).last().unwrap().kind, REP_ACK);
    c.start_tls(&keys.ca_dir()).expect("TLS handshake");
    assert_eq!(names(&mut c), ["open"], "TLS without a certificate: vm7 is not listed");
    assert_eq!(c.ask(OPT_GO, &info_data("vm7", &[])).last().unwrap().kind, REP_ERR_UNKNOWN);
    let e = c.go("open", true, false);
    assert_eq!(e.size, 1 << 20);
}

/// Connects over TCP, sends STARTTLS, and runs a TLS 1.3 handshake offering only `suite`,
/// with `identity` and `key` as the client's pre-shared key (the server's certificate is
/// not checked); then asks GO for `export` and returns the final reply's type.
fn go_with_psk(s: &Sluice, suite: &str, identity: &'static str, key: Vec<u8>, export: &str) -> u32 {
    use openssl::ssl::{SslConnector, SslMethod, SslVerifyMode, SslVersion};
    let mut c = Client::tcp(s.port);
    c.start();
    assert_eq!(c.ask(OPT_STARTTLS, &[]).last().unwrap().kind, REP_ACK);
    let Stream::Tcp(tcp) = std::mem::replace(&mut c.stream, Stream::Upgrading) else { panic!("a TCP client") };
    let mut b = SslConnector::builder(SslMethod::tls_client()).unwrap();
    b.set_verify(SslVerifyMode::NONE);
    b.set_min_proto_version(Some(SslVersion::TLS1_3)).unwrap();
    b.set_ciphersuites(suite).unwrap();
    b.set_psk_client_callback(move |_, _hint, id, out| {
        id[..identity.len()].copy_from_slice(identity.as_bytes());
        id[identity.len()] = 0;
        out[..key.len()].copy_from_slice(&key);
        Ok(key.len())
    });
    let connector = b.build().configure().unwrap().verify_hostname(false).use_server_name_indication(false);
    match connector.connect("localhost", tcp) {
        Ok(tls) => c.stream = Stream::Tls(Box::new(tls)),
        Err(_) => return u32::MAX,
    }
    c.ask(OPT_GO, &info_data(export, &[])).last().unwrap().kind
}

#[test]
fn a_psk_identity_counts_only_when_the_client_proved_it_holds_the_key() {
    require!("certtool", "psktool");
    let keys = Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let file = config(dir.path(), "tls = \"require\"\n[[export]]\nname = \"vm7\"\nspec = \"memory:1M\"\nallow = [\"psk:alice\"]\n");
    let s = start_with(&file, &["--tls-certificates", keys.server_dir().to_str().unwrap(), "--tls-psk", keys.psk_file().to_str().unwrap()]);
    let psk = std::fs::read_to_string(keys.psk_file()).unwrap();
    let hex = psk.lines().find_map(|l| l.strip_prefix("alice:")).expect("alice's key").trim().to_owned();
    let key: Vec<u8> = (0..hex.len()).step_by(2).map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap()).collect();
    // The key holder, with the SHA-256 suite PSKs pair with: served.
    assert_eq!(go_with_psk(&s, "TLS_AES_128_GCM_SHA256", "alice", key.clone(), "vm7"), REP_ACK);
    // Naming alice without her key, with a suite whose hash makes OpenSSL drop the PSK
    // unchecked and fall back to the certificate: TLS may succeed, but not as alice.
    let forged = go_with_psk(&s, "TLS_AES_256_GCM_SHA384", "alice", vec![0x5a; 32], "vm7");
    assert!(forged == REP_ERR_UNKNOWN || forged == u32::MAX, "a client without alice's key opened vm7 (reply {forged:#x})");
    assert_eq!(s.log_text().matches("opened export \"vm7\"").count(), 1, "only the key holder opened vm7:\n{}", s.log_text());
}
