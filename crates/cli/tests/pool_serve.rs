//! A raid10 pool of four sluice members served as one export by `sluice serve --export
//! vol=pool:FILE`: fio's nbd engine (crc32c verify) and nbdcopy write and read it back
//! byte-exact, `sluice copy pool:FILE` reads the same bytes from the members directly, and
//! every mirror copy holds its stripe units where the near layout puts them.
mod common;
use common::pool::*;
use common::*;

/// Two mirror sets of 16 MiB each make a 32 MiB volume.
const MEMBER_DATA: u64 = 16 * MIB;
const VOLUME: u64 = 2 * MEMBER_DATA;
const STRIPE_UNIT: usize = 64 * 1024;

/// Whether this fio was built with the nbd engine (Debian's is).
fn fio_has_nbd() -> bool {
    let (ok, out, _) = run("fio", &["--enghelp"]);
    ok && out.lines().any(|l| l.trim() == "nbd")
}

fn assert_same(got: &[u8], expected: &[u8], what: &str) {
    assert_eq!(got.len(), expected.len(), "{what}: sizes differ");
    if let Some(i) = got.iter().zip(expected).position(|(a, b)| a != b) {
        panic!("{what}: first difference at byte {i}");
    }
}

/// Checks that members 0/1 hold the even stripe units of `volume` and members 2/3 the odd
/// ones, one after the other (raid10's near layout with two sets).
fn assert_near_layout(pool: &Pool, volume: &[u8]) {
    for set in 0..2 {
        let expected: Vec<u8> = volume.chunks(STRIPE_UNIT).skip(set).step_by(2).flatten().copied().collect();
        for m in [2 * set, 2 * set + 1] {
            assert_same(&pool.members[m].data(), &expected, &format!("member {m}'s data (mirror set {set})"));
        }
    }
}

/// `sluice copy pool:FILE OUT` once the server has stopped; returns what it wrote.
fn copy_out_directly(pool: &Pool) -> Vec<u8> {
    let out = pool.dir.path().join("direct.img");
    let (ok, _, err) = run(SLUICE, &["copy", &pool.spec, out.to_str().unwrap()]);
    assert!(ok, "sluice copy {} {}: {err}", pool.spec, out.display());
    std::fs::read(out).unwrap()
}

/// Stops the server cleanly and checks the pool is whole.
fn stop_and_check_in_sync(pool: &Pool, vol: Coordinator) -> serde_json::Value {
    vol.stop_clean();
    let status = pool.status();
    assert!(all_in_sync(&status) && status["dirty_regions"] == 0, "after a clean stop: {status}");
    status
}

#[test]
fn fio_writes_and_verifies_a_served_raid10_pool_with_crc32c() {
    require!("fio");
    if !fio_has_nbd() {
        eprintln!("SKIPPED: this fio has no nbd engine (fio --enghelp does not list it)");
        assert!(std::env::var_os("CI").is_none(), "fio lacks the nbd engine in CI");
        return;
    }
    let pool = Pool::raid10(MEMBER_DATA, "");
    let vol = pool.serve();
    let uri = format!("--uri={}", vol.uri());
    let size = format!("--size={VOLUME}");
    let args = [
        "--name=pool",
        "--ioengine=nbd",
        &uri,
        "--rw=randwrite",
        "--bsrange=4k-256k",
        "--iodepth=16",
        &size,
        "--verify=crc32c",
        "--do_verify=1",
        // No state files in the working directory, whatever happens.
        "--verify_state_save=0",
    ];
    let (ok, out, err) = run("fio", &args);
    let text = format!("{out}{err}");
    let complaints: Vec<&str> = text.lines().filter(|l| l.contains("verify:") || l.contains("bad magic")).collect();
    assert!(ok && text.contains("err= 0") && complaints.is_empty(), "fio failed: {complaints:#?}\n{text}");
    assert!(text.contains("write:") && text.contains("read:"), "fio did not both write and verify:\n{text}");

    // What fio left there, read through the server, is what the members hold.
    let through = pool.dir.path().join("through.img");
    let (ok, _, err) = run("nbdcopy", &[&vol.uri(), through.to_str().unwrap()]);
    assert!(ok, "nbdcopy out of the pool: {err}");
    let written = std::fs::read(&through).unwrap();
    stop_and_check_in_sync(&pool, vol);
    assert_same(&copy_out_directly(&pool), &written, "sluice copy of the pool after fio");
    assert_near_layout(&pool, &written);
}

#[test]
fn nbdcopy_and_sluice_copy_read_back_a_served_raid10_pool_byte_exact() {
    require!("nbdcopy", "nbdinfo");
    let pool = Pool::raid10(MEMBER_DATA, "");
    let vol = pool.serve();
    let (ok, out, err) = run("nbdinfo", &["--size", &vol.uri()]);
    assert!(ok && out.trim() == VOLUME.to_string(), "nbdinfo --size of the served pool: {out}{err}");

    let data = pattern(VOLUME as usize, 31);
    let (src, back) = (pool.dir.path().join("src.img"), pool.dir.path().join("back.img"));
    write_file(&src, &data);
    let (ok, _, err) = run("nbdcopy", &[src.to_str().unwrap(), &vol.uri()]);
    assert!(ok, "nbdcopy into the pool: {err}");
    let (ok, _, err) = run("nbdcopy", &[&vol.uri(), back.to_str().unwrap()]);
    assert!(ok, "nbdcopy out of the pool: {err}");
    assert_same(&std::fs::read(&back).unwrap(), &data, "nbdcopy out of the served pool");

    stop_and_check_in_sync(&pool, vol);
    assert_same(&copy_out_directly(&pool), &data, "sluice copy of the pool");
    assert_near_layout(&pool, &data);
}

/// A clean stop releases the pool even while a client is still in its handshake.
///
/// The exports are dropped (and a pool released) by whichever thread lets go of them last,
/// so `sluice serve` must not exit before that thread has: here a silent client's handshake
/// thread holds them; without one, an accept thread that runs after the main thread
/// returned can, now and then.
#[test]
fn a_clean_stop_releases_the_pool_while_a_client_is_in_its_handshake() {
    use std::io::Read;
    let pool = Pool::raid10(MEMBER_DATA, "");
    let vol = pool.serve();
    // The server's greeting (magic, IHAVEOPT, flags) has arrived: the server is in this
    // client's handshake, waiting for its options, which never come.
    let mut silent = std::os::unix::net::UnixStream::connect(&vol.socket).unwrap();
    let mut greeting = [0u8; 18];
    silent.read_exact(&mut greeting).expect("the server's greeting");
    assert_eq!(&greeting[..8], b"NBDMAGIC");
    let status = stop_and_check_in_sync(&pool, vol);
    assert!(status["owner"].is_null(), "a clean stop exited 0 but left the pool owned by {}: {status}", status["owner"]);
}
