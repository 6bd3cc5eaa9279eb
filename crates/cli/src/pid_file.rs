//! `sluice serve --pid-file FILE`: the server's pid, written once it listens and its
//! exports are open, removed when it exits cleanly. A file that names a live process is
//! another server's: refused, never overwritten. One that names a dead one is stale.

use std::path::{Path, PathBuf};

pub struct PidFile {
    path: PathBuf,
}

/// The pid FILE names, if it names a process that is running (and is not this one).
fn live_owner(path: &Path) -> Option<u32> {
    let text = std::fs::read_to_string(path).ok()?;
    let pid: u32 = text.trim().parse().ok()?;
    (pid != std::process::id() && Path::new(&format!("/proc/{pid}")).exists()).then_some(pid)
}

impl PidFile {
    /// Checks that FILE is free to take (absent, or stale); writes nothing yet.
    pub fn claim(path: &Path) -> Result<PidFile, String> {
        if let Some(pid) = live_owner(path) {
            return Err(format!("the pid file {} names pid {pid}, which is running: is another sluice serving?", path.display()));
        }
        Ok(PidFile { path: path.to_owned() })
    }

    /// Writes this process's pid, whole (aside, then renamed over FILE).
    pub fn write(&self) -> Result<(), String> {
        let aside = self.path.with_extension(format!("tmp.{}", std::process::id()));
        std::fs::write(&aside, format!("{}\n", std::process::id()))
            .and_then(|()| std::fs::rename(&aside, &self.path))
            .map_err(|e| format!("cannot write the pid file {}: {e}", self.path.display()))
    }

    /// Removes FILE if it still names this process.
    pub fn remove(&self) {
        let ours = std::fs::read_to_string(&self.path).is_ok_and(|t| t.trim() == std::process::id().to_string());
        if ours {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}
