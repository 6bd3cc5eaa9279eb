//! Elastic RAM exports (`memory:SIZE,elastic`): the node lends memory it does not need and
//! takes it back when its own jobs need it, as the Global Memory Service intended.
//!
//! One watcher thread serves the whole server, and only once an elastic export exists: it
//! wakes every second, reads the node's memory (`readings`), asks the policy whether to
//! give back (`policy`, sans-IO), and if so punches holes in each elastic export
//! (`give_back`). Punched data reads back as zeros: an elastic export is for caches that
//! check what they read, never for a filesystem.

mod give_back;
pub mod policy;
pub mod readings;

use std::sync::mpsc::{self, Receiver, RecvTimeoutError, Sender};
use std::sync::{Arc, Mutex, Weak};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

pub use give_back::ElasticMemory;
use policy::{Cause, Policy, Reading};
use readings::Sources;

use crate::export::Exports;
use crate::limits::ELASTIC_WATCH_INTERVAL_MS;
use crate::metrics::{ElasticSample, ElasticState};

/// The elastic exports being served, the watcher that squeezes them, and its last reading.
pub struct Elastic {
    /// The elastic exports being served.
    exports: Mutex<Vec<Arc<ElasticMemory>>>,
    /// Elastic exports a reload removed that connections may still use: their memory is
    /// still the node's, so they are still squeezed. Weak: each goes with its export.
    retired: Mutex<Vec<Weak<ElasticMemory>>>,
    last: Mutex<Option<Reading>>,
    watcher: Mutex<Option<(Sender<()>, JoinHandle<()>)>>,
}

impl Elastic {
    pub fn new(exports: &Exports) -> Arc<Elastic> {
        let e = Elastic { exports: Mutex::default(), retired: Mutex::default(), last: Mutex::default(), watcher: Mutex::default() };
        e.set_exports(exports);
        Arc::new(e)
    }

    /// The exports a reload serves from now on. One a reload removed is still squeezed
    /// while connections use it (a cache may keep its connection for good), but no longer
    /// shown in the metrics.
    pub fn set_exports(&self, exports: &Exports) {
        let next: Vec<Arc<ElasticMemory>> = exports.iter().filter_map(|e| e.elastic.clone()).collect();
        let before = std::mem::replace(&mut *self.exports.lock().unwrap_or_else(|e| e.into_inner()), next.clone());
        let served = |m: &Arc<ElasticMemory>| next.iter().any(|n| Arc::ptr_eq(n, m));
        let mut retired = self.retired.lock().unwrap_or_else(|e| e.into_inner());
        retired.retain(|w| w.upgrade().is_some_and(|m| !served(&m)));
        retired.extend(before.iter().filter(|m| !served(m)).map(Arc::downgrade));
    }

    fn exports(&self) -> Vec<Arc<ElasticMemory>> {
        self.exports.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Every elastic export whose memory the node may take back: those served, and those
    /// a reload removed while connections still use them.
    fn squeezed(&self) -> Vec<Arc<ElasticMemory>> {
        let mut all = self.exports();
        all.extend(self.retired.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade));
        all
    }

    /// Starts the watcher when there is an elastic export and none runs yet: a server
    /// without elastic exports has no thread for it.
    pub fn watch(self: &Arc<Self>) -> std::io::Result<()> {
        let mut watcher = self.watcher.lock().unwrap_or_else(|e| e.into_inner());
        if watcher.is_some() || self.exports().is_empty() {
            return Ok(());
        }
        let (stop, stopped) = mpsc::channel();
        let (me, sources) = (Arc::downgrade(self), Sources::from_env());
        let thread = std::thread::Builder::new().name("sluice-elastic".into()).spawn(move || run(&me, &sources, &stopped))?;
        log::info!("elastic memory: watching the node's memory every {ELASTIC_WATCH_INTERVAL_MS} ms");
        *watcher = Some((stop, thread));
        Ok(())
    }

    /// Stops the watcher (at once: it waits on the channel) and waits for it.
    pub fn stop(&self) {
        let watcher = self.watcher.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some((stop, thread)) = watcher {
            drop(stop);
            let _ = thread.join();
        }
    }

    /// What the metrics show: each export's memory and give-backs, and the last reading.
    pub fn state(&self) -> ElasticState {
        let samples = self.exports().into_iter().map(|m| ElasticSample {
            export: m.export.clone(),
            held_bytes: m.held_bytes().unwrap_or(0),
            given_back_bytes: m.given_back_bytes(),
            give_backs: m.give_backs(),
        });
        let last = *self.last.lock().unwrap_or_else(|e| e.into_inner());
        ElasticState {
            exports: samples.collect(),
            available_bytes: last.and_then(|r| r.available_bytes),
            pressure_some_avg10: last.and_then(|r| r.pressure_some_avg10),
        }
    }
}

/// The watcher: until the channel closes (or the server is gone), read, decide, give back.
fn run(elastic: &Weak<Elastic>, sources: &Sources, stopped: &Receiver<()>) {
    let (mut policy, started) = (Policy::default(), Instant::now());
    let mut warned = false;
    while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(Duration::from_millis(ELASTIC_WATCH_INTERVAL_MS)) {
        let Some(elastic) = elastic.upgrade() else { return };
        let reading = sources.read();
        if reading.available_bytes.is_none() && reading.pressure_some_avg10.is_none() && !warned {
            log::warn!("elastic memory: neither MemAvailable nor memory PSI can be read; nothing will be given back");
            warned = true;
        }
        *elastic.last.lock().unwrap_or_else(|e| e.into_inner()) = Some(reading);
        let now_ms = started.elapsed().as_millis() as u64;
        if let Some(cause) = policy.tick(now_ms, &reading) {
            for m in elastic.squeezed() {
                give_back_from(&m, &cause);
            }
        }
    }
}

/// One export's step of a give-back, logged with what caused it.
fn give_back_from(m: &ElasticMemory, cause: &Cause) {
    let held = match m.held_bytes() {
        Ok(h) => h,
        Err(e) => return log::warn!("export {:?}: cannot tell the memory it holds: {e}", m.export),
    };
    let step = policy::step_bytes(held, m.floor_bytes);
    if step == 0 {
        return;
    }
    match m.give_back(step) {
        Ok(0) => {}
        Ok(freed) => log::info!(
            "export {:?}: gave back {freed} bytes of memory ({cause}); it holds {} bytes now",
            m.export,
            m.held_bytes().unwrap_or(0)
        ),
        Err(e) => log::warn!("export {:?}: giving memory back failed: {e}", m.export),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::export::{Export, Options};
    use crate::Spec;

    fn exports(specs: &[&str]) -> Exports {
        let mut all = Exports::default();
        for (i, s) in specs.iter().enumerate() {
            all.insert(Export::open(&format!("e{i}"), &Spec::parse(s).unwrap(), Options::default()).unwrap()).unwrap();
        }
        all
    }

    fn running(e: &Elastic) -> bool {
        e.watcher.lock().unwrap().is_some()
    }

    #[test]
    fn no_elastic_export_no_thread() {
        let e = Elastic::new(&exports(&["memory:1M", "null:1M"]));
        e.watch().unwrap();
        assert!(!running(&e));
        assert_eq!(e.state(), ElasticState::default());
    }

    #[test]
    fn an_elastic_export_starts_the_watcher_and_a_stop_ends_it() {
        let e = Elastic::new(&exports(&["memory:1M"]));
        e.set_exports(&exports(&["memory:1M", "memory:4M,elastic"]));
        e.watch().unwrap();
        assert!(running(&e));
        let state = e.state();
        assert_eq!(state.exports.iter().map(|s| s.export.as_str()).collect::<Vec<_>>(), ["e1"]);
        e.stop();
        assert!(!running(&e));
    }

    fn names(all: Vec<Arc<ElasticMemory>>) -> Vec<String> {
        all.iter().map(|m| m.export.clone()).collect()
    }

    /// A reload that removes an elastic export (or changes its spec, which opens a new one)
    /// leaves it to the connections that use it, which may be there for good (a cache keeps
    /// its members open): its memory is still the node's to take back until it is released.
    #[test]
    fn an_export_a_reload_removed_is_squeezed_until_its_last_connection_lets_go() {
        let before = exports(&["memory:4M,elastic"]);
        let e = Elastic::new(&before);
        let connection = Arc::clone(before.get("e0").unwrap());
        drop(before);
        e.set_exports(&exports(&["memory:4M"]));
        assert_eq!(names(e.squeezed()), ["e0"], "still used: still squeezed");
        assert!(e.state().exports.is_empty(), "no longer served: no longer shown");
        e.set_exports(&exports(&["memory:8M,elastic"]));
        assert_eq!(names(e.squeezed()), ["e0", "e0"], "the new one, and the old one still used");
        drop(connection);
        assert_eq!(names(e.squeezed()), ["e0"], "released: only the one served");
    }
}
