//! The Linux kernel's nbd client (nbd.ko and nbd-client 3.24, Debian 12's kernel 6.1 in a
//! guest under qemu) against `sluice serve` on this host. Each test boots a guest that
//! runs one scenario of tests/vm/ and checks what the server saw.

mod common;

use common::vm::{Guests, Options};
use common::Sluice;

const DATA_PATHS: [&str; 4] = ["copy", "direct", "splice", "splice-direct"];

/// Sparse image files in the server's directory, one per name.
fn images(server_dir: &std::path::Path, names: &[&str], bytes: u64) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            let path = server_dir.join(format!("{name}.img"));
            std::fs::File::create(&path).unwrap().set_len(bytes).unwrap();
            path.display().to_string()
        })
        .collect()
}

/// ext4 made, filled, read back after a reconnect and checked clean, on each data path.
#[test]
fn ext4_round_trip_on_each_data_path() {
    require_guests!();
    let dir = tempfile::tempdir().unwrap();
    let files = images(dir.path(), &DATA_PATHS, 256 << 20);
    let exports: Vec<String> =
        DATA_PATHS.iter().zip(&files).map(|(p, f)| format!("--export={p}={f},data-path={p}")).collect();
    let args: Vec<&str> = exports.iter().map(String::as_str).collect();
    let server = Sluice::start(&args);
    let guests = Guests::start(
        "ext4",
        &[("SERVER_PORT", server.port.to_string()), ("DATA_PATHS", DATA_PATHS.join(" "))],
        Options::default(),
    );
    let outcome = guests.finish();
    let expected: Vec<String> = DATA_PATHS.iter().map(|p| format!("ext4 on data path {p}")).collect();
    outcome.assert_passed(&expected.iter().map(String::as_str).collect::<Vec<_>>(), &server.log_text());
}

/// One export per data path, each a sparse file of `bytes`; the server's arguments.
fn data_path_exports(dir: &std::path::Path, bytes: u64) -> Vec<String> {
    let files = images(dir, &DATA_PATHS, bytes);
    DATA_PATHS.iter().zip(&files).map(|(p, f)| format!("--export={p}={f},data-path={p}")).collect()
}

fn start(args: &[String]) -> Sluice {
    Sluice::start(&args.iter().map(String::as_str).collect::<Vec<_>>())
}

/// fio write+verify, O_DIRECT, 4 KiB and 1 MiB requests, on each data path.
#[test]
fn fio_verify_on_each_data_path() {
    require_guests!();
    let dir = tempfile::tempdir().unwrap();
    let server = start(&data_path_exports(dir.path(), 128 << 20));
    let env = [("SERVER_PORT", server.port.to_string()), ("DATA_PATHS", DATA_PATHS.join(" "))];
    let outcome = Guests::start("fio", &env, Options::default()).finish();
    let expected: Vec<String> =
        DATA_PATHS.iter().flat_map(|p| [format!("fio 4K verify on {p}"), format!("fio 1M verify on {p}")]).collect();
    outcome.assert_passed(&expected.iter().map(String::as_str).collect::<Vec<_>>(), &server.log_text());
}

/// Discard and zeroout read back as zeros; FLUSH and FUA reach the server and are counted
/// there; a read-only export refuses writes; offsets past 4 GiB land where they should.
#[test]
fn discard_flush_fua_read_only_and_offsets_past_4_gib() {
    require_guests!();
    let dir = tempfile::tempdir().unwrap();
    let disk = images(dir.path(), &["disk"], 64 << 20).remove(0);
    let big_bytes: u64 = 5 << 30;
    let big = images(dir.path(), &["big"], big_bytes).remove(0);
    let ro = dir.path().join("ro.img");
    let ro_data = common::pattern(1 << 20, 7);
    common::write_file(&ro, &ro_data);
    let metrics = common::free_port();
    let args = [
        format!("--export=disk={disk}"),
        format!("--export=big={big}"),
        format!("--export=ro={},ro", ro.display()),
        format!("--metrics=127.0.0.1:{metrics}"),
    ];
    let server = start(&args);
    let fua_writes = 64;
    let big_at_mib = 4608; // 4.5 GiB
    let env = [
        ("SERVER_PORT", server.port.to_string()),
        ("FUA_WRITES", fua_writes.to_string()),
        ("RO_MD5", md5(&ro_data)),
        ("BIG_BYTES", big_bytes.to_string()),
        ("BIG_AT_MIB", big_at_mib.to_string()),
    ];
    let outcome = Guests::start("blocks", &env, Options::default()).finish();
    let far = outcome.share.path().join("far.bin");
    let expected = ["discard and zeroout read back as zeros", "FLUSH and FUA sent", "read-only export refuses writes", "offsets past 4 GiB"];
    outcome.assert_passed(&expected, &server.log_text());

    // The guest let every device go: once the server has closed them, every request is counted.
    let body = common::metrics_after_close(metrics, "disk");
    let count = |series: &str| common::sample(&body, series);
    let fua = count(r#"sluice_requests_fua_total{export="disk",op="write"}"#);
    assert!(fua >= fua_writes as f64, "{fua_writes} O_DSYNC writes sent, {fua} FUA writes counted\n{body}");
    assert!(count(r#"sluice_requests_total{export="disk",op="flush"}"#) >= 1.0, "no FLUSH counted\n{body}");
    assert!(count(r#"sluice_requests_total{export="disk",op="trim"}"#) >= 1.0, "no TRIM counted\n{body}");
    assert_eq!(std::fs::read(&ro).unwrap(), ro_data, "the read-only export's file changed");
    // What the guest wrote at 4.5 GiB is in the file there, not at the offset's low 32 bits.
    let written = std::fs::read(&far).expect("the guest's far.bin");
    let file = std::fs::File::open(&big).unwrap();
    let mut back = vec![0; written.len()];
    std::os::unix::fs::FileExt::read_exact_at(&file, &mut back, big_at_mib << 20).unwrap();
    assert!(back == written, "the bytes written at {big_at_mib} MiB are not in the file there");
}

fn md5(data: &[u8]) -> String {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("data");
    std::fs::write(&path, data).unwrap();
    let (ok, out, err) = common::run("md5sum", &[path.to_str().unwrap()]);
    assert!(ok, "md5sum: {err}");
    out.split_whitespace().next().unwrap().to_owned()
}

/// Thousands of small files created, renamed and removed on ext4; the same after a
/// remount, and e2fsck clean.
#[test]
fn many_small_files_on_ext4() {
    require_guests!();
    let dir = tempfile::tempdir().unwrap();
    let disk = images(dir.path(), &["disk"], 256 << 20).remove(0);
    let server = start(&[format!("--export=disk={disk}")]);
    let env =
        [("SERVER_PORT", server.port.to_string()), ("DIRS", "20".to_string()), ("FILES_PER_DIR", "100".to_string())];
    let outcome = Guests::start("smallfiles", &env, Options::default()).finish();
    outcome.assert_passed(&["many small files on ext4"], &server.log_text());
}

/// `nbd-client -C 4`: four connections, each served, fio write+verify across them.
#[test]
fn multi_conn_with_four_connections() {
    require_guests!();
    let dir = tempfile::tempdir().unwrap();
    let disk = images(dir.path(), &["disk"], 64 << 20).remove(0);
    let metrics = common::free_port();
    let server = start(&[format!("--export=disk={disk}"), format!("--metrics=127.0.0.1:{metrics}")]);
    let mut guests = Guests::start("multiconn", &[("SERVER_PORT", server.port.to_string())], Options::default());
    let seen = guests.wait_for("connected", std::time::Duration::from_secs(150));
    let (_, body) = common::http_get(metrics, "/metrics");
    guests.tell("counted");
    let outcome = guests.finish();
    outcome.assert_passed(&["nbd-client -C 4 with fio verify"], &server.log_text());
    seen.unwrap();
    let open = common::sample(&body, r#"sluice_connections{export="disk"}"#);
    assert_eq!(open, 4.0, "connections open while the guest used -C 4\n{body}");
}

/// nbd-client's TLS (certificate, key, CA, host name) against `--tls=require` with
/// `--tls-verify-peer`; a plaintext client is refused.
#[test]
fn tls_with_client_certificates() {
    require!("certtool", "psktool");
    require_guests!();
    let keys = common::tls::Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let disk = images(dir.path(), &["disk"], 64 << 20).remove(0);
    let server_dir = keys.server_dir();
    let args = [
        format!("--export=disk={disk}"),
        "--tls=require".to_string(),
        format!("--tls-certificates={}", server_dir.display()),
        "--tls-verify-peer".to_string(),
    ];
    let server = start(&args);
    let env = [("SERVER_PORT", server.port.to_string())];
    let outcome = Guests::start_with("tls", &env, Options::default(), |share| {
        common::vm::copy_dir(&keys.client_dir(), &share.join("pki"))
    })
    .finish();
    outcome.assert_passed(&["nbd-client over TLS with a client certificate", "plaintext client refused"], &server.log_text());
}

/// A raid10 pool served by sluice; a member is killed while the kernel client writes.
#[test]
fn pool_with_a_member_killed_mid_write() {
    require_guests!();
    let mut pool = common::pool::Pool::raid10(64 << 20, "member-timeout = \"2s\"");
    let server = start(&[format!("--export=vol={}", pool.spec)]);
    let mut guests = Guests::start("pool", &[("SERVER_PORT", server.port.to_string())], Options::default());
    let writing = guests.wait_for("writing", std::time::Duration::from_secs(150));
    if writing.is_ok() {
        pool.members[1].kill();
        guests.tell("killed");
    }
    let outcome = guests.finish();
    outcome.assert_passed(&["raid10 pool, a member killed mid-write"], &server.log_text());
    writing.unwrap();
}

/// What a server restart does to nbd-client 3.24's kernel device, pinned for each mode: a
/// request in flight across the restart never succeeds (EIO after `-t`, or a wait that
/// only `nbd-client -d` ends), the old device never comes back by itself, and every
/// acknowledged write is there for a new connection.
#[test]
fn server_restart_under_the_kernel_client() {
    require_guests!();
    let dir = tempfile::tempdir().unwrap();
    let disk = images(dir.path(), &["disk"], 64 << 20).remove(0);
    let mut server = start(&[format!("--export=disk={disk}")]);
    let mut guests = Guests::start("restart", &[("SERVER_PORT", server.port.to_string())], Options::default());
    let limit = std::time::Duration::from_secs(150);
    for n in 1..=3 {
        // The guest puts a read in flight while the server is stopped, then the server dies.
        let step = |guests: &mut Guests, name: String| {
            guests.wait_for(&name, limit).unwrap_or_else(|e| panic!("{e}\n--- server\n{}", server.log_text()))
        };
        step(&mut guests, format!("pause-{n}"));
        server.pause();
        guests.tell(&format!("paused-{n}"));
        step(&mut guests, format!("restart-{n}"));
        server.kill_and_restart();
        guests.tell(&format!("restarted-{n}"));
    }
    let outcome = guests.finish();
    outcome.assert_passed(
        &[
            "restart under nbd-client -t 15",
            "restart under netlink nbd-client without a timeout",
            "restart under ioctl nbd-client -persist",
        ],
        &server.log_text(),
    );
}

/// OCFS2 on two guests (o2cb over their private network): on one export, then on a raid10
/// pool served by sluice. Both mount, write, read each other's files, create files in one
/// directory at once, unmount; fsck.ocfs2 finds nothing to fix.
#[test]
fn ocfs2_on_two_nodes() {
    require_guests!();
    let dir = tempfile::tempdir().unwrap();
    let shared = images(dir.path(), &["shared"], 512 << 20).remove(0);
    let pool = common::pool::Pool::raid10(256 << 20, "");
    let server = start(&[format!("--export=shared={shared}"), format!("--export=vol={}", pool.spec)]);
    let env = [
        ("SERVER_PORT", server.port.to_string()),
        ("EXPORTS", "shared vol".to_string()),
        ("FILES_PER_NODE", "100".to_string()),
    ];
    let options = Options { nodes: 2, limit: std::time::Duration::from_secs(400), ..Options::default() };
    let outcome = Guests::start("ocfs2", &env, options).finish();
    outcome.assert_passed(
        &["o2cb cluster up", "OCFS2 on two nodes over shared", "OCFS2 on two nodes over vol", "o2cb cluster down"],
        &server.log_text(),
    );
}

/// Test binaries of this suite that need nothing the guest lacks, run inside it.
const IN_GUEST_TESTS: [&str; 6] = ["smoke", "nbdinfo", "nbdcopy", "protocol_handshake", "protocol_transmission", "hostile"];

/// The newest test binary NAME-HASH beside this one (cargo builds them together).
fn test_binary(name: &str) -> std::path::PathBuf {
    let deps = std::env::current_exe().unwrap().parent().unwrap().to_owned();
    let ours = |n: &str| {
        n.strip_prefix(name).and_then(|r| r.strip_prefix('-')).is_some_and(|h| h.len() == 16 && h.bytes().all(|b| b.is_ascii_hexdigit()))
    };
    std::fs::read_dir(&deps)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| ours(&e.file_name().to_string_lossy()))
        .max_by_key(|e| e.metadata().and_then(|m| m.modified()).ok())
        .unwrap_or_else(|| panic!("no test binary {name} in {}", deps.display()))
        .path()
}

/// sluice itself inside the 6.1 guest: every data path through nbdcopy and the kernel
/// client, a raid10 pool of members that run there too, and the suite's own tests that
/// need no host tools (the smoke, nbdinfo, nbdcopy, protocol and hostile-input binaries).
#[test]
fn sluice_serves_on_debian_12_kernel() {
    require_guests!();
    let binaries: Vec<String> = IN_GUEST_TESTS.iter().map(|n| test_binary(n).display().to_string()).collect();
    let env = [("DATA_PATHS", DATA_PATHS.join(" ")), ("TEST_BINARIES", binaries.join(" "))];
    let options = Options { memory_mib: 1536, cpus: 2, limit: std::time::Duration::from_secs(280), ..Options::default() };
    let outcome = Guests::start("inguest", &env, options).finish();
    let log = std::fs::read_to_string(outcome.share.path().join("sluice-guest.log")).unwrap_or_default();
    let mut expected = vec!["storage for the guest's exports".to_string(), "sluice starts on 6.1".to_string()];
    for p in DATA_PATHS {
        expected.push(format!("nbdcopy round trip on {p}"));
        expected.push(format!("kernel client on {p}"));
    }
    expected.push("raid10 pool in the guest".to_string());
    expected.extend(IN_GUEST_TESTS.iter().map(|n| format!("the {n} tests")));
    outcome.assert_passed(&expected.iter().map(String::as_str).collect::<Vec<_>>(), &log);
}

/// kTLS in the guest (its kernel has tls.ko): libnbd over TLS 1.3 and nbd-client over TLS
/// 1.2 get kTLS on the splice and direct paths, data verified; a handoff made wrong on
/// purpose fails the connection instead of corrupting data.
#[test]
fn ktls_in_the_guest() {
    require!("certtool", "psktool");
    require_guests!();
    let keys = common::tls::Keys::generate();
    let options = Options { memory_mib: 1536, ..Options::default() };
    let outcome = Guests::start_with("ktls", &[], options, |share| {
        common::vm::copy_dir(&keys.server_dir(), &share.join("pki-server"));
        common::vm::copy_dir(&keys.client_dir(), &share.join("pki-client"));
    })
    .finish();
    let log = std::fs::read_to_string(outcome.share.path().join("sluice-ktls.log")).unwrap_or_default();
    outcome.assert_passed(
        &[
            "the kernel offers kTLS",
            "sluice starts with TLS required",
            "libnbd TLS 1.3 over kTLS on splice",
            "libnbd TLS 1.3 over kTLS on direct",
            "nbd-client TLS 1.2 over kTLS",
            "a wrong send sequence number is caught",
            "a wrong receive sequence number is caught",
            "CPU per GiB with and without kTLS",
        ],
        &log,
    );
}

/// `sluice attach` in the guest: the kernel's nbd driver on sockets from sluice's guardian,
/// which reconnects them when the server is killed and restarted. A writer that notes every
/// acknowledged write sees no error and every such write reads back, on ext4 and through a
/// pool and a cached volume whose gateways restart (the cached volume's reads then hit its
/// RAM members), with 1 and 4 connections; nbd-client meets the same writer
/// and kill for comparison; a server away past --dead-timeout fails I/O cleanly and detach
/// works; another disk under the same name is refused; read-only holds at the block layer.
#[test]
fn attach_rides_through_server_restarts() {
    require_guests!();
    let options = Options { memory_mib: 1536, cpus: 2, limit: std::time::Duration::from_secs(400), ..Options::default() };
    require!("certtool");
    let keys = common::tls::Keys::generate();
    let env = [("SLUICE_ATTACH_DIR", "/tmp/attach".to_string())];
    let outcome = Guests::start_with("attach", &env, options, |share| {
        common::vm::copy_dir(&keys.server_dir(), &share.join("pki-server"));
        common::vm::copy_dir(&keys.client_dir(), &share.join("pki-client"));
    })
    .finish();
    let mut logs = String::new();
    for name in ["attach-ext4", "attach-short", "attach-mc", "attach-pool", "attach-cache", "server-cache", "server-cache-backing", "server-cache-members", "attach-swap", "attach-ro", "attach-tls", "server"] {
        let text = std::fs::read_to_string(outcome.share.path().join(format!("{name}.log"))).unwrap_or_default();
        logs.push_str(&format!("--- {name}.log\n{text}"));
    }
    outcome.assert_passed(
        &[
            "storage for the attach tests",
            "attach: ext4 across a kill -9 and restart",
            "nbd-client: the same writer and kill",
            "attach: past the dead timeout, then detach",
            "attach: 4 connections across a restart",
            "attach: a pool gateway restart",
            "attach: a cached volume's gateway restart",
            "attach: another disk under the same name is refused",
            "attach: read-only",
            "attach: nbds:// over kTLS across a restart",
        ],
        &logs,
    );
}
