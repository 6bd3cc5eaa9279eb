//! Pipelined reads: a large read is split into chunks that go out as each is read, in
//! completion order with structured replies, and a storage error mid-read is reported the
//! way the protocol requires; automatic chunks (the default) arrive intact on every data
//! path and in every reply mode; many large reads in flight at once arrive intact when the
//! socket fills under them.
mod common;
mod raw;
use std::os::fd::AsRawFd;
use std::time::Duration;

use common::*;
use raw::*;

const CHUNK: u32 = 64 * 1024;
const READ: u32 = 1 << 20;

/// A file of `len` pattern bytes served by a sluice on data path `path` with 64 KiB chunks.
fn serve_file(len: usize, path: &str) -> (Sluice, std::path::PathBuf, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.keep().join(format!("disk-{path}.img"));
    let data = pattern(len, 5);
    write_file(&file, &data);
    let f = std::fs::File::open(&file).unwrap();
    f.sync_all().unwrap();
    let s = Sluice::start(&[file.to_str().unwrap(), "--data-path", path, "--chunk", "64K"]);
    (s, file, data)
}

/// Leaves only the last chunk of the first READ bytes in the page cache: it is read while
/// being submitted, and the chunks before it must wait for the disk, so it goes out first.
fn cache_only_last_chunk(file: &std::path::Path) {
    let f = std::fs::File::open(file).unwrap();
    // SAFETY: posix_fadvise takes a descriptor we own and plain numbers; no memory is shared.
    let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    assert_eq!(rc, 0, "posix_fadvise");
    let mut tail = vec![0u8; CHUNK as usize];
    std::os::unix::fs::FileExt::read_exact_at(&f, &mut tail, (READ - CHUNK) as u64).unwrap();
}

/// Offsets of the OFFSET_DATA chunks of a reply, in the order they arrived.
fn data_offsets(r: &Reply) -> Vec<u64> {
    r.msgs
        .iter()
        .filter_map(|m| match m {
            Msg::Chunk(c) if c.kind == CHUNK_OFFSET_DATA => Some(be64(&c.payload[0..8])),
            _ => None,
        })
        .collect()
}

#[test]
fn structured_chunks_go_out_in_completion_order_and_reassemble_byte_exact() {
    // The copy path reads through the page cache, so the one cached chunk is reliably the
    // first to complete; the other paths must reassemble whatever their order.
    for path in ["copy", "direct", "splice", "splice-direct"] {
        let (s, file, data) = serve_file(2 << 20, path);
        let (mut c, _) = Client::connect(&s.socket, "", true, false);
        let mut out_of_order = false;
        for attempt in 0..5 {
            cache_only_last_chunk(&file);
            let r = c.call(0, CMD_READ, 0, READ);
            let offsets = data_offsets(&r);
            assert_eq!(offsets.len(), (READ / CHUNK) as usize, "{path}: one OFFSET_DATA chunk per 64 KiB: {offsets:?}");
            assert!(r.read_data() == data[..READ as usize], "{path}: attempt {attempt} read back different bytes");
            out_of_order |= offsets.windows(2).any(|w| w[0] > w[1]);
        }
        if path == "copy" {
            assert!(out_of_order, "copy: the cached last chunk never overtook the uncached ones");
        }
        // Unaligned, and not a multiple of the chunk: first and last chunks are partial.
        let r = c.call(0, CMD_READ, 12345, 700_001);
        assert!(r.read_data() == data[12345..12345 + 700_001], "{path}: unaligned read differs");
        c.disconnect();
        assert_eq!(s.stop().code(), Some(0));
    }
}

#[test]
fn libnbd_reassembles_out_of_order_chunks() {
    require!("nbdsh");
    let (s, file, _) = serve_file(4 << 20, "copy");
    cache_only_last_chunk(&file);
    let script = format!(
        r#"
import nbd
h = nbd.NBD()
h.connect_uri("{uri}")
assert h.get_structured_replies_negotiated()
want = open("{file}", "rb").read()
for off, n in ((0, 1 << 20), (4097, 3 << 20), (0, 4 << 20)):
    assert h.pread(n, off) == want[off:off + n], "read of %d at %d differs" % (n, off)
h.shutdown()
print("SCRIPT-COMPLETED")
"#,
        uri = s.uri(),
        file = file.display()
    );
    let (ok, out, err) = run("nbdsh", &["-c", &script]);
    assert!(ok && out.contains("SCRIPT-COMPLETED"), "nbdsh failed\n{out}\n{err}");
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn storage_error_mid_read_is_an_error_chunk_after_the_good_data() {
    for path in ["copy", "direct", "splice", "splice-direct"] {
        let (s, file, data) = serve_file(READ as usize, path);
        // The server sized the export at open; shrinking the file makes every read past the
        // new end fail, as a disk with bad sectors would.
        let cut = 512 * 1024 + 100;
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(cut).unwrap();
        let (mut c, _) = Client::connect(&s.socket, "", true, false);
        let r = c.call(0, CMD_READ, 0, READ);
        assert_eq!(r.error(), Some(EIO), "{path}: {r:?}");
        let last = r.msgs.last().unwrap();
        let Msg::Chunk(err) = last else { panic!("{path}: structured reply expected") };
        assert_eq!(err.kind, CHUNK_ERROR_OFFSET, "{path}: the error names its offset");
        assert!(be64(&err.payload[err.payload.len() - 8..]) >= 512 * 1024, "{path}: error before the cut");
        for m in &r.msgs[..r.msgs.len() - 1] {
            let Msg::Chunk(ch) = m else { unreachable!() };
            assert_eq!(ch.kind, CHUNK_OFFSET_DATA, "{path}: only data before the error");
            assert_eq!(ch.flags & REPLY_FLAG_DONE, 0, "{path}: DONE only on the last chunk");
            let at = be64(&ch.payload[0..8]) as usize;
            let bytes = &ch.payload[8..];
            assert!(at + bytes.len() <= cut as usize, "{path}: data chunk past the cut");
            assert!(bytes == &data[at..at + bytes.len()], "{path}: good chunk at {at} carries wrong bytes");
        }
        // The connection is still usable after a failed read.
        assert!(c.read(0, 4096) == data[..4096], "{path}");
        c.disconnect();
        assert_eq!(s.stop().code(), Some(0));
    }
}

#[test]
fn storage_error_mid_read_with_simple_replies_errors_or_disconnects() {
    for path in ["copy", "splice"] {
        let (s, file, data) = serve_file(READ as usize, path);
        std::fs::OpenOptions::new().write(true).open(&file).unwrap().set_len(512 * 1024 + 100).unwrap();
        let (mut c, _) = Client::connect(&s.socket, "", false, false);
        let h = c.req(0, CMD_READ, 0, READ);
        let head = c.recv(16);
        assert_eq!(&head[0..4], &SIMPLE_REPLY_MAGIC);
        assert_eq!(be64(&head[8..16]), h);
        match be32(&head[4..8]) {
            0 => {
                // Data started flowing before the error was known: the server must cut the
                // connection before the promised megabyte is complete.
                let rest = c.close_within(Duration::from_secs(5)).expect("server must disconnect");
                assert!(rest.len() < READ as usize, "{path}: all data sent for a failed read");
                assert!(rest[..] == data[..rest.len()], "{path}: partial data is wrong");
            }
            e => {
                assert_eq!(e, EIO, "{path}");
                assert!(c.read(0, 4096) == data[..4096], "{path}: connection unusable after the error");
            }
        }
        assert_eq!(s.stop().code(), Some(0));
    }
}

/// A spliced chunk as long as the pipe but not page-aligned touches one page more than the
/// pipe holds. Such reads once filled the pipe short of their length and never finished
/// (found by `sluice mount --direct-io`, whose kernel requests are 1 MiB at any offset).
#[test]
fn unaligned_pipe_sized_reads_finish_on_the_splice_paths() {
    let len = 6 << 20;
    for path in ["splice", "splice-direct"] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        let data = pattern(len, 11);
        write_file(&file, &data);
        // A 1 MiB chunk equals the pipe size: the case that hung. Automatic chunks are cut
        // at the pipe size too.
        for chunk in ["1M", "auto"] {
            let s = Sluice::start(&[file.to_str().unwrap(), "--data-path", path, "--chunk", chunk]);
            for cached in [true, false] {
                if !cached {
                    let f = std::fs::File::open(&file).unwrap();
                    // SAFETY: posix_fadvise takes a descriptor we own and plain numbers.
                    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                }
                let (mut c, _) = Client::connect(&s.socket, "", true, false);
                c.set_read_timeout(Duration::from_secs(10));
                for (offset, n) in [(100u64, 1u32 << 20), (4095, 3 << 20), (4097, (2 << 20) + 7), (512, 1 << 20)] {
                    let r = c.call(0, CMD_READ, offset, n);
                    r.assert_ok();
                    let got = r.read_data();
                    let want = &data[offset as usize..offset as usize + n as usize];
                    assert!(got == want, "{path} {chunk} cached={cached}: read at {offset} of {n}");
                }
            }
        }
    }
}

#[test]
fn automatic_chunks_arrive_intact_on_every_path_and_in_every_reply_mode() {
    let len = 8 << 20;
    for path in ["copy", "direct", "splice", "splice-direct"] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        let data = pattern(len, 3);
        write_file(&file, &data);
        let s = Sluice::start(&[file.to_str().unwrap(), "--data-path", path]);
        for (structured, flags) in [(false, 0), (true, 0), (true, F_DF)] {
            let (mut c, _) = Client::connect(&s.socket, "", structured, false);
            c.set_read_timeout(Duration::from_secs(10));
            // The first reads are cut before anything is measured, the later ones by the rates.
            for (offset, n) in [(0u64, 4u32 << 20), (0, 4 << 20), (12345, (3 << 20) + 7), (4 << 20, 4 << 20)] {
                let f = std::fs::File::open(&file).unwrap();
                // SAFETY: posix_fadvise takes a descriptor we own and plain numbers.
                unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
                let r = c.call(flags, CMD_READ, offset, n);
                r.assert_ok();
                let mode = format!("{path}, structured {structured}, flags {flags}");
                assert!(r.read_data() == data[offset as usize..offset as usize + n as usize], "{mode}: read at {offset} of {n}");
                if flags != 0 || !structured {
                    assert_eq!(data_offsets(&r).len(), structured as usize, "{mode}: one run of data");
                }
            }
            c.disconnect();
        }
        assert_eq!(s.stop().code(), Some(0));
    }
}

/// Spliced replies to many reads in flight at once: the socket fills while the client is
/// not yet reading, so the server's splices stop short or find no room and must carry on
/// once the client reads.
#[test]
fn many_large_reads_in_flight_arrive_intact_when_the_socket_fills() {
    let len = 8 << 20;
    for path in ["splice", "splice-direct", "copy"] {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("disk.img");
        let data = pattern(len, 11);
        write_file(&file, &data);
        let s = Sluice::start(&[file.to_str().unwrap(), "--data-path", path]);
        for structured in [false, true] {
            let mut sockets = vec![Client::connect(&s.socket, "", structured, false).0, Client::tcp(s.port)];
            sockets[1].start();
            sockets[1].go("", structured, false);
            for mut c in sockets {
                c.set_read_timeout(Duration::from_secs(10));
                let reads: Vec<(u64, u32)> = (0..24u64).map(|i| ((i * 333_333) % (6 << 20), (1 << 20) + (i as u32 % 3) * 4096)).collect();
                let handles: Vec<u64> = reads.iter().map(|&(offset, n)| c.req(0, CMD_READ, offset, n)).collect();
                let mut replies = c.replies(reads.len());
                for (h, (offset, n)) in handles.into_iter().zip(reads) {
                    let r = replies.remove(&h).unwrap();
                    r.assert_ok();
                    let want = &data[offset as usize..offset as usize + n as usize];
                    assert!(r.read_data() == want, "{path}, structured {structured}: read of {n} at {offset} differs");
                }
                c.disconnect();
            }
        }
        assert_eq!(s.stop().code(), Some(0));
    }
}
