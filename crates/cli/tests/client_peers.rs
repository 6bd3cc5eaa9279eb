//! The client library against the other NBD servers: nbdkit, qemu-nbd and nbd-server (which
//! speaks only simple replies). The same workout runs against each.

mod common;

use common::*;
use sluice_client::{Client, Error, Options, Uri};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const SIZE: u64 = 16 << 20;

/// A peer server process, killed on drop.
struct Peer(Child);

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A daemon that forked away from us, killed by pid on drop.
struct Daemon(u32);

impl Drop for Daemon {
    fn drop(&mut self) {
        signal(self.0, libc::SIGTERM);
    }
}

fn spawn(program: &str, args: &[&str]) -> Peer {
    let child = Command::new(program)
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot start {program}: {e}"));
    Peer(child)
}

fn wait_for(ready: impl Fn() -> bool, what: &str) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !ready() {
        assert!(Instant::now() < deadline, "{what} did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn image(dir: &Path) -> std::path::PathBuf {
    let p = dir.join("disk.img");
    std::fs::File::create(&p).unwrap().set_len(SIZE).unwrap();
    p
}

/// Writes, reads back with many requests in flight, zeroes, trims, flushes, maps.
async fn workout(uri: &str, connections: usize) -> Client {
    let c = Client::connect_with(&Uri::parse(uri).unwrap(), &Options { connections, ..Options::default() })
        .await
        .unwrap_or_else(|e| panic!("{uri}: {e}"));
    assert_eq!(c.size(), SIZE, "{uri}");
    let mut tasks = Vec::new();
    for i in 0..32u64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move {
            let data = pattern(100_000, i);
            c.write(i * 300_000 + 17, &data, false).await?;
            Ok::<_, Error>(())
        }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    c.flush().await.unwrap();
    let mut reads = Vec::new();
    for i in 0..32u64 {
        let c = c.clone();
        reads.push(tokio::spawn(async move { (i, c.read_owned(i * 300_000 + 17, vec![0; 100_000]).await) }));
    }
    for r in reads {
        let (i, got) = r.await.unwrap();
        assert!(got.unwrap() == pattern(100_000, i), "{uri}: block {i} differs");
    }
    // A read larger than one request is split and reassembled.
    let whole = c.read_owned(0, vec![0; SIZE as usize]).await.unwrap();
    assert!(whole[17..100_017] == pattern(100_000, 0)[..], "{uri}: whole-disk read");
    if c.export().can_zero() {
        c.write_zeroes(17, 50_000, false, true, false).await.unwrap();
        let got = c.read_owned(0, vec![1; 100_000]).await.unwrap();
        assert!(got[..50_017].iter().all(|&b| b == 0), "{uri}: zeroed range");
        assert!(got[50_017..100_000] == pattern(100_000, 0)[50_000..99_983], "{uri}: after zero");
    }
    if c.export().can_trim() {
        c.trim(SIZE - (1 << 20), 1 << 20, false).await.unwrap();
    }
    let extents = c.block_status(0, SIZE).await.unwrap();
    assert!(!extents.is_empty() && extents[0].offset == 0, "{uri}: {extents:?}");
    assert!(extents.iter().all(|e| e.length > 0 && e.offset + e.length <= SIZE));
    assert!(matches!(c.read_owned(SIZE - 1, vec![0; 2]).await, Err(Error::OutOfRange { .. })));
    c
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_nbdkit() {
    require!("nbdkit");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("nbdkit.sock");
    let img = image(dir.path());
    let _peer = spawn("nbdkit", &["-f", "-U", sock.to_str().unwrap(), "file", img.to_str().unwrap()]);
    // The socket file exists once bound, before the server listens: wait for a connection.
    wait_for(|| std::os::unix::net::UnixStream::connect(&sock).is_ok(), "nbdkit");
    let uri = format!("nbd+unix:///?socket={}", sock.display());
    let c = workout(&uri, 4).await;
    assert!(c.export().structured && c.export().base_allocation);
    assert_eq!(c.connections(), 4, "nbdkit's file plugin allows multi-conn");
    c.disconnect().await;
    assert!(std::fs::read(&img).unwrap()[50_017..100_017] == pattern(100_000, 0)[50_000..]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_qemu_nbd() {
    require!("qemu-nbd");
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("qemu.sock");
    let img = image(dir.path());
    let _peer = spawn("qemu-nbd", &["-f", "raw", "-x", "disk", "-k", sock.to_str().unwrap(), "--persistent", "--shared=8", "--discard=unmap", img.to_str().unwrap()]);
    wait_for(|| std::os::unix::net::UnixStream::connect(&sock).is_ok(), "qemu-nbd");
    let c = workout(&format!("nbd+unix:///disk?socket={}", sock.display()), 1).await;
    assert!(c.export().structured && c.export().base_allocation);
    match Client::connect(&format!("nbd+unix:///other?socket={}", sock.display())).await {
        Err(Error::UnknownExport(n)) => assert_eq!(n, "other"),
        other => panic!("qemu-nbd unknown export gave {:?}", other.map(|_| ())),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn against_nbd_server() {
    require!("nbd-server");
    let dir = tempfile::tempdir().unwrap();
    let img = image(dir.path());
    let port = free_port();
    let conf = dir.path().join("nbd-server.conf");
    std::fs::write(
        &conf,
        format!("[generic]\n    port = {port}\n    listenaddr = 127.0.0.1\n    allowlist = true\n[disk]\n    exportname = {}\n    trim = true\n", img.display()),
    )
    .unwrap();
    // Daemonized: with -d (no fork) nbd-server serves one connection at a time, and
    // multi-conn needs two.
    let pidfile = dir.path().join("nbd-server.pid");
    let (ok, _, err) = run("nbd-server", &["-C", conf.to_str().unwrap(), "-p", pidfile.to_str().unwrap()]);
    assert!(ok, "nbd-server: {err}");
    wait_for(|| std::fs::read_to_string(&pidfile).is_ok_and(|p| p.trim().parse::<u32>().is_ok()), "nbd-server");
    let _peer = Daemon(std::fs::read_to_string(&pidfile).unwrap().trim().parse().unwrap());
    wait_for(|| std::net::TcpStream::connect(("127.0.0.1", port)).is_ok(), "nbd-server");
    let uri = format!("nbd://127.0.0.1:{port}/disk");
    let c = workout(&uri, 2).await;
    // nbd-server has no structured replies: reads come back as simple replies, and block
    // status falls back to "all data".
    assert!(!c.export().structured && !c.export().base_allocation);
    let listed = sluice_client::list_exports(&Uri::parse(&uri).unwrap(), false).await.unwrap();
    assert!(listed.iter().any(|e| e.name == "disk"), "{listed:?}");
}
