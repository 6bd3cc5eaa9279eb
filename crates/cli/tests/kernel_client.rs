//! The Linux kernel's nbd client (nbd.ko and nbd-client 3.24, Debian 12's kernel 6.1 in a
//! guest under qemu) against `sluice serve` on this host. Each test boots a guest that
//! runs one scenario of tests/vm/ and checks what the server saw.

mod common;

use common::vm::{Guests, Options};
use common::Sluice;

const DATA_PATHS: [&str; 4] = ["copy", "direct", "splice", "splice-direct"];

/// Sparse image files in the server's directory, one per name.
fn images(server_dir: &std::path::Path, names: &[&str], bytes: u64) -> Vec<String> {
    names
        .iter()
        .map(|name| {
            let path = server_dir.join(format!("{name}.img"));
            std::fs::File::create(&path).unwrap().set_len(bytes).unwrap();
            path.display().to_string()
        })
        .collect()
}

/// ext4 made, filled, read back after a reconnect and checked clean, on each data path.
#[test]
fn ext4_round_trip_on_each_data_path() {
    require_guests!();
    let dir = tempfile::tempdir().unwrap();
    let files = images(dir.path(), &DATA_PATHS, 256 << 20);
    let exports: Vec<String> =
        DATA_PATHS.iter().zip(&files).map(|(p, f)| format!("--export={p}={f},data-path={p}")).collect();
    let args: Vec<&str> = exports.iter().map(String::as_str).collect();
    let server = Sluice::start(&args);
    let guests = Guests::start(
        "ext4",
        &[("SERVER_PORT", server.port.to_string()), ("DATA_PATHS", DATA_PATHS.join(" "))],
        Options::default(),
    );
    let outcome = guests.finish();
    let expected: Vec<String> = DATA_PATHS.iter().map(|p| format!("ext4 on data path {p}")).collect();
    outcome.assert_passed(&expected.iter().map(String::as_str).collect::<Vec<_>>(), &server.log_text());
}
