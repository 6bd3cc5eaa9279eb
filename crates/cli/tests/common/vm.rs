//! Guests with Debian 12's kernel (6.1) under qemu, for what this host's kernel lacks: the
//! kernel's nbd client, kTLS, OCFS2 (scripts/vm builds and boots them). A test hands a
//! scenario from tests/vm/ and its parameters to one or two guests, and gets back each
//! check's line and the consoles.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use super::timeout;

fn repository() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..").canonicalize().expect("repository root")
}

/// Whether guests can be booted here: scripts/vm prepares them (downloads once, then a
/// cache). Missing, the calling test skips loudly; in CI it fails.
#[macro_export]
macro_rules! require_guests {
    () => {
        if let Err(why) = $crate::common::vm::prepare() {
            eprintln!("SKIPPED: no guests for the kernel tests: {why}");
            if std::env::var_os("CI").is_some() {
                panic!("guests cannot be prepared in CI: {why}");
            }
            return;
        }
    };
}

pub fn prepare() -> Result<(), String> {
    static PREPARED: std::sync::OnceLock<Result<(), String>> = std::sync::OnceLock::new();
    PREPARED
        .get_or_init(|| {
            let out = super::output(Command::new(repository().join("scripts/vm")).arg("prepare"));
            if out.status.success() {
                Ok(())
            } else {
                Err(String::from_utf8_lossy(&out.stderr).trim().to_owned())
            }
        })
        .clone()
}

/// How to boot the guests.
pub struct Options {
    pub nodes: u32,
    pub memory_mib: u32,
    pub cpus: u32,
    /// The guests are stopped after this long and the test fails.
    pub limit: Duration,
}

impl Default for Options {
    fn default() -> Options {
        Options { nodes: 1, memory_mib: 1024, cpus: 1, limit: Duration::from_secs(200) }
    }
}

/// Guests running a scenario. The share is /host in every guest; `tell`/`wait_for` pass
/// files through it when the host must act in the middle of a scenario.
pub struct Guests {
    pub share: tempfile::TempDir,
    child: Option<Child>,
    started: Instant,
    limit: Duration,
    _report: timeout::Registered,
}

/// What the guests printed, check by check.
pub struct Outcome {
    pub status: Option<i32>,
    pub output: String,
    pub took: Duration,
    /// What the guests left in the share.
    pub share: tempfile::TempDir,
}

impl Guests {
    /// Boots the guests with tests/vm/SCENARIO.sh and `env` (exported before it runs).
    pub fn start(scenario: &str, env: &[(&str, String)], options: Options) -> Guests {
        Guests::start_with(scenario, env, options, |_| {})
    }

    /// `start`, with `fill` putting files into the share (/host) before the guests boot.
    pub fn start_with(scenario: &str, env: &[(&str, String)], options: Options, fill: impl FnOnce(&Path)) -> Guests {
        let share = tempfile::tempdir().expect("tempdir");
        fill(share.path());
        let vm = repository().join("tests/vm");
        std::fs::copy(vm.join("lib.sh"), share.path().join("lib.sh")).expect("lib.sh");
        std::fs::copy(vm.join(format!("{scenario}.sh")), share.path().join("scenario.sh")).expect("the scenario");
        // The guest runs the binary this test was built against, and knows whether this is
        // CI (where a test that cannot run fails instead of skipping).
        let mut vars = format!("export SLUICE='{}'\n", super::SLUICE);
        if std::env::var_os("CI").is_some() {
            vars.push_str("export CI=1\n");
        }
        for (k, v) in env {
            assert!(!v.contains('\''), "{k}: quote-free values only");
            vars.push_str(&format!("export {k}='{v}'\n"));
        }
        std::fs::write(share.path().join("env.sh"), vars).unwrap();
        std::fs::write(share.path().join("run.sh"), ". /host/lib.sh\n. /host/env.sh\n. /host/scenario.sh\nfinish\n").unwrap();
        let output = std::fs::File::create(share.path().join("output.log")).unwrap();
        let child = Command::new(repository().join("scripts/vm"))
            .args(["run", "--nodes", &options.nodes.to_string(), "--memory", &options.memory_mib.to_string()])
            .args(["--cpus", &options.cpus.to_string(), "--timeout", &options.limit.as_secs().to_string()])
            .arg(share.path())
            .stdin(Stdio::null())
            .stdout(output.try_clone().unwrap())
            .stderr(output)
            .spawn()
            .expect("scripts/vm run");
        let consoles = share.path().to_owned();
        let report = timeout::on_timeout(&format!("guests running {scenario}"), move || consoles_of(&consoles));
        Guests { share, child: Some(child), started: Instant::now(), limit: options.limit, _report: report }
    }

    /// Waits for the guests to power off (scripts/vm stops them at their limit).
    pub fn finish(mut self) -> Outcome {
        let mut child = self.child.take().unwrap();
        // scripts/vm stops the guests at the limit; the margin covers its own clean-up.
        let status = super::wait_timeout(&mut child, self.limit + Duration::from_secs(30)).and_then(|s| s.code());
        let mut output = std::fs::read_to_string(self.share.path().join("output.log")).unwrap_or_default();
        if status.is_none() {
            // SIGTERM first: scripts/vm's exit trap stops the guests it started.
            super::signal(child.id(), libc::SIGTERM);
            if super::wait_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.kill();
                let _ = child.wait();
            }
            output.push_str(&format!("\nscripts/vm had not ended {:?} after its limit\n", Duration::from_secs(30)));
            output.push_str(&consoles_of(self.share.path()));
        }
        let share = std::mem::replace(&mut self.share, tempfile::tempdir().expect("tempdir"));
        Outcome { status, output, took: self.started.elapsed(), share }
    }

    /// Waits (bounded) until a guest creates `name` in the share.
    pub fn wait_for(&mut self, name: &str, limit: Duration) -> Result<(), String> {
        let deadline = Instant::now() + limit;
        let path = self.share.path().join(name);
        while !path.exists() {
            let ended = self.child.as_mut().unwrap().try_wait().unwrap().is_some();
            if ended || Instant::now() >= deadline {
                return Err(format!(
                    "waited for the guest's {name} {}\n{}",
                    if ended { "but the guests ended" } else { "in vain" },
                    consoles_of(self.share.path())
                ));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Creates `name` in the share, which a guest's `wait_host` is waiting for.
    pub fn tell(&self, name: &str) {
        std::fs::write(self.share.path().join(name), b"").unwrap();
    }

    pub fn path(&self, name: &str) -> PathBuf {
        self.share.path().join(name)
    }
}

/// Copies the files of directory `from` into `to` (created).
pub fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), to.join(entry.file_name())).unwrap();
    }
}

impl Drop for Guests {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // scripts/vm's exit trap stops the guests by pid.
            super::signal(child.id(), libc::SIGTERM);
            let _ = super::wait_timeout(&mut child, Duration::from_secs(10));
        }
    }
}

fn consoles_of(share: &Path) -> String {
    let mut text = String::new();
    for n in 1..=2 {
        let path = share.join(format!("console-{n}.log"));
        if path.exists() {
            text.push_str(&format!("--- console of node {n} (last lines)\n{}", super::tail(&path, 80)));
        }
    }
    text
}

impl Outcome {
    /// Lines "ok NAME (S s)".
    pub fn passed(&self) -> Vec<&str> {
        self.output.lines().filter_map(|l| l.trim_end().split_once("] ok ").map(|(_, r)| r)).collect()
    }

    pub fn failed(&self) -> Vec<&str> {
        self.output.lines().filter_map(|l| l.trim_end().split_once("] not ok ").map(|(_, r)| r)).collect()
    }

    /// Lines the scenario marked with `note`.
    pub fn notes(&self) -> Vec<&str> {
        self.output.lines().filter_map(|l| l.trim_end().split_once("] note ").map(|(_, r)| r)).collect()
    }

    /// Fails the test unless the scenario ran to its end, every check passed, and every
    /// one of `expected` passed on every node; `logs` adds the server's side.
    pub fn assert_passed(&self, expected: &[&str], logs: &str) {
        let passed_on = |node: &str, name: &str| {
            self.output.lines().any(|l| {
                l.trim_end().strip_prefix(node).and_then(|r| r.strip_prefix(" ok ")).and_then(|r| r.split(" (").next())
                    == Some(name)
            })
        };
        let nodes: Vec<&str> = ["[node 1]", "[node 2]"].into_iter().filter(|n| self.output.contains(n)).collect();
        let missing: Vec<String> = expected
            .iter()
            .flat_map(|e| nodes.iter().filter(|n| !passed_on(n, e)).map(move |n| format!("{n} {e}")))
            .collect();
        let passed = self.passed();
        let clean = self.status == Some(0) && self.failed().is_empty() && missing.is_empty();
        assert!(
            clean,
            "guest scenario failed (status {:?} after {:?}); failed: {:?}; never passed: {missing:?}\n{}\n--- server\n{logs}",
            self.status,
            self.took,
            self.failed(),
            self.output
        );
        for line in passed.iter().chain(self.notes().iter()) {
            eprintln!("{line}");
        }
    }
}
