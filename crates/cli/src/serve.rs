//! `sluice serve`: parse the command line and config file into a server configuration,
//! bind (or take the listeners a service manager passed down), serve until SIGINT/SIGTERM
//! or until a `--run` command exits, reload on SIGHUP, drain, exit.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::num::NonZeroUsize;
use std::path::PathBuf;
use std::process::ExitCode;

use std::sync::Arc;

use clap::Args;
use signal_hook::consts::{SIGHUP, SIGINT, SIGTERM};
use signal_hook::iterator::Signals;
use sluice_server::access::{Access, Rule};
use sluice_server::backend::RbdAccess;
use sluice_server::export::{DataPath, Options};
use sluice_server::limits::BUSY_POLL_DEFAULT_US;
use sluice_server::qos::QosConfig;
use sluice_server::{Config, Limits, Listener, Reload, Running, Server, Spec, Stopper, TlsServer, TlsSettings};

use crate::config::{self, FileConfig};
use crate::exit::{EXIT_FAILURE, EXIT_USAGE};
use crate::logger;
use crate::pid_file::PidFile;
use crate::serve_access;
use crate::serve_catalog::{self, Catalog, Wanted};
use crate::serve_export::ExportEntry;
use crate::serve_qos;
use crate::serve_run::{self, Captive, PrivateSocket};
use crate::serve_systemd::{Housekeeping, Notifier, Poke};
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
    /// File or block device to serve as the default export (name ""); anything --export
    /// takes as SPEC works too (memory:4G, nbd://HOST/NAME, pool:FILE, cache:FILE). Without
    /// PATH and without --export, a 1 GiB in-memory export is served.
    #[arg(value_name = "PATH", value_parser = Spec::parse)]
    path: Option<Spec>,

    /// Address to listen on (repeatable). Default: 127.0.0.1:10809 and [::1]:10809, unless
    /// a Unix socket or a listener in the config file is given.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Vec<ListenAddr>,

    /// Listen on a Unix socket (repeatable).
    #[arg(long, value_name = "PATH")]
    unix: Vec<PathBuf>,

    /// Add a named export (repeatable). SPEC is a path, memory:SIZE
    /// (memory:SIZE,elastic[,floor=SIZE]: RAM the node takes back under memory pressure, down
    /// to the floor, that reads as zeros after; not a disk), null:SIZE, an NBD URI
    /// (nbd://HOST[:PORT]/NAME, nbd+unix:///NAME?socket=PATH) to re-export, pool:FILE (a
    /// striped or mirrored pool), cache:FILE (a volume cached in other nodes' RAM), or a
    /// Ceph RBD image rbd:POOL/[NAMESPACE/]IMAGE[@SNAPSHOT] (a snapshot is read-only);
    /// options follow after commas: `ro`, `degraded` (a pool: may start with members
    /// missing, see --degraded), `data-path=PATH`, for RBD `rbd-conf=FILE`, `rbd-id=ID` and
    /// `rbd-keyring=FILE`, `qos=NAME` (the load restriction class of its connections, a
    /// `[qos.NAME]` table of the --config file) and `description=TEXT` (last, may contain
    /// commas).
    #[arg(long, value_name = "NAME=SPEC[,OPTION]...")]
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

    /// Assemble every pool: export (mirror or raid10) even when some of its members cannot
    /// be reached, as long as every set keeps an in-sync copy; the missing members are
    /// tried again in the background and rebuilt when they answer. Only for members known
    /// to hold nothing newer than the others (mdadm's --run). One export: `,degraded`.
    #[arg(long)]
    degraded: bool,

    /// Let only clients that match RULE in (repeatable; added to the file's `allow`): an
    /// address or CIDR (10.1.0.0/16, ::1), uid:N or gid:N (Unix socket peers), psk:IDENTITY,
    /// x509:DN, x509-cn:NAME, or all. Without any allow rule, every client may.
    #[arg(long, value_name = "RULE")]
    allow: Vec<Rule>,

    /// Keep clients that match RULE out (repeatable; added to the file's `deny`); deny wins
    /// over allow. A client refused by address or uid is closed before the handshake; one
    /// refused an export is told the export does not exist.
    #[arg(long, value_name = "RULE")]
    deny: Vec<Rule>,

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

    /// TOML configuration file (listeners, exports, limits, load restriction classes).
    /// Listeners and exports given here are added to the file's; --threads, --log-level
    /// and --read-only override it.
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

    /// Check the configuration as a start would (the file and every key, the TLS files,
    /// each export opened and closed again; a pool's file is read but its members are left
    /// to the server that serves them), print what would be served, and exit: 0 when a
    /// start would succeed, 2 with the reason when it would not. Nothing is served.
    #[arg(long)]
    check: bool,

    /// Captive mode: once serving, run COMMAND with /bin/sh -c, with $uri (an NBD URI of
    /// the default or only export), $unixsocket, $port and $exportname set; when it exits,
    /// stop serving and exit with its status. Without --listen, --unix or listeners in the
    /// file, listen only on a private Unix socket, removed at exit.
    #[arg(long, value_name = "COMMAND")]
    run: Option<String>,
}

struct Usage(String);

pub fn run(args: ServeArgs) -> ExitCode {
    if args.exit_with_parent {
        if let Err(e) = exit_with_parent() {
            eprintln!("sluice serve: --exit-with-parent: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    }
    if args.check {
        return check(&args);
    }
    // Registered before anything is opened, so that a SIGHUP while exports open cannot end
    // the process, and a SIGTERM then stops it cleanly once it is up (signals queue).
    let signals = Signals::new([SIGINT, SIGTERM, SIGHUP]);
    let started = inherited_listeners()
        .and_then(|inherited| Ok((inherited, args.pid_file.as_deref().map(PidFile::claim).transpose().map_err(Usage)?)))
        .and_then(|(inherited, pid_file)| Ok((build(&args, inherited)?, pid_file)));
    match started {
        Ok((built, pid_file)) => start(args, built, pid_file, signals),
        Err(Usage(msg)) => {
            eprintln!("sluice serve: {msg}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

/// The listening sockets a service manager passed down, and the variables that told of
/// them taken out of the environment so that a command run by `--run` does not see them.
fn inherited_listeners() -> Result<Vec<(Listener, String)>, Usage> {
    let inherited = Listener::inherited().map_err(|e| Usage(format!("socket activation: {e}")))?;
    for var in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(var);
    }
    Ok(inherited)
}

fn start(args: ServeArgs, built: Built, pid_file: Option<PidFile>, signals: std::io::Result<Signals>) -> ExitCode {
    let Built { config, catalog, fixed, captive_dir, tls_settings } = built;
    let inherited = config.inherited.len();
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
    let endpoints = server.endpoints();
    let stopper = server.stopper();
    let running = match server.start(&stopper) {
        Ok(r) => Arc::new(r),
        Err(e) => {
            eprintln!("sluice serve: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    let notifier = Arc::new(Notifier::from_env());
    // Housekeeping watches the connections before READY=1 goes out: a client that connects
    // the moment the manager hears it must still change the status line. (The other way
    // round, one that came in between was missed until the next change.)
    let housekeeping = Housekeeping::spawn(Arc::clone(&running), Arc::clone(&notifier));
    notifier.ready(&running);
    let command = args.run.clone();
    let reloader = Reloader { args, inherited, catalog, fixed, poke: housekeeping.poker() };
    match signals {
        Ok(signals) => handle_signals(signals, &stopper, &running, &notifier, reloader),
        Err(e) => log::warn!("cannot handle signals: {e}"),
    }
    let captive = command.map(|command| {
        let tls = tls_settings.as_ref().filter(|_| running.tls().is_some());
        let place = serve_run::place(&endpoints, &running.exports(), tls);
        Captive::spawn(&command, place, stopper.clone(), Arc::clone(&notifier))
    });
    let served = running.wait();
    drop(housekeeping);
    if let Some(p) = &pid_file {
        p.remove();
    }
    let status = captive.map(Captive::finish);
    drop(captive_dir);
    match served {
        Ok(()) => {
            log::info!("stopped");
            status.map_or(ExitCode::SUCCESS, ExitCode::from)
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

/// SIGINT and SIGTERM stop the server (in-flight requests finish first); SIGHUP reloads.
fn handle_signals(mut signals: Signals, stopper: &Stopper, running: &Arc<Running>, notifier: &Arc<Notifier>, mut reloader: Reloader) {
    let (stopper, running, notifier) = (stopper.clone(), Arc::clone(running), Arc::clone(notifier));
    std::thread::spawn(move || {
        for sig in signals.forever() {
            if sig == SIGHUP {
                notifier.reloading();
                reloader.reload(&running);
                notifier.ready(&running);
                continue;
            }
            log::info!("signal {sig}: finishing in-flight requests, then exiting");
            stopper.stop();
            notifier.stopping();
            break;
        }
    });
}

/// What a reload needs: the command line (the file is read again), and what is served.
struct Reloader {
    args: ServeArgs,
    inherited: usize,
    catalog: Catalog,
    fixed: Fixed,
    /// Wakes the housekeeping thread after a reload (to close what it retired).
    poke: std::sync::mpsc::Sender<Poke>,
}

impl Reloader {
    fn reload(&mut self, running: &Running) {
        let source = self.args.config.as_ref().map_or_else(|| "the command line".to_owned(), |p| p.display().to_string());
        log::info!("SIGHUP: reloading {source}");
        match self.try_reload(running) {
            Ok(()) => log::info!("reloaded {source}"),
            Err(Usage(e)) => log::error!("reload refused, nothing changed: {e}"),
        }
        let _ = self.poke.send(Poke::Look);
    }

    fn try_reload(&mut self, running: &Running) -> Result<(), Usage> {
        let s = settings(&self.args, self.inherited)?;
        let tls = TlsServer::load(&s.tls).map_err(Usage)?;
        let (catalog, exports) = self.catalog.reopen(s.wanted).map_err(Usage)?;
        let pool_moves = self.catalog.pool_moves(&catalog).map_err(Usage)?;
        let restart = running.reload(Reload { exports, access: s.access, tls, limits: s.limits, qos: s.qos }).map_err(Usage)?;
        self.catalog = catalog;
        serve_catalog::apply_pool_moves(pool_moves);
        log::set_max_level(s.log_level);
        let keys = restart.into_iter().map(|k| format!("[limits] {k}")).chain(self.fixed.changes(&s.fixed));
        for key in keys {
            log::warn!("reload: {key} changed, which takes a restart; still using the old value");
        }
        Ok(())
    }
}

/// `--check`: everything a start would do short of listening and serving.
fn check(args: &ServeArgs) -> ExitCode {
    match checked(args) {
        Ok(lines) => {
            for line in lines {
                println!("{line}");
            }
            println!("configuration OK");
            ExitCode::SUCCESS
        }
        Err(Usage(msg)) => {
            eprintln!("sluice serve: {msg}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn checked(args: &ServeArgs) -> Result<Vec<String>, Usage> {
    let s = settings(args, 0)?;
    logger::init(s.log_level);
    // In the order a start and a reload go: TLS, then the exports.
    let tls = TlsServer::load(&s.tls).map_err(Usage)?;
    let mut lines = Vec::new();
    serve_catalog::cache_conflict(&[], &s.wanted).map_err(Usage)?;
    for w in &s.wanted {
        lines.push(serve_catalog::check(w).map_err(Usage)?);
    }
    if s.wanted.is_empty() {
        lines.push("no exports: clients are refused until a reload adds one".into());
    }
    lines.extend(s.access.describe().into_iter().map(|l| format!("access: {l}")));
    let doubts = serve_access::doubts(&s.access, tls.is_some()).into_iter().chain(serve_qos::doubts(&s.qos, tls.is_some()));
    lines.extend(doubts.map(|d| format!("warning: {d}")));
    lines.extend(serve_qos::describe(&s.qos, &s.limits));
    if let Some(t) = tls {
        lines.push(format!("TLS {}", if t.mode == sluice_proto::TlsMode::Require { "required" } else { "offered" }));
    }
    // The loopback defaults give way to sockets a service manager passes down.
    let default = if s.fixed.tcp_ipv6_optional { " (the default, unless socket-activated)" } else { "" };
    let named = s.fixed.tcp.iter().map(ToString::to_string).chain(s.fixed.unix.iter().map(|p| format!("unix:{}", p.display())));
    lines.extend(named.map(|l| format!("listen on {l}{default}")));
    Ok(lines)
}

/// The server's configuration, what its exports were opened from, and the private socket
/// of captive mode.
struct Built {
    config: Config,
    /// TLS as configured, for the URI of a `--run` command.
    tls_settings: Option<TlsSettings>,
    catalog: Catalog,
    fixed: Fixed,
    captive_dir: Option<PrivateSocket>,
}

fn build(args: &ServeArgs, inherited: Vec<(Listener, String)>) -> Result<Built, Usage> {
    let s = settings(args, inherited.len())?;
    logger::init(s.log_level);
    for (listener, name) in &inherited {
        log::info!("socket activation: given {} (named {name:?})", listener.describe());
    }
    let inherited: Vec<Listener> = inherited.into_iter().map(|(l, _)| l).collect();
    let tls = TlsServer::load(&s.tls).map_err(Usage)?;
    for doubt in serve_access::doubts(&s.access, tls.is_some()).into_iter().chain(serve_qos::doubts(&s.qos, tls.is_some())) {
        log::warn!("{doubt}");
    }
    let (catalog, exports) = Catalog::default().reopen(s.wanted).map_err(Usage)?;
    let f = s.fixed.clone();
    let captive_dir = match args.run.is_some() && f.tcp.is_empty() && f.unix.is_empty() && inherited.is_empty() {
        true => Some(PrivateSocket::new().map_err(|e| Usage(format!("--run: cannot make a private socket directory: {e}")))?),
        false => None,
    };
    let unix = f.unix.iter().cloned().chain(captive_dir.as_ref().map(PrivateSocket::path)).collect();
    let config = Config {
        tcp: f.tcp,
        tcp_ipv6_optional: f.tcp_ipv6_optional,
        unix,
        threads: f.threads,
        pin_threads: f.pin_threads,
        busy_poll_us: f.busy_poll_us,
        limits: s.limits,
        exports,
        access: s.access,
        metrics: f.metrics,
        tls,
        inherited,
        qos: s.qos,
    };
    Ok(Built { config, catalog, fixed: s.fixed, captive_dir, tls_settings: Some(s.tls) })
}

/// The file and the command line merged, before anything is opened.
struct Settings {
    wanted: Vec<Wanted>,
    access: Access,
    tls: TlsSettings,
    limits: Limits,
    qos: QosConfig,
    log_level: log::LevelFilter,
    fixed: Fixed,
}

/// What only a restart changes.
#[derive(Clone, Debug, PartialEq)]
struct Fixed {
    tcp: Vec<SocketAddr>,
    /// When true, a [::1] default that cannot be bound (no IPv6) is skipped.
    tcp_ipv6_optional: bool,
    unix: Vec<PathBuf>,
    threads: usize,
    pin_threads: bool,
    busy_poll_us: u64,
    metrics: Option<SocketAddr>,
}

impl Fixed {
    /// The keys whose value differs in `next`.
    fn changes(&self, next: &Fixed) -> Vec<String> {
        let keys = [
            ("listen", self.tcp != next.tcp),
            ("unix", self.unix != next.unix),
            ("threads", self.threads != next.threads),
            ("pin-threads", self.pin_threads != next.pin_threads),
            ("busy-poll", self.busy_poll_us != next.busy_poll_us),
            ("metrics", self.metrics != next.metrics),
        ];
        keys.iter().filter(|(_, changed)| *changed).map(|(k, _)| (*k).to_owned()).collect()
    }
}

/// Merges the command line over the file: both arrive typed and checked, so what is left
/// is choosing and checking the limits. `inherited` counts the listeners a service
/// manager passed down: with any, no default listener is opened.
fn settings(args: &ServeArgs, inherited: usize) -> Result<Settings, Usage> {
    let file = match &args.config {
        Some(p) => config::load(p).map_err(Usage)?,
        None => FileConfig::default(),
    };
    let log_level = args.log_level.or(file.log_level).unwrap_or_default().0;
    let entries = export_entries(args, &file);
    let wanted = wanted_exports(args, &file, &entries)?;
    let access = serve_access::access(file.allow.as_deref(), &file.deny, &args.allow, &args.deny, entries.iter().map(|e| (e.name.clone(), e.rules())).collect());
    file.limits.check().map_err(|e| Usage(format!("[limits]: {e}")))?;
    let qos = serve_qos::config(&file.qos, &file.qos_match, &entries, &file.limits).map_err(Usage)?;
    let busy_poll_us = match args.busy_poll.or(file.busy_poll) {
        Some(us) => check_busy_poll(us).map_err(Usage)?,
        None => BUSY_POLL_DEFAULT_US,
    };
    let (tcp, unix, tcp_ipv6_optional) = listeners(args, &file, inherited);
    let cpus = || std::thread::available_parallelism().ok();
    let fixed = Fixed {
        tcp,
        tcp_ipv6_optional,
        unix,
        threads: args.threads.or(file.threads).or_else(cpus).map_or(1, NonZeroUsize::get),
        pin_threads: args.pin_threads || file.pin_threads.unwrap_or(false),
        busy_poll_us,
        metrics: args.metrics.as_ref().or(file.metrics.as_ref()).map(ListenAddr::first),
    };
    let tls = TlsSettings {
        mode: args.tls.or(file.tls).unwrap_or_default().0,
        certificates: args.tls_certificates.clone().or(file.tls_certificates),
        psk: args.tls_psk.clone().or(file.tls_psk),
        verify_peer: args.tls_verify_peer || file.tls_verify_peer.unwrap_or(false),
        ktls: args.tls_ktls.or(file.tls_ktls).unwrap_or_default().0,
    };
    Ok(Settings { wanted, access, tls, limits: file.limits, qos, log_level, fixed })
}

/// Each export with its spec and options resolved; a name given twice is an error.
fn wanted_exports(args: &ServeArgs, file: &FileConfig, entries: &[ExportEntry]) -> Result<Vec<Wanted>, Usage> {
    let defaults = Options {
        read_only: args.read_only || file.read_only.unwrap_or(false),
        description: None,
        data_path: args.data_path.or(file.data_path).unwrap_or_default(),
        chunking: args.chunk.or(file.chunk).unwrap_or_default().0,
        degraded: args.degraded,
    };
    let rbd = RbdAccess {
        conf: args.rbd_conf.clone().or(file.rbd_conf.clone()),
        id: args.rbd_id.clone().or(file.rbd_id.clone()),
        keyring: args.rbd_keyring.clone().or(file.rbd_keyring.clone()),
    };
    let mut wanted: Vec<Wanted> = Vec::new();
    for entry in entries {
        if wanted.iter().any(|w| w.name == entry.name) {
            return Err(Usage(format!("export {:?} is defined twice", entry.name)));
        }
        let spec = entry.spec(&rbd).map_err(Usage)?;
        wanted.push(Wanted { name: entry.name.clone(), spec, options: entry.options(&defaults) });
    }
    Ok(wanted)
}

/// The file's exports first, then PATH, then each --export. Without any, and without a
/// file, a RAM disk; a file that names no exports serves none until it is edited.
fn export_entries(args: &ServeArgs, file: &FileConfig) -> Vec<ExportEntry> {
    let mut entries = file.exports.clone();
    entries.extend(args.path.iter().map(|spec| ExportEntry::plain("", spec.clone())));
    entries.extend(args.export.iter().cloned());
    if entries.is_empty() && args.config.is_none() {
        entries.push(ExportEntry::plain("", Spec::Memory(sluice_server::backend::MemorySpec::plain(DEFAULT_MEMORY_EXPORT_BYTES))));
    }
    entries
}

/// TCP addresses, Unix sockets, and whether the IPv6 listener may be skipped. The two
/// loopback defaults are used only when neither the command line nor the file names a
/// listener, no service manager passed one down, and no `--run` command wants a private one.
fn listeners(args: &ServeArgs, file: &FileConfig, inherited: usize) -> (Vec<SocketAddr>, Vec<PathBuf>, bool) {
    let tcp: Vec<SocketAddr> = args.listen.iter().chain(&file.listen).flat_map(|l| l.0.iter().copied()).collect();
    let unix: Vec<PathBuf> = args.unix.iter().chain(&file.unix).cloned().collect();
    if !tcp.is_empty() || !unix.is_empty() || inherited > 0 || args.run.is_some() {
        return (tcp, unix, false);
    }
    let loopback = [SocketAddr::from((Ipv4Addr::LOCALHOST, NBD_PORT)), SocketAddr::from((Ipv6Addr::LOCALHOST, NBD_PORT))];
    (loopback.to_vec(), unix, true)
}
