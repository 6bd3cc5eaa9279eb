//! A throwaway single-node Ceph cluster (scripts/ceph-cluster: one monitor, one manager,
//! one memstore OSD, authentication off) in a temporary directory, stopped by process id
//! when dropped, or at exit for the one the tests of a binary share.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;

use super::run;

const SCRIPT: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../scripts/ceph-cluster");

/// Skips the test (loudly; fails in CI) unless the Ceph daemons and tools are installed.
#[macro_export]
macro_rules! require_ceph {
    () => {
        require!("ceph-mon", "ceph-osd", "ceph-mgr", "ceph", "rbd", "monmaptool");
    };
}

pub struct Ceph {
    dir: tempfile::TempDir,
    pub conf: PathBuf,
    /// Prints the cluster's state and stops it if the test runner stops the test.
    _report: super::timeout::Registered,
}

impl Ceph {
    /// Starts a cluster with pool "rbd" ready; `extra` is appended to its ceph.conf's
    /// [client] section (for settings such as operation timeouts).
    pub fn start(extra: &str) -> Ceph {
        let dir = tempfile::tempdir().expect("tempdir");
        let out = Command::new(SCRIPT).arg("start").arg(dir.path()).output().expect("run scripts/ceph-cluster");
        let path = dir.path().to_owned();
        let report = super::timeout::on_timeout("the Ceph cluster", move || {
            let state = state_of(&path);
            stop(&path);
            state
        });
        let ceph = Ceph { conf: dir.path().join("ceph.conf"), dir, _report: report };
        if !out.status.success() {
            panic!(
                "the Ceph cluster did not start: {}\n{}\nmonitor log tail: {}",
                String::from_utf8_lossy(&out.stderr),
                String::from_utf8_lossy(&out.stdout),
                ceph.log_tail("mon.a.log")
            );
        }
        if !extra.is_empty() {
            let mut text = std::fs::read_to_string(&ceph.conf).unwrap();
            text.push_str(&format!("[client]\n{extra}\n"));
            std::fs::write(&ceph.conf, text).unwrap();
        }
        ceph
    }

    pub fn conf(&self) -> &str {
        self.conf.to_str().unwrap()
    }

    /// `rbd -c CONF ARGS...`; panics with rbd's message on failure.
    pub fn rbd(&self, args: &[&str]) -> String {
        let mut all = vec!["-c", self.conf()];
        all.extend_from_slice(args);
        let (ok, out, err) = run("rbd", &all);
        assert!(ok, "rbd {args:?} failed: {err}");
        out
    }

    /// A new image of `size` (`64M`, ...) in pool "rbd", with a name no other test uses.
    pub fn image(&self, size: &str) -> String {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let name = format!("img{}", NEXT.fetch_add(1, Ordering::Relaxed));
        self.rbd(&["create", "--size", size, &format!("rbd/{name}")]);
        name
    }

    /// `ceph osd pause`: every client holds its reads and writes until `unpause`, as
    /// when the storage below stops answering. The cluster itself undoes it, always.
    pub fn pause(&self) {
        self.script("pause");
    }

    pub fn unpause(&self) {
        self.script("unpause");
    }

    /// The cluster's health, flags and placement groups, for a failing test's message.
    pub fn state(&self) -> String {
        state_of(self.dir.path())
    }

    fn script(&self, what: &str) {
        let ok = Command::new(SCRIPT).arg(what).arg(self.dir.path()).status().is_ok_and(|s| s.success());
        assert!(ok, "scripts/ceph-cluster {what} failed");
    }

    fn log_tail(&self, name: &str) -> String {
        super::tail(&self.dir.path().join("log").join(name), 20)
    }
}

fn state_of(dir: &Path) -> String {
    let out = Command::new(SCRIPT).arg("state").arg(dir).output();
    out.map(|o| String::from_utf8_lossy(&o.stdout).into_owned()).unwrap_or_else(|e| format!("no cluster state: {e}"))
}

fn stop(dir: &Path) {
    let _ = Command::new(SCRIPT).arg("stop").arg(dir).status();
}

impl Drop for Ceph {
    fn drop(&mut self) {
        stop(self.dir.path());
    }
}

static SHARED: OnceLock<Ceph> = OnceLock::new();

/// One cluster for every test of the binary that does not pause it, started by the
/// first to ask and stopped when the test process exits.
pub fn shared() -> &'static Ceph {
    SHARED.get_or_init(|| {
        extern "C" fn stop_shared() {
            if let Some(ceph) = SHARED.get() {
                stop(ceph.dir.path());
                let _ = std::fs::remove_dir_all(ceph.dir.path());
            }
        }
        let ceph = Ceph::start("");
        // SAFETY: registers a plain function to run at exit(3); it touches only the static.
        unsafe { libc::atexit(stop_shared) };
        ceph
    })
}
