//! What each guardian says about its device, for `sluice attach --list` and `sluice
//! detach`: one small file per device under /run/sluice/attach, as `key=value` lines,
//! replaced whole (written aside, then renamed) so a reader never sees half of one.

use std::io;
use std::path::{Path, PathBuf};

/// Where the files live; `SLUICE_ATTACH_DIR` moves them (tests, unprivileged use).
pub fn dir() -> PathBuf {
    std::env::var_os("SLUICE_ATTACH_DIR").map_or_else(|| PathBuf::from("/run/sluice/attach"), PathBuf::from)
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    pub index: u32,
    pub uri: String,
    pub pid: u32,
    /// connected, reconnecting, refused: WHY, ...
    pub state: String,
    pub reconnects: u64,
    pub connections: usize,
}

fn path(dir: &Path, index: u32) -> PathBuf {
    dir.join(format!("nbd{index}"))
}

impl State {
    fn encode(&self) -> String {
        let state = self.state.replace('\n', " ");
        format!(
            "device=/dev/nbd{}\nuri={}\npid={}\nstate={state}\nreconnects={}\nconnections={}\n",
            self.index, self.uri, self.pid, self.reconnects, self.connections
        )
    }

    fn decode(text: &str) -> Option<State> {
        let mut s = State::default();
        for line in text.lines() {
            let (k, v) = line.split_once('=')?;
            match k {
                "device" => s.index = v.strip_prefix("/dev/nbd")?.parse().ok()?,
                "uri" => s.uri = v.to_owned(),
                "pid" => s.pid = v.parse().ok()?,
                "state" => s.state = v.to_owned(),
                "reconnects" => s.reconnects = v.parse().ok()?,
                "connections" => s.connections = v.parse().ok()?,
                _ => {}
            }
        }
        (s.pid != 0).then_some(s)
    }

    pub fn write(&self, dir: &Path) -> io::Result<()> {
        std::fs::create_dir_all(dir)?;
        let target = path(dir, self.index);
        let aside = dir.join(format!(".nbd{}.{}", self.index, std::process::id()));
        std::fs::write(&aside, self.encode())?;
        std::fs::rename(&aside, &target)
    }
}

/// This device's file, if any.
pub fn read(dir: &Path, index: u32) -> Option<State> {
    State::decode(&std::fs::read_to_string(path(dir, index)).ok()?)
}

/// Every device's file, by index.
pub fn read_all(dir: &Path) -> Vec<State> {
    let Ok(entries) = std::fs::read_dir(dir) else { return Vec::new() };
    let mut out: Vec<State> = entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.strip_prefix("nbd")?.parse::<u32>().ok())
        .filter_map(|i| read(dir, i))
        .collect();
    out.sort_by_key(|s| s.index);
    out
}

/// Removes this device's file if `pid` wrote it.
pub fn remove(dir: &Path, index: u32, pid: u32) {
    if read(dir, index).is_some_and(|s| s.pid == pid) {
        let _ = std::fs::remove_file(path(dir, index));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_state_reads_back_and_only_its_writer_removes_it() {
        let dir = tempfile::tempdir().unwrap();
        let s = State { index: 3, uri: "nbd://h:10809/d".into(), pid: 77, state: "refused: the size\nchanged".into(), reconnects: 2, connections: 4 };
        s.write(dir.path()).unwrap();
        let back = read(dir.path(), 3).unwrap();
        assert_eq!(back, State { state: "refused: the size changed".into(), ..s.clone() });
        assert_eq!(read_all(dir.path()), [back]);
        remove(dir.path(), 3, 78);
        assert!(read(dir.path(), 3).is_some());
        remove(dir.path(), 3, 77);
        assert_eq!(read_all(dir.path()), []);
    }
}
