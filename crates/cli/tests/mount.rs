//! `sluice mount`: the export as a FUSE file that losetup, mkfs.ext4 and mount can use, with
//! fsync, punch hole, read-only exports, clean exits and the errors before mounting.
mod common;
use common::*;

use std::fs;
use std::os::unix::fs::{FileExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const MIB: u64 = 1 << 20;

/// Longest a read or write through the mount may take before the test fails.
const IO_TIMEOUT: Duration = Duration::from_secs(60);

/// Skips the calling test, loudly, when the machine cannot mount FUSE or attach loop
/// devices (no /dev/fuse, no loop driver, not root). CI has them, so there it fails.
macro_rules! require_fuse_and_loop {
    () => {
        if let Some(missing) = fuse_and_loop_missing() {
            eprintln!("SKIPPED: {missing}");
            if std::env::var_os("CI").is_some() {
                panic!("{missing} in CI");
            }
            return;
        }
        require!("losetup", "mkfs.ext4", "mount", "umount");
    };
}

fn fuse_and_loop_missing() -> Option<String> {
    // SAFETY: geteuid has no preconditions and touches no memory.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not running as root (FUSE mounts and loop devices need it)".into());
    }
    if !Path::new("/dev/fuse").exists() {
        return Some("/dev/fuse is missing (no FUSE in this kernel or container)".into());
    }
    if !Path::new("/dev/loop-control").exists() {
        return Some("/dev/loop-control is missing (no loop devices)".into());
    }
    None
}

/// Whether `path` is a mount point now, from /proc/self/mountinfo (field 5).
fn mounted(path: &Path) -> bool {
    let info = fs::read_to_string("/proc/self/mountinfo").unwrap();
    let want = path.to_str().unwrap();
    info.lines().any(|l| l.split(' ').nth(4) == Some(want))
}

/// A running `sluice mount`. Dropping it stops the process and makes sure FILE is unmounted,
/// so a failed assertion leaves nothing behind.
struct FuseMount {
    child: Option<Child>,
    file: PathBuf,
    log: PathBuf,
}

impl FuseMount {
    /// Starts `sluice mount ARGS... URI FILE` and waits (bounded) until FILE is mounted.
    fn start(uri: &str, file: &Path, args: &[&str]) -> FuseMount {
        let log = file.with_extension("mount.log");
        let child = Command::new(SLUICE)
            .arg("mount")
            .args(args)
            .arg(uri)
            .arg(file)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(fs::File::create(&log).unwrap())
            .spawn()
            .expect("spawn sluice mount");
        let mut m = FuseMount { child: Some(child), file: file.to_path_buf(), log };
        let deadline = Instant::now() + Duration::from_secs(20);
        while !mounted(file) {
            if let Some(status) = m.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("sluice mount exited early with {status}: {}", m.log_text());
            }
            assert!(Instant::now() < deadline, "{} was not mounted in time: {}", file.display(), m.log_text());
            std::thread::sleep(Duration::from_millis(20));
        }
        m
    }

    fn log_text(&self) -> String {
        fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// SIGTERM, then the exit status (bounded wait).
    fn stop(mut self) -> ExitStatus {
        signal(self.pid(), libc::SIGTERM);
        self.wait_exit()
    }

    /// Waits (bounded) for the process to end on its own.
    fn wait_exit(&mut self) -> ExitStatus {
        let mut child = self.child.take().unwrap();
        match wait_timeout(&mut child, Duration::from_secs(30)) {
            Some(status) => status,
            None => {
                let _ = child.wait();
                panic!("sluice mount did not exit: {}", self.log_text());
            }
        }
    }
}

impl Drop for FuseMount {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            signal(child.id(), libc::SIGTERM);
            if wait_timeout(&mut child, Duration::from_secs(10)).is_none() {
                let _ = child.wait();
            }
        }
        if mounted(&self.file) {
            let _ = run("umount", &["-l", self.file.to_str().unwrap()]);
        }
    }
}

/// A loop device over a file; detached on drop.
struct LoopDev(String);

impl LoopDev {
    fn attach(file: &Path) -> LoopDev {
        let (ok, out, err) = run("losetup", &["--find", "--show", file.to_str().unwrap()]);
        assert!(ok, "losetup failed: {err}");
        LoopDev(out.trim().to_string())
    }
}

impl Drop for LoopDev {
    fn drop(&mut self) {
        let (ok, _, err) = run("losetup", &["-d", &self.0]);
        if !ok {
            eprintln!("losetup -d {} failed: {err}", self.0);
        }
    }
}

/// A filesystem mounted on a directory; unmounted on drop.
struct FsMount(PathBuf);

impl FsMount {
    fn mount(device: &str, dir: &Path) -> FsMount {
        let (ok, _, err) = run("mount", &[device, dir.to_str().unwrap()]);
        assert!(ok, "mount {device} failed: {err}");
        FsMount(dir.to_path_buf())
    }
}

impl Drop for FsMount {
    fn drop(&mut self) {
        let dir = self.0.to_str().unwrap();
        if !run("umount", &[dir]).0 {
            let _ = run("umount", &["-l", dir]);
        }
    }
}

fn run_ok(program: &str, args: &[&str]) -> String {
    let (ok, out, err) = run(program, args);
    assert!(ok, "{program} {args:?} failed: {err}");
    out
}

/// Runs blocking I/O on a FUSE file in a thread, so that a request the mount never answers
/// fails the test after a while instead of hanging it. The guards then kill `sluice mount`,
/// which makes the kernel fail the stuck request.
fn bounded<T: Send + 'static>(what: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(f());
    });
    match rx.recv_timeout(IO_TIMEOUT) {
        Ok(v) => v,
        Err(mpsc::RecvTimeoutError::Timeout) => panic!("{what} did not finish in {IO_TIMEOUT:?}"),
        Err(mpsc::RecvTimeoutError::Disconnected) => panic!("{what} failed"),
    }
}

/// A temporary directory by its canonical path (mountinfo shows canonical paths).
fn workdir() -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().canonicalize().unwrap();
    (dir, path)
}

fn sparse_file(path: &Path, size: u64) {
    fs::File::create(path).unwrap().set_len(size).unwrap();
}

fn same(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a == b
}

#[test]
fn ext4_over_a_loop_device_survives_remounting() {
    require_fuse_and_loop!();
    let (_dir, dir) = workdir();
    let disk = dir.join("disk.img");
    sparse_file(&disk, 256 * MIB);
    let server = Sluice::start(&["--export", &format!("disk={}", disk.display())]);
    let uri = server.uri_for("disk");
    let file = dir.join("nbd");
    let mnt = dir.join("mnt");
    fs::create_dir(&mnt).unwrap();
    let files: Vec<(&str, Vec<u8>)> =
        vec![("small.txt", b"hello from sluice mount\n".to_vec()), ("big.bin", pattern(5 * MIB as usize + 12345, 1)), ("sub/middle.bin", pattern(300_000, 2))];

    {
        let fuse = FuseMount::start(&uri, &file, &[]);
        let meta = fs::metadata(&file).unwrap();
        assert!(meta.is_file(), "FILE is not a regular file");
        assert_eq!(meta.len(), 256 * MIB, "size is not the export's");
        assert_eq!(meta.permissions().mode() & 0o777, 0o644);
        let lo = LoopDev::attach(&file);
        run_ok("mkfs.ext4", &["-q", "-F", &lo.0]);
        let fsm = FsMount::mount(&lo.0, &mnt);
        fs::create_dir(mnt.join("sub")).unwrap();
        for (name, data) in &files {
            let (path, data) = (mnt.join(name), data.clone());
            bounded("writing through ext4", move || fs::write(path, data).unwrap());
        }
        run_ok("sync", &[]);
        drop(fsm);
        drop(lo);
        let status = fuse.stop();
        assert!(status.success(), "sluice mount exited with {status} after SIGTERM");
        assert!(!mounted(&file), "FILE is still a mount point after sluice mount exited");
    }

    // A new mount process over the same server sees the filesystem, byte for byte.
    let fuse = FuseMount::start(&uri, &file, &[]);
    let lo = LoopDev::attach(&file);
    let fsm = FsMount::mount(&lo.0, &mnt);
    for (name, data) in &files {
        let path = mnt.join(name);
        let got = bounded("reading back through ext4", move || fs::read(path).unwrap());
        assert!(same(&got, data), "{name} differs after remounting ({} bytes, expected {})", got.len(), data.len());
    }
    drop(fsm);
    drop(lo);
    let status = fuse.stop();
    assert!(status.success(), "second sluice mount exited with {status}");
    assert!(!mounted(&file));
}

#[test]
fn fusermount_u_ends_the_process_with_status_0() {
    require_fuse_and_loop!();
    require!("fusermount3");
    let (_dir, dir) = workdir();
    let server = Sluice::start(&["--export", "mem=memory:64M"]);
    let file = dir.join("nbd");
    let mut fuse = FuseMount::start(&server.uri_for("mem"), &file, &[]);
    run_ok("fusermount3", &["-u", file.to_str().unwrap()]);
    let status = fuse.wait_exit();
    assert!(status.success(), "sluice mount exited with {status}: {}", fuse.log_text());
    assert!(!mounted(&file));
    assert!(!file.exists(), "the FILE sluice created is left behind");
}

/// Writes, fsyncs, punches a hole and zeroes a range through FILE; each must reach the
/// server's backing file and read back through FILE.
fn fsync_punch_and_zero(extra: &[&str]) {
    require!("fallocate");
    let (_dir, dir) = workdir();
    let disk = dir.join("disk.img");
    sparse_file(&disk, 16 * MIB);
    let server = Sluice::start(&["--export", &format!("disk={}", disk.display())]);
    let file = dir.join("nbd");
    let fuse = FuseMount::start(&server.uri_for("disk"), &file, extra);

    let data = pattern(2 * MIB as usize, 7);
    let (f, d) = (file.clone(), data.clone());
    bounded("write and fsync", move || {
        let f = fs::OpenOptions::new().read(true).write(true).open(&f).unwrap();
        f.write_all_at(&d, MIB).unwrap();
        f.sync_all().expect("fsync on the FUSE file");
    });
    let on_server = fs::read(&disk).unwrap();
    assert!(same(&on_server[MIB as usize..3 * MIB as usize], &data), "written data is not on the server after fsync");

    let (hole_at, hole_len) = (MIB + 128 * 1024, 256 * 1024u64);
    run_ok("fallocate", &["--punch-hole", "--offset", &hole_at.to_string(), "--length", &hole_len.to_string(), file.to_str().unwrap()]);
    let (zero_at, zero_len) = (2 * MIB, 64 * 1024u64);
    run_ok("fallocate", &["--zero-range", "--keep-size", "--offset", &zero_at.to_string(), "--length", &zero_len.to_string(), file.to_str().unwrap()]);

    let mut expected = data.clone();
    for (at, len) in [(hole_at, hole_len), (zero_at, zero_len)] {
        let from = (at - MIB) as usize;
        expected[from..from + len as usize].fill(0);
    }
    let (f, n) = (file.clone(), data.len());
    let back = bounded("read back", move || {
        let mut back = vec![0u8; n];
        fs::File::open(&f).unwrap().read_exact_at(&mut back, MIB).unwrap();
        back
    });
    assert!(same(&back, &expected), "FILE does not read back zeros where the hole and the zeroed range are");
    let on_server = fs::read(&disk).unwrap();
    assert!(same(&on_server[MIB as usize..3 * MIB as usize], &expected), "the server's file does not have the zeros");
    let status = fuse.stop();
    assert!(status.success(), "sluice mount exited with {status}");
}

#[test]
fn fsync_punch_hole_and_zero_range_reach_the_server() {
    require_fuse_and_loop!();
    fsync_punch_and_zero(&[]);
}

#[test]
fn fsync_punch_hole_and_zero_range_reach_the_server_with_direct_io() {
    require_fuse_and_loop!();
    fsync_punch_and_zero(&["--direct-io"]);
}

#[test]
fn read_only_mounts_are_0444_and_refuse_writes() {
    require_fuse_and_loop!();
    let (_dir, dir) = workdir();
    let disk = dir.join("disk.img");
    let content = pattern(4 * MIB as usize, 3);
    write_file(&disk, &content);
    let server = Sluice::start(&["--export", &format!("ro={},ro", disk.display()), "--export", &format!("rw={}", disk.display())]);
    for (export, args) in [("ro", &[][..]), ("rw", &["--read-only"][..])] {
        let file = dir.join(format!("nbd-{export}"));
        let fuse = FuseMount::start(&server.uri_for(export), &file, args);
        let meta = fs::metadata(&file).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o444, "{export}: mode");
        let err = fs::OpenOptions::new().write(true).open(&file).expect_err("opened a read-only mount for writing");
        assert_eq!(err.raw_os_error(), Some(libc::EROFS), "{export}: {err}");
        let f = file.clone();
        let got = bounded("reading a read-only mount", move || fs::read(f).unwrap());
        assert!(same(&got, &content), "{export}: reads differ from the export");
        let status = fuse.stop();
        assert!(status.success(), "{export}: sluice mount exited with {status}");
    }
}

#[test]
fn sigterm_while_a_loop_device_holds_the_file_detaches_then_exits_0() {
    require_fuse_and_loop!();
    let (_dir, dir) = workdir();
    let server = Sluice::start(&["--export", "mem=memory:32M"]);
    let file = dir.join("nbd");
    let mut fuse = FuseMount::start(&server.uri_for("mem"), &file, &[]);
    let lo = LoopDev::attach(&file);
    signal(fuse.pid(), libc::SIGTERM);
    let deadline = Instant::now() + Duration::from_secs(20);
    while mounted(&file) {
        assert!(Instant::now() < deadline, "FILE was not detached after SIGTERM: {}", fuse.log_text());
        std::thread::sleep(Duration::from_millis(20));
    }
    // Still served while the loop device uses it.
    let dev = lo.0.clone();
    bounded("reading through the loop device after detaching", move || {
        let mut buf = vec![0u8; 64 * 1024];
        fs::File::open(dev).unwrap().read_exact_at(&mut buf, MIB).unwrap();
    });
    assert!(fuse.child.as_mut().unwrap().try_wait().unwrap().is_none(), "sluice mount exited while still in use");
    drop(lo);
    let status = fuse.wait_exit();
    assert!(status.success(), "sluice mount exited with {status}: {}", fuse.log_text());
}

/// Runs `sluice mount ARGS...` expecting it to fail before mounting; returns (code, stderr).
fn mount_fails(args: &[&str]) -> (i32, String) {
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut child = Command::new(SLUICE).arg("mount").args(args).stdin(Stdio::null()).stdout(Stdio::null()).stderr(log.reopen().unwrap()).spawn().unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(60)).expect("sluice mount did not give up");
    let err = fs::read_to_string(log.path()).unwrap();
    assert!(!status.success(), "sluice mount {args:?} succeeded");
    (status.code().unwrap_or(-1), err)
}

#[test]
fn errors_before_mounting_have_clear_messages_and_exit_codes() {
    let (_dir, dir) = workdir();
    let file = dir.join("nbd");
    let f = file.to_str().unwrap();

    let (code, err) = mount_fails(&["http://example.com/disk", f]);
    assert_eq!(code, 2, "bad URI: {err}");
    assert!(err.contains("sluice mount:") && err.contains("URI"), "{err}");

    let unreachable = format!("nbd://127.0.0.1:{}/", free_port());
    let (code, err) = mount_fails(&[&unreachable, f]);
    assert_eq!(code, 1, "unreachable server: {err}");

    let server = Sluice::start(&["--export", "mem=memory:1M"]);
    let (code, err) = mount_fails(&[&server.uri_for("nope"), f]);
    assert_eq!(code, 1, "unknown export: {err}");
    if Path::new("/dev/fuse").exists() {
        assert!(err.contains("nope"), "{err}");
    }

    let (code, err) = mount_fails(&[&server.uri_for("mem"), dir.to_str().unwrap()]);
    assert_eq!(code, 2, "directory: {err}");
    assert!(err.contains("is a directory"), "{err}");

    assert!(!file.exists(), "a failed mount left FILE behind");
}

#[test]
fn seek_data_and_seek_hole_follow_the_exports_allocation() {
    require_fuse_and_loop!();
    use rustix::fs::SeekFrom;
    let (_dir, dir) = workdir();
    let disk = dir.join("sparse.img");
    sparse_file(&disk, 64 * MIB);
    let f = fs::OpenOptions::new().write(true).open(&disk).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &pattern(2 * MIB as usize, 1), 10 * MIB).unwrap();
    std::os::unix::fs::FileExt::write_all_at(&f, &pattern(4096, 2), 40 * MIB).unwrap();
    f.sync_all().unwrap();
    let server = Sluice::start(&["--export", &format!("disk={}", disk.display())]);
    let file = dir.join("nbd");
    let fuse = FuseMount::start(&server.uri_for("disk"), &file, &[]);
    let f = file.clone();
    let seeks = bounded("seeking in the mount", move || {
        let file = fs::File::open(f).unwrap();
        let seek = |whence: SeekFrom| rustix::fs::seek(&file, whence).map_err(|e| e.raw_os_error());
        [
            seek(SeekFrom::Data(0)),
            seek(SeekFrom::Hole(10 * MIB)),
            seek(SeekFrom::Data(12 * MIB)),
            seek(SeekFrom::Hole(40 * MIB)),
            seek(SeekFrom::Hole(0)),
            seek(SeekFrom::Data(41 * MIB)),
            seek(SeekFrom::Hole(41 * MIB)),
        ]
    });
    assert_eq!(
        seeks,
        [Ok(10 * MIB), Ok(12 * MIB), Ok(40 * MIB), Ok(40 * MIB + 4096), Ok(0), Err(libc::ENXIO), Ok(41 * MIB)],
        "SEEK_DATA/SEEK_HOLE through the mount"
    );
    assert!(fuse.stop().success());
}
