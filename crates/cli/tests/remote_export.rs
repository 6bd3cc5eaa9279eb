//! A sluice export re-exported by a second sluice (`--export NAME=nbd://…`) carries data,
//! flush, trim, zero and block status through byte-exact, over each worker's own connection
//! once it is up, and a dead or lying remote fails only its own export's requests.
mod common;
use common::*;
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SIZE: usize = 16 << 20;

/// Server A with a RAM export "disk", and server B re-exporting it as "unix" (over A's Unix
/// socket) and "tcp" (over A's TCP port), beside a RAM export "local" of its own.
fn remote_and_proxy(disk_options: &str) -> (Sluice, Sluice) {
    let a = Sluice::start(&["--export", &format!("disk=memory:16M{disk_options}")]);
    let unix = format!("unix={}", a.uri_for("disk"));
    let tcp = format!("tcp=nbd://127.0.0.1:{}/disk", a.port);
    let b = Sluice::start(&["--export", &unix, "--export", &tcp, "--export", "local=memory:1M"]);
    (a, b)
}

/// Stops a server with SIGTERM; it exits 0 without a panic.
fn stop_clean(s: Sluice) {
    let (status, log) = s.stop_with_log();
    assert_eq!(status.code(), Some(0), "{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// Stops B, which says goodbye to A, then A.
fn stop_both(a: Sluice, b: Sluice) {
    stop_clean(b);
    stop_clean(a);
}

/// Runs a Python script under nbdsh with `connect(uri, meta=False)` defined; panics with its
/// output unless it ran to the end.
fn nbdsh(script: &str) {
    let prelude = "import nbd, errno\n\
        def connect(uri, meta=False):\n    h = nbd.NBD()\n    if meta:\n        h.add_meta_context(nbd.CONTEXT_BASE_ALLOCATION)\n    h.connect_uri(uri)\n    return h\n";
    let full = format!("{prelude}\n{script}\nprint('SCRIPT-COMPLETED')\n");
    let (ok, out, err) = run("nbdsh", &["-c", &full]);
    assert!(ok && out.contains("SCRIPT-COMPLETED"), "nbdsh script failed\nstdout:\n{out}\nstderr:\n{err}");
}

fn nbdcopy(from: &str, to: &str) {
    let (ok, out, err) = run("nbdcopy", &[from, to]);
    assert!(ok, "nbdcopy {from} {to} failed\n{out}\n{err}");
}

fn assert_same(a: &[u8], b: &[u8], what: &str) {
    assert_eq!(a.len(), b.len(), "{what}: sizes differ");
    if let Some(i) = a.iter().zip(b).position(|(x, y)| x != y) {
        panic!("{what}: first difference at byte {i}");
    }
}

#[test]
fn data_copied_through_a_re_export_lands_on_the_remote_byte_exact() {
    require!("nbdcopy", "nbdinfo");
    let (a, b) = remote_and_proxy("");
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("src.img");
    for (seed, name) in [(11, "unix"), (12, "tcp")] {
        let (ok, out, err) = run("nbdinfo", &["--size", &b.uri_for(name)]);
        assert!(ok && out.trim() == SIZE.to_string(), "nbdinfo --size through {name}: {out}{err}");
        // Different content each time, so a copy that reached nothing shows.
        let expected = pattern(SIZE, seed);
        write_file(&src, &expected);
        nbdcopy(src.to_str().unwrap(), &b.uri_for(name));
        let (on_a, through_b) = (dir.path().join("a.img"), dir.path().join("b.img"));
        nbdcopy(&a.uri_for("disk"), on_a.to_str().unwrap());
        nbdcopy(&b.uri_for(name), through_b.to_str().unwrap());
        assert_same(&expected, &std::fs::read(&on_a).unwrap(), &format!("A after a copy into B's {name}"));
        assert_same(&expected, &std::fs::read(&through_b).unwrap(), &format!("B's {name} read back"));
    }
    stop_both(a, b);
}

#[test]
fn flush_fua_trim_zero_cache_and_block_status_pass_through() {
    require!("nbdsh");
    let (a, b) = remote_and_proxy("");
    nbdsh(&format!(
        r#"
MiB = 1 << 20
b = connect("{b}", meta=True)
a = connect("{a}", meta=True)
assert b.get_size() == a.get_size()
assert b.can_trim() and b.can_zero() and b.can_fast_zero() and b.can_fua() and b.can_flush()
data = bytes(range(256)) * (4 * MiB // 256)
b.pwrite(data, 0)
b.flush()
assert a.pread(4 * MiB, 0) == data
b.pwrite(b"\xab" * 4096, 8 * MiB, nbd.CMD_FLAG_FUA)
assert a.pread(4096, 8 * MiB) == b"\xab" * 4096

# A RAM export punches holes: trimmed bytes read back as zeros on A.
b.trim(MiB, MiB)
assert a.pread(MiB, MiB) == bytes(MiB)
b.zero(MiB, 2 * MiB, nbd.CMD_FLAG_NO_HOLE)
assert a.pread(MiB, 2 * MiB) == bytes(MiB)
b.zero(64 * 1024, 3 * MiB, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_FUA)
assert a.pread(64 * 1024, 3 * MiB) == bytes(64 * 1024)
# A zeroes without holes only by writing zeros, so it refuses that under FAST_ZERO; B says so too.
try:
    b.zero(4096, 0, nbd.CMD_FLAG_FAST_ZERO | nbd.CMD_FLAG_NO_HOLE)
    raise AssertionError("a slow fast zero succeeded")
except nbd.Error as e:
    assert e.errnum == errno.ENOTSUP, e
assert b.pread(4 * MiB, 0) == data[:MiB] + bytes(2 * MiB + 64 * 1024) + data[3 * MiB + 64 * 1024:]
b.cache(MiB, 0)

def extents(h):
    out = []
    def cb(ctx, off, entries, err):
        out.extend(zip(entries[0::2], entries[1::2]))
        return 0
    h.block_status(4 * MiB, 0, cb)
    return out

# The same allocation map, holes where A punched them.
assert extents(b) == extents(a), (extents(b), extents(a))
assert any(flags & nbd.STATE_HOLE for _, flags in extents(b))
b.flush()
"#,
        b = b.uri_for("unix"),
        a = a.uri_for("disk"),
    ));
    stop_both(a, b);
}

#[test]
fn a_read_only_remote_makes_a_read_only_re_export() {
    require!("nbdsh");
    let (a, b) = remote_and_proxy(",ro");
    nbdsh(&format!(
        r#"
b = connect("{b}")
assert b.is_read_only()
assert b.pread(4096, 0) == bytes(4096)
"#,
        b = b.uri_for("tcp"),
    ));
    stop_both(a, b);
}

#[test]
fn a_dead_remote_fails_its_requests_while_the_server_serves_other_exports() {
    require!("nbdsh");
    let (a, mut b) = remote_and_proxy("");
    // Killed, and its exit waited for: every connection B had to it is closed.
    drop(a);
    nbdsh(&format!(
        r#"
def fails_with_eio(what, f, *args):
    try:
        f(*args)
    except nbd.Error as e:
        assert e.errnum == errno.EIO, "%s: expected EIO, got %s (%s)" % (what, e.errnum, e.string)
        return
    raise AssertionError("%s succeeded with the remote gone" % what)

for uri in ["{unix}", "{tcp}"]:
    h = connect(uri)
    fails_with_eio("read", h.pread, 4096, 0)
    fails_with_eio("write", h.pwrite, b"x" * 4096, 0)
    fails_with_eio("flush", h.flush)
    # The connection itself stays usable: the next request gets its own answer.
    fails_with_eio("second read", h.pread, 512, 4096)
    h.shutdown()

local = connect("{local}")
local.pwrite(b"still here" * 100, 0)
assert local.pread(1000, 0) == b"still here" * 100
"#,
        unix = b.uri_for("unix"),
        tcp = b.uri_for("tcp"),
        local = b.uri_for("local"),
    ));
    assert!(b.alive(), "B died with its remote: {}", b.log_text());
    stop_clean(b);
}

#[test]
fn an_unreachable_remote_is_a_usage_error_at_start() {
    let dir = tempfile::tempdir().unwrap();
    let missing = dir.path().join("nobody.sock");
    let spec = format!("p=nbd+unix:///disk?socket={}", missing.display());
    let sock = dir.path().join("nbd.sock");
    let mut child = Command::new(SLUICE)
        .args(["serve", "--export", &spec, "--unix", sock.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = wait_timeout(&mut child, Duration::from_secs(30)).expect("sluice exits when its remote is unreachable");
    let mut err = String::new();
    std::io::Read::read_to_string(&mut child.stderr.take().unwrap(), &mut err).unwrap();
    assert_eq!(status.code(), Some(2), "{err}");
    assert!(err.contains(&format!("export \"p\": cannot open nbd+unix:///disk?socket={}", missing.display())), "{err}");
    assert!(!sock.exists(), "nothing was served");
}

#[test]
fn another_servers_block_size_and_errors_come_through() {
    require!("nbdkit", "nbdsh");
    let dir = tempfile::tempdir().unwrap();
    // A RAM disk that asks for 512-byte blocks, refuses requests off them, and fails every
    // write with ENOSPC.
    let filters = ["--filter=blocksize-policy", "--filter=error"];
    let params = ["blocksize-minimum=512", "blocksize-error-policy=error", "error=ENOSPC", "error-pwrite-rate=100%"];
    let kit = Nbdkit::start(dir.path(), "kit", &[&filters[..], &["memory", "4M"], &params[..]].concat());
    let b = Sluice::start(&["--threads", "1", "--log-level", "debug", "--export", &format!("kit={}", kit.uri())]);
    let checks = format!(
        r#"
b = connect("{b}")
assert b.get_block_size(nbd.SIZE_MINIMUM) == 512, b.get_block_size(nbd.SIZE_MINIMUM)
assert b.get_block_size(nbd.SIZE_PREFERRED) >= 512
assert b.pread(4096, 512) == bytes(4096)
# Off the remote's blocks: widened to them, not sent as it is.
b.set_strict_mode(0)
assert b.pread(100, 700) == bytes(100)
try:
    b.pwrite(b"x" * 4096, 0)
    raise AssertionError("nbdkit's failure was lost")
except nbd.Error as e:
    assert e.errnum == errno.ENOSPC, e
"#,
        b = b.uri_for("kit"),
    );
    // Through the export's client, then over the worker's own connection.
    nbdsh(&checks);
    let up = "worker 0 sends reads, writes and flushes over a connection of its own";
    wait_until("the worker's own connection", Duration::from_secs(20), || one_read(&b.uri_for("kit")) && b.log_text().contains(up), || b.log_text());
    nbdsh(&checks);
    assert!(!b.log_text().contains("failed ("), "{}", b.log_text());
    assert_eq!(b.stop().code(), Some(0));
}

/// A mirror pool over two RAM members, initialized; returns the members and `pool:FILE`.
fn mirror_pool(dir: &std::path::Path) -> (Vec<Sluice>, String) {
    let members: Vec<Sluice> = (0..2).map(|_| Sluice::start(&["memory:16M"])).collect();
    let uris: Vec<String> = members.iter().map(|m| format!("{:?}", m.uri())).collect();
    let file = dir.join("pool.toml");
    std::fs::write(&file, format!("layout = \"mirror\"\nmembers = [{}]\n", uris.join(", "))).unwrap();
    let spec = format!("pool:{}", file.display());
    let out = output(Command::new(SLUICE).args(["pool", "init", &spec]));
    assert!(out.status.success(), "pool init: {}", String::from_utf8_lossy(&out.stderr));
    (members, spec)
}

/// Copies `data` into `uri` and back out, and checks it came back byte-exact.
fn round_trip(dir: &std::path::Path, uri: &str, data: &[u8], what: &str) {
    let (src, back) = (dir.join("src.img"), dir.join("back.img"));
    write_file(&src, data);
    nbdcopy(src.to_str().unwrap(), uri);
    nbdcopy(uri, back.to_str().unwrap());
    assert_same(data, &std::fs::read(&back).unwrap(), what);
}

#[test]
fn a_pool_served_as_an_export_mirrors_writes_is_released_and_outlives_a_member() {
    require!("nbdcopy", "nbdinfo");
    let dir = tempfile::tempdir().unwrap();
    let (mut members, spec) = mirror_pool(dir.path());
    let b = Sluice::start(&["--export", &format!("vol={spec}")]);
    let (ok, out, err) = run("nbdinfo", &["--size", &b.uri_for("vol")]);
    assert!(ok, "nbdinfo --size: {err}");
    let size: usize = out.trim().parse().unwrap();
    let first = pattern(size, 21);
    round_trip(dir.path(), &b.uri_for("vol"), &first, "served");
    // Each member holds a copy, after its metadata.
    for (i, m) in members.iter().enumerate() {
        let copy = dir.path().join(format!("member{i}.img"));
        nbdcopy(&m.uri(), copy.to_str().unwrap());
        let bytes = std::fs::read(&copy).unwrap();
        assert_same(&first, &bytes[bytes.len() - size..], &format!("member {i}"));
    }
    stop_clean(b);

    // A clean stop released the pool: the next server takes it without waiting out a lease.
    let b = Sluice::start(&["--export", &format!("vol={spec}")]);
    let back = dir.path().join("again.img");
    nbdcopy(&b.uri_for("vol"), back.to_str().unwrap());
    assert_same(&first, &std::fs::read(&back).unwrap(), "served again");
    assert!(!b.log_text().contains("name an owner"), "{}", b.log_text());

    // One mirror copy is enough to go on.
    drop(members.pop());
    round_trip(dir.path(), &b.uri_for("vol"), &pattern(size, 22), "one member gone");
    stop_clean(b);
}

/// Reads once through `uri` with nbdsh; true when the read succeeded.
fn one_read(uri: &str) -> bool {
    run("nbdsh", &["-u", uri, "-c", "h.pread(4096, 0)"]).0
}

/// The closing lines `log` has for connections to export `name`, and the most bytes one of
/// them read, and wrote.
fn closed_connections<'a>(log: &'a str, name: &str) -> (Vec<&'a str>, u64, u64) {
    let after = |line: &str, word: &str| -> u64 {
        line.split(word).nth(1).and_then(|r| r.split(' ').next()).and_then(|n| n.parse().ok()).unwrap_or(0)
    };
    let lines: Vec<&str> = log.lines().filter(|l| l.contains(&format!("closed export \"{name}\""))).collect();
    let read = lines.iter().map(|l| after(l, "; read ")).max().unwrap_or(0);
    let wrote = lines.iter().map(|l| after(l, ", wrote ")).max().unwrap_or(0);
    (lines, read, wrote)
}

#[test]
fn reads_and_writes_go_over_the_workers_own_connection_once_it_is_up() {
    require!("nbdsh", "nbdcopy");
    let a = Sluice::start(&["--export", "disk=memory:16M"]);
    let tcp = format!("vol=nbd://127.0.0.1:{}/disk", a.port);
    // One worker, so that every request below is that worker's.
    let b = Sluice::start(&["--threads", "1", "--log-level", "debug", "--export", &tcp]);
    let uri = b.uri_for("vol");
    let up = "worker 0 sends reads, writes and flushes over a connection of its own";
    wait_until("the worker's own connection", Duration::from_secs(20), || one_read(&uri) && b.log_text().contains(up), || b.log_text());
    // Writes and reads of every size the link handles differently (small ones copied out
    // of its receive buffer, large ones received in place), many in flight, checked
    // against a model.
    nbdsh(&format!(
        r#"
import os, random
random.seed(5)
h = connect("{uri}")
size = h.get_size()
model = bytearray(size)
written = 0
for n in [1, 511, 4096, 4097, 65536, 65537, 1 << 20, 3 << 20]:
    off = random.randrange(0, size - n)
    data = os.urandom(n)
    h.pwrite(data, off, nbd.CMD_FLAG_FUA if n == 4097 else 0)
    model[off:off + n] = data
    written += n
assert h.pread(size, 0) == model, "one whole read"
for n in [1, 4095, 16384, 16385, 262144, 2 << 20]:
    off = random.randrange(0, size - n)
    assert h.pread(n, off) == model[off:off + n], "read of %d at %d" % (n, off)
{reads_in_flight}
h.flush()
open("{model}", "wb").write(model)
print("WRITTEN", written)
"#,
        model = b.dir.path().join("model.bin").display(),
        reads_in_flight = NBDSH_READS_IN_FLIGHT,
    ));
    // Over TCP, on the default data path, large reads were spliced.
    assert!(b.log_text().contains("worker 0 splices read data from its own connection"), "{}", b.log_text());
    let model = std::fs::read(b.dir.path().join("model.bin")).unwrap();
    let on_a = b.dir.path().join("a.img");
    nbdcopy(&a.uri_for("disk"), on_a.to_str().unwrap());
    assert_same(&model, &std::fs::read(&on_a).unwrap(), "A after writes through B");
    stop_clean(b);
    // B said goodbye on every connection, and one of them carried the writes and the
    // whole-volume read above: the worker's own, not the client's four.
    let (status, log) = a.stop_with_log();
    assert_eq!(status.code(), Some(0), "{log}");
    let (lines, read, wrote) = closed_connections(&log, "disk");
    let written = (1 + 511 + 4096 + 4097 + 65536 + 65537 + (1 << 20) + (3 << 20)) as u64;
    assert!(wrote >= written && read >= SIZE as u64, "no connection of B's carried the data (most read {read}, most written {wrote})\n{log}");
    assert!(lines.len() >= 2 && lines.iter().all(|l| l.ends_with("client disconnected")), "B left each connection with NBD_CMD_DISC\n{log}");
    assert!(!log.contains("panicked"), "{log}");
}

/// What a fake remote saw on connections negotiated without structured replies (a
/// worker's own), and whether it garbled a reply.
#[derive(Default)]
struct Seen {
    link_reads: AtomicUsize,
    link_flushes: AtomicUsize,
    garbled: AtomicBool,
}

/// A remote of 1 MiB of zeros that answers honestly with simple replies, except the first
/// read at 4096 on a worker's own connection: that one gets a reply with a wrong magic, and
/// the connection is closed.
fn garbling_remote() -> (u16, Arc<Seen>) {
    use sluice_proto::wire::*;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let shared = Arc::clone(&seen);
    std::thread::spawn(move || {
        for s in listener.incoming() {
            let Ok(mut s) = s else { return };
            let seen = Arc::clone(&shared);
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                let Some(structured) = fake_handshake(&mut s) else { return };
                while let Some((kind, handle, offset, len)) = fake_request(&mut s) {
                    let mut reply = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
                    reply.extend_from_slice(&0u32.to_be_bytes());
                    reply.extend_from_slice(&handle.to_be_bytes());
                    match kind {
                        CMD_DISC => return,
                        CMD_READ if !structured && offset == 4096 && !seen.garbled.swap(true, Ordering::SeqCst) => {
                            reply[0] ^= 0xff;
                            let _ = s.write_all(&reply);
                            return;
                        }
                        CMD_READ => {
                            if !structured {
                                seen.link_reads.fetch_add(1, Ordering::SeqCst);
                            }
                            reply.resize(reply.len() + len as usize, 0);
                        }
                        CMD_FLUSH if !structured => {
                            seen.link_flushes.fetch_add(1, Ordering::SeqCst);
                        }
                        _ => {}
                    }
                    if s.write_all(&reply).is_err() {
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

/// The remote's side of the handshake: whether the client asked for structured replies.
fn fake_handshake(s: &mut TcpStream) -> Option<bool> {
    use sluice_proto::wire::*;
    let reply = |s: &mut TcpStream, opt: u32, kind: u32, payload: &[u8]| {
        let mut out = OPTION_REPLY_MAGIC.to_be_bytes().to_vec();
        for v in [opt, kind, payload.len() as u32] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        out.extend_from_slice(payload);
        s.write_all(&out).ok()
    };
    let mut greeting = NBDMAGIC.to_be_bytes().to_vec();
    greeting.extend_from_slice(&IHAVEOPT.to_be_bytes());
    greeting.extend_from_slice(&(FLAG_FIXED_NEWSTYLE | FLAG_NO_ZEROES).to_be_bytes());
    s.write_all(&greeting).ok()?;
    let mut b = [0u8; 16];
    s.read_exact(&mut b[..4]).ok()?;
    let mut structured = false;
    loop {
        s.read_exact(&mut b).ok()?;
        let opt = u32::from_be_bytes(b[8..12].try_into().unwrap());
        let mut payload = vec![0u8; u32::from_be_bytes(b[12..16].try_into().unwrap()) as usize];
        s.read_exact(&mut payload).ok()?;
        match opt {
            OPT_STRUCTURED_REPLY => {
                structured = true;
                reply(s, opt, REP_ACK, &[])?;
            }
            OPT_GO => {
                let mut info = INFO_EXPORT.to_be_bytes().to_vec();
                info.extend_from_slice(&(1u64 << 20).to_be_bytes());
                info.extend_from_slice(&(FLAG_HAS_FLAGS | FLAG_SEND_FLUSH | FLAG_CAN_MULTI_CONN).to_be_bytes());
                reply(s, opt, REP_INFO, &info)?;
                reply(s, opt, REP_ACK, &[])?;
                return Some(structured);
            }
            _ => reply(s, opt, REP_ERR_UNSUP, &[])?,
        }
    }
}

/// The next request's kind, handle, offset and length, its payload read and dropped.
fn fake_request(s: &mut TcpStream) -> Option<(u16, u64, u64, u32)> {
    let mut b = [0u8; sluice_proto::wire::REQUEST_BYTES];
    s.read_exact(&mut b).ok()?;
    let raw = sluice_proto::RawRequest::decode(&b).ok()?;
    let mut payload = vec![0u8; raw.payload_len(false) as usize];
    s.read_exact(&mut payload).ok()?;
    Some((raw.kind, raw.handle, raw.offset, raw.length as u32))
}

/// The byte at `offset` of the dribbling remote's export.
fn dribbled_byte(offset: u64) -> u8 {
    ((offset * 7) ^ (offset >> 12)) as u8
}

/// A remote of 1 MiB (`dribbled_byte`) whose replies on a worker's own connection send
/// read data 100 bytes at a time, each from a page of its own (`sendfile`), so that every
/// piece arrives as a separate fragment of a page: a pipe of N pages holds only N pieces.
fn dribbling_remote(dir: &std::path::Path) -> (u16, Arc<Seen>) {
    use sluice_proto::wire::*;
    use std::os::fd::AsRawFd;
    const PIECE: usize = 100;
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Seen::default());
    let shared = Arc::clone(&seen);
    let dir = dir.to_owned();
    std::thread::spawn(move || {
        for (n, s) in listener.incoming().enumerate() {
            let Ok(mut s) = s else { return };
            let (seen, pages) = (Arc::clone(&shared), dir.join(format!("pages-{n}")));
            std::thread::spawn(move || {
                s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
                s.set_nodelay(true).unwrap();
                let Some(structured) = fake_handshake(&mut s) else { return };
                let file = std::fs::OpenOptions::new().read(true).write(true).create(true).truncate(true).open(&pages).unwrap();
                let mut pages_used = 0;
                while let Some((kind, handle, offset, len)) = fake_request(&mut s) {
                    let mut reply = SIMPLE_REPLY_MAGIC.to_be_bytes().to_vec();
                    reply.extend_from_slice(&0u32.to_be_bytes());
                    reply.extend_from_slice(&handle.to_be_bytes());
                    let data: Vec<u8> = (offset..offset + u64::from(len)).map(dribbled_byte).collect();
                    let dribble = kind == CMD_READ && !structured;
                    match kind {
                        CMD_DISC => return,
                        CMD_READ if structured => reply.extend_from_slice(&data),
                        _ => {}
                    }
                    if s.write_all(&reply).is_err() {
                        return;
                    }
                    if !dribble {
                        continue;
                    }
                    seen.link_reads.fetch_add(1, Ordering::SeqCst);
                    // Pages of their own for every reply: the socket, and the pipes they
                    // are spliced into, hold the pages themselves until the bytes are sent
                    // on, so a page written over would change data already "sent".
                    use std::os::unix::fs::FileExt;
                    let first = pages_used;
                    pages_used += data.len().div_ceil(PIECE);
                    for (i, piece) in data.chunks(PIECE).enumerate() {
                        file.write_all_at(piece, ((first + i) * 4096) as u64).unwrap();
                    }
                    for (i, piece) in data.chunks(PIECE).enumerate() {
                        let mut at = ((first + i) * 4096) as libc::off_t;
                        // SAFETY: both descriptors are open for the call; `at` is ours.
                        let sent = unsafe { libc::sendfile(s.as_raw_fd(), file.as_raw_fd(), &mut at, piece.len()) };
                        if sent != piece.len() as isize {
                            return;
                        }
                    }
                }
            });
        }
    });
    (port, seen)
}

#[test]
fn a_spliced_read_whose_pipe_fills_early_is_finished_in_a_buffer_byte_exact() {
    require!("nbdsh");
    let dir = tempfile::tempdir().unwrap();
    let (port, seen) = dribbling_remote(dir.path());
    let remote = format!("vol=nbd://127.0.0.1:{port}/");
    let b = Sluice::start(&["--threads", "1", "--log-level", "debug", "--export", &remote]);
    let uri = b.uri_for("vol");
    wait_until("a read over the worker's own connection", Duration::from_secs(20), || {
        assert!(one_read(&uri), "a read failed\n{}", b.log_text());
        seen.link_reads.load(Ordering::SeqCst) > 0
    }, || b.log_text());
    let before = seen.link_reads.load(Ordering::SeqCst);
    // Spliced reads (64 KiB and more), one at a time and several in flight, at offsets
    // that are not page multiples; the pipe of each fills after its 256th piece or so.
    nbdsh(&format!(
        r#"
def byte(o):
    return ((o * 7) ^ (o >> 12)) & 0xff
h = connect("{uri}")
for n, off in [(65536, 0), (262144, 4096 * 3 + 512), (524288, 1 << 19)]:
    got = h.pread(n, off)
    assert got == bytes(byte(o) for o in range(off, off + n)), "read of %d at %d" % (n, off)
bufs = [nbd.Buffer(131072) for _ in range(4)]
for i, b in enumerate(bufs):
    h.aio_pread(b, 131072 * (i + 2))
while h.aio_in_flight() > 0:
    h.poll(-1)
for i, b in enumerate(bufs):
    off = 131072 * (i + 2)
    assert b.to_bytearray() == bytes(byte(o) for o in range(off, off + 131072)), "read at %d" % off
"#
    ));
    let log = b.log_text();
    assert!(seen.link_reads.load(Ordering::SeqCst) >= before + 7, "the reads went over the worker's own connection\n{log}");
    assert!(log.contains("splices read data from its own connection"), "{log}");
    assert!(log.contains("filled before all its data came"), "no pipe filled early\n{log}");
    // Each time, later reads were cut finer, down to the least share of a pipe.
    assert!(log.contains("spliced reads now fill 1/4 of a pipe") && log.contains("spliced reads now fill 1/16 of a pipe"), "{log}");
    assert!(!log.contains("the connection of worker"), "the worker's own connection failed\n{log}");
    stop_clean(b);
}

#[test]
fn a_garbled_reply_on_a_workers_own_connection_fails_that_read_and_no_other() {
    require!("nbdsh");
    let (port, seen) = garbling_remote();
    let remote = format!("vol=nbd://127.0.0.1:{port}/");
    let mut b = Sluice::start(&["--threads", "1", "--export", &remote]);
    let uri = b.uri_for("vol");
    let read_at = |offset: u64| run("nbdsh", &["-u", &uri, "-c", &format!("h.pread(4096, {offset})")]).0;
    // Reads go through the export's client until the worker's connection is up.
    wait_until("a read over the worker's own connection", Duration::from_secs(20), || {
        assert!(read_at(0), "a read failed\n{}", b.log_text());
        seen.link_reads.load(Ordering::SeqCst) > 0
    }, || b.log_text());
    // A flush goes that way too.
    nbdsh(&format!("h = connect(\"{uri}\")\nh.flush()"));
    assert_eq!(seen.link_flushes.load(Ordering::SeqCst), 1, "{}", b.log_text());
    // The garbled read fails, and no other.
    assert!(!read_at(4096), "the garbled read succeeded\n{}", b.log_text());
    assert!(seen.garbled.load(Ordering::SeqCst));
    for _ in 0..3 {
        assert!(read_at(4096), "a read after the garbled one\n{}", b.log_text());
    }
    assert!(b.alive(), "{}", b.log_text());
    let log = b.log_text();
    assert!(log.contains("the connection of worker 0 failed (the server sent a reply with the unknown magic"), "{log}");
    assert!(log.contains("requests on it failed with EIO: 1;"), "{log}");
    stop_clean(b);
}

#[test]
fn a_remote_killed_under_reads_on_the_workers_own_connection_fails_them_with_eio() {
    require!("nbdsh");
    let mut a = Sluice::start(&["--export", "disk=memory:16M"]);
    let tcp = format!("vol=nbd://127.0.0.1:{}/disk", a.port);
    let metrics = free_port().to_string();
    let metrics_at = format!("127.0.0.1:{metrics}");
    let args = ["--threads", "1", "--log-level", "debug", "--metrics", &metrics_at, "--export", &tcp, "--export", "local=memory:1M"];
    let mut b = Sluice::start(&args);
    let uri = b.uri_for("vol");
    let up = "worker 0 sends reads, writes and flushes over a connection of its own";
    wait_until("the worker's own connection", Duration::from_secs(20), || one_read(&uri) && b.log_text().contains(up), || b.log_text());
    // A answers nothing from here on; whatever B sends it waits, until A is killed.
    a.pause();
    let script = format!(
        r#"
import nbd, errno
h = nbd.NBD()
h.connect_uri("{uri}")
pending = set(h.aio_pread(nbd.Buffer(65536), i * 65536) for i in range(8))
failed = 0
while pending:
    h.poll(-1)
    for c in list(pending):
        try:
            done = h.aio_command_completed(c)
        except nbd.Error as e:
            assert e.errnum == errno.EIO, e
            failed += 1
            done = True
        if done:
            pending.discard(c)
assert failed == 8, failed
print("ALL-FAILED-EIO")
"#
    );
    let reads = run_in_background("nbdsh", &["-c", &script]);
    // Killed once B has all eight: a request is started on the worker's connection in the
    // pass that receives it, so they are all on it.
    let port: u16 = metrics.parse().unwrap();
    let inflight = || sample(&http_get(port, "/metrics").1, r#"sluice_requests_inflight{export="vol"}"#);
    wait_until("B to hold the eight reads", Duration::from_secs(20), || inflight() >= 8.0 || reads.is_finished(), || b.log_text());
    a.kill();
    let (ok, out, err) = reads.join().unwrap();
    assert!(ok && out.contains("ALL-FAILED-EIO"), "{out}\n{err}\n{}", b.log_text());
    assert!(b.alive(), "{}", b.log_text());
    // Each read is at least one request on the worker's connection (a read may be cut in
    // chunks); the log counts them.
    let log = b.log_text();
    let line = log.lines().find(|l| l.contains("the connection of worker 0 failed")).unwrap_or_else(|| panic!("{log}"));
    let n: usize = line.split("failed with EIO: ").nth(1).and_then(|r| r.split(';').next()).and_then(|n| n.parse().ok()).unwrap_or(0);
    assert!(n >= 8, "the reads were not on the worker's connection: {line}\n{log}");
    nbdsh(&format!("h = connect(\"{}\")\nh.pwrite(b'x' * 512, 0)\nassert h.pread(512, 0) == b'x' * 512", b.uri_for("local")));
    stop_clean(b);
}

#[test]
fn a_reload_that_removes_the_export_closes_the_workers_own_connection_too() {
    require!("nbdsh");
    let a = Sluice::start(&["--export", "disk=memory:16M"]);
    let dir = tempfile::tempdir().unwrap();
    let export = |name: &str, spec: &str| format!("[[export]]\nname = \"{name}\"\nspec = \"{spec}\"\n");
    let remote = format!("nbd://127.0.0.1:{}/disk", a.port);
    let config = write_config(dir.path(), &format!("{}{}", export("vol", &remote), export("local", "memory:1M")));
    let b = Sluice::start(&["--config", config.to_str().unwrap(), "--threads", "1", "--log-level", "debug"]);
    let uri = b.uri_for("vol");
    let up = "worker 0 sends reads, writes and flushes over a connection of its own";
    wait_until("the worker's own connection", Duration::from_secs(20), || one_read(&uri) && b.log_text().contains(up), || b.log_text());
    write_config(dir.path(), &export("local", "memory:1M"));
    signal(b.pid(), libc::SIGHUP);
    // The export's four shared connections and the worker's own all say goodbye; the
    // worker lets its own go once the export is gone, on its next pass, which the reads
    // below make.
    let closed = || closed_connections(&a.log_text(), "disk").0.iter().filter(|l| l.ends_with("client disconnected")).count();
    wait_until("A to see all of B's connections go", Duration::from_secs(20), || {
        one_read(&b.uri_for("local"));
        closed() >= 5
    }, || format!("{}\n---\n{}", a.log_text(), b.log_text()));
    assert!(!b.log_text().contains("the connection of worker 0 failed"), "{}", b.log_text());
    stop_clean(b);
    stop_clean(a);
}
