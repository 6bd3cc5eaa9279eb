//! Extended headers (NBD_OPT_EXTENDED_HEADERS): qemu 10's client negotiates them with
//! sluice and runs every command through them; sluice's client uses them with qemu-nbd 10;
//! block status answers more than 4 GiB at once; hostile extended requests get the spec's
//! error reply or a clean hang-up, and the server goes on serving.
mod common;
mod raw;

use std::time::Duration;

use common::*;
use raw::{info_data, meta_data, Client, OPT_GO, OPT_SET_META_CONTEXT, REP_ACK};
use sluice_proto::client::{decode_block_status_ext, decode_error_chunk, ChunkHeader};
use sluice_proto::wire as w;
use sluice_proto::RawRequest;

const GIB: u64 = 1 << 30;

/// The debug line the server logs when a connection starts transmission.
const EXTENDED_LINE: &str = "transmission with extended headers";

fn qemu(program: &str, args: &[&str]) -> String {
    let (ok, out, err) = run(program, args);
    assert!(ok, "{program} {args:?} failed:\n{out}{err}");
    format!("{out}{err}")
}

/// A sparse file of `size` bytes with `data` written at each offset.
fn sparse(path: &std::path::Path, size: u64, data: &[(u64, &[u8])]) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::File::create(path).unwrap();
    f.set_len(size).unwrap();
    for (at, bytes) in data {
        f.write_all_at(bytes, *at).unwrap();
    }
}

/// `len` bytes of a (large, sparse) file at `offset`, without reading the rest.
fn read_at(path: &std::path::Path, offset: u64, len: usize) -> Vec<u8> {
    use std::os::unix::fs::FileExt;
    let mut b = vec![0u8; len];
    std::fs::File::open(path).unwrap().read_exact_at(&mut b, offset).unwrap();
    b
}

fn debug_sluice(exports: &[&str]) -> Sluice {
    let mut args = vec!["--log-level", "debug"];
    for e in exports {
        args.extend(["--export", e]);
    }
    Sluice::start(&args)
}

fn assert_extended_in_log(s: &Sluice) -> String {
    let log = s.log_text();
    let line = log.lines().find(|l| l.contains(EXTENDED_LINE));
    assert!(line.is_some(), "no {EXTENDED_LINE:?} in the log:\n{log}");
    line.unwrap().to_owned()
}

#[test]
fn qemu_io_runs_every_command_over_extended_headers_on_every_data_path() {
    require!("qemu-io", "qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let paths = ["copy", "direct", "splice", "splice-direct"];
    let specs: Vec<String> = paths
        .iter()
        .map(|p| {
            let file = dir.path().join(format!("{p}.img"));
            sparse(&file, 64 << 20, &[]);
            format!("{p}={},data-path={p}", file.display())
        })
        .collect();
    // 64 KiB chunks: a 1 MiB read goes out as 16 pipelined OFFSET_DATA chunks.
    let mut args = vec!["--log-level", "debug", "--chunk", "64K"];
    for spec in &specs {
        args.extend(["--export", spec]);
    }
    let s = Sluice::start(&args);
    for p in paths {
        qemu_io_every_command(&s.uri_for(p));
        let on_disk = read_at(&dir.path().join(format!("{p}.img")), 0, 4000);
        assert!(on_disk[..1000].iter().all(|&b| b == 0xab) && on_disk[1000..].iter().all(|&b| b == 0xcd), "{p}");
        assert!(read_at(&dir.path().join(format!("{p}.img")), 17 << 20, 65536).iter().all(|&b| b == 0x12), "{p}");
    }
    eprintln!("{}", assert_extended_in_log(&s));
    let connections = s.log_text().matches(EXTENDED_LINE).count();
    assert!(connections >= 2 * paths.len(), "{connections} connections with extended headers");
    assert_eq!(s.stop().code(), Some(0));
}

/// Write, read, FUA, zero (with and without holes), discard, pipelined writes, flush and
/// map through qemu-io, then block status through qemu-img map.
fn qemu_io_every_command(uri: &str) {
    let commands = [
        "write -P 0xab 0 1M",
        "read -P 0xab 0 1M",
        "write -f -P 0xcd 1000 3000",
        "read -P 0xcd 1000 3000",
        "write -z 2M 1M",
        "read -P 0 2M 1M",
        "write -z -u 4M 1M",
        "discard 8M 8M",
        "read -P 0 8M 8M",
        "aio_write -P 0x11 16M 64k",
        "aio_write -P 0x12 17M 64k",
        "aio_flush",
        "read -P 0x12 17M 64k",
        "flush",
        "map",
    ];
    let mut args = vec!["-f", "raw"];
    for c in &commands {
        args.extend(["-c", c]);
    }
    args.push(uri);
    let out = qemu("qemu-io", &args);
    assert!(!out.contains("failed") && !out.contains("error"), "qemu-io on {uri}:\n{out}");
    // Block status: the data qemu wrote and the holes around it, as qemu reads them.
    let map = qemu("qemu-img", &["map", "-f", "raw", "--output=json", uri]);
    let extents: serde_json::Value = serde_json::from_str(&map).unwrap_or_else(|e| panic!("{e}: {map}"));
    assert_eq!((extents[0]["start"].as_u64(), extents[0]["data"].as_bool()), (Some(0), Some(true)), "{map}");
    assert!(extents.as_array().unwrap().iter().any(|e| e["zero"] == true && e["data"] == false), "no hole in {map}");
}

#[test]
fn qemu_img_converts_and_maps_past_4_gib_over_extended_headers() {
    require!("qemu-img");
    let dir = tempfile::tempdir().unwrap();
    let (src, dst) = (dir.path().join("src.img"), dir.path().join("dst.img"));
    let (head, tail) = (pattern(1 << 20, 3), pattern(1 << 20, 4));
    sparse(&src, 8 * GIB, &[(0, &head), (5 * GIB, &tail)]);
    sparse(&dst, 8 * GIB, &[(3 * GIB, &[0x77; 4096])]);
    let s = debug_sluice(&[&format!("dst={}", dst.display())]);
    let uri = s.uri_for("dst");
    qemu("qemu-img", &["convert", "-n", "-f", "raw", "-O", "raw", src.to_str().unwrap(), &uri]);
    qemu("qemu-img", &["compare", "-f", "raw", "-F", "raw", src.to_str().unwrap(), &uri]);
    // One extent of zeros longer than 4 GiB: block status answered past 32 bits.
    let map = qemu("qemu-img", &["map", "-f", "raw", "--output=json", &uri]);
    let extents: serde_json::Value = serde_json::from_str(&map).unwrap_or_else(|e| panic!("{e}: {map}"));
    let long_zero = extents.as_array().unwrap().iter().any(|e| e["zero"] == true && e["length"].as_u64() > Some(4 * GIB));
    assert!(long_zero, "no zero extent past 4 GiB in:\n{map}");
    eprintln!("{}", assert_extended_in_log(&s));
    assert!(read_at(&dst, 0, 1 << 20) == head, "the first MiB differs");
    assert!(read_at(&dst, 3 * GIB, 4096).iter().all(|&b| b == 0), "the old data was not zeroed");
    assert!(read_at(&dst, 5 * GIB, 1 << 20) == tail, "the MiB at 5 GiB differs");
    assert_eq!(s.stop().code(), Some(0));
}

/// qemu-nbd on a private port, killed (by pid) on drop; its log says why when it fails.
struct QemuNbd {
    child: std::process::Child,
    port: u16,
    log: std::path::PathBuf,
}

impl QemuNbd {
    fn start(dir: &std::path::Path, image: &std::path::Path) -> QemuNbd {
        let port = free_port();
        let log = dir.join("qemu-nbd.log");
        let child = std::process::Command::new("qemu-nbd")
            .args(["-f", "raw", "-x", "disk", "-b", "127.0.0.1", "-p", &port.to_string(), "--persistent"])
            .arg(image)
            .stdout(std::process::Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .expect("start qemu-nbd");
        let q = QemuNbd { child, port, log };
        let up = || std::net::TcpStream::connect(("127.0.0.1", q.port)).is_ok();
        wait_until("qemu-nbd listening", Duration::from_secs(10), up, || std::fs::read_to_string(&q.log).unwrap_or_default());
        q
    }

    fn uri(&self) -> String {
        format!("nbd://127.0.0.1:{}/disk", self.port)
    }
}

impl Drop for QemuNbd {
    fn drop(&mut self) {
        signal(self.child.id(), libc::SIGTERM);
        if wait_timeout(&mut self.child, Duration::from_secs(10)).is_none() {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn sluice_info_and_copy_use_extended_headers_with_qemu_nbd() {
    require!("qemu-nbd");
    let dir = tempfile::tempdir().unwrap();
    let image = dir.path().join("disk.img");
    let tail = pattern(1 << 20, 9);
    sparse(&image, 6 * GIB, &[(5 * GIB, &tail)]);
    let q = QemuNbd::start(dir.path(), &image);
    let (ok, out, err) = run(SLUICE, &["info", "--json", &q.uri()]);
    assert!(ok, "sluice info:\n{out}{err}");
    let info: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!((info["extended_headers"].as_bool(), info["size"].as_u64()), (Some(true), Some(6 * GIB)), "{out}");
    let (ok, map, err) = run(SLUICE, &["info", "--map", &q.uri()]);
    assert!(ok, "sluice info --map:\n{map}{err}");
    assert!(map.lines().next().is_some_and(|l| l.split_whitespace().nth(1) == Some("5368709120")), "{map}");
    // Out of qemu-nbd into a file, then a file into qemu-nbd, and compare.
    let copy = dir.path().join("copy.img");
    let (ok, out, err) = run(SLUICE, &["copy", &q.uri(), copy.to_str().unwrap()]);
    assert!(ok, "sluice copy out:\n{out}{err}");
    assert_eq!(std::fs::metadata(&copy).unwrap().len(), 6 * GIB);
    assert!(read_at(&copy, 5 * GIB, 1 << 20) == tail, "the MiB at 5 GiB differs in the copy");
    assert!(read_at(&copy, 0, 1 << 20).iter().all(|&b| b == 0));
    let head = pattern(3 << 20, 10);
    let small = dir.path().join("small.img");
    std::fs::write(&small, &head).unwrap();
    let (ok, out, err) = run(SLUICE, &["copy", small.to_str().unwrap(), &q.uri()]);
    assert!(ok, "sluice copy in:\n{out}{err}");
    drop(q);
    assert!(read_at(&image, 0, 3 << 20) == head, "what sluice wrote through qemu-nbd differs");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_client_library_maps_and_zeroes_past_4_gib_and_falls_back_without_extended_headers() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.img");
    sparse(&big, 8 * GIB, &[(5 * GIB, &[7; 4096])]);
    let s = debug_sluice(&[&format!("big={}", big.display())]);
    let c = sluice_client::Client::connect(&s.uri_for("big")).await.unwrap();
    assert!(c.export().extended, "{:?}", c.export());
    let map = c.block_status(0, 8 * GIB).await.unwrap();
    assert_eq!((map[0].length, map[0].hole, map[1].offset), (5 * GIB, true, 5 * GIB), "{map:?}");
    c.write_zeroes(4 * GIB, 2 * GIB, false, true, true).await.unwrap();
    c.trim(0, 8 * GIB, false).await.unwrap();
    c.disconnect().await;
    assert!(read_at(&big, 5 * GIB, 4096).iter().all(|&b| b == 0));
    let log = s.log_text();
    assert_eq!(log.matches(EXTENDED_LINE).count(), 1, "{log}");
    assert_eq!(s.stop().code(), Some(0));
    // The same library refused extended headers falls back to structured replies.
    let old = Sluice::start(&["--export", &format!("big={}", big.display())]);
    let options = sluice_client::Options { extended: false, ..Default::default() };
    let c = sluice_client::Client::connect_with(&sluice_client::Uri::parse(&old.uri_for("big")).unwrap(), &options).await.unwrap();
    assert!(c.export().structured && !c.export().extended);
    assert_eq!(c.block_status(0, 8 * GIB).await.unwrap()[0].length, GIB, "a compact request stops at 1 GiB");
    c.disconnect().await;
}

// ---------------------------------------------------------------------------------------
// The raw protocol
// ---------------------------------------------------------------------------------------

/// A raw connection that negotiated extended headers and base:allocation.
struct Ext {
    c: Client,
    handle: u64,
}

impl Ext {
    fn open(s: &Sluice, export: &str) -> Ext {
        let mut c = Client::unix(&s.socket);
        c.start();
        assert_eq!(c.ask(w::OPT_EXTENDED_HEADERS, &[]).last().unwrap().kind, REP_ACK);
        assert_eq!(c.ask(OPT_SET_META_CONTEXT, &meta_data(export, &["base:allocation"])).last().unwrap().kind, REP_ACK);
        assert_eq!(c.ask(OPT_GO, &info_data(export, &[])).last().unwrap().kind, REP_ACK);
        Ext { c, handle: 100 }
    }

    fn send(&mut self, flags: u16, kind: u16, offset: u64, length: u64, payload: &[u8]) -> u64 {
        self.handle += 1;
        let mut b = RawRequest { flags, kind, handle: self.handle, offset, length }.encode_extended().to_vec();
        b.extend_from_slice(payload);
        self.c.send(&b);
        self.handle
    }

    /// Every chunk of the reply to `handle`, the only request in flight.
    fn reply(&mut self, handle: u64, offset: u64) -> Vec<(ChunkHeader, Vec<u8>)> {
        let mut chunks = Vec::new();
        loop {
            let head = self.c.recv(w::EXTENDED_REPLY_BYTES);
            assert_eq!(head[..4], w::EXTENDED_REPLY_MAGIC.to_be_bytes(), "only extended replies");
            let h = ChunkHeader::decode_extended(head[4..].try_into().unwrap());
            assert_eq!((h.handle, h.offset), (handle, offset), "the cookie and offset echoed");
            assert!(h.len <= 64 << 20, "a chunk of {} bytes", h.len);
            let payload = self.c.recv(h.len as usize);
            chunks.push((h, payload));
            if h.done() {
                return chunks;
            }
        }
    }

    fn call(&mut self, flags: u16, kind: u16, offset: u64, length: u64, payload: &[u8]) -> Vec<(ChunkHeader, Vec<u8>)> {
        let h = self.send(flags, kind, offset, length, payload);
        self.reply(h, offset)
    }

    /// The errno of a one-chunk error reply.
    fn errno(&mut self, flags: u16, kind: u16, offset: u64, length: u64, payload: &[u8]) -> u32 {
        let chunks = self.call(flags, kind, offset, length, payload);
        let [(h, p)] = &chunks[..] else { panic!("{chunks:?}") };
        decode_error_chunk(h.kind, p).unwrap_or_else(|e| panic!("{e}: {h:?}")).code
    }

    /// NBD_CMD_DISC in the extended framing; the server closes without a reply.
    fn disconnect(mut self) {
        self.send(0, w::CMD_DISC, 0, 0, &[]);
        assert!(self.c.close_within(Duration::from_secs(5)).is_ok_and(|b| b.is_empty()), "DISC was answered");
    }

    fn ok(&mut self, flags: u16, kind: u16, offset: u64, length: u64) {
        let chunks = self.call(flags, kind, offset, length, &[]);
        assert!(matches!(&chunks[..], [(h, p)] if h.kind == w::REPLY_TYPE_NONE && p.is_empty()), "{chunks:?}");
    }
}

#[test]
fn block_status_past_4_gib_is_one_request_and_one_block_status_ext_chunk() {
    let dir = tempfile::tempdir().unwrap();
    let big = dir.path().join("big.img");
    sparse(&big, 8 * GIB, &[(5 * GIB, &[1; 4096])]);
    let s = debug_sluice(&[&format!("big={}", big.display())]);
    let mut e = Ext::open(&s, "big");
    let chunks = e.call(0, w::CMD_BLOCK_STATUS, 0, 8 * GIB, &[]);
    let [(h, p)] = &chunks[..] else { panic!("{chunks:?}") };
    assert_eq!(h.kind, w::REPLY_TYPE_BLOCK_STATUS_EXT);
    let (_, extents) = decode_block_status_ext(p).unwrap();
    assert_eq!(extents[0], (5 * GIB, w::STATE_HOLE | w::STATE_ZERO), "one hole of 5 GiB first: {extents:?}");
    assert_eq!(extents[1], (4096, 0));
    assert_eq!(extents.iter().map(|x| x.0).sum::<u64>(), 8 * GIB, "the whole export in one reply");
    // REQ_ONE: exactly one extent, still past 32 bits.
    let one = e.call(w::CMD_FLAG_REQ_ONE, w::CMD_BLOCK_STATUS, 0, 6 * GIB, &[]);
    assert_eq!(decode_block_status_ext(&one[0].1).unwrap().1, vec![(5 * GIB, 3)]);
    // 64-bit trim and zeroing of the whole export, each one request.
    e.ok(0, w::CMD_TRIM, 0, 8 * GIB);
    e.ok(w::CMD_FLAG_FAST_ZERO, w::CMD_WRITE_ZEROES, 0, 8 * GIB);
    e.ok(0, w::CMD_CACHE, 0, 8 * GIB);
    assert!(read_at(&big, 5 * GIB, 4096).iter().all(|&b| b == 0), "the data survived trim and zeroing");
    e.disconnect();
    assert_extended_in_log(&s);
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn hostile_extended_requests_get_errors_or_a_clean_hang_up() {
    let s = debug_sluice(&["mem=memory:8M"]);
    let size = 8 << 20;
    let mut e = Ext::open(&s, "mem");
    let (einval, enospc) = (22, 28);
    assert_eq!(e.errno(0, w::CMD_TRIM, 0, size + 1, &[]), einval, "a 64-bit length past the end");
    assert_eq!(e.errno(0, w::CMD_WRITE_ZEROES, 4096, u64::MAX, &[]), enospc, "offset + length overflows");
    assert_eq!(e.errno(0, w::CMD_BLOCK_STATUS, 0, 1 << 40, &[]), einval, "block status past the end");
    assert_eq!(e.errno(0, w::CMD_READ, 0, 1 << 33, &[]), einval, "a read past the payload maximum");
    assert_eq!(e.errno(0, w::CMD_BLOCK_STATUS, 0, 0, &[]), einval, "zero-length block status");
    e.ok(0, w::CMD_TRIM, size, 0);
    let empty_read = e.call(0, w::CMD_READ, 0, 0, &[]);
    assert!(matches!(&empty_read[..], [(h, _)] if h.kind == w::REPLY_TYPE_NONE), "{empty_read:?}");
    // A payload on a command that takes none is read in full, then refused.
    assert_eq!(e.errno(w::CMD_FLAG_PAYLOAD_LEN, w::CMD_TRIM, 0, 100, &[0xee; 100]), einval);
    assert_eq!(e.errno(w::CMD_FLAG_PAYLOAD_LEN, w::CMD_READ, 0, 8, &[0xee; 8]), einval);
    // A write with or without PAYLOAD_LEN, read back through an OFFSET_DATA chunk.
    e.ok(w::CMD_FLAG_PAYLOAD_LEN, w::CMD_WRITE, 4096, 0);
    let h = e.send(w::CMD_FLAG_PAYLOAD_LEN, w::CMD_WRITE, 4096, 4, b"abcd");
    assert!(e.reply(h, 4096)[0].0.kind == w::REPLY_TYPE_NONE);
    let h = e.send(0, w::CMD_WRITE, 4100, 4, b"efgh");
    assert!(e.reply(h, 4100)[0].0.kind == w::REPLY_TYPE_NONE);
    let read = e.call(0, w::CMD_READ, 4096, 8, &[]);
    assert_eq!((read[0].0.kind, &read[0].1[8..]), (w::REPLY_TYPE_OFFSET_DATA, &b"abcdefgh"[..]));
    // A payload past the maximum is not read: the connection ends, promptly.
    e.send(w::CMD_FLAG_PAYLOAD_LEN, w::CMD_WRITE, 0, 64 << 20, &[]);
    let rest = e.c.close_within(Duration::from_secs(5)).unwrap_or_else(|got| panic!("still open after {} bytes", got.len()));
    assert!(rest.is_empty(), "no reply before the hang-up: {rest:?}");
    // A compact header where an extended one belongs is out of step: hang up.
    let mut e = Ext::open(&s, "mem");
    e.c.send(&RawRequest { flags: 0, kind: w::CMD_FLUSH, handle: 1, offset: 0, length: 0 }.encode());
    e.c.send(&[0; 4]);
    assert!(e.c.close_within(Duration::from_secs(5)).is_ok_and(|b| b.is_empty()), "a compact header was answered");
    // The handshake's rules: no downgrade, no EXPORT_NAME.
    let mut c = Client::unix(&s.socket);
    c.start();
    assert_eq!(c.ask(w::OPT_EXTENDED_HEADERS, &[1]).last().unwrap().kind, w::REP_ERR_INVALID, "data");
    assert_eq!(c.ask(w::OPT_EXTENDED_HEADERS, &[]).last().unwrap().kind, REP_ACK);
    assert_eq!(c.ask(w::OPT_STRUCTURED_REPLY, &[]).last().unwrap().kind, w::REP_ERR_EXT_HEADER_REQD);
    c.option(w::OPT_EXPORT_NAME, b"mem");
    assert!(c.close_within(Duration::from_secs(5)).is_ok_and(|b| b.is_empty()), "EXPORT_NAME was answered");
    // Still serving, and nothing panicked.
    let mut again = Ext::open(&s, "mem");
    again.ok(0, w::CMD_FLUSH, 0, 0);
    again.disconnect();
    let (status, log) = s.stop_with_log();
    assert_eq!(status.code(), Some(0));
    assert!(!log.contains("panicked"), "{log}");
    assert!(log.contains("payload longer than the maximum payload; disconnecting"), "{log}");
}
