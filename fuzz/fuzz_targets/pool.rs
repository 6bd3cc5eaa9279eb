//! Drives the pool coordinator's seeded simulation with fuzz input as its random choices:
//! layouts, workloads, member crashes, stalls and failures, and coordinator crashes. Any
//! acknowledged write that does not read back, copies that disagree after resync, or a
//! stop that does not release the pool is a crash.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_pool::sim::{run, Rng};

fuzz_target!(|data: &[u8]| {
    if let Err(e) = run(Rng::from_bytes(data)) {
        panic!("{e}");
    }
});
