//! A raid10 pool used through the client library survives losing a member: a member killed
//! with SIGKILL during writes costs no write an error, comes back when restarted, gets only
//! the regions it missed, and then serves every byte alone when its partner is killed.
mod common;
use common::*;

use sluice_client::pool::MemberState;
use sluice_client::{Client, Options, Uri};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;
/// Data bytes per member after its 1 MiB of metadata: 8 write-intent regions of 4 MiB.
const MEMBER_DATA: u64 = 32 * MIB;

/// A `sluice serve FILE` on a socket of its own that survives its process, so that a
/// restarted member is the same member.
struct Member {
    file: PathBuf,
    socket: PathBuf,
    child: Option<Child>,
}

impl Member {
    fn new(dir: &Path, i: usize) -> Member {
        let file = dir.join(format!("m{i}.img"));
        std::fs::File::create(&file).unwrap().set_len(MIB + MEMBER_DATA).unwrap();
        let mut m = Member { file, socket: dir.join(format!("m{i}.sock")), child: None };
        m.start();
        m
    }

    fn uri(&self) -> String {
        format!("nbd+unix:///?socket={}", self.socket.display())
    }

    fn start(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
        let log = std::fs::File::create(self.file.with_extension("log")).unwrap();
        let child = Command::new(SLUICE)
            .args(["serve", self.file.to_str().unwrap(), "--unix", self.socket.to_str().unwrap()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("spawn sluice serve");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::os::unix::net::UnixStream::connect(&self.socket).is_err() {
            assert!(Instant::now() < deadline, "member {} did not start", self.socket.display());
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    fn kill(&mut self) {
        let mut child = self.child.take().expect("running");
        child.kill().unwrap();
        child.wait().unwrap();
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if self.child.is_some() {
            self.kill();
        }
    }
}

async fn write_range(pool: &Client, shadow: &mut [u8], from: u64, to: u64, seed: u64) {
    let chunk = 256 * 1024;
    let tasks: Vec<_> = (from..to)
        .step_by(chunk)
        .map(|at| {
            let data = pattern(chunk, seed ^ at);
            shadow[at as usize..][..chunk].copy_from_slice(&data);
            let pool = pool.clone();
            tokio::spawn(async move { pool.write(at, &data, false).await })
        })
        .collect();
    for t in tasks {
        t.await.unwrap().expect("a write to the pool failed although a copy was in sync");
    }
}

async fn wait_for(pool: &Client, what: &str, ok: impl Fn(&[MemberState]) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let status = pool.pool_status().expect("a pool client has a pool status");
        let states: Vec<MemberState> = status.members.iter().map(|m| m.state).collect();
        if ok(&states) {
            return;
        }
        assert!(Instant::now() < deadline, "{what}: members still {states:?}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_member_is_resynced_with_only_what_it_missed() {
    let dir = tempfile::tempdir().unwrap();
    let mut members: Vec<Member> = (0..4).map(|i| Member::new(dir.path(), i)).collect();
    let uris: Vec<String> = members.iter().map(|m| format!("{:?}", m.uri())).collect();
    let text = format!("layout = \"raid10\"\nstripe-unit = \"64K\"\nmembers = [{}]\n", uris.join(", "));
    let file = dir.path().join("pool.toml");
    std::fs::write(&file, text).unwrap();
    let spec = format!("pool:{}", file.display());
    let (ok, _, err) = run(SLUICE, &["pool", "init", &spec]);
    assert!(ok, "pool init: {err}");

    let pool = Client::connect_with(&Uri::parse(&spec).unwrap(), &Options::default()).await.expect("open the pool");
    let size = pool.size();
    assert_eq!(size, 2 * MEMBER_DATA);
    let mut shadow = vec![0u8; size as usize];
    write_range(&pool, &mut shadow, 0, 16 * MIB, 1).await;

    // Member 1 (set 0, with member 0) dies; writes touch only the first 8 MiB from now on,
    // which is 4 MiB of each set: one region of member 1's.
    members[1].kill();
    write_range(&pool, &mut shadow, 0, 8 * MIB, 2).await;
    wait_for(&pool, "member 1 declared missing", |s| s[1] == MemberState::Missing).await;

    members[1].start();
    wait_for(&pool, "member 1 resynced", |s| s.iter().all(|&m| m == MemberState::InSync)).await;
    let resynced = pool.pool_status().unwrap().resynced_bytes;
    assert!(resynced > 0 && resynced <= 8 * MIB, "resynced {resynced} bytes; member 1 missed at most two regions");

    // Its partner dies: every byte of set 0 now comes from the resynced member alone.
    members[0].kill();
    let chunk = 4 * MIB as usize;
    for (i, expected) in shadow.chunks(chunk).enumerate() {
        let at = (i * chunk) as u64;
        let got = pool.read_owned(at, vec![0; chunk]).await.expect("read the volume back");
        assert!(got == expected, "the volume did not read back what was written at {at}");
    }
    pool.disconnect().await;
}
