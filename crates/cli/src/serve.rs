//! `sluice serve`: parse the command line and config file into a server configuration,
//! bind, serve until SIGINT/SIGTERM, drain, exit 0.

use std::net::{SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Args;
use log::LevelFilter;
use sluice_server::export::{parse_size, DataPath, Options};
use sluice_server::{Config, Export, Exports, Limits, Server, Spec};

use crate::exit::{EXIT_FAILURE, EXIT_USAGE};
use crate::{config, logger};

/// Default NBD port (IANA).
const NBD_PORT: u16 = 10809;
/// Size of the in-memory export served when no PATH or --export is given.
const DEFAULT_MEMORY_EXPORT_BYTES: u64 = 1 << 30;
/// Default read chunk; see bench/README.md for the measurement behind it.
const DEFAULT_CHUNK_BYTES: u64 = 1024 * 1024;

#[derive(Args, Debug)]
#[command(after_help = "EXAMPLES:
  sluice serve                          # 1 GiB RAM export on 127.0.0.1:10809 and [::1]:10809
  sluice serve disk.img                 # serve a file as the default export
  sluice serve --export vm=/dev/vdb,ro --export scratch=memory:4G
  sluice serve --unix /run/sluice.sock disk.img
  sluice serve --data-path direct --chunk 512K disk.img
  sluice serve --export cold=/dev/vdc,data-path=splice-direct --metrics 127.0.0.1:9109

Exit status: 0 after a clean shutdown (SIGINT/SIGTERM); 1 when the server cannot start
(address in use, io_uring unavailable); 2 for a bad command line or config file, including
an export that cannot be opened (missing file, bad size).")]
pub struct ServeArgs {
    /// File or block device to serve as the default export (name ""). Without PATH and
    /// without --export, a 1 GiB in-memory export is served.
    #[arg(value_name = "PATH")]
    path: Option<String>,

    /// Address to listen on (repeatable). Default: 127.0.0.1:10809 and [::1]:10809, unless
    /// a Unix socket or a listener in the config file is given.
    #[arg(long, value_name = "ADDR:PORT")]
    listen: Vec<String>,

    /// Listen on a Unix socket (repeatable).
    #[arg(long, value_name = "PATH")]
    unix: Vec<PathBuf>,

    /// Add a named export (repeatable). SPEC is a path, memory:SIZE or null:SIZE; options
    /// follow after commas: `ro`, `data-path=PATH`, and `description=TEXT` (last, may
    /// contain commas).
    #[arg(long, value_name = "NAME=SPEC[,ro][,data-path=PATH][,description=TEXT]")]
    export: Vec<String>,

    /// How reads and writes move data: copy (read into a buffer, then send), direct
    /// (O_DIRECT into registered buffers, no page cache), splice (file -> pipe -> socket,
    /// no CPU copy) or splice-direct (splice from O_DIRECT: no copy and no page cache).
    /// Applies to exports that do not choose their own. Default: splice.
    #[arg(long, value_name = "PATH")]
    data_path: Option<String>,

    /// Split reads larger than SIZE into chunks sent as soon as each is read (out of order
    /// with structured replies); 0 sends a read only when all of it is read. Default: 1M.
    #[arg(long, value_name = "SIZE")]
    chunk: Option<String>,

    /// Serve Prometheus metrics (per-export request counts, bytes, errors, and per-phase
    /// latency histograms) at http://ADDR:PORT/metrics. Off by default.
    #[arg(long, value_name = "ADDR:PORT")]
    metrics: Option<String>,

    /// Make every export read-only.
    #[arg(long)]
    read_only: bool,

    /// TOML configuration file (listeners, exports, limits). Listeners and exports given
    /// here are added to the file's; --threads, --log-level and --read-only override it.
    #[arg(long, value_name = "FILE")]
    config: Option<PathBuf>,

    /// Worker threads, each with its own io_uring. Default: number of CPUs.
    #[arg(long, value_name = "N")]
    threads: Option<usize>,

    /// error, warn, info, debug or trace. Default: info.
    #[arg(long, value_name = "LEVEL")]
    log_level: Option<String>,
}

struct Usage(String);

pub fn run(args: ServeArgs) -> ExitCode {
    match build(args) {
        Ok(config) => start(config),
        Err(Usage(msg)) => {
            eprintln!("sluice serve: {msg}");
            ExitCode::from(EXIT_USAGE)
        }
    }
}

fn start(config: Config) -> ExitCode {
    let server = match Server::bind(config) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("sluice serve: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
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
    match server.serve(&stopper) {
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

fn build(args: ServeArgs) -> Result<Config, Usage> {
    let file = match &args.config {
        Some(p) => config::load(p).map_err(Usage)?,
        None => config::FileConfig::default(),
    };
    let level = args.log_level.as_deref().or(file.log_level.as_deref()).unwrap_or("info");
    let level: LevelFilter = level
        .parse()
        .map_err(|_| Usage(format!("unknown log level {level:?} (use error, warn, info, debug or trace)")))?;
    logger::init(level);

    let read_only_all = args.read_only || file.read_only.unwrap_or(false);
    let data_path = match args.data_path.as_deref().or(file.data_path.as_deref()) {
        Some(p) => p.parse::<DataPath>().map_err(|e| Usage(format!("--data-path: {e}")))?,
        None => DataPath::default(),
    };
    let chunk = match args.chunk.as_deref().or(file.chunk.as_deref()) {
        Some(c) => parse_size(c).map_err(|e| Usage(format!("--chunk: {e}")))?,
        None => DEFAULT_CHUNK_BYTES,
    };
    if chunk > sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES as u64 {
        return Err(Usage(format!("--chunk: at most {} bytes (the largest request)", sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES)));
    }
    let defaults = Options { read_only: false, description: None, data_path, chunk_bytes: chunk as u32 };
    let mut wanted: Vec<(String, Spec, Options)> = Vec::new();
    for e in &file.exports {
        let spec = Spec::parse(&e.spec).map_err(|err| Usage(format!("export {:?}: {err}", e.name)))?;
        let mut o = Options { read_only: e.read_only, description: e.description.clone(), ..defaults.clone() };
        if let Some(p) = &e.data_path {
            o.data_path = p.parse().map_err(|err| Usage(format!("export {:?}: {err}", e.name)))?;
        }
        wanted.push((e.name.clone(), spec, o));
    }
    if let Some(p) = &args.path {
        wanted.push((String::new(), Spec::parse(p).map_err(|e| Usage(e.to_string()))?, defaults.clone()));
    }
    for e in &args.export {
        wanted.push(parse_export(e, &defaults)?);
    }
    if wanted.is_empty() {
        wanted.push((String::new(), Spec::Memory(DEFAULT_MEMORY_EXPORT_BYTES), defaults.clone()));
    }
    let mut exports = Exports::default();
    for (name, spec, mut options) in wanted {
        options.read_only |= read_only_all;
        let export = Export::open(&name, &spec, options).map_err(|e| {
            let what = match &spec {
                Spec::Path(p) => p.display().to_string(),
                _ => format!("{spec:?}"),
            };
            Usage(format!("export {name:?}: cannot open {what}: {e}"))
        })?;
        exports.insert(export).map_err(|e| Usage(e.to_string()))?;
    }

    let mut listen = args.listen.clone();
    listen.extend(file.listen.iter().cloned());
    let mut unix = args.unix.clone();
    unix.extend(file.unix.iter().map(PathBuf::from));
    let mut tcp = Vec::new();
    for l in &listen {
        tcp.extend(parse_listen(l)?);
    }
    let defaults = tcp.is_empty() && unix.is_empty();
    if defaults {
        tcp.push(SocketAddr::from(([127, 0, 0, 1], NBD_PORT)));
        tcp.push(SocketAddr::from((std::net::Ipv6Addr::LOCALHOST, NBD_PORT)));
    }
    let threads = args.threads.or(file.threads).unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    if threads == 0 {
        return Err(Usage("--threads must be at least 1".into()));
    }
    let limits: Limits = file.limits;
    limits.check().map_err(|e| Usage(format!("[limits]: {e}")))?;
    let metrics = match args.metrics.as_deref().or(file.metrics.as_deref()) {
        Some(m) => {
            let mut addrs = parse_listen(m).map_err(|Usage(e)| Usage(e.replace("--listen", "--metrics")))?;
            Some(addrs.remove(0))
        }
        None => None,
    };
    Ok(Config { tcp, tcp_ipv6_optional: defaults, unix, threads, limits, exports, metrics })
}

fn parse_listen(s: &str) -> Result<Vec<SocketAddr>, Usage> {
    let addrs: Vec<SocketAddr> = s
        .to_socket_addrs()
        .map_err(|e| Usage(format!("--listen {s:?}: expected ADDR:PORT such as 127.0.0.1:10809 or [::1]:10809 ({e})")))?
        .collect();
    if addrs.is_empty() {
        return Err(Usage(format!("--listen {s:?}: resolves to no address")));
    }
    Ok(addrs)
}

/// `NAME=SPEC[,ro][,data-path=PATH][,description=TEXT]`
fn parse_export(s: &str, defaults: &Options) -> Result<(String, Spec, Options), Usage> {
    let Some((name, rest)) = s.split_once('=') else {
        return Err(Usage(format!("--export {s:?}: expected NAME=SPEC")));
    };
    let (body, description) = match rest.split_once(",description=") {
        Some((b, d)) => (b, Some(d.to_owned())),
        None => (rest, None),
    };
    let mut parts = body.split(',');
    let spec = parts.next().unwrap_or_default();
    let mut o = Options { description, ..defaults.clone() };
    for opt in parts {
        match opt {
            "ro" | "read-only" => o.read_only = true,
            "" => {}
            other => match other.strip_prefix("data-path=") {
                Some(p) => o.data_path = p.parse().map_err(|e| Usage(format!("--export {s:?}: {e}")))?,
                None => {
                    return Err(Usage(format!(
                        "--export {s:?}: unknown option {other:?} (known: ro, data-path=, description=)"
                    )))
                }
            },
        }
    }
    let spec = Spec::parse(spec).map_err(|e| Usage(format!("--export {s:?}: {e}")))?;
    Ok((name.to_owned(), spec, o))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn export_options_parse() {
        let d = Options::default();
        let (name, spec, o) = parse_export("vm=/dev/vdb,ro,data-path=direct,description=a, b", &d).ok().unwrap();
        assert_eq!((name.as_str(), o.read_only, o.description.as_deref()), ("vm", true, Some("a, b")));
        assert_eq!(o.data_path, DataPath::Direct);
        assert_eq!(spec, Spec::Path("/dev/vdb".into()));
        assert!(parse_export("novalue", &d).is_err());
        assert!(parse_export("x=memory:1G,rw", &d).is_err());
        assert!(parse_export("x=memory:1G,data-path=fast", &d).is_err());
    }
}
