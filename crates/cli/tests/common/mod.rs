//! Shared by the integration tests: start the real `sluice` binary, find the real clients,
//! skip loudly when one is missing.
#![allow(dead_code)]

pub mod ceph;
pub mod pool;
pub mod timeout;
pub mod tls;
pub mod vm;

use std::net::TcpListener;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const SLUICE: &str = env!("CARGO_BIN_EXE_sluice");

/// A running `sluice serve`, listening on a private Unix socket and a free TCP port.
pub struct Sluice {
    child: Option<Child>,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
    pub port: u16,
    pub log: PathBuf,
    args: Vec<String>,
    /// Environment variables the server is started with, beside the test's own.
    env: Vec<(String, String)>,
    /// Prints the log if the test runner stops the test for taking too long.
    _report: timeout::Registered,
}

impl Sluice {
    /// Starts `sluice serve ARGS... --unix SOCK --listen 127.0.0.1:PORT` and waits until
    /// it accepts connections.
    pub fn start(args: &[&str]) -> Sluice {
        Sluice::start_with_env(args, &[])
    }

    /// `start`, with these environment variables set for the server.
    pub fn start_with_env(args: &[&str], env: &[(&str, &str)]) -> Sluice {
        // free_port() releases the port before sluice binds it, so another test's outgoing
        // connection may take it in between: retry with a new port when that happens.
        for attempt in 1.. {
            let dir = tempfile::tempdir().expect("tempdir");
            let socket = dir.path().join("nbd.sock");
            let log = dir.path().join("sluice.log");
            let path = log.clone();
            let report = timeout::on_timeout(&format!("sluice serve {args:?}"), move || tail(&path, 60));
            let args = args.iter().map(|a| a.to_string()).collect();
            let env = env.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let mut s = Sluice { child: None, dir, socket, port: free_port(), log, args, env, _report: report };
            match s.spawn() {
                Ok(()) => return s,
                Err(text) if attempt < 5 && text.contains(&format!("cannot listen on 127.0.0.1:{}", s.port)) => continue,
                Err(text) => panic!("{text}"),
            }
        }
        unreachable!()
    }

    fn spawn(&mut self) -> Result<(), String> {
        let _ = std::fs::remove_file(&self.socket);
        let child = Command::new(SLUICE)
            .arg("serve")
            .args(&self.args)
            .arg("--unix")
            .arg(&self.socket)
            .args(["--listen", &format!("127.0.0.1:{}", self.port)])
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::OpenOptions::new().create(true).append(true).open(&self.log).expect("log file"))
            .spawn()
            .expect("spawn sluice");
        self.child = Some(child);
        self.wait_ready()
    }

    /// SIGSTOP, and waits (bounded) until every thread has stopped: the server keeps its
    /// connections and answers nothing (SIGKILL still ends it).
    pub fn pause(&self) {
        let pid = self.pid();
        signal(pid, libc::SIGSTOP);
        let stopped = || {
            let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else { return false };
            tasks.filter_map(Result::ok).all(|t| {
                let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
                // The state follows the command name's closing parenthesis.
                stat.rsplit_once(')').is_some_and(|(_, rest)| rest.trim_start().starts_with('T'))
            })
        };
        wait_until("sluice to stop (SIGSTOP)", Duration::from_secs(10), stopped, || self.log_text());
    }

    /// SIGKILL, then the same server again on the same port and socket (its log goes on).
    pub fn kill_and_restart(&mut self) {
        let mut child = self.child.take().unwrap();
        if let Some(status) = child.try_wait().unwrap() {
            panic!("sluice had already exited ({status}) when it was to be killed\n{}", self.log_text());
        }
        child.kill().unwrap();
        child.wait().unwrap();
        // The killed server's listening socket is gone with it; its port is free at once.
        self.spawn().unwrap_or_else(|e| panic!("restarting sluice: {e}"));
    }

    /// SIGKILL by pid, and waits for it; `restart` starts it again.
    pub fn kill(&mut self) {
        let child = self.child.as_mut().unwrap();
        if let Some(status) = child.try_wait().unwrap() {
            panic!("sluice had already exited ({status}) when it was to be killed\n{}", self.log_text());
        }
        signal(child.id(), libc::SIGKILL);
        child.wait().unwrap();
    }

    /// The same server again, on the same port and socket (its log goes on), after `kill`.
    pub fn restart(&mut self) {
        self.spawn().unwrap_or_else(|e| panic!("restarting sluice: {e}"));
    }

    fn wait_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            if UnixStream::connect(&self.socket).is_ok() && std::net::TcpStream::connect(("127.0.0.1", self.port)).is_ok() {
                return Ok(());
            }
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                return Err(format!("sluice exited early with {status}: {}", self.log_text()));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Err(format!("sluice did not start listening: {}", self.log_text()))
    }

    /// URI of the default export over the Unix socket.
    pub fn uri(&self) -> String {
        self.uri_for("")
    }

    pub fn uri_for(&self, export: &str) -> String {
        format!("nbd+unix:///{export}?socket={}", self.socket.display())
    }

    pub fn tcp_uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/", self.port)
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// Sends SIGTERM and waits (bounded) for the exit status.
    pub fn stop(mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        signal(child.id(), libc::SIGTERM);
        wait_timeout(&mut child, Duration::from_secs(15)).expect("sluice did not exit after SIGTERM")
    }

    /// Whether the server process is still running.
    pub fn alive(&mut self) -> bool {
        self.child.as_mut().unwrap().try_wait().unwrap().is_none()
    }
}

impl Drop for Sluice {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The last `lines` lines of a file (a log), or why there are none.
pub fn tail(path: &Path, lines: usize) -> String {
    match std::fs::read_to_string(path) {
        Ok(text) => {
            let all: Vec<&str> = text.lines().collect();
            all[all.len().saturating_sub(lines)..].join("\n")
        }
        Err(e) => format!("(cannot read {}: {e})", path.display()),
    }
}

pub fn signal(pid: u32, sig: i32) {
    // SAFETY: kill(2) with a pid we spawned; no memory is involved.
    unsafe { libc::kill(pid as i32, sig) };
}

pub fn wait_timeout(child: &mut Child, limit: Duration) -> Option<ExitStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if let Some(s) = child.try_wait().unwrap() {
            return Some(s);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let _ = child.kill();
    None
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port()
}

/// Whether an external program is on PATH.
pub fn have(tool: &str) -> bool {
    Command::new("sh").args(["-c", &format!("command -v {tool}")]).stdout(Stdio::null()).status().is_ok_and(|s| s.success())
}

/// Skips the calling test, loudly, when a tool is missing. CI installs them all.
#[macro_export]
macro_rules! require {
    ($($tool:expr),+) => {
        $(
            if !$crate::common::have($tool) {
                eprintln!("SKIPPED: {} is not installed (run ./scripts/test to install test dependencies)", $tool);
                if std::env::var_os("CI").is_some() {
                    panic!("{} is missing in CI", $tool);
                }
                return;
            }
        )+
    };
}

/// Runs a command (with /usr/bin first on PATH, for nbdsh's Python) with a time limit;
/// returns (success, stdout, stderr).
pub fn run(program: &str, args: &[&str]) -> (bool, String, String) {
    run_with_input(program, args, None)
}

pub fn run_with_input(program: &str, args: &[&str], input: Option<&[u8]>) -> (bool, String, String) {
    let path = format!("/usr/bin:/bin:{}", std::env::var("PATH").unwrap_or_default());
    let out = bounded(Command::new(program).args(args).env("PATH", path), input.map(<[u8]>::to_vec));
    (out.status.success(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `Command::output`, bounded: a program still running after `PROGRAM_TIMEOUT` is killed,
/// and its stderr ends with a line that says so.
pub fn output(command: &mut Command) -> std::process::Output {
    bounded(command, None)
}

/// `output` with `input` on the program's standard input, fed from a thread (so a full
/// stdout pipe cannot deadlock it; a program that exits before reading it all is no error).
pub fn bounded(command: &mut Command, input: Option<Vec<u8>>) -> std::process::Output {
    use std::io::Write;
    let mut child = command
        .stdin(if input.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {command:?}: {e}"));
    let feeder = input.map(|data| {
        let mut stdin = child.stdin.take().unwrap();
        std::thread::spawn(move || drop(stdin.write_all(&data)))
    });
    // The watchdog kills the program only if it has not exited by the deadline; told that
    // it has, it stops at once, so it never signals a process id that was reused since.
    let pid = child.id();
    let (exited, told) = std::sync::mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        let late = told.recv_timeout(PROGRAM_TIMEOUT) == Err(std::sync::mpsc::RecvTimeoutError::Timeout);
        if late {
            signal(pid, libc::SIGKILL);
        }
        late
    });
    let mut out = child.wait_with_output().unwrap();
    let _ = exited.send(());
    if let Some(feeder) = feeder {
        let _ = feeder.join();
    }
    if watchdog.join().unwrap_or(false) {
        let note = format!("\n[{command:?} was killed: it had not exited after {PROGRAM_TIMEOUT:?}]\n");
        out.stderr.extend_from_slice(note.as_bytes());
    }
    out
}

/// Longest an external program run by `run` may take before it is killed and its test
/// fails with what it printed. The slowest single program in the suite (a fio soak, a
/// qemu-img convert) takes well under half of it on the 2-core machine under load.
pub const PROGRAM_TIMEOUT: Duration = Duration::from_secs(120);

/// `run` on a thread of its own, for a program that must be running while the test does
/// something else; `join` it for the outcome (bounded by `PROGRAM_TIMEOUT`).
pub fn run_in_background(program: &str, args: &[&str]) -> std::thread::JoinHandle<(bool, String, String)> {
    let program = program.to_owned();
    let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
    std::thread::spawn(move || {
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        run(&program, &args)
    })
}

/// Waits until `done` is true, looking every 20 ms, at most `limit`; past it the test fails
/// saying what it waited for, with `logs()` (the server's log, a cluster's state).
pub fn wait_until(what: &str, limit: Duration, mut done: impl FnMut() -> bool, logs: impl Fn() -> String) {
    let deadline = Instant::now() + limit;
    while !done() {
        if Instant::now() >= deadline {
            panic!("waited {limit:?} for {what}, in vain\n{}", logs());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Deterministic pseudo-random bytes (xorshift), so failures reproduce.
/// Writes `sluice.toml` in `dir` and returns its path: aside, then renamed, so a server
/// reloading it never reads half a file.
pub fn write_config(dir: &Path, text: &str) -> PathBuf {
    let path = dir.join("sluice.toml");
    let aside = dir.join("sluice.toml.new");
    std::fs::write(&aside, text).unwrap();
    std::fs::rename(&aside, &path).unwrap();
    path
}

pub fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    let mut v = Vec::with_capacity(len);
    while v.len() < len {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        v.extend_from_slice(&x.to_le_bytes());
    }
    v.truncate(len);
    v
}

pub fn write_file(path: &Path, data: &[u8]) {
    std::fs::write(path, data).unwrap();
}

/// How long the server may take to open its metrics endpoint after its NBD listeners, or
/// to close a connection the client has closed; far more than it needs, so reaching it
/// means the server never did (a bug).
const SERVER_SETTLE_TIMEOUT: Duration = Duration::from_secs(10);

/// GET http://127.0.0.1:PORT/PATH with a plain socket; returns (status line, body).
/// sluice binds the metrics endpoint after its NBD listeners, which is all `Sluice::start`
/// waits for, so a refused connection is retried (bounded) until the endpoint listens.
pub fn http_get(port: u16, path: &str) -> (String, String) {
    use std::io::{Read, Write};
    let deadline = Instant::now() + SERVER_SETTLE_TIMEOUT;
    let mut s = loop {
        match std::net::TcpStream::connect(("127.0.0.1", port)) {
            Ok(s) => break s,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(e) => panic!("cannot connect to the metrics endpoint 127.0.0.1:{port}: {e}"),
        }
    };
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header and a body");
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

/// The value of the sample `name{labels}` (labels exactly as rendered) in a /metrics
/// body. sluice renders every series from the start, so a missing one is a failure.
pub fn sample(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map(|v| v.trim().parse().expect("a number"))
        .unwrap_or_else(|| panic!("no sample {series} in /metrics:\n{body}"))
}

/// /metrics once the server has closed every connection to `export`, for tests that count
/// requests. The server records a request only after its reply is sent, so a scrape right
/// after the reply arrived may miss it; a connection is closed only after all its requests
/// are recorded. The gauge is rendered after the counters, so the counters come from a
/// second scrape taken after the gauge read 0. Call it after the clients disconnected.
pub fn metrics_after_close(port: u16, export: &str) -> String {
    let gauge = format!("sluice_connections{{export=\"{export}\"}}");
    let deadline = Instant::now() + SERVER_SETTLE_TIMEOUT;
    loop {
        let open = sample(&http_get(port, "/metrics").1, &gauge);
        if open == 0.0 {
            return http_get(port, "/metrics").1;
        }
        assert!(
            Instant::now() < deadline,
            "{gauge} is still {open} {SERVER_SETTLE_TIMEOUT:?} after the clients disconnected"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

impl Sluice {
    /// Like `stop`, but also returns the server's log as it was at exit (the log file goes
    /// away with the Sluice), so shutdown-time messages can be checked.
    pub fn stop_with_log(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().unwrap();
        signal(child.id(), libc::SIGTERM);
        let status = wait_timeout(&mut child, Duration::from_secs(15)).expect("sluice did not exit after SIGTERM");
        (status, self.log_text())
    }
}

/// A foreground nbdkit on a private socket, killed on drop.
pub struct Nbdkit {
    child: Child,
    socket: PathBuf,
}

impl Nbdkit {
    pub fn start(dir: &Path, tag: &str, plugin_args: &[&str]) -> Nbdkit {
        let socket = dir.join(format!("{tag}.sock"));
        let child = Command::new("nbdkit")
            .args(["-f", "-U", socket.to_str().expect("a UTF-8 path")])
            .args(plugin_args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nbdkit");
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&socket).is_err() {
            assert!(
                Instant::now() < deadline,
                "nbdkit {plugin_args:?} did not start"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Nbdkit { child, socket }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }
}

impl Drop for Nbdkit {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Python for nbdsh: 64 reads of 4 KiB in flight at once through handle `h`, answered in
/// whatever order, each checked against `model` (a bytearray of the export's `size`).
pub const NBDSH_READS_IN_FLIGHT: &str = r#"
bufs = []
for i in range(64):
    off = random.randrange(0, size // 4096) * 4096
    b = nbd.Buffer(4096)
    h.aio_pread(b, off)
    bufs.append((b, off))
while h.aio_in_flight() > 0:
    h.poll(-1)
for b, off in bufs:
    assert b.to_bytearray() == model[off:off + 4096], "concurrent read at %d" % off
"#;
