//! Arbitrary bytes as a client's side of the handshake: every `Next::Read` honoured, every
//! option reply checked for magic, echoed option, lengths and well-formed payloads.
#![no_main]

use libfuzzer_sys::fuzz_target;

// The harness body is shared with crates/proto/tests/random_input.rs, which runs it on
// pseudo-random input in a normal `cargo test`.
#[path = "../../crates/proto/tests/harness/mod.rs"]
mod harness;

fuzz_target!(|data: &[u8]| harness::handshake(data));
