//! The client library against a real sluice server: URIs, many requests in flight answered
//! out of order, scatter-gather, split large requests, block status, multi-conn, readahead,
//! and the errors a user meets.

mod common;

use common::*;
use sluice_client::{Client, Error, Options, Readahead, Uri};
use std::io::IoSlice;
use std::os::unix::fs::FileExt;

fn sparse_file(dir: &std::path::Path, name: &str, size: u64) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    p
}

async fn connect(uri: &str) -> Client {
    Client::connect(uri).await.unwrap_or_else(|e| panic!("connect {uri}: {e}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn connects_by_tcp_and_unix_uri_and_reports_the_export() {
    let dir = tempfile::tempdir().unwrap();
    let img = sparse_file(dir.path(), "a.img", 3 << 20);
    let s = Sluice::start(&["--export", &format!("disk={},description=first disk", img.display()), "--export", "ro=memory:1M,ro"]);
    for uri in [format!("nbd://127.0.0.1:{}/disk", s.port), s.uri_for("disk")] {
        let c = connect(&uri).await;
        let e = c.export();
        assert_eq!((e.name.as_str(), e.size), ("disk", 3 << 20));
        assert_eq!(e.description.as_deref(), Some("first disk"));
        assert!(e.structured && e.base_allocation, "{e:?}");
        assert!(!e.read_only() && e.can_flush() && e.can_fua() && e.can_trim() && e.can_zero());
        c.disconnect().await;
        assert!(matches!(c.read_owned(0, vec![0; 1]).await, Err(Error::Closed)));
    }
    let ro = connect(&s.uri_for("ro")).await;
    assert!(ro.export().read_only());
    assert!(matches!(ro.write(0, b"x", false).await, Err(Error::ReadOnly)));
    assert!(matches!(ro.trim(0, 4096, false).await, Err(Error::ReadOnly)));

    let listed = sluice_client::list_exports(&Uri::parse(&s.uri()).unwrap(), true).await.unwrap();
    let mut names: Vec<_> = listed.iter().map(|e| (e.name.as_str(), e.details.as_ref().map(|d| d.size))).collect();
    names.sort();
    assert_eq!(names, [("disk", Some(3 << 20)), ("ro", Some(1 << 20))]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_a_user_meets() {
    let s = Sluice::start(&["--export", "disk=memory:1M"]);
    match Client::connect(&s.uri_for("nope")).await {
        Err(Error::UnknownExport(name)) => assert_eq!(name, "nope"),
        other => panic!("unknown export gave {:?}", other.map(|_| ())),
    }
    let port = free_port();
    let e = Client::connect(&format!("nbd://127.0.0.1:{port}/")).await.err().expect("nothing listens there");
    assert!(matches!(e, Error::Io(_)), "{e}");
    assert!(e.to_string().contains(&port.to_string()), "{e}");
    assert!(matches!(Client::connect("http://x/").await, Err(Error::Uri(_))));

    let c = connect(&s.uri_for("disk")).await;
    let e = c.read_owned((1 << 20) - 10, vec![0; 20]).await.unwrap_err();
    assert!(matches!(e, Error::OutOfRange { .. }), "{e}");
    assert!(matches!(c.write(u64::MAX - 1, b"ab", false).await, Err(Error::OutOfRange { .. })));
    // Still usable after refusals, which were never sent.
    c.write(0, b"still here", true).await.unwrap();
    assert_eq!(c.read_owned(0, vec![0; 10]).await.unwrap(), b"still here");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_requests_in_flight_match_a_shadow_copy() {
    let dir = tempfile::tempdir().unwrap();
    let size = 16u64 << 20;
    let img = sparse_file(dir.path(), "a.img", size);
    // Small chunks so reads come back as several out-of-order chunks.
    let s = Sluice::start(&["--chunk", "64K", "--export", &format!("disk={}", img.display())]);
    let c = connect(&s.uri_for("disk")).await;
    let mut shadow = vec![0u8; size as usize];
    // Non-overlapping writes of odd sizes and offsets, all in flight together.
    let mut tasks = Vec::new();
    for i in 0..96u64 {
        let off = i * (size / 96) + i * 7;
        let len = 1000 + (i as usize * 3331) % 150_000;
        let data = pattern(len, i);
        shadow[off as usize..off as usize + len].copy_from_slice(&data);
        let c = c.clone();
        tasks.push(tokio::spawn(async move { c.write(off, &data, i % 5 == 0).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    c.flush().await.unwrap();
    let mut reads = Vec::new();
    for i in 0..128u64 {
        let off = (i * 131_071) % (size - 400_000);
        let len = 1 + (i as usize * 7919) % 400_000;
        let c = c.clone();
        reads.push((off, len, tokio::spawn(async move { c.read_owned(off, vec![0xAA; len]).await })));
    }
    for (off, len, t) in reads {
        let got = t.await.unwrap().unwrap();
        assert!(got == shadow[off as usize..off as usize + len], "read at {off} len {len} differs");
    }
    let on_disk = std::fs::read(&img).unwrap();
    assert!(on_disk == shadow, "backing file differs from the shadow copy");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn vectored_and_split_requests() {
    // 80 MiB: more than two 32 MiB requests, so both directions are split.
    let s = Sluice::start(&["--export", "disk=memory:80M"]);
    let c = connect(&s.uri_for("disk")).await;
    let max = c.export().request_max_bytes() as usize;
    assert!(max <= 32 << 20);
    let big = pattern((70 << 20) + 12345, 7);
    let (a, b) = big.split_at(3 << 20);
    let (b, rest) = b.split_at(40 << 20);
    c.write_vectored(4096, &[IoSlice::new(a), IoSlice::new(b), IoSlice::new(rest)], false).await.unwrap();
    let lens = [1usize, 4095, 33 << 20, big.len() - 1 - 4095 - (33 << 20)];
    let bufs = c.read_vectored(4096, lens.iter().map(|&n| vec![0x55; n]).collect()).await.unwrap();
    assert_eq!(bufs.iter().map(Vec::len).collect::<Vec<_>>(), lens);
    assert!(bufs.concat() == big, "scatter read differs from the gather write");
    let mut one = vec![0u8; 1 << 20];
    c.read(4096 + (50 << 20), &mut one).await.unwrap();
    assert!(one[..] == big[50 << 20..51 << 20]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn block_status_zeroes_and_trim() {
    let dir = tempfile::tempdir().unwrap();
    let img = sparse_file(dir.path(), "a.img", 8 << 20);
    std::fs::OpenOptions::new().write(true).open(&img).unwrap().write_all_at(&pattern(1 << 20, 1), 2 << 20).unwrap();
    let s = Sluice::start(&["--export", &format!("disk={}", img.display())]);
    let c = connect(&s.uri_for("disk")).await;
    let mut map = Vec::new();
    let mut at = 0;
    while at < c.size() {
        let ex = c.block_status(at, c.size() - at).await.unwrap();
        assert!(!ex.is_empty() && ex[0].offset == at);
        at = ex.last().map(|e| e.offset + e.length).unwrap();
        map.extend(ex);
    }
    let data: Vec<_> = map.iter().filter(|e| !e.hole).map(|e| (e.offset, e.length)).collect();
    assert_eq!(data, [(2 << 20, 1 << 20)], "map {map:?}");
    assert!(map.iter().filter(|e| e.hole).all(|e| e.zero));

    c.write_zeroes(2 << 20, 4096, false, true, false).await.unwrap();
    c.write_zeroes((2 << 20) + 8192, 4096, true, false, false).await.unwrap();
    c.trim((3 << 20) - 4096, 4096, false).await.unwrap();
    c.flush().await.unwrap();
    let got = c.read_owned(2 << 20, vec![1; 3 * 4096]).await.unwrap();
    let want = pattern(1 << 20, 1);
    assert!(got[..4096].iter().all(|&b| b == 0) && got[8192..].iter().all(|&b| b == 0));
    assert!(got[4096..8192] == want[4096..8192]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_conn_spreads_requests_and_stays_coherent() {
    let s = Sluice::start(&["--export", "disk=memory:8M"]);
    let uri = Uri::parse(&s.uri_for("disk")).unwrap();
    let c = Client::connect_with(&uri, &Options { connections: 4, ..Options::default() }).await.unwrap();
    assert!(c.export().can_multi_conn());
    assert_eq!(c.connections(), 4);
    let mut tasks = Vec::new();
    for i in 0..64u64 {
        let c = c.clone();
        tasks.push(tokio::spawn(async move { c.write(i * 65536, &pattern(65536, i), false).await }));
    }
    for t in tasks {
        t.await.unwrap().unwrap();
    }
    c.flush().await.unwrap();
    // A separate single connection sees every write.
    let other = connect(&s.uri_for("disk")).await;
    for i in 0..64u64 {
        assert!(other.read_owned(i * 65536, vec![0; 65536]).await.unwrap() == pattern(65536, i), "block {i}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readahead_serves_sequential_and_random_reads_correctly() {
    let s = Sluice::start(&["--export", "disk=memory:4M"]);
    let c = connect(&s.uri_for("disk")).await;
    let mut data = pattern(4 << 20, 3);
    c.write(0, &data, false).await.unwrap();
    let mut ra = Readahead::new(c.clone(), 256 << 10);
    let mut at = 0usize;
    let mut buf = vec![0u8; 12_345];
    while at < data.len() {
        let n = buf.len().min(data.len() - at);
        ra.read(at as u64, &mut buf[..n]).await.unwrap();
        assert!(buf[..n] == data[at..at + n], "sequential read at {at}");
        at += n;
    }
    // A write inside the window, then invalidate: the next sequential read sees it.
    ra.read(0, &mut buf[..100]).await.unwrap();
    ra.read(100, &mut buf[..100]).await.unwrap();
    c.write(200, b"fresh", false).await.unwrap();
    ra.invalidate(200, 5);
    ra.read(200, &mut buf[..5]).await.unwrap();
    assert_eq!(&buf[..5], b"fresh");
    data[200..205].copy_from_slice(b"fresh");
    // Random reads go straight through.
    for i in 0..20u64 {
        let off = ((i * 1_000_003) % ((4 << 20) - 5000)) as usize;
        ra.read(off as u64, &mut buf[..5000]).await.unwrap();
        assert!(buf[..5000] == data[off..off + 5000], "random read at {off}");
    }
}

/// Reads of export "disk" the server has counted, once `client` has disconnected and the
/// server has closed its connections (see metrics_after_close: a request is recorded only
/// after its reply is sent).
async fn server_reads_after_disconnect(client: &Client, metrics_port: u16) -> f64 {
    client.disconnect().await;
    let body = tokio::task::spawn_blocking(move || metrics_after_close(metrics_port, "disk")).await.unwrap();
    sample(&body, r#"sluice_requests_total{export="disk",op="read"}"#)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readahead_turns_small_sequential_reads_into_window_sized_requests() {
    let mport = free_port();
    let s = Sluice::start(&["--export", "disk=memory:4M", "--metrics", &format!("127.0.0.1:{mport}")]);
    let c = connect(&s.uri_for("disk")).await;
    let mut ra = Readahead::new(c.clone(), 256 << 10);
    let mut buf = vec![0u8; 4096];
    let reads = (4 << 20) / 4096;
    for i in 0..reads {
        ra.read(i * 4096, &mut buf).await.unwrap();
    }
    let sent = server_reads_after_disconnect(&c, mport).await;
    // 1024 reads of 4 KiB; 256 KiB windows need about 16 requests (plus the first, direct).
    assert!(sent > 0.0 && sent <= 24.0, "server saw {sent} reads for {reads} sequential 4K reads");
    // Off: one request per read. A new client, so nothing the first one left can count here.
    let c = connect(&s.uri_for("disk")).await;
    let mut plain = Readahead::new(c.clone(), 0);
    for i in 0..64 {
        plain.read(i * 4096, &mut buf).await.unwrap();
    }
    assert_eq!(server_reads_after_disconnect(&c, mport).await - sent, 64.0);
}
