//! `sluice serve` as a system service runs it: socket activation (`systemd-socket-activate`
//! stands in for systemd), readiness and status through `NOTIFY_SOCKET`, captive mode
//! (`--run`) and `--check`. Reloads are in reload.rs.
mod common;
use common::*;

use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A server started through `systemd-socket-activate`, which binds the listener, waits for
/// the first connection, and execs sluice with it (the same pid).
struct Activated {
    child: Child,
    log: PathBuf,
}

impl Activated {
    fn start(dir: &Path, listen: &str, extra_env: &[&str], serve_args: &[&str]) -> Activated {
        let log = dir.join("sluice.log");
        let mut command = Command::new("systemd-socket-activate");
        command.args(["-l", listen, "--fdname=nbd"]);
        for var in extra_env {
            command.args(["-E", var]);
        }
        let child = command
            .arg(SLUICE)
            .arg("serve")
            .args(serve_args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("systemd-socket-activate");
        let a = Activated { child, log };
        wait_until("systemd-socket-activate to listen", Duration::from_secs(10), || a.log_text().contains("Listening on"), || a.log_text());
        a
    }

    fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn stop(mut self) -> (std::process::ExitStatus, String) {
        signal(self.child.id(), libc::SIGTERM);
        let status = wait_timeout(&mut self.child, Duration::from_secs(15)).unwrap_or_else(|| panic!("sluice did not stop\n{}", self.log_text()));
        (status, self.log_text())
    }
}

impl Drop for Activated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// nbdinfo, then a round trip through nbdcopy: a patterned file in, read back out.
fn round_trip(dir: &Path, uri: &str) {
    let (ok, out, err) = run("nbdinfo", &["--size", uri]);
    assert!(ok, "nbdinfo {uri}: {err}");
    assert_eq!(out.trim(), (8u64 << 20).to_string());
    let (data, back) = (dir.join("data"), dir.join("back"));
    write_file(&data, &pattern(8 << 20, 24));
    let (ok, _, err) = run("nbdcopy", &[data.to_str().unwrap(), uri]);
    assert!(ok, "nbdcopy in: {err}");
    let (ok, _, err) = run("nbdcopy", &[uri, back.to_str().unwrap()]);
    assert!(ok, "nbdcopy out: {err}");
    assert!(std::fs::read(&back).unwrap() == std::fs::read(&data).unwrap(), "the data came back different");
}

#[test]
fn socket_activation_serves_on_the_inherited_tcp_listener_and_opens_no_default() {
    require!("systemd-socket-activate", "nbdinfo", "nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let server = Activated::start(dir.path(), &format!("127.0.0.1:{port}"), &[], &["memory:8M"]);
    round_trip(dir.path(), &format!("nbd://127.0.0.1:{port}/"));
    let (status, log) = server.stop();
    assert!(status.success(), "{status}\n{log}");
    let listening: Vec<&str> = log.lines().filter(|l| l.contains("listening on")).collect();
    assert_eq!(listening, [format!("sluice: info: listening on 127.0.0.1:{port}")], "{log}");
    // LISTEN_FDNAMES names it.
    assert!(log.contains(&format!("socket activation: given 127.0.0.1:{port} (named \"nbd\")")), "{log}");
}

#[test]
fn socket_activation_serves_on_an_inherited_unix_socket_and_leaves_its_file() {
    require!("systemd-socket-activate", "nbdinfo", "nbdcopy");
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("activated.sock");
    let server = Activated::start(dir.path(), socket.to_str().unwrap(), &[], &["memory:8M"]);
    round_trip(dir.path(), &format!("nbd+unix:///?socket={}", socket.display()));
    let (status, log) = server.stop();
    assert!(status.success(), "{status}\n{log}");
    assert!(log.contains(&format!("listening on unix:{}", socket.display())), "{log}");
    assert!(!log.contains("listening on 127.0.0.1"), "a default listener was opened too\n{log}");
    // The socket file belongs to whoever made it (systemd removes it with the unit).
    assert!(socket.exists(), "sluice removed a socket file it did not make");
}

/// The datagrams a server sends to its NOTIFY_SOCKET.
struct Manager {
    socket: UnixDatagram,
    path: PathBuf,
}

impl Manager {
    fn new(dir: &Path) -> Manager {
        let path = dir.join("notify.sock");
        Manager { socket: UnixDatagram::bind(&path).unwrap(), path }
    }

    /// The next message, or a failure after `limit` with the server's log.
    fn next(&self, limit: Duration, log: &dyn Fn() -> String) -> String {
        self.socket.set_read_timeout(Some(limit)).unwrap();
        let mut buf = vec![0u8; 4096];
        match self.socket.recv(&mut buf) {
            Ok(n) => String::from_utf8_lossy(&buf[..n]).into_owned(),
            Err(e) => panic!("no notification within {limit:?} ({e})\n{}", log()),
        }
    }

    /// Messages until one holds `line`; the others are returned with it.
    fn until(&self, line: &str, log: &dyn Fn() -> String) -> Vec<String> {
        let deadline = Instant::now() + Duration::from_secs(20);
        let mut seen = Vec::new();
        loop {
            let left = deadline.saturating_duration_since(Instant::now()).max(Duration::from_millis(1));
            let message = self.next(left, &|| format!("waiting for {line}, saw {seen:?}\n{}", log()));
            let done = message.lines().any(|l| l == line);
            seen.push(message);
            if done {
                return seen;
            }
        }
    }
}

#[test]
fn notify_socket_hears_ready_after_listening_then_reload_watchdog_and_stop() {
    require!("nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let manager = Manager::new(dir.path());
    let (socket, log) = (dir.path().join("nbd.sock"), dir.path().join("sluice.log"));
    let child = Command::new(SLUICE)
        .args(["serve", "--unix", socket.to_str().unwrap(), "memory:8M"])
        .env("NOTIFY_SOCKET", &manager.path)
        .env("WATCHDOG_USEC", "400000")
        .stdin(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut server = Reaped(child);
    let log_text = || std::fs::read_to_string(&log).unwrap_or_default();
    let first = manager.next(Duration::from_secs(20), &log_text);
    assert!(first.lines().any(|l| l == "READY=1"), "the first message is not READY=1: {first:?}");
    assert!(first.contains("STATUS=serving 1 export (\"\") to 0 clients"), "{first:?}");
    // Ready means ready: a client that connects now is greeted at once. It is the only
    // client, so the status line that counts one is about it.
    let mut client = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    client.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let mut greeting = [0u8; 8];
    std::io::Read::read_exact(&mut client, &mut greeting).unwrap_or_else(|e| panic!("no greeting after READY=1: {e}\n{}", log_text()));
    assert_eq!(&greeting, b"NBDMAGIC");
    manager.until("STATUS=serving 1 export (\"\") to 1 client", &log_text);
    drop(client);
    manager.until("STATUS=serving 1 export (\"\") to 0 clients", &log_text);
    // WATCHDOG_USEC=400000: pings every 200 ms.
    manager.until("WATCHDOG=1", &log_text);
    manager.until("WATCHDOG=1", &log_text);
    signal(server.0.id(), libc::SIGHUP);
    let reload = manager.until("READY=1", &log_text);
    let reloading = reload.iter().position(|m| m.lines().any(|l| l == "RELOADING=1"));
    assert!(reloading.is_some_and(|i| i + 1 < reload.len()), "no RELOADING=1 before READY=1: {reload:?}");
    assert!(reload[reloading.unwrap()].contains("MONOTONIC_USEC="), "{reload:?}");
    signal(server.0.id(), libc::SIGTERM);
    manager.until("STOPPING=1", &log_text);
    let status = wait_timeout(&mut server.0, Duration::from_secs(15)).expect("sluice did not stop");
    assert!(status.success(), "{status}\n{}", log_text());
}

/// A child process killed and reaped when the test ends, passed or not.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// `sluice serve --run COMMAND ARGS...`, bounded; returns the exit code and the log.
fn captive(args: &[&str]) -> (Option<i32>, String) {
    let out = output(Command::new(SLUICE).arg("serve").args(args).env("PATH", format!("/usr/bin:/bin:{}", std::env::var("PATH").unwrap_or_default())));
    (out.status.code(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn run_passes_the_uri_to_nbdinfo_nbdcopy_and_qemu_img_and_exits_with_the_commands_status() {
    require!("nbdinfo", "nbdcopy", "qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let seen = dir.path().join("seen");
    let data = dir.path().join("data");
    write_file(&data, &pattern(4 << 20, 7));
    let command = format!(
        "set -e; echo \"$uri|$unixsocket|$port|$exportname\" >'{seen}'; nbdinfo --size \"$uri\" >>'{seen}'; \
         nbdcopy '{data}' \"$uri\"; nbdcopy \"$uri\" '{seen}.back'; qemu-img info --output=json \"$uri\" >'{seen}.qemu'; exit 7",
        seen = seen.display(),
        data = data.display()
    );
    let (code, log) = captive(&["--run", &command, "memory:4M"]);
    assert_eq!(code, Some(7), "{log}");
    let text = std::fs::read_to_string(&seen).unwrap();
    let mut lines = text.lines();
    let fields: Vec<&str> = lines.next().unwrap().split('|').collect();
    let socket = fields[1];
    assert_eq!(fields[0], format!("nbd+unix:///?socket={socket}"));
    assert_eq!((fields[2], fields[3]), ("", ""), "{text}");
    assert_eq!(lines.next(), Some("4194304"));
    assert!(std::fs::read(format!("{}.back", seen.display())).unwrap() == std::fs::read(&data).unwrap());
    assert!(std::fs::read_to_string(format!("{}.qemu", seen.display())).unwrap().contains("\"virtual-size\": 4194304"));
    // The private socket's directory is gone.
    let private = Path::new(socket).parent().unwrap();
    assert!(!private.exists(), "{} outlived the server", private.display());
    assert!(!log.contains("listening on 127.0.0.1"), "--run opened the default listeners\n{log}");
    // Each connection's closing line tells what it moved: nbdcopy in, then nbdcopy out.
    assert!(log.contains("closed export \"\"; read 0 bytes, wrote 4194304 bytes: "), "{log}");
    assert!(log.contains("closed export \"\"; read 4194304 bytes, wrote 0 bytes: "), "{log}");
    // A Unix peer is named by its credentials (SO_PEERCRED): the clients ran as this user.
    let uid = std::os::unix::fs::MetadataExt::uid(&std::fs::metadata("/proc/self").unwrap());
    assert!(log.contains(&format!("nbd.sock uid={uid} pid=")), "{log}");
}

#[test]
fn run_with_a_tcp_listener_names_its_port_and_the_only_export() {
    require!("nbdinfo");
    let port = free_port();
    let listen = format!("127.0.0.1:{port}");
    let command = format!("test \"$uri\" = nbd://127.0.0.1:{port}/vm && test \"$port\" = {port} && test \"$exportname\" = vm && test -z \"$unixsocket\" && nbdinfo --size \"$uri\"");
    let (code, log) = captive(&["--listen", &listen, "--export", "vm=memory:1M", "--run", &command]);
    assert_eq!(code, Some(0), "{log}");
}

#[test]
fn run_passes_on_a_failure_and_a_signal() {
    let (code, log) = captive(&["--run", "exit 3", "memory:1M"]);
    assert_eq!(code, Some(3), "{log}");
    let (code, log) = captive(&["--run", "kill -TERM $$", "memory:1M"]);
    assert_eq!(code, Some(128 + libc::SIGTERM), "{log}");
    // A configuration without exports gives the command nothing to use: status 1, said.
    let dir = tempfile::tempdir().unwrap();
    let empty = dir.path().join("empty.toml");
    std::fs::write(&empty, "# nothing yet\n").unwrap();
    let (code, log) = captive(&["--config", empty.to_str().unwrap(), "--run", "true"]);
    assert_eq!(code, Some(1), "{log}");
    assert!(log.contains("--run: there is no export or no listener to point the command at"), "{log}");
}

#[test]
fn check_accepts_a_good_configuration_without_serving() {
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    std::fs::write(&image, vec![0u8; 1 << 20]).unwrap();
    let port = free_port();
    let config = dir.path().join("sluice.toml");
    let text = format!("listen = [\"127.0.0.1:{port}\"]\n[[export]]\nname = \"disk\"\nspec = \"{}\"\n[limits]\nconnections = 8\n", image.display());
    std::fs::write(&config, text).unwrap();
    let out = output(Command::new(SLUICE).args(["serve", "--check", "--config", config.to_str().unwrap()]));
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("export \"disk\""), "{stdout}");
    assert!(stdout.contains(&format!("listen on 127.0.0.1:{port}")), "{stdout}");
    assert!(stdout.ends_with("configuration OK\n"), "{stdout}");
    // Nothing was bound: the port is still free.
    std::net::TcpListener::bind(("127.0.0.1", port)).expect("--check left the port bound");
}

#[test]
fn check_refuses_bad_configurations_with_exit_2_and_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("unknown key", "colour = \"blue\"\n", "unknown field `colour`"),
        ("bad limit", "[limits]\nconnections = 0\n", "connections must be at least 1"),
        ("missing file", "[[export]]\nname = \"gone\"\nspec = \"/nonexistent/disk.img\"\n", "export \"gone\": cannot open /nonexistent/disk.img"),
        ("twice", "[[export]]\nname = \"a\"\nspec = \"memory:1M\"\n[[export]]\nname = \"a\"\nspec = \"null:1M\"\n", "export \"a\" is defined twice"),
        ("missing TLS files", "tls = \"require\"\ntls-certificates = \"/nonexistent/pki\"\n", "/nonexistent/pki"),
    ];
    for (what, text, reason) in cases {
        let config = dir.path().join("bad.toml");
        std::fs::write(&config, text).unwrap();
        let out = output(Command::new(SLUICE).args(["serve", "--check", "--config", config.to_str().unwrap()]));
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{what}: {stderr}");
        assert!(stderr.contains(reason), "{what}: expected {reason:?} in {stderr}");
        assert!(!String::from_utf8_lossy(&out.stdout).contains("configuration OK"), "{what}");
    }
}

#[test]
fn logs_carry_priorities_only_when_stderr_is_the_journal_stream() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().unwrap();
    for journal in [true, false] {
        let log = dir.path().join(format!("stderr-{journal}"));
        let file = std::fs::File::create(&log).unwrap();
        let meta = file.metadata().unwrap();
        // Another file's numbers: what a child whose stderr was redirected inherits.
        let ino = if journal { meta.ino() } else { meta.ino() + 1 };
        let child = Command::new(SLUICE)
            .args(["serve", "--run", "true", "memory:1M"])
            .env("JOURNAL_STREAM", format!("{}:{ino}", meta.dev()))
            .stdin(Stdio::null())
            .stderr(file)
            .spawn()
            .unwrap();
        let mut server = Reaped(child);
        let status = wait_timeout(&mut server.0, Duration::from_secs(30)).expect("sluice --run true did not end");
        assert!(status.success());
        let text = std::fs::read_to_string(&log).unwrap();
        let first = text.lines().next().unwrap_or_default();
        if journal {
            assert!(first.starts_with("<6>export \"\": memory backend"), "{text}");
            assert!(!text.contains("sluice: info:"), "{text}");
        } else {
            assert!(first.starts_with("sluice: info: export"), "{text}");
        }
    }
}

/// What systemd does with a socket unit: it keeps the listening socket across the
/// service's restarts. Two servers in turn get the same socket; a client that connects
/// between them waits in its queue and is served by the second. (The first must not shut
/// the socket down when it stops.)
#[test]
fn an_inherited_socket_outlives_the_server_for_the_next_one() {
    require!("nbdinfo", "python3");
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let ready = dir.path().join("ready");
    let script = format!(
        r#"
import os, socket, subprocess
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", {port}))
s.listen(16)
os.dup2(s.fileno(), 3)
def serve(command):
    line = "LISTEN_PID=$$ LISTEN_FDS=1 exec {sluice} serve --run '" + command + "' memory:1M"
    return subprocess.Popen(["sh", "-c", line], pass_fds=(3,))
print("first", serve("nbdinfo --size $uri").wait(timeout=60), flush=True)
# Between the two: a client connects, and waits in the socket's queue.
c = socket.create_connection(("127.0.0.1", {port}), timeout=60)
second = serve("while [ ! -e {ready} ]; do sleep 0.02; done; nbdinfo --size $uri")
assert c.recv(8) == b"NBDMAGIC", "the waiting client got no greeting"
open("{ready}", "w").close()
print("second", second.wait(timeout=60), flush=True)
"#,
        sluice = SLUICE,
        ready = ready.display()
    );
    let (ok, out, err) = run("python3", &["-c", &script]);
    assert!(ok, "{out}{err}");
    assert!(out.contains("first 0") && out.contains("second 0"), "{out}{err}");
}

#[test]
fn run_command_gets_sigterm_when_the_server_is_stopped_first() {
    let dir = tempfile::tempdir().unwrap();
    let started = dir.path().join("started");
    let command = format!("touch '{}'; exec sleep 60", started.display());
    let child = Command::new(SLUICE).args(["serve", "--run", &command, "memory:1M"]).stdin(Stdio::null()).stderr(Stdio::null()).spawn().unwrap();
    let mut server = Reaped(child);
    wait_until("the command to start", Duration::from_secs(20), || started.exists(), String::new);
    signal(server.0.id(), libc::SIGTERM);
    let status = wait_timeout(&mut server.0, Duration::from_secs(20)).expect("sluice did not stop");
    // The command was ended by SIGTERM, and its status passed on as a shell would.
    assert_eq!(status.code(), Some(128 + libc::SIGTERM));
}
