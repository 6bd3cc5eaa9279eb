//! Putting it together: bind listeners, start workers, accept until told to stop, drain.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use crate::export::Exports;
use crate::limits::Limits;
use crate::listen::{Acceptor, Listener};
use crate::metrics::{self, Metrics, MetricsServer, PoolProbe, PoolSource};
use crate::tls::TlsServer;
use crate::worker;

pub struct Config {
    pub tcp: Vec<SocketAddr>,
    /// When true, a [::1] address that cannot be bound (no IPv6) is skipped, not an error.
    pub tcp_ipv6_optional: bool,
    pub unix: Vec<PathBuf>,
    pub threads: usize,
    /// Pin worker N to the Nth CPU the process may use (wrapping around).
    pub pin_threads: bool,
    /// Longest a worker spins for more work before sleeping, in microseconds; 0 never spins.
    pub busy_poll_us: u64,
    pub limits: Limits,
    pub exports: Exports,
    /// Where to serve Prometheus metrics over HTTP, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// TLS, loaded and checked (`TlsServer::load`); None serves plaintext only.
    pub tls: Option<Arc<TlsServer>>,
}

#[derive(Debug)]
pub enum StartError {
    Bind { address: String, source: io::Error },
    Engine(io::Error),
    Config(String),
}

impl std::fmt::Display for StartError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            StartError::Bind { address, source } if source.kind() == io::ErrorKind::AddrInUse => {
                write!(f, "cannot listen on {address}: address already in use (is another server running?)")
            }
            StartError::Bind { address, source } => write!(f, "cannot listen on {address}: {source}"),
            StartError::Engine(e) => write!(f, "cannot start the io_uring engine: {e}"),
            StartError::Config(e) => f.write_str(e),
        }
    }
}

impl std::error::Error for StartError {}

pub struct Server {
    listeners: Vec<Arc<Listener>>,
    config: Config,
    shutdown: Arc<AtomicBool>,
    metrics: Arc<Metrics>,
    metrics_server: Option<MetricsServer>,
}

impl Server {
    /// Binds every listener, so address errors surface before anything is served.
    pub fn bind(config: Config) -> Result<Server, StartError> {
        config.limits.check().map_err(StartError::Config)?;
        if config.exports.is_empty() {
            return Err(StartError::Config("no exports configured".into()));
        }
        let mut listeners = Vec::new();
        for addr in &config.tcp {
            match Listener::bind_tcp(*addr) {
                Ok(l) => listeners.push(Arc::new(l)),
                Err(e) if config.tcp_ipv6_optional && addr.is_ipv6() && e.kind() != io::ErrorKind::AddrInUse => {
                    log::debug!("skipping {addr}: {e}");
                }
                Err(source) => return Err(StartError::Bind { address: addr.to_string(), source }),
            }
        }
        for path in &config.unix {
            let l = Listener::bind_unix(path)
                .map_err(|source| StartError::Bind { address: path.display().to_string(), source })?;
            listeners.push(Arc::new(l));
        }
        if listeners.is_empty() {
            return Err(StartError::Config("nothing to listen on".into()));
        }
        let names: Vec<String> = config.exports.iter().map(|e| e.name.clone()).collect();
        let pools = config
            .exports
            .iter()
            .filter(|e| e.backend.pool_status().is_some())
            .map(|e| {
                let export = Arc::clone(e);
                let probe: PoolProbe = Box::new(move || export.backend.pool_status());
                PoolSource { export: e.name.clone(), probe }
            })
            .collect();
        let metrics = Metrics::with_pools(&names, pools);
        let metrics_server = match config.metrics {
            Some(addr) => Some(
                metrics::serve_http(addr, Arc::clone(&metrics))
                    .map_err(|source| StartError::Bind { address: format!("metrics {addr}"), source })?,
            ),
            None => None,
        };
        Ok(Server { listeners, config, shutdown: Arc::new(AtomicBool::new(false)), metrics, metrics_server })
    }

    pub fn addresses(&self) -> Vec<String> {
        self.listeners.iter().map(|l| l.describe()).collect()
    }

    /// The metrics endpoint's address, when one was asked for.
    pub fn metrics_address(&self) -> Option<SocketAddr> {
        self.metrics_server.as_ref().map(MetricsServer::local_addr)
    }

    /// A handle that stops the server from any thread (a signal handler thread, a test).
    pub fn stopper(&self) -> Stopper {
        Stopper { shutdown: Arc::clone(&self.shutdown), listeners: self.listeners.clone(), workers: Arc::default() }
    }

    /// Serves until `Stopper::stop`, then lets in-flight requests finish and returns.
    pub fn serve(self, stopper: &Stopper) -> Result<(), StartError> {
        let Server { listeners, config, shutdown, metrics, metrics_server } = self;
        if let Some(m) = &metrics_server {
            log::info!("metrics at http://{}/metrics", m.local_addr());
        }
        let mut handles = Vec::new();
        let mut joins = Vec::new();
        let cpus = if config.pin_threads { worker::allowed_cpus() } else { Vec::new() };
        for id in 0..config.threads.max(1) {
            let placement = worker::Placement {
                cpu: (!cpus.is_empty()).then(|| cpus[id % cpus.len()]),
                busy_poll: std::time::Duration::from_micros(config.busy_poll_us),
            };
            let (h, j) = worker::spawn(id, config.limits, placement, Arc::clone(&shutdown), Arc::clone(&metrics))
                .map_err(StartError::Engine)?;
            handles.push(h);
            joins.push(j);
        }
        *stopper.workers.lock().expect("stopper lock") = handles.clone();
        if shutdown.load(Ordering::SeqCst) {
            stopper.stop();
        }
        for e in config.exports.iter() {
            let ro = if e.read_only { ", read-only" } else { "" };
            let path = if e.caps().instant { String::new() } else { format!(", {} data path", e.data_path) };
            log::info!("export {:?}: {} backend, {} bytes{ro}{path}", e.name, e.backend.kind(), e.backend.size());
        }
        let exports = Arc::new(config.exports);
        if let Some(t) = &config.tls {
            log::info!("TLS {}: {}", if t.mode == sluice_proto::TlsMode::Require { "required" } else { "offered" }, t.describe_ktls());
        }
        let acceptor = Arc::new(Acceptor::new(Arc::clone(&exports), config.tls.clone(), handles, config.limits, Arc::clone(&shutdown)));
        for l in &listeners {
            log::info!("listening on {}", l.describe());
            let (a, l) = (Arc::clone(&acceptor), Arc::clone(l));
            std::thread::Builder::new()
                .name("sluice-accept".into())
                .spawn(move || a.accept_loop(l))
                .map_err(StartError::Engine)?;
        }
        for j in joins {
            let _ = j.join();
        }
        // Accept and handshake threads may still hold the exports: say goodbye to remotes
        // and release pools here, before the process exits.
        for e in exports.iter() {
            e.backend.close();
        }
        drop(metrics_server);
        Ok(())
    }
}

#[derive(Clone)]
pub struct Stopper {
    shutdown: Arc<AtomicBool>,
    listeners: Vec<Arc<Listener>>,
    /// Filled in by `serve` once the workers exist; a clone taken earlier sees them too.
    workers: Arc<std::sync::Mutex<Vec<worker::WorkerHandle>>>,
}

impl Stopper {
    pub fn stop(&self) {
        self.shutdown.store(true, Ordering::SeqCst);
        for l in &self.listeners {
            l.stop();
        }
        for w in self.workers.lock().expect("stopper lock").iter() {
            w.wake();
        }
    }
}
