//! Arbitrary bytes as the random choices of the transmission-core simulation: the client's
//! request stream, the order operations complete in, short transfers, storage errors and
//! closes. Any broken rule (a reply outside its request, an answer twice, a lost buffer, a
//! hang) is a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sluice_server::sim::{run, Rng};

// The same harness runs over many seeds in `cargo test -p sluice-server`.
fuzz_target!(|data: &[u8]| {
    if let Err(broken) = run(Rng::from_bytes(data)) {
        panic!("{broken}");
    }
});
