//! `sluice mount URI FILE`: the export as one regular file, through FUSE, so `losetup` can
//! make it a block device. The FUSE filesystem's root inode is the file itself, mounted
//! over FILE (as libnbd's nbdfuse does). Runs in the foreground until FILE is unmounted
//! (`fusermount3 -u FILE`, `umount FILE`) or a SIGINT/SIGTERM/SIGHUP unmounts it.

use crate::client_cli::{self, fail, TlsArgs};
use crate::exit::{EXIT_FAILURE, EXIT_USAGE};
use crate::logger;
use crate::mount_fs::{ExportFile, Settings};
use fuser::{Config, MountOption, Session, SessionUnmounter};
use sluice_client::{Client, Options};
use std::fs;
use std::io;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Duration;
use tokio::signal::unix::{signal, Signal, SignalKind};

const CMD: &str = "mount";

/// The FUSE device; without it nothing can be mounted.
const DEV_FUSE: &str = "/dev/fuse";

/// Time allowed for the final flush and disconnect after unmounting.
const SHUTDOWN_TIMEOUT_MS: u64 = 30_000;

#[derive(clap::Args)]
#[command(
    long_about = "Expose an export as a single regular file through FUSE, mounted over FILE, \
so that `losetup` can turn it into a block device for mkfs and mount.\n\n\
FILE is created (empty) if it does not exist, and removed again at exit; it must not be a \
directory. The file's size is the export's; its mode is 0644, or 0444 when the export is \
read-only or --read-only is given. Reads and writes go to the server; fsync sends \
NBD_CMD_FLUSH; fallocate --punch-hole and --zero-range send NBD_CMD_WRITE_ZEROES.\n\n\
sluice mount stays in the foreground until FILE is unmounted (fusermount3 -u FILE, or \
umount FILE), or until SIGINT, SIGTERM or SIGHUP, which unmount FILE; it then exits 0. A \
FILE still in use (say, by a loop device) is detached instead, and served until its last \
user lets go. Mounting needs root or the fusermount3 helper (Debian package fuse3).",
    after_help = "EXAMPLES:
  sluice mount nbd://server/disk /tmp/disk &
  losetup --find --show /tmp/disk               # prints /dev/loopN
  mkfs.ext4 /dev/loopN && mount /dev/loopN /mnt
  umount /mnt && losetup -d /dev/loopN && fusermount3 -u /tmp/disk

Exit status: 0 once FILE is unmounted; 1 when the server cannot be reached or has no such \
export, TLS fails, /dev/fuse is missing, mounting fails, or the final flush fails; 2 for a \
bad command line or URI, TLS options or files that cannot be used, or a FILE that is a \
directory."
)]
pub struct MountArgs {
    /// The export: nbd://HOST[:PORT]/NAME or nbd+unix:///NAME?socket=PATH, nbds:// or
    /// nbds+unix:// for TLS, or pool:PATH for a pool.
    #[arg(value_name = "URI")]
    uri: String,

    /// The file to mount the export over; created empty if missing; not a directory.
    #[arg(value_name = "FILE")]
    file: PathBuf,

    /// Refuse writes (mode 0444) even when the export is writable.
    #[arg(long)]
    read_only: bool,

    /// Connections to open when the server allows multi-conn (otherwise one is used).
    #[arg(long, value_name = "N", default_value_t = sluice_client::limits::CONNECTIONS_DEFAULT as u16,
          value_parser = clap::value_parser!(u16).range(1..=sluice_client::limits::CONNECTIONS_MAX as i64))]
    connections: u16,

    /// Bypass the kernel's page cache for FILE (FUSE direct I/O): requests reach the
    /// server with the sizes callers use, and writes run in parallel.
    #[arg(long)]
    direct_io: bool,

    /// Log every FUSE request to stderr.
    #[arg(long, short)]
    verbose: bool,

    #[command(flatten)]
    tls: TlsArgs,
}

pub fn run(args: MountArgs) -> ExitCode {
    logger::init(if args.verbose { log::LevelFilter::Debug } else { log::LevelFilter::Off });
    let uri = match args.tls.uri(&args.uri) {
        Ok(u) => u,
        Err(e) => return fail(CMD, &e),
    };
    let existed = match check_mount_point(&args.file) {
        Ok(existed) => existed,
        Err(message) => {
            eprintln!("sluice {CMD}: {message}");
            return ExitCode::from(EXIT_USAGE);
        }
    };
    if !Path::new(DEV_FUSE).exists() {
        eprintln!("sluice {CMD}: {DEV_FUSE} is missing: load the fuse module (modprobe fuse), or give the container the device");
        return ExitCode::from(EXIT_FAILURE);
    }
    let runtime = client_cli::runtime();
    // base:allocation answers SEEK_DATA and SEEK_HOLE on the file.
    let options = Options { connections: args.connections as usize, ..Options::default() };
    let client = match runtime.block_on(client_cli::connect(&uri, &options)) {
        Ok(c) => c,
        Err(e) => return fail(CMD, &e),
    };
    // Handle the signals before mounting: from then on, dying by one would leave a dead
    // mount behind ("Transport endpoint is not connected").
    let mut signals = {
        let _guard = runtime.enter();
        match (signal(SignalKind::interrupt()), signal(SignalKind::terminate()), signal(SignalKind::hangup())) {
            (Ok(int), Ok(term), Ok(hup)) => Signals { int, term, hup },
            (Err(e), _, _) | (_, Err(e), _) | (_, _, Err(e)) => {
                eprintln!("sluice {CMD}: cannot handle signals: {e}");
                return ExitCode::from(EXIT_FAILURE);
            }
        }
    };
    let code = mount_and_serve(&args, &runtime, &client, &mut signals, existed);
    if !existed {
        remove_if_unused(&args.file);
    }
    code
}

/// Mounts, serves until the session ends, then flushes and disconnects.
fn mount_and_serve(args: &MountArgs, runtime: &tokio::runtime::Runtime, client: &Client, signals: &mut Signals, existed: bool) -> ExitCode {
    let file = &args.file;
    if !existed {
        // mode(0o644) is what the mount shows anyway; umask may narrow the empty file.
        if let Err(e) = fs::OpenOptions::new().write(true).create_new(true).mode(0o644).open(file) {
            eprintln!("sluice {CMD}: cannot create {}: {e}", file.display());
            return disconnect(runtime, client, EXIT_FAILURE);
        }
    }
    let owner = match fs::metadata(file) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("sluice {CMD}: {}: {e}", file.display());
            return disconnect(runtime, client, EXIT_FAILURE);
        }
    };
    let export = client.export();
    let settings = Settings { writable: !args.read_only && !export.read_only(), direct_io: args.direct_io, uid: owner.uid(), gid: owner.gid() };
    let filesystem = ExportFile::new(client.clone(), runtime.handle().clone(), &settings);
    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("sluice".into()),
        MountOption::Subtype("sluice".into()),
        // The kernel checks the file's mode, so 0444 means read-only to everyone but root.
        MountOption::DefaultPermissions,
        MountOption::NoDev,
        MountOption::NoSuid,
        if settings.writable { MountOption::RW } else { MountOption::RO },
    ];
    // One thread reads requests from the kernel; the work runs on the tokio runtime.
    config.n_threads = Some(1);
    let mut session = match Session::new(filesystem, file, &config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice {CMD}: cannot mount on {}: {e}", file.display());
            return disconnect(runtime, client, EXIT_FAILURE);
        }
    };
    let mut unmounter = session.unmount_callable();
    let (done_tx, mut done) = tokio::sync::oneshot::channel();
    let session_thread = std::thread::Builder::new().name("fuse".into()).spawn(move || {
        let _ = done_tx.send(session.run());
    });
    let session_thread = match session_thread {
        Ok(t) => t,
        Err(e) => {
            eprintln!("sluice {CMD}: cannot start the FUSE thread: {e}");
            let _ = unmounter.unmount();
            return disconnect(runtime, client, EXIT_FAILURE);
        }
    };
    let name = if export.name.is_empty() { "the default export".to_string() } else { format!("export {:?}", export.name) };
    let ro = if settings.writable { "" } else { ", read-only" };
    eprintln!("sluice {CMD}: {name} ({} bytes{ro}) is mounted on {}", export.size, file.display());

    let ended = runtime.block_on(async {
        tokio::select! {
            r = &mut done => Some(r),
            _ = signals.next() => None,
        }
    });
    let result = match ended {
        Some(r) => r,
        None => {
            unmount(&mut unmounter, file);
            let second = runtime.block_on(async {
                tokio::select! {
                    r = &mut done => Some(r),
                    _ = signals.next() => None,
                }
            });
            match second {
                Some(r) => r,
                None => {
                    // Exiting closes /dev/fuse: the kernel then fails the file's users' I/O.
                    eprintln!("sluice {CMD}: second signal: exiting while {} is still in use", file.display());
                    return disconnect(runtime, client, EXIT_FAILURE);
                }
            }
        }
    };
    let _ = session_thread.join();
    let status = match result {
        Ok(Ok(())) => 0,
        Ok(Err(e)) => {
            eprintln!("sluice {CMD}: the FUSE session failed: {e}");
            EXIT_FAILURE
        }
        Err(_) => {
            eprintln!("sluice {CMD}: the FUSE session thread died");
            EXIT_FAILURE
        }
    };
    if !settings.writable {
        return disconnect(runtime, client, status);
    }
    // Whatever the kernel wrote last is durable before we go.
    let flushed = runtime.block_on(async { tokio::time::timeout(Duration::from_millis(SHUTDOWN_TIMEOUT_MS), client.flush()).await });
    let status = match flushed {
        Ok(Ok(())) => status,
        Ok(Err(e)) => {
            eprintln!("sluice {CMD}: final flush failed: {e}");
            EXIT_FAILURE
        }
        Err(_) => {
            eprintln!("sluice {CMD}: final flush timed out");
            EXIT_FAILURE
        }
    };
    disconnect(runtime, client, status)
}

/// The signals that unmount: SIGINT (^C), SIGTERM, and SIGHUP (the terminal went away).
struct Signals {
    int: Signal,
    term: Signal,
    hup: Signal,
}

impl Signals {
    async fn next(&mut self) {
        tokio::select! {
            _ = self.int.recv() => {}
            _ = self.term.recv() => {}
            _ = self.hup.recv() => {}
        }
    }
}

/// Whether FILE exists already, or why it cannot be mounted over.
fn check_mount_point(file: &Path) -> Result<bool, String> {
    match fs::metadata(file) {
        Ok(m) if m.is_file() => Ok(true),
        Ok(m) if m.is_dir() => Err(format!(
            "{} is a directory: give the path of a file to mount the export over (it is created if missing), e.g. {}",
            file.display(),
            file.join("disk").display()
        )),
        Ok(_) => Err(format!("{} is not a regular file", file.display())),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            let parent = match file.parent() {
                Some(p) if !p.as_os_str().is_empty() => p,
                _ => Path::new("."),
            };
            if parent.is_dir() {
                Ok(false)
            } else {
                Err(format!("{}: no such directory", parent.display()))
            }
        }
        Err(e) => Err(format!("{}: {e}", file.display())),
    }
}

/// Unmounts FILE. When it is busy (open, or attached to a loop device) it is detached
/// instead: it leaves the namespace now, and the session ends when its last user lets go.
fn unmount(unmounter: &mut SessionUnmounter, file: &Path) {
    match unmounter.unmount() {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(libc::EBUSY) => {
            eprintln!(
                "sluice {CMD}: {} is in use (open, or attached to a loop device): detached it; serving until its last user closes it (signal again to stop now)",
                file.display()
            );
            if let Err(e) = detach(file) {
                eprintln!("sluice {CMD}: cannot detach {}: {e}", file.display());
            }
        }
        Err(e) => eprintln!("sluice {CMD}: cannot unmount {}: {e} (signal again to stop now)", file.display()),
    }
}

/// A lazy unmount: umount2(MNT_DETACH) as root, `fusermount3 -u -z` otherwise.
fn detach(file: &Path) -> io::Result<()> {
    match rustix::mount::unmount(file, rustix::mount::UnmountFlags::DETACH) {
        Ok(()) => return Ok(()),
        Err(e) if e != rustix::io::Errno::PERM => return Err(e.into()),
        Err(_) => {}
    }
    let status = std::process::Command::new("fusermount3").args(["-u", "-z", "--"]).arg(file).status()?;
    if status.success() {
        Ok(())
    } else {
        Err(io::Error::other(format!("fusermount3 -u -z failed ({status})")))
    }
}

/// Removes FILE when sluice created it and it is still the empty file it made.
fn remove_if_unused(file: &Path) {
    if fs::symlink_metadata(file).is_ok_and(|m| m.is_file() && m.len() == 0) {
        let _ = fs::remove_file(file);
    }
}

fn disconnect(runtime: &tokio::runtime::Runtime, client: &Client, status: u8) -> ExitCode {
    runtime.block_on(async {
        let _ = tokio::time::timeout(Duration::from_millis(SHUTDOWN_TIMEOUT_MS), client.disconnect()).await;
    });
    ExitCode::from(status)
}
