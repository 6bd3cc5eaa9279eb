//! Per-request phase timings and counters, shared by every worker thread. Workers only add
//! to relaxed atomics (`recorder`); `exposition` reads them into Prometheus metric families
//! on the scraper's thread, and `endpoint` serves those over HTTP.

mod buffers;
mod cache;
mod elastic;
mod endpoint;
mod exposition;
mod pool;
mod qos;
mod recorder;
mod refused;
mod watch;

pub use cache::{CacheProbe, CacheSource};
pub use elastic::{elastic_families, ElasticSample, ElasticState};
pub use endpoint::{serve_http, MetricsServer};
pub use pool::{PoolProbe, PoolSource};
pub use qos::{qos_families, QosClassRecorder, QosRecorder, QosSample};
pub use recorder::{Families, Metrics, Op, Phases};
pub use refused::{Refusals, Refused};
pub use watch::{Board, Look};
