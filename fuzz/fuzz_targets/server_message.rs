//! Arbitrary bytes as a server's messages to the client: greeting, option replies, NBD_INFO
//! payloads, reply chunk headers and payloads. Every decoder must refuse what it cannot
//! parse instead of panicking, and whatever it accepts must be sane.
#![no_main]

use libfuzzer_sys::fuzz_target;

// Shared with crates/proto/tests/random_input.rs, which runs it in a normal `cargo test`.
#[path = "../../crates/proto/tests/harness/mod.rs"]
mod harness;

fuzz_target!(|data: &[u8]| harness::server_message(data));
