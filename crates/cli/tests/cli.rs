//! `sluice serve` on the command line: exit codes, error messages, --help, signals, config files.
mod common;
use common::*;

use std::io::Read;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// Starts `sluice serve ARGS` with stderr going to DIR/stderr; never on the default port.
fn spawn_serve(dir: &Path, args: &[&str]) -> Child {
    Command::new(SLUICE)
        .arg("serve")
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(dir.join("stderr")).unwrap())
        .spawn()
        .expect("spawn sluice")
}

/// Runs `sluice serve ARGS` expecting it to refuse to start: returns (exit code, stderr).
/// A Unix listener is always added, so a server that wrongly starts never takes port 10809;
/// it is killed after 10 s and the code is None.
fn serve_refuses(args: &[&str]) -> (Option<i32>, String) {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("refused.sock");
    let mut all = args.to_vec();
    all.extend(["--unix", sock.to_str().unwrap()]);
    let mut child = spawn_serve(dir.path(), &all);
    let status = wait_timeout(&mut child, Duration::from_secs(10));
    let _ = child.wait();
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    (status.and_then(|s| s.code()), stderr)
}

#[test]
fn missing_file_exits_2_with_a_message_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("no-such-disk.img");
    let missing = missing.to_str().unwrap();
    let (code, err) = serve_refuses(&[missing]);
    assert_eq!(code, Some(2), "stderr: {err}");
    assert!(err.contains(missing), "message does not name {missing}: {err}");
    // The same through --export.
    let spec = format!("d={missing}");
    let (code, err) = serve_refuses(&["--export", &spec]);
    assert_eq!(code, Some(2), "stderr: {err}");
    assert!(err.contains(missing), "message does not name {missing}: {err}");
}

#[test]
fn bad_size_exits_2_naming_the_size() {
    for args in [&["--export", "a=memory:12Q"][..], &["memory:12Q"], &["--export", "a=null:lots"]] {
        let (code, err) = serve_refuses(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        let size = args.last().unwrap().rsplit(':').next().unwrap();
        assert!(err.contains(size), "{args:?}: message does not name {size:?}: {err}");
    }
}

#[test]
fn other_bad_command_lines_exit_2_with_a_message() {
    let cases: &[&[&str]] = &[
        &["--threads", "0"],
        &["--log-level", "loud"],
        &["--listen", "not-an-address"],
        &["--export", "novalue"],
        &["--export", "a=memory:1M,rw"],
        &["--export", "a=memory:1M", "--export", "a=memory:2M"],
        &["--no-such-option"],
        &["--data-path", "fast"],
        &["--export", "a=memory:1M,data-path=zero-copy"],
        &["--chunk", "lots"],
        &["--chunk", "64M"],
        &["--metrics", "nowhere"],
        &["--busy-poll", "1001"],
        &["--busy-poll", "soon"],
    ];
    for args in cases {
        let (code, err) = serve_refuses(args);
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert!(!err.trim().is_empty(), "{args:?}: no message");
    }
}

#[test]
fn tcp_port_in_use_exits_1_saying_in_use() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let (code, err) = serve_refuses(&["--listen", &addr, "--export", "a=memory:1M"]);
    assert_eq!(code, Some(1), "stderr: {err}");
    assert!(err.contains("in use"), "message does not say the address is in use: {err}");
    assert!(err.contains(&addr), "message does not name {addr}: {err}");
}

#[test]
fn unix_socket_in_use_exits_1_and_leaves_the_first_server_alone() {
    require!("nbdinfo");
    let first = Sluice::start(&["--export", "a=memory:1M"]);
    let (code, err) = serve_refuses(&["--unix", first.socket.to_str().unwrap(), "--export", "b=memory:2M"]);
    assert_eq!(code, Some(1), "stderr: {err}");
    assert!(err.contains("in use"), "message does not say the socket is in use: {err}");
    let (ok, out, err) = run("nbdinfo", &["--size", &first.uri_for("a")]);
    assert!(ok && out.trim() == "1048576", "first server no longer serves: {out}{err}");
    assert_eq!(first.stop().code(), Some(0));
}

#[test]
fn serve_help_mentions_every_option_and_the_exit_codes() {
    let out = output(Command::new(SLUICE).args(["serve", "--help"]));
    assert!(out.status.success());
    let help = String::from_utf8(out.stdout).unwrap();
    for option in [
        "--listen",
        "--unix",
        "--export",
        "--read-only",
        "--config",
        "--threads",
        "--pin-threads",
        "--busy-poll",
        "--log-level",
        "--data-path",
        "--chunk",
        "--metrics",
        "--tls",
        "--tls-certificates",
        "--tls-psk",
        "--tls-verify-peer",
        "--help",
    ] {
        assert!(help.contains(option), "serve --help does not mention {option}:\n{help}");
    }
    for word in ["memory:", ",elastic", "floor=SIZE", "null:", "pool:FILE", "cache:FILE", "rbd:", "description=", "ro", "Exit status", "splice-direct", "data-path="] {
        assert!(help.contains(word), "serve --help does not mention {word:?}:\n{help}");
    }
    let out = output(Command::new(SLUICE).arg("--help"));
    assert!(out.status.success());
    assert!(String::from_utf8(out.stdout).unwrap().contains("serve"), "sluice --help does not list serve");
}

/// Every subcommand's --help reads at 80 columns: a long value name once pushed the
/// descriptions of `serve --help` into a column one word wide (860 lines).
#[test]
fn help_text_is_readable_at_80_columns() {
    for sub in ["serve", "info", "copy", "bench", "mount", "pool", "attach", "detach"] {
        let out = output(Command::new(SLUICE).args([sub, "--help"]).env("COLUMNS", "80"));
        assert!(out.status.success(), "{sub} --help failed");
        let help = String::from_utf8(out.stdout).unwrap();
        let squeezed: Vec<&str> = help.lines().filter(|l| l.len() - l.trim_start().len() > 50).collect();
        assert!(squeezed.len() < 3, "{sub} --help wraps into a narrow column at 80 columns:\n{help}");
    }
}

/// SIGINT alone (no SIGTERM fallback) stops the server with status 0.
#[test]
fn sigint_exits_0() {
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("s.sock");
    let mut child = spawn_serve(dir.path(), &["--unix", sock.to_str().unwrap(), "--export", "a=memory:1M"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while std::os::unix::net::UnixStream::connect(&sock).is_err() {
        assert!(Instant::now() < deadline, "sluice did not start listening");
        assert!(child.try_wait().unwrap().is_none(), "sluice exited early");
        std::thread::sleep(Duration::from_millis(20));
    }
    signal(child.id(), libc::SIGINT);
    let status = wait_timeout(&mut child, Duration::from_secs(15));
    let stderr = std::fs::read_to_string(dir.path().join("stderr")).unwrap();
    assert_eq!(status.and_then(|s| s.code()), Some(0), "after SIGINT: {status:?}\n{stderr}");
}

#[test]
fn read_only_flag_makes_nbdinfo_report_read_only() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    write_file(&disk, &pattern(1 << 20, 1));
    for (flag, expected) in [(None, "false"), (Some("--read-only"), "true")] {
        let mut args: Vec<&str> = flag.into_iter().collect();
        args.push(disk.to_str().unwrap());
        let s = Sluice::start(&args);
        let (ok, out, err) = run("nbdinfo", &[&s.uri()]);
        assert!(ok, "{err}");
        assert!(out.contains(&format!("is_read_only: {expected}")), "{flag:?}: expected is_read_only {expected}:\n{out}");
        assert_eq!(s.stop().code(), Some(0));
    }
}

/// Opens a raw connection and reads the 18-byte greeting; None when the server closed it
/// without one (a refused connection).
fn greeting(socket: &Path) -> Option<std::os::unix::net::UnixStream> {
    let mut c = std::os::unix::net::UnixStream::connect(socket).ok()?;
    c.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut g = [0u8; 18];
    c.read_exact(&mut g).ok()?;
    assert_eq!(&g[..8], b"NBDMAGIC");
    Some(c)
}

#[test]
fn toml_config_with_two_exports_and_limits_is_obeyed() {
    require!("nbdinfo", "nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    write_file(&disk, &pattern(8 << 20, 1));
    let config = dir.path().join("sluice.toml");
    std::fs::write(
        &config,
        format!(
            r#"
threads = 1
log-level = "debug"

[limits]
inflight-requests-per-connection = 4
connections = 3
handshake-timeout-ms = 60000

[[export]]
name = "disk"
spec = "{}"
description = "the data disk"

[[export]]
name = "scratch"
spec = "memory:2M"
read-only = true
"#,
            disk.display()
        ),
    )
    .unwrap();
    let s = Sluice::start(&["--config", config.to_str().unwrap()]);

    let (ok, out, err) = run("nbdinfo", &["--list", &s.uri()]);
    assert!(ok, "{err}");
    for line in
        ["export=\"disk\":", "description: the data disk", "export-size: 8388608", "export=\"scratch\":", "export-size: 2097152"]
    {
        assert!(out.contains(line), "missing {line:?}:\n{out}");
    }
    let ro: Vec<&str> = out.lines().filter(|l| l.contains("is_read_only")).map(str::trim).collect();
    assert_eq!(ro, ["is_read_only: false", "is_read_only: true"], "{out}");

    // Data through the file export, with nbdcopy keeping far more than 4 requests in flight.
    let src = dir.path().join("src.img");
    write_file(&src, &pattern(8 << 20, 2));
    let (ok, out, err) = run("nbdcopy", &["--connections=1", "--requests=64", src.to_str().unwrap(), &s.uri_for("disk")]);
    assert!(ok, "nbdcopy under a 4-request budget: {out}{err}");
    assert!(std::fs::read(&disk).unwrap() == pattern(8 << 20, 2), "backing file differs after the copy");

    // connections = 3: three clients idle in the handshake hold every slot. Connections the
    // readiness probe and the tools above left may take a moment to be released.
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut held = Vec::new();
    while held.len() < 3 {
        match greeting(&s.socket) {
            Some(c) => held.push(c),
            None => {
                assert!(Instant::now() < deadline, "could not open 3 connections with connections = 3");
                std::thread::sleep(Duration::from_millis(50));
            }
        }
    }
    assert!(greeting(&s.socket).is_none(), "a fourth connection was served with connections = 3");
    drop(held.pop());
    let deadline = Instant::now() + Duration::from_secs(10);
    while greeting(&s.socket).is_none() {
        assert!(Instant::now() < deadline, "a freed connection slot was never reused");
        std::thread::sleep(Duration::from_millis(50));
    }
    drop(held);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn unknown_config_keys_exit_2_naming_the_key() {
    let dir = tempfile::tempdir().unwrap();
    for (i, (text, key)) in [
        ("listne = []\n", "listne"),
        ("[limits]\nconections = 5\n", "conections"),
        ("[[export]]\nname = \"a\"\nspec = \"memory:1M\"\nreadonly = true\n", "readonly"),
    ]
    .into_iter()
    .enumerate()
    {
        let config = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&config, text).unwrap();
        let (code, err) = serve_refuses(&["--config", config.to_str().unwrap()]);
        assert_eq!(code, Some(2), "{text:?}: {err}");
        assert!(err.contains(key), "{text:?}: message does not name {key:?}: {err}");
    }
    let (code, err) = serve_refuses(&["--config", dir.path().join("absent.toml").to_str().unwrap()]);
    assert_eq!(code, Some(2), "missing config file: {err}");
    assert!(err.contains("absent.toml"), "message does not name the config file: {err}");
}

/// SERVER BUG (see the report): `serve --help` promises exit status 2 "for a bad command
/// line or config file", but an out-of-range limit in the config file exits 1, the status
/// for "cannot start", because limits are only checked in Server::bind.
#[test]
fn out_of_range_limits_in_the_config_file_exit_2() {
    let dir = tempfile::tempdir().unwrap();
    for (i, text) in [
        "[limits]\ninflight-requests-per-connection = 0\n",
        "[limits]\nconnections = 0\n",
        "[limits]\ninflight-bytes-per-connection = 4096\n",
    ]
    .into_iter()
    .enumerate()
    {
        let config = dir.path().join(format!("limits{i}.toml"));
        std::fs::write(&config, text).unwrap();
        let (code, err) = serve_refuses(&["--config", config.to_str().unwrap(), "--export", "a=memory:1M"]);
        assert!(!err.trim().is_empty(), "{text:?}: no message");
        assert_eq!(code, Some(2), "{text:?}: {err}");
    }
}

#[test]
fn bad_tls_settings_exit_2_at_start_naming_the_problem() {
    require!("certtool");
    let keys = tls::Keys::generate();
    let d = keys.dir.path();
    let server = keys.server_dir();
    let server = server.to_str().unwrap();
    // A key that does not belong to the certificate.
    let mismatched = d.join("mismatched");
    std::fs::create_dir(&mismatched).unwrap();
    std::fs::copy(keys.server_dir().join("server-cert.pem"), mismatched.join("server-cert.pem")).unwrap();
    std::fs::copy(keys.other_ca_server_dir().join("server-key.pem"), mismatched.join("server-key.pem")).unwrap();
    let no_key = d.join("no-key");
    std::fs::create_dir(&no_key).unwrap();
    std::fs::copy(keys.server_dir().join("server-cert.pem"), no_key.join("server-cert.pem")).unwrap();
    let bad_psk = d.join("bad.psk");
    std::fs::write(&bad_psk, "alice:00112233\nbob:xyz\n").unwrap();
    let empty_psk = d.join("empty.psk");
    std::fs::write(&empty_psk, "\n").unwrap();
    let cases: Vec<(Vec<String>, String)> = vec![
        (vec!["--tls=require".into()], "--tls needs --tls-certificates=DIR or --tls-psk=FILE".into()),
        (vec!["--tls=maybe".into()], "unknown TLS mode".into()),
        (vec!["--tls-certificates".into(), server.into()], "--tls is off".into()),
        (vec!["--tls=on".into(), "--tls-certificates=/nonexistent".into()], "/nonexistent is not a directory".into()),
        (vec!["--tls=on".into(), format!("--tls-certificates={}", no_key.display())], format!("cannot read {}", no_key.join("server-key.pem").display())),
        (vec!["--tls=on".into(), format!("--tls-certificates={}", mismatched.display())], "does not belong to".into()),
        (vec!["--tls=on".into(), format!("--tls-psk={}", bad_psk.display())], format!("{}, line 2", bad_psk.display())),
        (vec!["--tls=on".into(), format!("--tls-psk={}", empty_psk.display())], "holds no keys".into()),
        (vec!["--tls=on".into(), "--tls-psk=/nonexistent.psk".into()], "cannot read PSK file /nonexistent.psk".into()),
        (vec!["--tls=on".into(), format!("--tls-psk={}", keys.psk_file().display()), "--tls-verify-peer".into()], "--tls-verify-peer needs --tls-certificates".into()),
        (
            vec!["--tls=on".into(), format!("--tls-psk={}", keys.psk_file().display()), format!("--tls-certificates={server}"), "--tls-verify-peer".into()],
            "cannot be combined with --tls-psk".into(),
        ),
    ];
    for (args, message) in cases {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, stderr) = serve_refuses(&args);
        assert_eq!(code, Some(2), "{args:?}: {stderr}");
        assert!(stderr.contains(&message), "{args:?}: expected {message:?} in {stderr}");
    }
}

#[test]
fn tls_keys_in_the_config_file_are_obeyed() {
    require!("certtool", "nbdinfo");
    let keys = tls::Keys::generate();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("sluice.toml");
    let text = format!("tls = \"require\"\ntls-psk = \"{}\"\n[[export]]\nname = \"disk\"\nspec = \"memory:1M\"\n", keys.psk_file().display());
    std::fs::write(&config, text).unwrap();
    let s = Sluice::start(&["--config", config.to_str().unwrap()]);
    let (ok, out, err) = run("nbdinfo", &[&format!("nbd://localhost:{}/disk", s.port)]);
    assert!(!ok, "plaintext served under tls = \"require\": {out}");
    let uri = format!("nbds://alice@localhost:{}/disk?tls-psk-file={}", s.port, keys.psk_file().display());
    let (ok, out, _) = run("nbdinfo", &[&uri]);
    assert!(ok && out.contains("with TLS"), "{out}{err}");
    assert_eq!(s.stop().code(), Some(0));
}

/// --pid-file: written once the server accepts connections, naming it; a second server with
/// the same file refuses (exit 2) naming the pid; removed at a clean exit; a stale file (a
/// pid that cannot be running) is replaced.
#[test]
fn pid_file_is_written_when_serving_refused_while_live_and_removed_at_exit() {
    let dir = tempfile::tempdir().unwrap();
    let pid_file = dir.path().join("sluice.pid");
    let sock = dir.path().join("nbd.sock");
    let pid_arg = pid_file.to_str().unwrap();
    let mut first = spawn_serve(dir.path(), &["--unix", sock.to_str().unwrap(), "--pid-file", pid_arg, "memory:1M"]);
    let log = || std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
    wait_until("the pid file", Duration::from_secs(10), || pid_file.exists(), log);
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap(), format!("{}\n", first.id()));
    assert!(std::os::unix::net::UnixStream::connect(&sock).is_ok(), "the pid file came before the listener");

    let (code, err) = serve_refuses(&["--pid-file", pid_arg, "memory:1M"]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains(&format!("pid {}", first.id())) && err.contains(pid_arg), "{err}");
    assert_eq!(std::fs::read_to_string(&pid_file).unwrap(), format!("{}\n", first.id()), "the refused server touched the file");

    signal(first.id(), libc::SIGTERM);
    assert!(wait_timeout(&mut first, Duration::from_secs(10)).is_some_and(|s| s.success()), "{}", log());
    assert!(!pid_file.exists(), "the pid file outlived a clean exit");

    // A stale file: no process has a pid above the kernel's maximum (4194304).
    std::fs::write(&pid_file, "4194305\n").unwrap();
    let mut second = spawn_serve(dir.path(), &["--unix", sock.to_str().unwrap(), "--pid-file", pid_arg, "memory:1M"]);
    let expected = format!("{}\n", second.id());
    wait_until("the stale pid file replaced", Duration::from_secs(10), || std::fs::read_to_string(&pid_file).is_ok_and(|t| t == expected), log);
    signal(second.id(), libc::SIGTERM);
    assert!(wait_timeout(&mut second, Duration::from_secs(10)).is_some_and(|s| s.success()), "{}", log());
}

/// --exit-with-parent: a server whose parent shell is killed stops by itself.
#[test]
fn exit_with_parent_stops_the_server_when_its_parent_is_killed() {
    let dir = tempfile::tempdir().unwrap();
    let (sock, pid_file) = (dir.path().join("nbd.sock"), dir.path().join("server.pid"));
    let script = format!(
        "{SLUICE} serve --exit-with-parent --unix '{}' memory:1M 2>'{}' & echo $! >'{}'; wait",
        sock.display(),
        dir.path().join("stderr").display(),
        pid_file.display()
    );
    let mut shell = Command::new("sh").args(["-c", &script]).stdin(Stdio::null()).spawn().unwrap();
    let log = || std::fs::read_to_string(dir.path().join("stderr")).unwrap_or_default();
    wait_until("the server to listen", Duration::from_secs(10), || std::os::unix::net::UnixStream::connect(&sock).is_ok(), log);
    let server: u32 = std::fs::read_to_string(&pid_file).unwrap().trim().parse().unwrap();
    shell.kill().unwrap();
    shell.wait().unwrap();
    let proc = format!("/proc/{server}");
    // Gone, or a zombie waiting for init to reap it.
    let ended = || std::fs::read_to_string(format!("{proc}/stat")).map_or(true, |s| s.rsplit_once(')').is_some_and(|(_, r)| r.trim_start().starts_with('Z')));
    wait_until("the server to stop after its parent died", Duration::from_secs(15), ended, log);
}
