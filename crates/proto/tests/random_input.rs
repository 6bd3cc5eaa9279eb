//! The fuzz harness bodies on pseudo-random input, so every `cargo test` exercises the
//! decoders without nightly or cargo-fuzz. The inputs are generated near the valid
//! grammar (right magics, real export names, lengths that mostly add up, then mutated):
//! uniformly random bytes would almost never get past the client flags or request magic.
//! A fixed seed keeps failures reproducible; the failing input is printed in hex.

mod common;
mod harness;

use common::{info_data, meta_data};
use sluice_proto::limits::{OPTION_DATA_MAX_BYTES, REQUEST_PAYLOAD_MAX_BYTES};
use sluice_proto::request::{RawRequest, Session};
use sluice_proto::wire::*;

const HANDSHAKE_INPUTS: u32 = 100_000;
const REQUEST_INPUTS: u32 = 100_000;

/// xorshift64* (Vigna): tiny, fast and good enough to spread inputs around.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(seed | 1) // the state must never be zero
    }
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn percent(&mut self, p: u64) -> bool {
        self.below(100) < p
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }
    fn bytes(&mut self, max_len: u64) -> Vec<u8> {
        (0..self.below(max_len + 1)).map(|_| self.next() as u8).collect()
    }
}

/// Runs `body` on `input`, naming the iteration and input if it panics.
fn run(name: &str, i: u32, input: &[u8], body: fn(&[u8])) {
    if let Err(panic) = std::panic::catch_unwind(|| body(input)) {
        let hex: String = input.iter().map(|b| format!("{b:02x}")).collect();
        eprintln!("{name} input #{i} failed; input ({} bytes): {hex}", input.len());
        std::panic::resume_unwind(panic);
    }
}

// ---------------------------------------------------------------------------------------
// Handshake inputs
// ---------------------------------------------------------------------------------------

/// Mostly the stream's `favourite` export, so that a SET_META_CONTEXT and a later GO often
/// agree on the name, as they must for the context to survive.
fn export_name(rng: &mut Rng, favourite: &str) -> Vec<u8> {
    match rng.below(10) {
        0 => rng.bytes(8),
        1 => b"missing".to_vec(),
        2 | 3 => rng.pick(&harness::EXPORT_NAMES).as_bytes().to_vec(),
        _ => favourite.as_bytes().to_vec(),
    }
}

fn option_data(rng: &mut Rng, option: u32, favourite: &str) -> Vec<u8> {
    match option {
        OPT_EXPORT_NAME => export_name(rng, favourite),
        OPT_INFO | OPT_GO => {
            let requests: Vec<u16> = (0..rng.below(5))
                .map(|_| if rng.percent(90) { rng.below(5) as u16 } else { rng.next() as u16 })
                .collect();
            info_data(&export_name(rng, favourite), &requests)
        }
        OPT_LIST_META_CONTEXT | OPT_SET_META_CONTEXT => {
            let random = rng.bytes(6);
            let choices: [&[u8]; 7] =
                [b"base:allocation", b"base:allocation", b"base:", b"base:other", b"qemu:dirty-bitmap:a", b"", &random];
            let queries: Vec<&[u8]> = (0..rng.below(4)).map(|_| rng.pick(&choices)).collect();
            meta_data(&export_name(rng, favourite), &queries)
        }
        _ if rng.percent(80) => Vec::new(),
        _ => rng.bytes(8),
    }
}

/// Damages well-formed data now and then: a flipped byte, a cut, garbage at the end, or a
/// length-sized field overwritten.
fn mutate(rng: &mut Rng, mut data: Vec<u8>) -> Vec<u8> {
    if rng.percent(80) {
        return data;
    }
    match rng.below(4) {
        0 if !data.is_empty() => {
            let at = rng.below(data.len() as u64) as usize;
            data[at] ^= 1 << rng.below(8);
        }
        1 => data.truncate(rng.below(data.len() as u64 + 1) as usize),
        2 => data.extend(rng.bytes(4)),
        _ if data.len() >= 4 => {
            let at = rng.below(data.len() as u64 - 3) as usize;
            let random = rng.next() as u32;
            let value = rng.pick(&[0, 1, 0x1001, u32::MAX, random]);
            data[at..at + 4].copy_from_slice(&value.to_be_bytes());
        }
        _ => {}
    }
    data
}

fn handshake_input(rng: &mut Rng) -> Vec<u8> {
    let mut input = Vec::new();
    let client_flags = match rng.below(20) {
        0 => rng.next() as u32,
        1 => rng.below(8) as u32,
        _ => rng.pick(&[FLAG_C_FIXED_NEWSTYLE, FLAG_C_FIXED_NEWSTYLE | FLAG_C_NO_ZEROES]),
    };
    input.extend(client_flags.to_be_bytes());
    // Options come in random order, but SET_META_CONTEXT only selects anything after
    // STRUCTURED_REPLY, so many streams start with it to reach the base:allocation paths.
    let structured_first = rng.percent(40);
    let favourite = rng.pick(&harness::EXPORT_NAMES);
    for n in 0..=rng.below(8) {
        let option = match rng.below(20) {
            _ if n == 0 && structured_first => OPT_STRUCTURED_REPLY,
            0 => rng.next() as u32,
            1..=3 => OPT_SET_META_CONTEXT,
            _ => rng.below(12) as u32,
        };
        let data = option_data(rng, option, favourite);
        let data = mutate(rng, data);
        let length = match rng.below(40) {
            0 => data.len() as u32 ^ (1 << rng.below(6)),
            1 => OPTION_DATA_MAX_BYTES + rng.below(2) as u32,
            2 => rng.next() as u32,
            _ => data.len() as u32,
        };
        let magic = if rng.percent(98) { IHAVEOPT } else { IHAVEOPT ^ (1 << rng.below(64)) };
        input.extend(magic.to_be_bytes());
        input.extend(option.to_be_bytes());
        input.extend(length.to_be_bytes());
        input.extend(data);
    }
    if rng.percent(10) {
        input.extend(rng.bytes(40));
    }
    input
}

#[test]
fn handshake_harness_holds_on_random_option_streams() {
    let mut rng = Rng::new(0x5eed_0001);
    for i in 0..HANDSHAKE_INPUTS {
        let input = handshake_input(&mut rng);
        run("handshake", i, &input, harness::handshake);
    }
}

// ---------------------------------------------------------------------------------------
// Request inputs
// ---------------------------------------------------------------------------------------

fn session(rng: &mut Rng) -> Session {
    let random = rng.next();
    let size = rng.pick(&[0, 1, 4096, 1 << 20, 1 << 40, u64::MAX, u64::MAX - 4095, random]);
    let context_id = rng.pick(&[0, 1, random as u32]);
    let payload_max_bytes = rng.pick(&[REQUEST_PAYLOAD_MAX_BYTES, 4096, 0, u32::MAX, (random >> 32) as u32]);
    Session {
        size,
        // Every combination of advertised features, READ_ONLY included.
        flags: rng.next() as u16,
        structured: rng.percent(50),
        extended: false,
        base_allocation: rng.percent(50).then_some(context_id),
        payload_max_bytes,
    }
}

/// A session that may have negotiated extended headers (which imply structured replies).
fn any_session(rng: &mut Rng) -> Session {
    let s = session(rng);
    let extended = rng.percent(40);
    Session { extended, structured: s.structured || extended, ..s }
}

fn request_bytes(rng: &mut Rng, s: &Session) -> Vec<u8> {
    let kind = if rng.percent(90) { rng.below(9) as u16 } else { rng.next() as u16 };
    let flags = if rng.percent(70) { rng.below(64) as u16 } else { rng.next() as u16 };
    let max = s.payload_max_bytes as u64;
    let random = rng.next();
    let wide = if s.extended { u64::MAX } else { u32::MAX as u64 };
    let length = rng.pick(&[0, 1, 512, 4096, max, max + 1, u32::MAX as u64, 1 << 33, u64::MAX, random]) & wide;
    let offset = rng.pick(&[
        0,
        s.size,
        s.size.wrapping_sub(length),
        s.size.wrapping_sub(length).wrapping_add(1),
        s.size.wrapping_sub(1),
        u64::MAX,
        u64::MAX - length,
        random,
        random % s.size.saturating_add(1),
    ]);
    let raw = RawRequest { flags, kind, handle: rng.next(), offset, length };
    let mut b = if s.extended { raw.encode_extended().to_vec() } else { raw.encode().to_vec() };
    if rng.percent(5) {
        b[rng.below(4) as usize] ^= 1 << rng.below(8);
    }
    b
}

fn request_input(rng: &mut Rng) -> Vec<u8> {
    let s = any_session(rng);
    let mut input = harness::encode_session(&s).to_vec();
    for _ in 0..=rng.below(8) {
        input.extend(request_bytes(rng, &s));
    }
    if rng.percent(10) {
        input.extend(rng.bytes(27)); // a partial request, which must be ignored
    }
    input
}

#[test]
fn request_harness_holds_on_random_requests() {
    let mut rng = Rng::new(0x5eed_0002);
    for i in 0..REQUEST_INPUTS {
        let input = request_input(&mut rng);
        run("request", i, &input, harness::request);
    }
}

#[test]
fn session_encoding_round_trips() {
    // The generators rely on the harness reading back the session they wrote.
    let mut rng = Rng::new(0x5eed_0003);
    for _ in 0..1000 {
        let s = any_session(&mut rng);
        assert_eq!(harness::decode_session(&harness::encode_session(&s)), s);
    }
}

// ---------------------------------------------------------------------------------------
// Server messages (the client's decoders)
// ---------------------------------------------------------------------------------------

const SERVER_MESSAGE_INPUTS: u32 = 100_000;

/// A decoder selector, then bytes near what a server sends: the right lengths for the
/// fixed-size messages, plausible length fields for the rest, then a few bytes mutated.
fn server_message_input(rng: &mut Rng) -> Vec<u8> {
    let which = rng.below(8) as u8;
    let mut body = match which {
        0 => {
            let mut g = NBDMAGIC.to_be_bytes().to_vec();
            g.extend_from_slice(&IHAVEOPT.to_be_bytes());
            g.extend_from_slice(&(rng.next() as u16).to_be_bytes());
            g
        }
        1 => {
            let mut r = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
            r.extend(rng.bytes(12));
            r.resize(20, 0);
            r
        }
        2 | 4 => {
            let name = rng.bytes(20);
            let mut p = (name.len() as u32 + rng.below(3) as u32).to_be_bytes().to_vec();
            p.extend(name);
            p.extend(rng.bytes(10));
            p
        }
        3 => {
            let mut p = (rng.below(6) as u16).to_be_bytes().to_vec();
            for _ in 0..3 {
                p.extend_from_slice(&(1u32 << rng.below(26)).to_be_bytes());
            }
            p.truncate(2 + rng.below(14) as usize);
            p
        }
        5 => {
            let message = rng.bytes(12);
            let mut p = (rng.below(120) as u32).to_be_bytes().to_vec();
            p.extend_from_slice(&(message.len() as u16 + rng.below(2) as u16).to_be_bytes());
            p.extend(message);
            if rng.percent(50) {
                p.extend(rng.bytes(8));
            }
            p
        }
        6 => {
            let n = rng.below(6) as usize;
            let mut p = rng.bytes(4);
            p.resize(4, 0);
            p.extend(rng.bytes(8 * n as u64 + 1));
            p
        }
        _ => rng.bytes(16),
    };
    for _ in 0..rng.below(3) {
        if !body.is_empty() {
            let at = rng.below(body.len() as u64) as usize;
            body[at] = rng.next() as u8;
        }
    }
    let mut input = vec![which];
    input.extend(body);
    input
}

#[test]
fn server_message_harness_holds_on_random_messages() {
    let mut rng = Rng::new(0x5eed_0004);
    for i in 0..SERVER_MESSAGE_INPUTS {
        let input = server_message_input(&mut rng);
        run("server_message", i, &input, harness::server_message);
    }
}

#[test]
fn harness_bodies_survive_short_and_empty_input() {
    for len in 0..64 {
        let input = vec![0xa5; len];
        harness::handshake(&input);
        harness::request(&input);
        harness::server_message(&input);
    }
}
