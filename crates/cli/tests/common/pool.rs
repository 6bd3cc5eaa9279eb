//! Pools of real `sluice serve` members on Unix sockets, a `sluice serve --export
//! vol=pool:FILE` coordinator in front of them, and the waits the pool tests share. Every
//! process is killed when its value is dropped, so a failing test leaves none behind.

use super::{free_port, http_get, run, sample, signal, wait_timeout, SLUICE};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

pub const MIB: u64 = 1 << 20;
/// The metadata area at the start of every member.
pub const META_BYTES: u64 = MIB;
/// Far longer than any wait needs on a loaded two-core machine; reaching it is a bug.
pub const PATIENCE: Duration = Duration::from_secs(60);

/// Polls a pool client's member states every 50 ms until `ok` holds; panics with `what`
/// and the states when `PATIENCE` runs out.
pub async fn wait_states(pool: &sluice_client::Client, what: &str, ok: impl Fn(&[sluice_client::pool::MemberState]) -> bool) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = pool.pool_status().expect("a pool client has a pool status");
        let states: Vec<_> = status.members.iter().map(|m| m.state).collect();
        if ok(&states) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: members still {states:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Polls `check` every 50 ms until it yields a value; panics with `what` and the last
/// thing `check` saw when `PATIENCE` runs out.
pub fn wait_for<T>(what: &str, mut check: impl FnMut() -> Result<T, String>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        match check() {
            Ok(v) => return v,
            Err(last) if Instant::now() >= deadline => panic!("{what}: not so after {PATIENCE:?}; last seen: {last}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    }
}

/// Waits until a Unix socket accepts connections; when `child` exits first or never
/// listens, kills it and says why, with its log.
fn wait_listening(socket: &Path, child: &mut Child, log: &Path) -> Result<(), String> {
    let deadline = Instant::now() + PATIENCE;
    while UnixStream::connect(socket).is_err() {
        let why = match child.try_wait().unwrap() {
            Some(status) => format!("exited with {status}"),
            None if Instant::now() >= deadline => format!("did not listen within {PATIENCE:?}"),
            None => {
                std::thread::sleep(Duration::from_millis(20));
                continue;
            }
        };
        let _ = child.kill();
        let _ = child.wait();
        return Err(format!("{why}: {}", std::fs::read_to_string(log).unwrap_or_default()));
    }
    Ok(())
}

/// One pool member: `sluice serve FILE --unix SOCK --metrics 127.0.0.1:PORT`. The file and
/// the socket outlive the process, so a restarted member is the same member with its old
/// contents.
pub struct Member {
    pub file: PathBuf,
    pub socket: PathBuf,
    log: PathBuf,
    metrics_port: u16,
    child: Option<Child>,
}

impl Member {
    /// A sparse file of `META_BYTES + data_bytes`, served.
    pub fn new(dir: &Path, i: usize, data_bytes: u64) -> Member {
        let file = dir.join(format!("m{i}.img"));
        std::fs::File::create(&file).unwrap().set_len(META_BYTES + data_bytes).unwrap();
        let (socket, log) = (dir.join(format!("m{i}.sock")), dir.join(format!("m{i}.log")));
        let mut m = Member { file, socket, log, metrics_port: 0, child: None };
        m.start();
        m
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    /// Starts the server (again). free_port() lets the port go before sluice binds it, so
    /// another process may take it in between: a new port is tried when that happens.
    pub fn start(&mut self) {
        assert!(self.child.is_none(), "member {} is already running", self.socket.display());
        for _ in 0..5 {
            let _ = std::fs::remove_file(&self.socket);
            self.metrics_port = free_port();
            let mut child = Command::new(SLUICE)
                .args(["serve", self.file.to_str().unwrap(), "--unix", self.socket.to_str().unwrap()])
                .args(["--metrics", &format!("127.0.0.1:{}", self.metrics_port)])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&self.log).unwrap())
                .spawn()
                .expect("spawn sluice serve");
            match wait_listening(&self.socket, &mut child, &self.log) {
                Ok(()) => {
                    self.child = Some(child);
                    return;
                }
                Err(why) if why.contains("in use") => continue,
                Err(why) => panic!("member {}: {why}", self.socket.display()),
            }
        }
        panic!("member {}: no free metrics port in 5 tries", self.socket.display());
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("member running").id()
    }

    /// SIGKILL, and the exit reaped: every connection it had is closed.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("member running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGSTOP: the process keeps its connections but answers nothing.
    pub fn pause(&self) {
        signal(self.pid(), libc::SIGSTOP);
    }

    pub fn resume(&self) {
        signal(self.pid(), libc::SIGCONT);
    }

    /// Bytes this process has been asked to write and has answered, from its /metrics.
    pub fn bytes_written(&self) -> u64 {
        let (_, body) = http_get(self.metrics_port, "/metrics");
        sample(&body, r#"sluice_request_bytes_total{export="",op="write"}"#) as u64
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// What the file holds after the metadata area.
    pub fn data(&self) -> Vec<u8> {
        let mut bytes = std::fs::read(&self.file).unwrap();
        bytes.split_off(META_BYTES as usize)
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            // SIGKILL ends a stopped process too.
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// Four members of `member_data` bytes each (after their metadata) in a raid10 pool with
/// a 64 KiB stripe unit, initialized: mirror sets are members 0/1 and 2/3. The members
/// are killed before their directory goes.
pub struct Pool {
    pub members: Vec<Member>,
    /// `pool:FILE`
    pub spec: String,
    pub dir: tempfile::TempDir,
}

impl Pool {
    /// `extra` goes into the pool file as it is (`member-timeout = "1s"`, say).
    pub fn raid10(member_data: u64, extra: &str) -> Pool {
        let dir = tempfile::tempdir().unwrap();
        let members: Vec<Member> = (0..4).map(|i| Member::new(dir.path(), i, member_data)).collect();
        let uris: Vec<String> = members.iter().map(|m| format!("{:?}", m.uri())).collect();
        let text = format!("layout = \"raid10\"\nstripe-unit = \"64K\"\nmembers = [{}]\n{extra}\n", uris.join(", "));
        let file = dir.path().join("pool.toml");
        std::fs::write(&file, text).unwrap();
        let spec = format!("pool:{}", file.display());
        let (ok, out, err) = run(SLUICE, &["pool", "init", &spec]);
        assert!(ok, "pool init: {out}{err}");
        Pool { members, spec, dir }
    }

    /// `sluice pool status --json`, parsed.
    pub fn status(&self) -> serde_json::Value {
        let (ok, out, err) = run(SLUICE, &["pool", "status", "--json", &self.spec]);
        assert!(ok, "pool status: {err}");
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("pool status printed bad JSON ({e}):\n{out}"))
    }

    /// Waits until `pool status --json` satisfies `ok`, and returns that status.
    pub fn wait_status(&self, what: &str, ok: impl Fn(&serde_json::Value) -> bool) -> serde_json::Value {
        wait_for(what, || {
            let s = self.status();
            if ok(&s) {
                Ok(s)
            } else {
                Err(s.to_string())
            }
        })
    }

    /// Serves the pool as export "vol" on a socket of its own.
    pub fn serve(&self) -> Coordinator {
        Coordinator::start(self.dir.path(), &self.spec)
    }
}

/// Member states from a status, in member order.
pub fn states(status: &serde_json::Value) -> Vec<String> {
    status["members"].as_array().expect("members").iter().map(|m| m["state"].as_str().expect("state").to_owned()).collect()
}

pub fn all_in_sync(status: &serde_json::Value) -> bool {
    states(status).iter().all(|s| s == "in-sync")
}

/// `sluice serve --unix SOCK --export vol=pool:FILE`: the pool's coordinator.
pub struct Coordinator {
    pub socket: PathBuf,
    log: PathBuf,
    child: Option<Child>,
}

impl Coordinator {
    /// Starts it and waits until it listens, which it does once it has assembled the pool
    /// (after waiting out the lease of an owner that did not release it).
    pub fn start(dir: &Path, spec: &str) -> Coordinator {
        Coordinator::start_with(dir, spec, &[])
    }

    /// `start`, with more options for `sluice serve`.
    pub fn start_with(dir: &Path, spec: &str, args: &[&str]) -> Coordinator {
        static STARTED: AtomicUsize = AtomicUsize::new(0);
        let n = STARTED.fetch_add(1, Ordering::Relaxed);
        let (socket, log) = (dir.join(format!("vol{n}.sock")), dir.join(format!("vol{n}.log")));
        let mut child = Command::new(SLUICE)
            .args(["serve", "--unix", socket.to_str().unwrap(), "--export", &format!("vol={spec}")])
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn sluice serve of the pool");
        if let Err(why) = wait_listening(&socket, &mut child, &log) {
            panic!("the pool's server {why}");
        }
        Coordinator { socket, log, child: Some(child) }
    }

    pub fn uri(&self) -> String {
        format!("nbd+unix:///vol?socket={}", self.socket.display())
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("coordinator running").id()
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// SIGKILL: the pool is left owned, with its dirty bits set.
    pub fn kill(&mut self) {
        let mut child = self.child.take().expect("coordinator running");
        child.kill().unwrap();
        child.wait().unwrap();
    }

    /// SIGTERM, which releases the pool; returns the exit status and the log.
    pub fn stop(mut self) -> (ExitStatus, String) {
        let mut child = self.child.take().expect("coordinator running");
        signal(child.id(), libc::SIGTERM);
        let status = wait_timeout(&mut child, PATIENCE).expect("the pool's server did not exit after SIGTERM");
        (status, self.log_text())
    }

    /// Stops it and checks that it exited 0 without a panic.
    pub fn stop_clean(self) {
        let (status, log) = self.stop();
        assert_eq!(status.code(), Some(0), "the pool's server did not stop cleanly: {log}");
        assert!(!log.contains("panicked"), "{log}");
    }
}

impl Drop for Coordinator {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}
