//! Arbitrary bytes as a session followed by 28-byte request headers: each is decoded and
//! validated, and what `validate` accepts or rejects is checked against the session.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The harness body is shared with crates/proto/tests/random_input.rs, which runs it on
// pseudo-random input in a normal `cargo test`.
#[path = "../../crates/proto/tests/harness/mod.rs"]
mod harness;

fuzz_target!(|data: &[u8]| harness::request(data));
