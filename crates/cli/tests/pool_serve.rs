//! A raid10 pool of four sluice members served as one export by `sluice serve --export
//! vol=pool:FILE`: fio's nbd engine (crc32c verify) and nbdcopy write and read it back
//! byte-exact, `sluice copy pool:FILE` reads the same bytes from the members directly, and
//! every mirror copy holds its stripe units where the near layout puts them.
mod common;
use common::pool::*;
use common::*;
use std::path::Path;

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

/// Runs an nbdsh script against the served pool at `uri`, with `model`, a file holding what
/// the volume should hold, loaded as `model` and saved back at the end. `write(n)` writes
/// `n` random bytes at a random offset through `h` and into the model; `check()` reads the
/// whole volume and compares. Offsets are on 4 KiB, the pool's minimum block.
fn nbdsh_on_model(uri: &str, model: &Path, seed: u64, body: &str) {
    let script = format!(
        r#"
import os, random
random.seed({seed})
h = nbd.NBD()
h.connect_uri("{uri}")
size = h.get_size()
model = bytearray(open("{model}", "rb").read())
assert len(model) == size
def at(n):
    return random.randrange(0, (size - n) // 4096) * 4096
def write(n, fua=False):
    off = at(n)
    data = os.urandom(n)
    h.pwrite(data, off, nbd.CMD_FLAG_FUA if fua else 0)
    model[off:off + n] = data
def check(what):
    assert h.pread(size, 0) == model, what
{body}
open("{model}", "wb").write(model)
print("SCRIPT-COMPLETED")
"#,
        model = model.display()
    );
    let (ok, out, err) = run("nbdsh", &["-c", &script]);
    assert!(ok && out.contains("SCRIPT-COMPLETED"), "nbdsh script failed\nstdout:\n{out}\nstderr:\n{err}");
}

/// How many times the server said its worker 0 took up a connection of its own to `member`.
fn links_up(log: &str, member: &Member) -> usize {
    let line = format!("member {}: worker 0 sends reads, writes and flushes over a connection of its own", member.uri());
    log.lines().filter(|l| l.contains(&line)).count()
}

/// The most bytes one connection wrote to a member, from its closing lines.
fn most_written_by_one_connection(log: &str) -> u64 {
    let lines = log.lines().filter(|l| l.contains("closed export"));
    lines.filter_map(|l| l.split(", wrote ").nth(1)?.split(' ').next()?.parse().ok()).max().unwrap_or(0)
}

/// A served pool's worker carries the members' reads, writes and flushes itself, over a
/// connection of its own to each member: the server says so, and the member's log shows
/// one connection that took every byte written once it was up. When a member is killed
/// that connection fails; writes go on to the other copy, and once the member is back
/// and resynced the worker opens a new one to it. The volume holds what the model says
/// throughout, and so do the members.
#[test]
fn a_served_pools_worker_carries_member_io_on_its_own_connections_across_a_member_restart() {
    require!("nbdsh");
    let mut pool = Pool::raid10(MEMBER_DATA, "");
    // One worker, so that every request is that worker's.
    let vol = Coordinator::start_with(pool.dir.path(), &pool.spec, &["--threads", "1", "--log-level", "debug"]);
    let model = pool.dir.path().join("model.bin");
    write_file(&model, &vec![0u8; VOLUME as usize]);
    // Writes reach every member; until the worker's connections are up they take the
    // pool's own.
    let mut seed = 1;
    wait_for("the worker's own connection to every member", || {
        seed += 1;
        nbdsh_on_model(&vol.uri(), &model, seed, "for _ in range(8): write(65536)");
        let log = vol.log_text();
        let up: Vec<usize> = pool.members.iter().map(|m| links_up(&log, m)).collect();
        if up.iter().all(|&n| n == 1) {
            Ok(())
        } else {
            Err(format!("links up per member: {up:?}\n{log}"))
        }
    });
    // Every size the link treats differently, FUA, many reads in flight, the whole volume
    // rewritten (so each member takes all of its data over the worker's connection).
    let round = format!(
        r#"
for n in [4096, 8192, 65536, 69632, 1 << 20, 3 << 20]:
    write(n, fua=(n == 8192))
check("after writes of every size")
for n in [4096, 12288, 16384, 20480, 262144, 2 << 20]:
    off = at(n)
    assert h.pread(n, off) == model[off:off + n], "read of %d at %d" % (n, off)
{reads_in_flight}
whole = os.urandom(size)
for off in range(0, size, 1 << 20):
    h.pwrite(whole[off:off + (1 << 20)], off)
model[:] = whole
h.flush()
check("after the whole volume was rewritten")
"#,
        reads_in_flight = NBDSH_READS_IN_FLIGHT
    );
    nbdsh_on_model(&vol.uri(), &model, 100, &round);

    // Member 1 (member 0's copy) dies: its connection fails, writes go on to member 0.
    pool.members[1].kill();
    nbdsh_on_model(&vol.uri(), &model, 101, "for n in [4096, 65536, 1 << 20]: write(n)\nh.flush()\ncheck('with member 1 gone')");
    pool.members[1].start();
    pool.wait_status("member 1 back in sync", all_in_sync);
    let mut seed = 200;
    wait_for("a new connection of the worker's own to member 1", || {
        seed += 1;
        nbdsh_on_model(&vol.uri(), &model, seed, "for _ in range(8): write(65536)\ncheck('after member 1 came back')");
        let log = vol.log_text();
        match links_up(&log, &pool.members[1]) {
            2 => Ok(()),
            n => Err(format!("{n} links to member 1 so far\n{log}")),
        }
    });
    let expected = std::fs::read(&model).unwrap();
    let log = vol.log_text();
    assert!(log.contains("the connection of worker 0 failed"), "the killed member's link never failed:\n{log}");
    let status = stop_and_check_in_sync(&pool, vol);
    assert!(all_in_sync(&status), "{status}");
    assert_same(&copy_out_directly(&pool), &expected, "sluice copy of the pool");
    // Members 0, 2 and 3 never went away: one connection of each took every byte of its
    // data (the whole volume rewritten above), and it said goodbye.
    for i in [0, 2, 3] {
        let mlog = pool.members[i].log_text();
        let most = most_written_by_one_connection(&mlog);
        assert!(most >= MEMBER_DATA, "member {i}: no connection carried its data (most one wrote: {most})\n{mlog}");
    }
}
