//! `sluice serve`: parse the command line and config file into a server configuration,
//! bind, serve until SIGINT/SIGTERM, drain, exit 0.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use sluice_server::backend::RbdAccess;
use sluice_server::export::{DataPath, Options};
use sluice_server::limits::BUSY_POLL_DEFAULT_US;
use sluice_server::{Config, Export, Exports, Server, Spec, TlsServer, TlsSettings};

use crate::config::{self, FileConfig};
use crate::pid_file::PidFile;
use crate::exit::{EXIT_FAILURE, EXIT_USAGE};
use crate::logger;
use crate::serve_export::ExportEntry;
use crate::serve_settings::{
    check_busy_poll, parse_busy_poll, parse_threads, ChunkChoice, KtlsChoice, ListenAddr, LogLevel, TlsChoice,
};

/// Default NBD port (IANA).
const NBD_PORT: u16 = 10809;
/// Size of the in-memory export served when no PATH or --export is given.
const DEFAULT_MEMORY_EXPORT_BYTES: u64 = 1 << 30;

#[derive(Args, Debug)]
#[command(after_help = "EXAMPLES:
  sluice serve                          # 1 GiB RAM export on 127.0.0.1:10809 and [::1]:10809
  sluice serve disk.img                 # serve a file as the default export
  sluice serve --export vm=/dev/vdb,ro --export scratch=memory:4G
  sluice serve --export far=nbd://10.0.0.7/disk   # re-export another NBD server's export
  sluice serve --export vm=rbd:rbd/vm1 --rbd-id sluice   # a Ceph RBD image (docs/backends/rbd.md)
  sluice serve --export gold=rbd:rbd/base@v1       # a snapshot, served read-only
  sluice serve --unix /run/sluice.sock disk.img
  sluice serve --data-path direct --chunk 512K disk.img
  sluice serve --export cold=/dev/vdc,data-path=splice-direct --metrics 127.0.0.1:9109
  sluice serve --tls=require --tls-certificates=/etc/sluice/pki disk.img
  sluice serve --tls=require --tls-psk=keys.psk --listen 0.0.0.0:10809 disk.img

Exit status: 0 after a clean shutdown (SIGINT/SIGTERM); 1 when the server cannot start
(address in use, io_uring unavailable); 2 for a bad command line or config file, including
an export that cannot be opened (missing file, bad size, unreachable NBD server or Ceph
cluster, missing RBD pool or image).")]
pub struct ServeArgs {
    /// File or block device to serve as the default export (name ""). Without PATH and
    /// without --export, a 1 GiB in-memory export is served.
    #[arg(value_name = "PATH", value_parser = Spec::parse)]
    path: Option<Spec>,

    /// Address to listen on (repeatable). Default: 127.0.0.1:10809 and [::1]:10809, unless
    /// a Unix socket or a listener in the config file is given.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Vec<ListenAddr>,

    /// Listen on a Unix socket (repeatable).
    #[arg(long, value_name = "PATH")]
    unix: Vec<PathBuf>,

    /// Add a named export (repeatable). SPEC is a path, memory:SIZE, null:SIZE, an NBD URI
    /// (nbd://HOST[:PORT]/NAME, nbd+unix:///NAME?socket=PATH) to re-export, pool:FILE, or a
    /// Ceph RBD image rbd:POOL/[NAMESPACE/]IMAGE[@SNAPSHOT] (a snapshot is read-only);
    /// options follow after commas: `ro`, `data-path=PATH`, for RBD `rbd-conf=FILE`,
    /// `rbd-id=ID` and `rbd-keyring=FILE`, and `description=TEXT` (last, may contain commas).
    #[arg(long, value_name = "NAME=SPEC[,ro][,data-path=PATH][,rbd-...=VALUE][,description=TEXT]")]
    export: Vec<ExportEntry>,

    /// Ceph configuration file for rbd: exports that name none. Default: where Ceph's
    /// tools look ($CEPH_CONF, /etc/ceph/ceph.conf, ~/.ceph/config, ./ceph.conf).
    #[arg(long, value_name = "FILE")]
    rbd_conf: Option<PathBuf>,

    /// Ceph client id (client.ID) for rbd: exports that name none. Default: admin.
    #[arg(long, value_name = "ID")]
    rbd_id: Option<String>,

    /// Keyring with the Ceph client's key, for rbd: exports that name none. Default: the
    /// keyring the Ceph configuration names.
    #[arg(long, value_name = "FILE")]
    rbd_keyring: Option<PathBuf>,

    /// How reads and writes move data: copy (read into a buffer, then send), direct
    /// (O_DIRECT into registered buffers, no page cache), splice (file -> pipe -> socket,
    /// no CPU copy) or splice-direct (splice from O_DIRECT: no copy and no page cache).
    /// Applies to exports that do not choose their own. Default: splice.
    #[arg(long, value_name = "PATH")]
    data_path: Option<DataPath>,

    /// Split reads into chunks sent as soon as each is read (out of order with structured
    /// replies). auto: the chunk size, and how many chunks of a read are read at once,
    /// follow the measured storage and network rates (cold data gets small chunks read a
    /// few at a time, warm data few or none); SIZE: reads larger than SIZE are split into
    /// chunks of SIZE, all read at once; 0: a read is sent only when all of it is read.
    /// Default: auto.
    #[arg(long, value_name = "auto|SIZE")]
    chunk: Option<ChunkChoice>,

    /// Serve Prometheus metrics (per-export request counts, bytes, errors, and per-phase
    /// latency histograms) at http://ADDR:PORT/metrics. Off by default.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<ListenAddr>,

    /// Make every export read-only.
    #[arg(long)]
    read_only: bool,

    /// TLS: off, on (offered; plaintext clients are still served) or require (nothing is
    /// served before STARTTLS). Needs --tls-certificates or --tls-psk. Default: off.
    #[arg(long, value_name = "MODE")]
    tls: Option<TlsChoice>,

    /// Directory with ca-cert.pem, server-cert.pem, server-key.pem and optionally
    /// ca-crl.pem (the layout nbdkit and qemu-nbd read). See docs/tls.md for making them.
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,

    /// Pre-shared keys: a psktool file, one `identity:hexkey` line per client.
    #[arg(long, value_name = "FILE")]
    tls_psk: Option<PathBuf>,

    /// Require a client certificate signed by ca-cert.pem of --tls-certificates.
    #[arg(long)]
    tls_verify_peer: bool,

    /// auto: after the TLS handshake, hand the session's keys to the kernel (kTLS) when it
    /// has the tls module and takes the suite (TLS 1.2 or 1.3 with AES-GCM or
    /// ChaCha20-Poly1305), so that splice and O_DIRECT reads stay copy-free; otherwise
    /// encrypt in user space. off: always in user space. Default: auto.
    #[arg(long, value_name = "auto|off")]
    tls_ktls: Option<KtlsChoice>,

    /// TOML configuration file (listeners, exports, limits). Listeners and exports given
    /// here are added to the file's; --threads, --log-level and --read-only override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Worker threads, each with its own io_uring. Default: number of CPUs.
    #[arg(long, value_name = "N", value_parser = parse_threads)]
    threads: Option<NonZeroUsize>,

    /// Pin worker N to the Nth CPU the server may run on (see taskset), wrapping around.
    #[arg(long)]
    pin_threads: bool,

    /// Microseconds a worker spins for more work before it sleeps; it adapts down to 0
    /// when traffic stops, so an idle server does not spin. 0 never spins. [default: 50]
    #[arg(long, value_name = "USEC", value_parser = parse_busy_poll)]
    busy_poll: Option<u64>,

    /// error, warn, info, debug or trace. Default: info.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<LogLevel>,

    /// Write the server's pid to FILE once every listener is bound and every export is
    /// open; removed at a clean exit. A FILE that names a running process is refused (exit
    /// 2); one that names a dead process is replaced.
    #[arg(long, value_name = "FILE")]
    pid_file: Option<PathBuf>,

    /// Stop serving (as on SIGTERM) when the process that started sluice exits: for test
    /// harnesses and scripts that must not leave a server behind.
    #[arg(long)]
    exit_with_parent: bool,
}

struct Usage(String);

pub fn run(args: ServeArgs) -> ExitCode {
    if args.exit_with_parent {
        if let Err(e) = exit_with_parent() {
            eprintln!("sluice serve: --exit-with-parent: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    }
    let pid_file = args.pid_file.as_deref().map(PidFile::claim).transpose();
    match pid_file.and_then(|p| build(args).map(|c| (c, p)).map_err(|Usage(m)| m)) {
        Ok((config, pid_file)) => start(config, pid_file),
        Err(msg) => {
            eprintln!("sluice serve: {msg}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn start(config: Config, pid_file: Option<PidFile>) -> ExitCode {
    let server = match Server::bind(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice serve: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    if let Some(Err(e)) = pid_file.as_ref().map(PidFile::write) {
        eprintln!("sluice serve: {e}");
        return ExitCode::from(EXIT_FAILURE);
    }
    let stopper = server.stopper();
    let on_signal = stopper.clone();
    let signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM]);
    match signals {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    log::info!("signal {sig}: finishing in-flight requests, then exiting");
                    on_signal.stop();
                }
            });
        }
        Err(e) => log::warn!("cannot handle signals: {e}"),
    }
    let served = server.serve(&stopper);
    if let Some(p) = &pid_file {
        p.remove();
    }
    match served {
        Ok(()) => {
            log::info!("stopped");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("sluice serve: {e}");
            ExitCode::from(EXIT_FAILURE)
        }
    }
}

/// Asks the kernel for SIGTERM (the clean stop) when the parent exits. A parent that died
/// before the request was made left this process to another: stop at once then.
fn exit_with_parent() -> std::io::Result<()> {
    let parent = rustix::process::getppid();
    rustix::process::set_parent_process_death_signal(Some(rustix::process::Signal::TERM))?;
    if rustix::process::getppid() != parent {
        return Err(std::io::Error::other("the parent process has already exited"));
    }
    Ok(())
}

/// Merges the command line over the file: both arrive typed and checked, so what is left
/// is choosing, opening the exports and checking the limits.
fn build(args: ServeArgs) -> Result<Config, Usage> {
    let file = match &args.config {
        Some(p) => config::load(p).map_err(Usage)?,
        None => FileConfig::default(),
    };
    logger::init(args.log_level.or(file.log_level).unwrap_or_default().0);
    let defaults = Options {
        read_only: args.read_only || file.read_only.unwrap_or(false),
        description: None,
        data_path: args.data_path.or(file.data_path).unwrap_or_default(),
        chunking: args.chunk.or(file.chunk).unwrap_or_default().0,
    };
    let rbd = RbdAccess {
        conf: args.rbd_conf.clone().or(file.rbd_conf.clone()),
        id: args.rbd_id.clone().or(file.rbd_id.clone()),
        keyring: args.rbd_keyring.clone().or(file.rbd_keyring.clone()),
    };
    let exports = open_exports(export_entries(&args, &file), &defaults, &rbd)?;
    let (tcp, unix, tcp_ipv6_optional) = listeners(&args, &file);
    let cpus = || std::thread::available_parallelism().ok();
    let threads = args.threads.or(file.threads).or_else(cpus).map_or(1, NonZeroUsize::get);
    file.limits.check().map_err(|e| Usage(format!("[limits]: {e}")))?;
    let busy_poll_us = match args.busy_poll.or(file.busy_poll) {
        Some(us) => check_busy_poll(us).map_err(Usage)?,
        None => BUSY_POLL_DEFAULT_US,
    };
    let pin_threads = args.pin_threads || file.pin_threads.unwrap_or(false);
    let metrics = args.metrics.as_ref().or(file.metrics.as_ref()).map(ListenAddr::first);
    let tls = TlsSettings {
        mode: args.tls.or(file.tls).unwrap_or_default().0,
        certificates: args.tls_certificates.clone().or(file.tls_certificates),
        psk: args.tls_psk.clone().or(file.tls_psk),
        verify_peer: args.tls_verify_peer || file.tls_verify_peer.unwrap_or(false),
        ktls: args.tls_ktls.or(file.tls_ktls).unwrap_or_default().0,
    };
    let tls = TlsServer::load(&tls).map_err(Usage)?;
    Ok(Config { tcp, tcp_ipv6_optional, unix, threads, pin_threads, busy_poll_us, limits: file.limits, exports, metrics, tls })
}

/// The file's exports first, then PATH, then each --export; a RAM disk when there are none.
fn export_entries(args: &ServeArgs, file: &FileConfig) -> Vec<ExportEntry> {
    let mut entries = file.exports.clone();
    entries.extend(args.path.iter().map(|spec| ExportEntry::plain("", spec.clone())));
    entries.extend(args.export.iter().cloned());
    if entries.is_empty() {
        entries.push(ExportEntry::plain("", Spec::Memory(DEFAULT_MEMORY_EXPORT_BYTES)));
    }
    entries
}

fn open_exports(entries: Vec<ExportEntry>, defaults: &Options, rbd: &RbdAccess) -> Result<Exports, Usage> {
    let mut exports = Exports::default();
    for entry in entries {
        let name = &entry.name;
        let spec = entry.spec(rbd).map_err(Usage)?;
        let export = Export::open(name, &spec, entry.options(defaults))
            .map_err(|e| Usage(format!("export {name:?}: cannot open {spec}: {e}")))?;
        exports.insert(export).map_err(|e| Usage(e.to_string()))?;
    }
    Ok(exports)
}

/// TCP addresses, Unix sockets, and whether the IPv6 listener may be skipped: the two
/// loopback defaults are used only when neither the command line nor the file names one.
fn listeners(args: &ServeArgs, file: &FileConfig) -> (Vec<SocketAddr>, Vec<PathBuf>, bool) {
    let tcp: Vec<SocketAddr> = args.listen.iter().chain(&file.listen).flat_map(|l| l.0.iter().copied()).collect();
    let unix: Vec<PathBuf> = args.unix.iter().chain(&file.unix).cloned().collect();
    if !tcp.is_empty() || !unix.is_empty() {
        return (tcp, unix, false);
    }
    let loopback = [SocketAddr::from((Ipv4Addr::LOCALHOST, NBD_PORT)), SocketAddr::from((Ipv6Addr::LOCALHOST, NBD_PORT))];
    (loopback.to_vec(), unix, true)
}
