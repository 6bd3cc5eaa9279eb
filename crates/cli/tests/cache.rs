//! A cached volume (`cache:FILE`) served by the real binary: a file export as the backing,
//! two RAM exports as members, a third `sluice serve` serving the cache. Reads hit once
//! filled, NBD_CMD_CACHE fills ahead of reads, a write has the members trim the slots it
//! drops, a member killed and restarted empty costs no error and no stale read, a bad file
//! is refused naming the file and the key, and the backing's errno reaches the client.
mod common;
use common::*;

use sluice_client::{Client, Options, Uri};
use std::time::Duration;

const MIB: u64 = 1 << 20;
/// The backing volume: room for the written range and a separate range for the hint.
const VOLUME: u64 = 16 * MIB;
/// Each member's RAM: 256 slots of 64 KiB blocks, so the 4 MiB the tests read (64 blocks)
/// fits with room to spare and nothing is evicted.
const MEMBER: &str = "memory:16M";
const RANGE: usize = 4 * MIB as usize;
const BLOCKS: f64 = (RANGE as u64 / (64 << 10)) as f64;
/// Longest wait for what the cache does on its own (fills, a member marked down); each
/// takes milliseconds.
const SETTLE: Duration = Duration::from_secs(20);
/// Longest a stalled member may hold a read up: its timeout is 2 s.
const STALL_MAX: Duration = Duration::from_secs(8);
const _: () = assert!(STALL_MAX.as_secs() < SETTLE.as_secs());
/// Longest wait for a restarted member to be used again: its reconnection backoff doubles
/// from 250 ms, so a member down for a few seconds is retried within about 8 s.
const BACK_UP: Duration = Duration::from_secs(40);

struct Setup {
    _dir: tempfile::TempDir,
    backing: Sluice,
    members: Vec<Sluice>,
    cache: Sluice,
    metrics: u16,
    /// The cache file.
    file: std::path::PathBuf,
}

/// Starts the backing, the members, and the server of the cached volume (prefetch off, so
/// that hits and misses are exact).
fn setup() -> Setup {
    setup_with("", &[])
}

/// `setup`, with more keys for the cache file and more arguments for its server.
fn setup_with(keys: &str, cache_args: &[&str]) -> Setup {
    let dir = tempfile::tempdir().unwrap();
    let disk = dir.path().join("disk.img");
    std::fs::File::create(&disk).unwrap().set_len(VOLUME).unwrap();
    let backing = Sluice::start(&["--export", &format!("vol={}", disk.display())]);
    let members: Vec<Sluice> = (0..2).map(|_| Sluice::start(&["--export", &format!("ram={MEMBER}")])).collect();
    let names: Vec<String> = members.iter().map(|m| format!("{:?}", m.uri_for("ram"))).collect();
    let file = dir.path().join("cache.toml");
    let text = format!("backing = {:?}\nmembers = [{}]\nblock = \"64K\"\nprefetch = \"off\"\n{keys}", backing.uri_for("vol"), names.join(", "));
    std::fs::write(&file, text).unwrap();
    let metrics = free_port();
    let export = format!("v=cache:{}", file.display());
    let metrics_at = format!("127.0.0.1:{metrics}");
    let cache = Sluice::start(&[&["--export", &export, "--metrics", &metrics_at], cache_args].concat());
    Setup { _dir: dir, backing, members, cache, metrics, file }
}

impl Setup {
    fn logs(&self) -> String {
        let members: Vec<String> = self.members.iter().enumerate().map(|(i, m)| format!("--- member {i}:\n{}", m.log_text())).collect();
        format!("--- cache:\n{}\n--- backing:\n{}\n{}", self.cache.log_text(), self.backing.log_text(), members.join("\n"))
    }

    fn metric(&self, series: &str) -> f64 {
        sample(&http_get(self.metrics, "/metrics").1, series)
    }

    fn counter(&self, name: &str) -> f64 {
        self.metric(&format!("sluice_cache_{name}_total{{export=\"v\"}}"))
    }

    fn member_up(&self, i: usize) -> f64 {
        let uri = self.members[i].uri_for("ram");
        self.metric(&format!("sluice_cache_member_up{{export=\"v\",member=\"{i}\",uri=\"{uri}\"}}"))
    }

    /// Waits until `name` reaches `at_least`.
    fn wait_counter(&self, name: &str, at_least: f64) {
        wait_until(&format!("sluice_cache_{name}_total >= {at_least}"), SETTLE, || self.counter(name) >= at_least, || self.logs());
    }

    fn wait_member(&self, i: usize, up: bool, limit: Duration) {
        wait_until(&format!("member {i} shown {}", if up { "up" } else { "down" }), limit, || self.member_up(i) == up as u64 as f64, || self.logs());
    }

    async fn client(&self) -> Client {
        Client::connect_with(&Uri::parse(&self.cache.uri_for("v")).unwrap(), &Options::default()).await.expect("connect to the cached volume")
    }
}

impl Setup {
    /// Reads the range back, bounded: a read the cache never answers (a stalled member not
    /// timed out, a lost completion) fails the test with the servers' logs.
    async fn read_back(&self, c: &Client, expected: &[u8], what: &str) {
        let got = self.bounded(what, c.read_owned(0, vec![0; expected.len()])).await;
        assert!(got == expected, "{what}: the cached volume did not read back the last data written\n{}", self.logs());
    }

    /// Writes `data` at 0, bounded as `read_back`.
    async fn write(&self, c: &Client, data: &[u8], fua: bool, what: &str) {
        self.bounded(what, c.write(0, data, fua)).await;
    }

    /// Disconnects the client, bounded: the cache answers what is in flight first.
    async fn disconnect(&self, c: Client) {
        let ok = tokio::time::timeout(SETTLE, c.disconnect()).await.is_ok();
        assert!(ok, "the client did not disconnect in {SETTLE:?}\n{}", self.logs());
    }

    /// Waits for both members, writes `RANGE` of `pattern(seed)`, reads it once and waits
    /// until every block is filled: a client, and the data.
    async fn filled(&self, seed: u64) -> (Client, Vec<u8>) {
        self.wait_member(0, true, SETTLE);
        self.wait_member(1, true, SETTLE);
        let c = self.client().await;
        let data = pattern(RANGE, seed);
        self.write(&c, &data, false, "write through the cache").await;
        self.read_back(&c, &data, "filling read").await;
        self.wait_counter("fills", BLOCKS);
        (c, data)
    }

    async fn bounded<T>(&self, what: &str, call: impl std::future::Future<Output = Result<T, sluice_client::Error>>) -> T {
        match tokio::time::timeout(SETTLE, call).await {
            Ok(Ok(v)) => v,
            Ok(Err(e)) => panic!("{what}: {e}\n{}", self.logs()),
            Err(_) => panic!("{what}: no answer in {SETTLE:?}\n{}", self.logs()),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_hit_once_filled_and_the_cache_hint_fills_ahead() {
    let s = setup();
    s.wait_member(0, true, SETTLE);
    s.wait_member(1, true, SETTLE);
    let c = s.client().await;
    let data = pattern(RANGE, 1);
    s.write(&c, &data, false, "write through the cache").await;
    s.read_back(&c, &data, "first read (misses)").await;
    assert_eq!(s.counter("misses"), BLOCKS, "{}", s.logs());
    // Fills complete after the read's reply; the second read hits only once they have.
    s.wait_counter("fills", BLOCKS);
    s.read_back(&c, &data, "second read (hits)").await;
    assert_eq!((s.counter("hits"), s.counter("misses")), (BLOCKS, BLOCKS), "{}", s.logs());
    assert_eq!(s.counter("hit_bytes"), RANGE as f64);

    // NBD_CMD_CACHE over 1 MiB not read yet (16 blocks) fills it; the reads that follow hit.
    let uri = s.cache.uri_for("v");
    let script = format!("h.cache({MIB}, {})\nprint('cached')", 8 * MIB);
    let (ok, out, err) = run("nbdsh", &["-u", &uri, "-c", &script]);
    assert!(ok && out.contains("cached"), "nbdsh: {out}{err}\n{}", s.logs());
    s.wait_counter("fills", BLOCKS + 16.0);
    let zeros = s.bounded("read the hinted range", c.read_owned(8 * MIB, vec![1; MIB as usize])).await;
    assert!(zeros.iter().all(|&b| b == 0), "the hinted range reads as the backing holds it");
    assert_eq!(s.counter("hits"), BLOCKS + 16.0, "{}", s.logs());
    assert_eq!(s.counter("prefetched_used_bytes"), MIB as f64, "{}", s.logs());
    s.disconnect(c).await;

    // `info` opens the volume itself and shows its members, as JSON too.
    let spec = format!("cache:{}", s.file.display());
    let (ok, out, err) = run(SLUICE, &["info", "--json", &spec]);
    assert!(ok, "info: {err}\n{}", s.logs());
    let v: serde_json::Value = serde_json::from_str(&out).expect("info --json prints JSON");
    assert_eq!(v["size"], VOLUME);
    let members = v["cache"]["members"].as_array().expect("the members");
    assert!(members.len() == 2 && members.iter().all(|m| m["up"] == true && m["slots"] == 256), "{out}");
}

/// How many times the cache's server said its worker 0 took up a connection of its own to
/// `member`.
fn links_up(log: &str, member: &Sluice) -> usize {
    links_up_to(log, &member.uri_for("ram"))
}

/// The same for the export at `uri` (a member, or the backing).
fn links_up_to(log: &str, uri: &str) -> usize {
    let line = format!("member {uri}: worker 0 sends reads, writes and flushes over a connection of its own");
    log.lines().filter(|l| l.contains(&line)).count()
}

/// The most bytes one connection read from a member, from its closing lines.
fn most_read_by_one_connection(log: &str) -> u64 {
    let lines = log.lines().filter(|l| l.contains("closed export"));
    lines.filter_map(|l| l.split("; read ").nth(1)?.split(' ').next()?.parse().ok()).max().unwrap_or(0)
}

/// A served cache's worker reads its hits from the members itself, over a connection of
/// its own to each member (and writes through to the backing over one of its own to it):
/// the server says so, and one connection of a member took every byte the hits read from
/// it once that connection was up (the cache's own client spreads its reads over four). When a member is killed that
/// connection fails, reads go to the backing, and once the member is back the worker
/// opens a new one to it. Every read returns the last data written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_served_caches_worker_reads_its_hits_on_its_own_connections_across_a_member_restart() {
    // One worker, so that every request is that worker's; a member timeout no loaded
    // machine reaches, so that only the kill drops a member.
    let mut s = setup_with("member-timeout = \"1h\"\n", &["--threads", "1", "--log-level", "debug"]);
    let (c, first) = s.filled(21).await;
    // The first operations for a member or the backing open the worker's connection to it
    // and go the cache's own way until it is up; the worker takes it up at its next one.
    // The rewrite drops the blocks, and the read fills them again.
    let deadline = std::time::Instant::now() + SETTLE;
    let backing = s.backing.uri_for("vol");
    while s.members.iter().any(|m| links_up(&s.cache.log_text(), m) != 1) || links_up_to(&s.cache.log_text(), &backing) != 1 {
        assert!(std::time::Instant::now() < deadline, "the worker has no connection of its own to each member and the backing\n{}", s.logs());
        let fills = s.counter("fills");
        s.write(&c, &first, false, "a rewrite while the worker's connections come up").await;
        s.read_back(&c, &first, "a read while the worker's connections come up").await;
        s.wait_counter("fills", fills + BLOCKS);
        s.read_back(&c, &first, "a read of the blocks filled again").await;
    }
    let uri = s.members[0].uri_for("ram");
    let used = s.metric(&format!("sluice_cache_member_slots_used{{export=\"v\",member=\"0\",uri=\"{uri}\"}}"));
    let hits = s.counter("hits");
    const PASSES: u64 = 4;
    for _ in 0..PASSES {
        s.read_back(&c, &first, "a read from the members").await;
    }
    assert_eq!(s.counter("hits"), hits + PASSES as f64 * BLOCKS, "every block of every pass hit\n{}", s.logs());

    // Member 1 dies: the worker's connection to it fails, and nothing stale or lost shows.
    s.members[1].kill();
    s.read_back(&c, &first, "a read with member 1 killed").await;
    s.wait_member(1, false, SETTLE);
    let second = pattern(RANGE, 22);
    s.write(&c, &second, true, "a write with member 1 down").await;
    s.read_back(&c, &second, "a read after a write with member 1 down").await;
    s.members[1].restart();
    s.wait_member(1, true, BACK_UP);
    let third = pattern(RANGE, 23);
    s.write(&c, &third, false, "a write with member 1 back").await;
    let deadline = std::time::Instant::now() + SETTLE;
    while links_up(&s.cache.log_text(), &s.members[1]) != 2 {
        assert!(std::time::Instant::now() < deadline, "the worker opened no new connection to member 1\n{}", s.logs());
        s.read_back(&c, &third, "a read with member 1 back").await;
    }
    let log = s.cache.log_text();
    assert!(log.contains("the connection of worker 0 failed"), "the killed member's connection never failed:\n{}", s.logs());
    s.disconnect(c).await;

    // Member 0 never went away: once the worker's connection to it was up, that one
    // connection took every byte the passes read from it (a whole block per hit).
    let Setup { cache, members, .. } = s;
    let (status, log) = cache.stop_with_log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(used > 0.0, "member 0 holds no block\n{log}");
    // The member logs each connection's end once it sees it.
    let carried = PASSES * used as u64 * (64 << 10);
    let what = format!("a connection of member 0's that read {carried} bytes to close");
    wait_until(&what, SETTLE, || most_read_by_one_connection(&members[0].log_text()) >= carried, || members[0].log_text());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_killed_and_restarted_empty_costs_no_error_and_no_stale_read() {
    let mut s = setup();
    let (c, first) = s.filled(2).await;

    s.members[0].kill();
    s.read_back(&c, &first, "a read with member 0 killed").await;
    s.wait_member(0, false, SETTLE);
    // Written while the member is down: what it held is gone, what member 1 holds is
    // invalidated, and nothing older may come back.
    let second = pattern(RANGE, 3);
    s.write(&c, &second, true, "a write with member 0 down").await;
    s.read_back(&c, &second, "a read after a write with member 0 down").await;

    s.members[0].restart();
    s.wait_member(0, true, BACK_UP);
    // What member 1 filled while member 0 was down still hits there.
    s.read_back(&c, &second, "a read with member 0 back, empty").await;
    // New data spreads over both members again, and reads back.
    let third = pattern(RANGE, 4);
    s.write(&c, &third, false, "a write with both members up").await;
    let fills = s.counter("fills");
    s.read_back(&c, &third, "a read after the last write").await;
    s.wait_counter("fills", fills + BLOCKS);
    s.read_back(&c, &third, "a read again, from the members").await;
    let uri = s.members[0].uri_for("ram");
    let used = s.metric(&format!("sluice_cache_member_slots_used{{export=\"v\",member=\"0\",uri=\"{uri}\"}}"));
    assert!(used > 0.0, "member 0 holds none of the blocks filled after its return\n{}", s.logs());
    assert!(s.counter("member_failures") >= 1.0, "{}", s.logs());
    s.disconnect(c).await;
}

/// A write over cached blocks drops them, and their members are asked to trim the slots, so
/// a RAM member gives that memory back: once the trims land, every byte of both members
/// reads as zero again. The new data reads back, from the backing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_over_cached_blocks_has_their_members_trim_the_slots() {
    let s = setup();
    let (c, _) = s.filled(7).await;
    let members: Vec<Client> = {
        let mut v = Vec::new();
        for m in &s.members {
            let uri = Uri::parse(&m.uri_for("ram")).unwrap();
            v.push(s.bounded("connect to a member", Client::connect_with(&uri, &Options::default())).await);
        }
        v
    };
    let zeroed = || async {
        let mut all = true;
        for m in &members {
            let size = m.size() as usize;
            all &= s.bounded("read a member", m.read_owned(0, vec![1; size])).await.iter().all(|&b| b == 0);
        }
        all
    };
    assert!(!zeroed().await, "the fills wrote nothing to the members\n{}", s.logs());

    let second = pattern(RANGE, 8);
    s.write(&c, &second, false, "a write over the cached blocks").await;
    s.wait_counter("member_trims", BLOCKS);
    let deadline = std::time::Instant::now() + SETTLE;
    while !zeroed().await {
        assert!(std::time::Instant::now() < deadline, "the members still hold bytes {SETTLE:?} after the trims were sent\n{}", s.logs());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    s.read_back(&c, &second, "a read after the write").await;
    assert_eq!(s.counter("misses"), 2.0 * BLOCKS, "the dropped blocks were read again from the backing\n{}", s.logs());
    assert_eq!(s.counter("member_trims"), BLOCKS, "one trim per dropped slot\n{}", s.logs());
    for m in members {
        m.disconnect().await;
    }
    s.disconnect(c).await;
}

/// A cache file that does not check out stops `info` (exit 2) and `serve`, and the message
/// names the file and the key.
#[test]
fn a_bad_cache_file_is_refused_naming_the_file_and_the_key() {
    let dir = tempfile::tempdir().unwrap();
    let cases = [
        ("backing = \"nbd://h/v\"\nmembers = [\"nbd://a/ram\"]\nblock = \"96K\"\n", "block"),
        ("backing = \"nbd://h/v\"\nmembers = [\"nbd://a/ram\"]\ncolour = \"blue\"\n", "colour"),
        ("members = [\"nbd://a/ram\"]\n", "backing"),
        ("backing = \"nbd://h/v\"\nmembers = [\"nbd://a/ram\", \"nbd://a/ram\"]\n", "members[1]"),
        ("backing = \"/var/lib/disk.img\"\nmembers = [\"nbd://a/ram\"]\n", "backing \"/var/lib/disk.img\""),
    ];
    for (i, (text, key)) in cases.iter().enumerate() {
        let file = dir.path().join(format!("bad{i}.toml"));
        std::fs::write(&file, text).unwrap();
        let spec = format!("cache:{}", file.display());
        let out = output(std::process::Command::new(SLUICE).args(["info", &spec]));
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "info {text:?}: {err}");
        assert!(err.contains(&file.display().to_string()) && err.contains(key), "info {text:?} should name the file and {key:?}: {err}");
    }
    let file = dir.path().join("bad0.toml");
    let out = output(std::process::Command::new(SLUICE).args(["serve", "--export", &format!("v=cache:{}", file.display()), "--unix"]).arg(dir.path().join("s.sock")));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success() && err.contains(&file.display().to_string()) && err.contains("block"), "serve: {err}");
    // `serve --check` reads the file without contacting the backing or the members.
    let check = |spec: &str| output(std::process::Command::new(SLUICE).args(["serve", "--check", "--export", &format!("v={spec}"), "--unix"]).arg(dir.path().join("s.sock")));
    let out = check(&format!("cache:{}", file.display()));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.code() == Some(2) && err.contains(&file.display().to_string()) && err.contains("block"), "serve --check: {err}");
    let good = dir.path().join("good.toml");
    std::fs::write(&good, "backing = \"nbd://nowhere.invalid/v\"\nmembers = [\"nbd://nowhere.invalid/ram\"]\n").unwrap();
    let out = check(&format!("cache:{}", good.display()));
    assert!(out.status.success(), "serve --check of a good file: {}", String::from_utf8_lossy(&out.stderr));
    // One cached volume served as two exports would be two caches writing the same slots.
    let twice = |check: bool| {
        let spec = format!("cache:{}", good.display());
        let mut c = std::process::Command::new(SLUICE);
        c.arg("serve").args(check.then_some("--check")).args(["--export", &format!("v={spec}"), "--export", &format!("w={spec}"), "--unix"]).arg(dir.path().join("s.sock"));
        output(&mut c)
    };
    for check in [true, false] {
        let out = twice(check);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.code() == Some(2) && err.contains("the same cached volume"), "serve (--check: {check}) of one cache twice: {err}");
    }
}

/// fio writes and verifies through the cached volume (4K to 64K at queue depth 16) while a
/// member is killed and restarted empty: no error, no verify failure.
#[test]
fn fio_verifies_through_a_member_killed_and_restarted() {
    require!("fio");
    let mut s = setup();
    s.wait_member(0, true, SETTLE);
    s.wait_member(1, true, SETTLE);
    let uri = format!("--uri={}", s.cache.uri_for("v"));
    let args = ["--name=cache", "--ioengine=nbd", &uri, "--rw=randwrite", "--bsrange=4k-64k", "--iodepth=16", "--size=8M", "--loops=12", "--verify=crc32c", "--do_verify=1", "--verify_state_save=0"];
    let fio = run_in_background("fio", &args);
    // A fill or a hit in flight when the member dies fails over to the backing.
    s.wait_counter("fills", 1.0);
    s.members[0].kill();
    assert!(!fio.is_finished(), "fio was done before the member was killed: give it more loops");
    s.wait_member(0, false, SETTLE);
    s.members[0].restart();
    s.wait_member(0, true, BACK_UP);
    let (ok, out, err) = fio.join().unwrap();
    let text = format!("{out}{err}");
    let verify: Vec<&str> = text.lines().filter(|l| l.contains("verify:") || l.contains("bad magic")).collect();
    assert!(ok && text.contains("err= 0") && verify.is_empty(), "fio through the cache failed: {verify:#?}\n{text}\n{}", s.logs());
    assert!(s.counter("member_failures") >= 1.0 && s.counter("fills") > 0.0, "{}", s.logs());
}

/// A member that stops answering (SIGSTOP) holds reads up for the member timeout (2 s)
/// at most: then it is marked down, its reads go to the backing, and writes made
/// meanwhile read back; killed and restarted, it is used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_member_is_timed_out_and_its_reads_go_to_the_backing() {
    let mut s = setup();
    let (c, first) = s.filled(5).await;

    s.members[0].pause();
    let started = std::time::Instant::now();
    s.read_back(&c, &first, "a read with member 0 stalled").await;
    // The member timeout (2 s), with room for a loaded machine; not SETTLE, which bounds
    // the read itself.
    let held = started.elapsed();
    assert!(held < STALL_MAX, "the stalled member held the read up for {held:?}\n{}", s.logs());
    s.wait_member(0, false, SETTLE);
    let second = pattern(RANGE, 6);
    s.write(&c, &second, false, "a write with member 0 stalled").await;
    s.read_back(&c, &second, "a read after a write with member 0 stalled").await;

    s.members[0].kill();
    s.members[0].restart();
    s.wait_member(0, true, BACK_UP);
    s.read_back(&c, &second, "a read with member 0 back").await;
    s.disconnect(c).await;
}

/// The backing's errno reaches the cached volume's client: nbdkit failing every write
/// with ENOSPC gives ENOSPC in the gateway's reply, not EIO, through the cache's own
/// connections to the backing and through the worker's; reads still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_backings_errno_comes_through() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let kit = Nbdkit::start(dir.path(), "kit", &["--filter=error", "memory", "4M", "error=ENOSPC", "error-pwrite-rate=100%"]);
    let member = Sluice::start(&["--export", &format!("ram={MEMBER}")]);
    let file = dir.path().join("cache.toml");
    std::fs::write(&file, format!("backing = {:?}\nmembers = [{:?}]\n", kit.uri(), member.uri_for("ram"))).unwrap();
    // One worker, so that its connection to the backing is the one every write can take.
    let metrics = free_port();
    let metrics_at = format!("127.0.0.1:{metrics}");
    let cache = Sluice::start(&["--export", &format!("v=cache:{}", file.display()), "--threads", "1", "--log-level", "debug", "--metrics", &metrics_at]);
    let logs = || format!("--- cache:\n{}\n--- member:\n{}", cache.log_text(), member.log_text());
    let uri = Uri::parse(&cache.uri_for("v")).unwrap();
    let c = tokio::time::timeout(SETTLE, Client::connect_with(&uri, &Options::default())).await.expect("connect, bounded").expect("connect");
    let read = tokio::time::timeout(SETTLE, c.read_owned(0, vec![1; 65536])).await.expect("a read, bounded");
    assert_eq!(read.unwrap_or_else(|e| panic!("read: {e}\n{}", logs())), vec![0; 65536]);
    let written = std::cell::Cell::new(0.0);
    let write = || async {
        written.set(written.get() + 1.0);
        match tokio::time::timeout(SETTLE, c.write(0, &[7; 4096], false)).await.expect("a write, bounded") {
            Err(sluice_client::Error::Server { errno, .. }) => assert_eq!(errno, libc::ENOSPC as u32, "{}", logs()),
            other => panic!("the backing's ENOSPC was lost: {other:?}\n{}", logs()),
        }
    };
    // The first write offered to the worker's connection to the backing opens it; the
    // writes go the cache's own way until it is up, and over it from then on.
    let up = format!("member {}: worker 0 sends reads, writes and flushes over a connection of its own", kit.uri());
    let deadline = std::time::Instant::now() + SETTLE;
    while !cache.log_text().contains(&up) {
        assert!(std::time::Instant::now() < deadline, "the worker opened no connection of its own to the backing\n{}", logs());
        write().await;
    }
    write().await;
    // Each failed write is counted.
    let failed = sample(&http_get(metrics, "/metrics").1, "sluice_cache_failed_writes_total{export=\"v\"}");
    assert_eq!(failed, written.get(), "{}", logs());
    c.disconnect().await;
    let (status, log) = cache.stop_with_log();
    assert_eq!(status.code(), Some(0), "{log}");
}
