//! `sluice attach` and `sluice detach`: an export as /dev/nbdN through the kernel's nbd
//! driver, kept connected across server restarts by a guardian process.

use crate::client_cli::{self, fail, TlsArgs};
use crate::exit::{EXIT_FAILURE, EXIT_USAGE};
use crate::logger;
use sluice_client::attach::{self, guard, state, AttachOptions, Event, Nbd};
use sluice_client::Error;
use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Command, ExitCode, Stdio};
use std::time::{Duration, Instant};

#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  sluice attach nbd://storage1/vm7
  sluice attach --connections 4 nbd://storage1/db /dev/nbd3
  sluice attach --foreground --dead-timeout 600 'nbd+unix:///disk?socket=/run/sluice.sock'
  sluice attach --tls-certificates /etc/sluice/pki nbds://storage1/vm7
  sluice attach --list
  sluice detach /dev/nbd0

The guardian reconnects whenever the device's link dies (the server restarted, the network
dropped), checks that the server serves the same disk (same size, and for sluice servers the
same export identity), and gives the kernel the new sockets: I/O waits meanwhile, for up to
--dead-timeout seconds, and then fails with EIO until the server is back. It keeps trying
until `sluice detach`, SIGTERM or SIGINT, which disconnect the device. The kernel's nbd
driver (modprobe nbd) and root are needed.

Exit status: 0 once attached (or detached); 1 when the server, TLS or the kernel refuses (or
a background guardian dies before attaching); 2 for a bad command line, URI or TLS files.")]
pub struct AttachArgs {
    /// NBD URI of the export: nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH, or
    /// nbds:// / nbds+unix:// for TLS (handed to the kernel's TLS).
    #[arg(value_name = "URI", required_unless_present = "list")]
    uri: Option<String>,

    /// The device to use, /dev/nbdN; without it, the kernel picks a free one.
    #[arg(value_name = "DEVICE")]
    device: Option<String>,

    /// Connections to the server (multi-conn); more than 1 only when the export allows it.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=64))]
    connections: u16,

    /// The kernel's per-request timeout: a request unanswered this long marks its
    /// connection dead, and is sent again once the guardian has reconnected.
    #[arg(long, value_name = "SECS", default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    timeout: u64,

    /// How long I/O waits for the guardian to reconnect before it fails.
    #[arg(long, value_name = "SECS", default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    dead_timeout: u64,

    /// Attach read-only, whatever the server allows: writes fail at the block layer.
    #[arg(long)]
    read_only: bool,

    /// Stay in the foreground as the guardian (for systemd, or a terminal). Without it, the
    /// guardian goes to the background once the device is attached.
    #[arg(long)]
    foreground: bool,

    /// Write the guardian's pid here once the device is attached; removed when it exits.
    #[arg(long, value_name = "FILE")]
    pid_file: Option<PathBuf>,

    /// List the devices sluice guardians look after: device, state, reconnections, URI.
    #[arg(long, conflicts_with_all = ["uri", "device"])]
    list: bool,

    /// Log every reconnection attempt, not only state changes.
    #[arg(short, long)]
    verbose: bool,

    #[command(flatten)]
    tls: TlsArgs,
}

#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  sluice detach /dev/nbd0

Stops the device's guardian, which disconnects the device (I/O still waiting for a
reconnection fails at once). A device without a guardian is disconnected directly.")]
pub struct DetachArgs {
    /// The device, /dev/nbdN.
    #[arg(value_name = "DEVICE")]
    device: String,
}

/// `/dev/nbdN` (or `nbdN`) to N.
fn device_index(s: &str) -> Result<u32, String> {
    let n = s.strip_prefix("/dev/").unwrap_or(s).strip_prefix("nbd");
    n.and_then(|n| n.parse().ok()).ok_or_else(|| format!("{s:?} is not an nbd device (/dev/nbdN)"))
}

fn usage(cmd: &str, m: &str) -> ExitCode {
    eprintln!("sluice {cmd}: {m}");
    ExitCode::from(EXIT_USAGE)
}

pub fn run(args: AttachArgs) -> ExitCode {
    if args.list {
        return list();
    }
    let uri = match args.tls.uri(args.uri.as_deref().unwrap_or_default()) {
        Ok(u) => u,
        Err(e) => return fail("attach", &e),
    };
    let device = match args.device.as_deref().map(device_index).transpose() {
        Ok(d) => d,
        Err(m) => return usage("attach", &m),
    };
    if !args.foreground {
        return background();
    }
    logger::init(if args.verbose { log::LevelFilter::Debug } else { log::LevelFilter::Info });
    let daemon = std::env::var_os(DAEMON_ENV).is_some();
    if daemon {
        // Out of the terminal's session: its hangup and job control are not ours.
        let _ = rustix::process::setsid();
    }
    let options = AttachOptions {
        uri,
        device,
        connections: args.connections as usize,
        timeout_s: args.timeout,
        dead_timeout_s: args.dead_timeout,
        read_only: args.read_only,
    };
    let rt = client_cli::runtime();
    match rt.block_on(attach_and_guard(&options, args.pid_file.as_deref(), daemon)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("attach", &e),
    }
}

/// Set for the guardian `background` starts: it leaves the terminal's session, and once it
/// has said which device it attached, its standard output goes nowhere.
const DAEMON_ENV: &str = "SLUICE_ATTACH_DAEMON";

/// Runs this same command again with --foreground, in a session of its own, and returns
/// once it says which device it attached (its first line of output) or fails (its exit
/// status; 1 when a signal ended it).
fn background() -> ExitCode {
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => return fail("attach", &Error::Io(std::sync::Arc::new(e))),
    };
    let mut argv: Vec<String> = std::env::args().skip(1).collect();
    argv.push("--foreground".into());
    let child = Command::new(exe).args(&argv).env(DAEMON_ENV, "1").stdin(Stdio::null()).stdout(Stdio::piped()).spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => return fail("attach", &Error::Io(std::sync::Arc::new(e))),
    };
    let mut line = String::new();
    let _ = BufReader::new(child.stdout.take().expect("piped")).read_line(&mut line);
    if !line.is_empty() {
        print!("{line}");
        return ExitCode::SUCCESS;
    }
    match child.wait() {
        Ok(s) => ExitCode::from(s.code().unwrap_or(EXIT_FAILURE as i32) as u8),
        Err(_) => ExitCode::from(EXIT_FAILURE),
    }
}

async fn attach_and_guard(options: &AttachOptions, pid_file: Option<&std::path::Path>, daemon: bool) -> Result<(), Error> {
    // Before the device exists: a detach that comes as soon as it does must find the
    // handlers in place, not the default action that would leave the device guardless.
    use tokio::signal::unix::{signal, SignalKind};
    let mut term = signal(SignalKind::terminate()).map_err(Error::from)?;
    let mut interrupt = signal(SignalKind::interrupt()).map_err(Error::from)?;
    let mut nbd = Nbd::open()?;
    let sockets = attach::open_sockets(&options.uri, options.connections).await?;
    if options.connections > 1 && sockets.fds.len() == 1 {
        log::warn!("the export does not allow multi-conn: using 1 connection, not {}", options.connections);
    }
    let setup = attach::setup(options, &sockets.export)?;
    let index = nbd.connect(&setup, &sockets.fds)?;
    if let Err(e) = attach::cap_request_size(index, sockets.export.block_max) {
        let _ = nbd.disconnect(index);
        return Err(e);
    }
    let dir = state::dir();
    let mut st = state::State {
        index,
        uri: options.uri.to_string(),
        pid: std::process::id(),
        state: "connected".into(),
        reconnects: 0,
        connections: sockets.fds.len(),
    };
    save(&st, &dir);
    if let Some(p) = pid_file {
        if let Err(e) = std::fs::write(p, format!("{}\n", std::process::id())) {
            log::warn!("cannot write the pid file {}: {e}", p.display());
        }
    }
    log::info!("/dev/nbd{index}: attached to {} ({} bytes, {} connection(s))", options.uri, setup.size, sockets.fds.len());
    // The device line is the one thing on standard output: a parent waiting in
    // `background` takes it as the sign that the device is ready. It may be gone already
    // (interrupted): that is no reason to leave the device unguarded.
    let mut out = std::io::stdout();
    let _ = writeln!(out, "/dev/nbd{index}").and_then(|()| out.flush());
    if daemon {
        if let Ok(null) = std::fs::File::options().write(true).open("/dev/null") {
            let _ = rustix::stdio::dup2_stdout(&null);
        }
    }

    let stop = async {
        tokio::select! {
            _ = term.recv() => {}
            _ = interrupt.recv() => {}
        }
    };
    let identity = sockets.identity.clone();
    let r = guard(nbd, index, options, &identity, sockets.fds, stop, |event| report(index, &event, &mut st, &dir)).await;
    state::remove(&dir, index, std::process::id());
    if let Some(p) = pid_file {
        let _ = std::fs::remove_file(p);
    }
    r
}

fn save(st: &state::State, dir: &std::path::Path) {
    if let Err(e) = st.write(dir) {
        log::warn!("cannot record the device's state in {}: {e}", dir.display());
    }
}

/// Logs what the guardian saw and records it for `--list`.
fn report(index: u32, event: &Event, st: &mut state::State, dir: &std::path::Path) {
    let dev = format!("/dev/nbd{index}");
    let state = match event {
        Event::LinkDead => {
            log::warn!("{dev}: the connection to the server died; reconnecting");
            "reconnecting".to_owned()
        }
        Event::Retrying { attempt, why } => {
            log::debug!("{dev}: reconnection attempt {attempt} failed: {why}");
            if *attempt == 1 {
                log::info!("{dev}: cannot reach the server yet ({why}); retrying");
            }
            format!("reconnecting: {why}")
        }
        Event::Refused { why } => {
            if !st.state.ends_with(why.as_str()) {
                log::error!("{dev}: not reconnecting to {}: {why}", st.uri);
            }
            format!("refused: {why}")
        }
        Event::Reconnected { after, connections } => {
            st.reconnects += 1;
            st.connections = *connections;
            log::info!("{dev}: reconnected after {:.1} s ({connections} connection(s))", after.as_secs_f64());
            "connected".to_owned()
        }
        Event::Detached => {
            log::info!("{dev}: detached");
            "detached".to_owned()
        }
    };
    st.state = state;
    save(st, dir);
}

fn list() -> ExitCode {
    let devices = state::read_all(&state::dir());
    let mut out = std::io::stdout().lock();
    // A reader that leaves early (`| head`) ends the listing, quietly.
    let _ = (|| -> std::io::Result<()> {
        writeln!(out, "{:<12} {:<8} {:<10} {:<8} URI / STATE", "DEVICE", "PID", "RECONNECTS", "CONNS")?;
        for d in devices {
            let alive = std::path::Path::new(&format!("/proc/{}", d.pid)).exists();
            let state = if alive { d.state.clone() } else { format!("guardian gone ({})", d.state) };
            let dev = format!("/dev/nbd{}", d.index);
            writeln!(out, "{dev:<12} {:<8} {:<10} {:<8} {} ({state})", d.pid, d.reconnects, d.connections, d.uri)?;
        }
        out.flush()
    })();
    ExitCode::SUCCESS
}

/// How long `detach` waits for a guardian to disconnect its device and exit.
const DETACH_WAIT_MS: u64 = 10_000;

/// The pid of device `index`'s guardian, if one runs: the state file names it, and the
/// process must still be a `sluice attach` (a pid can be reused).
fn guardian(dir: &std::path::Path, index: u32) -> Option<u32> {
    let st = state::read(dir, index)?;
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", st.pid)).ok()?;
    let args: Vec<&[u8]> = cmdline.split(|&b| b == 0).collect();
    let ours = args.first().is_some_and(|a| a.ends_with(b"sluice")) && args.contains(&&b"attach"[..]);
    ours.then_some(st.pid)
}

/// Stops a guardian (it disconnects its device on SIGTERM), waiting a bounded time; kills
/// it if it does not go, so that it cannot reconnect the device afterwards.
fn stop_guardian(pid: u32) {
    let Some(p) = rustix::process::Pid::from_raw(pid as i32) else { return };
    let proc = PathBuf::from(format!("/proc/{pid}"));
    if rustix::process::kill_process(p, rustix::process::Signal::TERM).is_err() {
        return;
    }
    let started = Instant::now();
    while proc.exists() && started.elapsed() < Duration::from_millis(DETACH_WAIT_MS) {
        std::thread::sleep(Duration::from_millis(50));
    }
    if proc.exists() {
        eprintln!("sluice detach: the guardian (pid {pid}) did not exit within {DETACH_WAIT_MS} ms; killing it");
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

pub fn detach(args: DetachArgs) -> ExitCode {
    logger::init(log::LevelFilter::Warn);
    let index = match device_index(&args.device) {
        Ok(i) => i,
        Err(m) => return usage("detach", &m),
    };
    let dir = state::dir();
    let guarded = guardian(&dir, index);
    if let Some(pid) = guarded {
        stop_guardian(pid);
        state::remove(&dir, index, pid);
    }
    // Whatever the guardian managed (it may have died before its handlers were up, or failed
    // to disconnect), the device is disconnected here too; doing it twice is harmless.
    let r = Nbd::open().and_then(|mut nbd| match nbd.connected(index)? {
        None => Err(Error::Kernel(format!("there is no /dev/nbd{index}"))),
        Some(false) if guarded.is_none() => Err(Error::Kernel(format!("/dev/nbd{index} is not connected"))),
        Some(false) => Ok(()),
        Some(true) => nbd.disconnect(index),
    });
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("detach", &e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn devices_are_named_as_the_kernel_names_them() {
        assert_eq!(device_index("/dev/nbd3"), Ok(3));
        assert_eq!(device_index("nbd12"), Ok(12));
        assert!(device_index("/dev/sda").is_err());
        assert!(device_index("/dev/nbd").is_err());
    }
}
