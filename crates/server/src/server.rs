//! Putting it together: bind listeners, start workers, accept until told to stop, drain.

use std::io;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;

use crate::access::Access;
use crate::elastic::Elastic;
use crate::export::{Export, Exports};
use crate::limits::Limits;
use crate::listen::{Acceptor, Endpoint, Listener, Served};
use crate::metrics::{self, CacheProbe, CacheSource, Metrics, MetricsServer, PoolProbe, PoolSource, QosRecorder};
use crate::qos::{Qos, QosConfig, WORKERS_MAX};
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
    /// Who may connect, and which exports each client may open.
    pub access: Access,
    /// Where to serve Prometheus metrics over HTTP, if anywhere.
    pub metrics: Option<SocketAddr>,
    /// TLS, loaded and checked (`TlsServer::load`); None serves plaintext only.
    pub tls: Option<Arc<TlsServer>>,
    /// Listening sockets made by someone else (systemd's socket activation), served
    /// beside those named above.
    pub inherited: Vec<Listener>,
    /// Load restriction: classes, which export and client gets which (the storage caps
    /// are in `limits`).
    pub qos: QosConfig,
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
    qos: Arc<Qos>,
    elastic: Arc<Elastic>,
}

impl Server {
    /// Binds every listener, so address errors surface before anything is served.
    pub fn bind(mut config: Config) -> Result<Server, StartError> {
        config.limits.check().map_err(StartError::Config)?;
        if config.threads > WORKERS_MAX {
            return Err(StartError::Config(format!("at most {WORKERS_MAX} threads")));
        }
        let mut listeners: Vec<Arc<Listener>> = config.inherited.drain(..).map(Arc::new).collect();
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
        let metrics = Metrics::with_pools(&names, pool_sources(&config.exports));
        metrics.set_caches(cache_sources(&config.exports));
        let qos = start_qos(&config, &metrics)?;
        let elastic = start_elastic(&config.exports, &metrics);
        let metrics_server = match config.metrics {
            Some(addr) => Some(
                metrics::serve_http(addr, Arc::clone(&metrics))
                    .map_err(|source| StartError::Bind { address: format!("metrics {addr}"), source })?,
            ),
            None => None,
        };
        Ok(Server { listeners, config, shutdown: Arc::new(AtomicBool::new(false)), metrics, metrics_server, qos, elastic })
    }

    pub fn addresses(&self) -> Vec<String> {
        self.listeners.iter().map(|l| l.describe()).collect()
    }

    /// Where clients reach the listeners, in the order they were given (inherited first).
    pub fn endpoints(&self) -> Vec<Endpoint> {
        self.listeners.iter().map(|l| l.endpoint()).collect()
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
        self.start(stopper)?.wait()
    }

    /// Starts the workers and the accept loops; connections are accepted once this returns.
    pub fn start(self, stopper: &Stopper) -> Result<Running, StartError> {
        let Server { listeners, config, shutdown, metrics, metrics_server, qos, elastic } = self;
        if let Some(m) = &metrics_server {
            log::info!("metrics at http://{}/metrics", m.local_addr());
        }
        raise_descriptor_limit(config.threads.max(1));
        let (handles, joins) = start_workers(&config, &shutdown, &metrics, &qos)?;
        qos.set_wakers(handles.iter().map(|h| {
            let h = h.clone();
            Box::new(move || h.wake()) as Box<dyn Fn() + Send + Sync>
        }).collect());
        log_qos(&config.qos, &config.limits);
        *stopper.workers.lock().expect("stopper lock") = handles.clone();
        if shutdown.load(Ordering::SeqCst) {
            stopper.stop();
        }
        for e in config.exports.iter() {
            log_export(e);
        }
        if config.exports.is_empty() {
            log::warn!("no exports: every client is refused until a reload adds one");
        }
        if let Some(t) = &config.tls {
            log_tls(t);
        }
        log_access(&config.access);
        elastic.watch().map_err(StartError::Engine)?;
        let served = Served { exports: Arc::new(config.exports), access: Arc::new(config.access), tls: config.tls, limits: config.limits };
        let acceptor = Arc::new(Acceptor::new(served, handles, Arc::clone(&shutdown), Arc::clone(&metrics)));
        for l in &listeners {
            log::info!("listening on {}", l.describe());
            let (a, l) = (Arc::clone(&acceptor), Arc::clone(l));
            std::thread::Builder::new()
                .name("sluice-accept".into())
                .spawn(move || a.accept_loop(l))
                .map_err(StartError::Engine)?;
        }
        let workers_limits = config.limits;
        Ok(Running {
            acceptor,
            joins: Mutex::new(joins),
            metrics,
            metrics_server: Mutex::new(metrics_server),
            workers_limits,
            retired: Mutex::default(),
            qos,
            elastic,
        })
    }
}

/// What gives elastic RAM exports' memory back, and its families in the metrics (through a
/// weak reference, like the QoS scheduler's).
fn start_elastic(exports: &Exports, metrics: &Metrics) -> Arc<Elastic> {
    let elastic = Elastic::new(exports);
    let weak = Arc::downgrade(&elastic);
    metrics.set_elastic(Box::new(move || weak.upgrade().map(|e| metrics::elastic_families(&e.state())).unwrap_or_default()));
    elastic
}

/// The QoS scheduler, and its families in the metrics (the scheduler is asked at scrape
/// time through a weak reference, so the two do not keep each other alive).
fn start_qos(config: &Config, metrics: &Metrics) -> Result<Arc<Qos>, StartError> {
    let recorder = Arc::new(QosRecorder::default());
    let qos = Qos::new(config.qos.clone(), &config.limits, config.threads.max(1), Arc::clone(&recorder));
    let qos = Arc::new(qos.map_err(StartError::Config)?);
    let weak = Arc::downgrade(&qos);
    metrics.set_qos(Box::new(move || {
        let samples = weak.upgrade().map(|q| q.samples()).unwrap_or_default();
        metrics::qos_families(&recorder, &samples)
    }));
    Ok(qos)
}

fn start_workers(
    config: &Config,
    shutdown: &Arc<AtomicBool>,
    metrics: &Arc<Metrics>,
    qos: &Arc<Qos>,
) -> Result<(Vec<worker::WorkerHandle>, Vec<JoinHandle<()>>), StartError> {
    let mut handles = Vec::new();
    let mut joins = Vec::new();
    let cpus = if config.pin_threads { worker::allowed_cpus() } else { Vec::new() };
    for id in 0..config.threads.max(1) {
        let placement = worker::Placement {
            cpu: (!cpus.is_empty()).then(|| cpus[id % cpus.len()]),
            busy_poll: std::time::Duration::from_micros(config.busy_poll_us),
        };
        let (h, j) = worker::spawn(id, config.limits, placement, Arc::clone(shutdown), Arc::clone(metrics), Arc::clone(qos))
            .map_err(StartError::Engine)?;
        handles.push(h);
        joins.push(j);
    }
    Ok((handles, joins))
}

fn log_qos(qos: &QosConfig, limits: &Limits) {
    if !qos.is_on(limits) {
        return;
    }
    let classes: Vec<&str> = qos.classes.keys().map(String::as_str).collect();
    let c = limits.storage();
    let caps = [("storage-bps", c.storage_bps), ("storage-iops", c.storage_iops), ("storage-inflight", c.storage_inflight.map(u64::from))];
    let caps: Vec<String> = caps.iter().filter_map(|(k, v)| v.map(|v| format!("{k} = {v}"))).collect();
    let or_none = |list: Vec<String>| if list.is_empty() { "none".to_owned() } else { list.join(", ") };
    log::info!("qos: classes: {}; storage caps: {}", or_none(classes.iter().map(|c| c.to_string()).collect()), or_none(caps));
}

fn log_access(access: &Access) {
    for line in access.describe() {
        log::info!("access: {line}");
    }
}

fn log_export(e: &Export) {
    let ro = if e.read_only { ", read-only" } else { "" };
    let path = if e.caps().instant { String::new() } else { format!(", {} data path", e.data_path) };
    let elastic = match &e.elastic {
        Some(m) if m.floor_bytes > 0 => format!(", elastic (keeps {} bytes)", m.floor_bytes),
        Some(_) => ", elastic".to_owned(),
        None => String::new(),
    };
    log::info!("export {:?}: {} backend, {} bytes{ro}{elastic}{path}", e.name, e.backend.kind(), e.backend.size());
}

fn log_tls(t: &TlsServer) {
    log::info!("TLS {}: {}", if t.mode == sluice_proto::TlsMode::Require { "required" } else { "offered" }, t.describe_ktls());
}

/// The pools among `exports`, for the metrics' pool families.
fn pool_sources(exports: &Exports) -> Vec<PoolSource> {
    exports
        .iter()
        .filter(|e| e.backend.pool_status().is_some())
        .map(|e| {
            let export = Arc::clone(e);
            let probe: PoolProbe = Box::new(move || export.backend.pool_status());
            PoolSource { export: e.name.clone(), probe }
        })
        .collect()
}

/// The cached volumes among `exports`, for the metrics' cache families.
fn cache_sources(exports: &Exports) -> Vec<CacheSource> {
    exports
        .iter()
        .filter(|e| e.backend.kind() == "cache")
        .map(|e| {
            let export = Arc::clone(e);
            let probe: CacheProbe = Box::new(move || export.backend.cache_status());
            CacheSource { export: e.name.clone(), probe }
        })
        .collect()
}

/// What a reload serves from now on.
pub struct Reload {
    pub exports: Exports,
    pub access: Access,
    pub tls: Option<Arc<TlsServer>>,
    pub limits: Limits,
    pub qos: QosConfig,
}

/// A server that accepts connections: what it serves can be changed (`reload`) until it is
/// stopped, and `wait` returns once it has drained.
pub struct Running {
    acceptor: Arc<Acceptor>,
    joins: Mutex<Vec<JoinHandle<()>>>,
    metrics: Arc<Metrics>,
    metrics_server: Mutex<Option<MetricsServer>>,
    /// The budgets the workers were given; a reload cannot change them.
    workers_limits: Limits,
    /// Exports a reload removed or replaced, kept until no connection uses them, then
    /// closed.
    retired: Mutex<Vec<Arc<Export>>>,
    /// The QoS scheduler; a reload gives it new classes and caps.
    qos: Arc<Qos>,
    /// Elastic RAM exports and their watcher; a reload gives it the exports it serves.
    elastic: Arc<Elastic>,
}

impl Running {
    /// The exports new connections are offered.
    pub fn exports(&self) -> Arc<Exports> {
        Arc::clone(&self.acceptor.served().exports)
    }

    /// TLS as new connections are offered it.
    pub fn tls(&self) -> Option<Arc<TlsServer>> {
        self.acceptor.served().tls.clone()
    }

    /// Connections open now, including those in their handshake.
    pub fn connections(&self) -> usize {
        self.acceptor.connections().open()
    }

    /// Calls `watcher` whenever a connection opens or closes (from the thread where it
    /// happened: it must be quick). Only the first watcher is kept.
    pub fn watch_connections(&self, watcher: Box<dyn Fn() + Send + Sync>) {
        self.acceptor.connections().watch(watcher);
    }

    /// Whether exports a reload removed are still waiting for their last connection.
    pub fn has_retired(&self) -> bool {
        !self.retired.lock().unwrap_or_else(|e| e.into_inner()).is_empty()
    }

    /// Serves `next` to new connections. Connections already open keep the export they
    /// opened (one removed finishes its requests; it is closed when the last one leaves).
    /// Returns the limits that changed but take a restart.
    pub fn reload(&self, next: Reload) -> Result<Vec<&'static str>, String> {
        next.limits.check()?;
        next.qos.check(&next.limits)?;
        for e in next.exports.iter() {
            if self.metrics.add_export(&e.name).is_none() {
                return Err(format!("export {:?}: a running server adds at most {} exports; restart to serve more", e.name, crate::limits::METRICS_EXPORTS_ADDED_MAX));
            }
        }
        self.metrics.set_pools(pool_sources(&next.exports));
        self.metrics.set_caches(cache_sources(&next.exports));
        self.elastic.set_exports(&next.exports);
        self.elastic.watch().map_err(|e| format!("cannot start the elastic memory watcher: {e}"))?;
        if let Some(t) = &next.tls {
            log_tls(t);
        }
        let restart = self.workers_limits.changes_needing_restart(&next.limits);
        if *self.acceptor.served().access != next.access {
            log_access(&next.access);
        }
        self.qos.reconfigure(next.qos.clone(), &next.limits)?;
        log_qos(&next.qos, &next.limits);
        let served = Served { exports: Arc::new(next.exports), access: Arc::new(next.access), tls: next.tls, limits: next.limits };
        let before = self.acceptor.swap(served);
        let now = self.exports();
        for e in now.iter().filter(|e| !before.exports.get(&e.name).is_some_and(|b| Arc::ptr_eq(b, e))) {
            log_export(e);
        }
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        for e in before.exports.iter().filter(|e| !now.get(&e.name).is_some_and(|n| Arc::ptr_eq(n, e))) {
            log::info!("export {:?}: no longer offered; its open connections are served until they close", e.name);
            retired.push(Arc::clone(e));
        }
        Ok(restart)
    }

    /// Whether every worker thread still runs (a watchdog stops vouching when one ended
    /// before the stop).
    pub fn healthy(&self) -> bool {
        self.acceptor.shutdown.load(Ordering::Relaxed)
            || self.joins.lock().unwrap_or_else(|e| e.into_inner()).iter().all(|j| !j.is_finished())
    }

    /// Closes the retired exports that no connection uses any more.
    pub fn release_retired(&self) {
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.retain(|e| {
            if Arc::strong_count(e) > 1 {
                return true;
            }
            log::info!("export {:?}: its last connection closed; released", e.name);
            e.backend.close();
            false
        });
    }

    /// Waits for the stop (`Stopper::stop`), lets in-flight requests finish, and closes
    /// every export.
    pub fn wait(&self) -> Result<(), StartError> {
        let joins = std::mem::take(&mut *self.joins.lock().unwrap_or_else(|e| e.into_inner()));
        for j in joins {
            let _ = j.join();
        }
        self.elastic.stop();
        // Accept and handshake threads may still hold the exports: say goodbye to remotes
        // and release pools here, before the process exits.
        let retired = std::mem::take(&mut *self.retired.lock().unwrap_or_else(|e| e.into_inner()));
        for e in self.exports().iter().chain(&retired) {
            e.backend.close();
        }
        drop(self.metrics_server.lock().unwrap_or_else(|e| e.into_inner()).take());
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

/// Raises the soft limit on open descriptors to the hard one, as a server with many clients
/// should: each worker may hold PIPES_PER_WORKER_MAX pipes (two descriptors each) besides
/// its connections, which the usual soft limit of 1024 cannot take on a many-core machine.
/// A limit that cannot be raised is only logged: clients are then refused with EMFILE
/// sooner, and reads fall back to copying when no pipe can be made.
fn raise_descriptor_limit(workers: usize) {
    use rustix::process::{getrlimit, setrlimit, Resource, Rlimit};
    let limit = getrlimit(Resource::Nofile);
    // None is "unlimited".
    let Some(soft) = limit.current else { return };
    if limit.maximum.is_some_and(|hard| hard <= soft) {
        return;
    }
    let hard = limit.maximum.map_or("unlimited".to_string(), |n| n.to_string());
    match setrlimit(Resource::Nofile, Rlimit { current: limit.maximum, maximum: limit.maximum }) {
        Ok(()) => log::debug!("open descriptor limit raised from {soft} to {hard}"),
        Err(e) => {
            let pipes = workers * crate::limits::PIPES_PER_WORKER_MAX * 2;
            log::warn!("cannot raise the open descriptor limit from {soft} ({e}); the workers' pipes alone may take {pipes}")
        }
    }
}
