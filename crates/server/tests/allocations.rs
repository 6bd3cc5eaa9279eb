//! The server makes no heap allocation per request in steady state.
//!
//! A counting global allocator (this test binary only) counts every allocation in the
//! process. The server runs in-process on one worker; load comes from fio's nbd engine in
//! a separate process, so the client's allocations are not counted. Each fio run opens a
//! new connection, and a connection's setup and teardown allocate a bounded amount, as do
//! spawning and waiting for the fio child in this thread (the counter is read before the
//! spawn and after the wait): a few hundred allocations, constant, not per request. So the
//! checks are that a run allocates far fewer times than it makes requests.

use std::alloc::{GlobalAlloc, Layout, System};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::process::Command;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use sluice_server::export::Options;
use sluice_server::{Config, Export, Exports, Limits, Server, Spec};

struct Counting;

static ALLOCS: AtomicU64 = AtomicU64::new(0);

// SAFETY: every call is passed straight to the system allocator; only a counter is added.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCS.fetch_add(1, Ordering::Relaxed);
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

fn fio_installed() -> bool {
    Command::new("fio").arg("--version").output().is_ok_and(|o| o.status.success())
}

/// Runs one fio process (one connection) and returns the allocations made meanwhile.
fn fio(port: u16, rw: &str, bs: u64, iodepth: u32, ios: u64) -> u64 {
    let before = ALLOCS.load(Ordering::SeqCst);
    let mut child = Command::new("fio")
        .args([
            "--name=a",
            "--ioengine=nbd",
            &format!("--uri=nbd://127.0.0.1:{port}/"),
            &format!("--rw={rw}"),
            &format!("--bs={bs}"),
            // fio stops once it has covered --size; --io_size makes it go round ios times.
            &format!("--io_size={}", bs * ios),
            &format!("--iodepth={iodepth}"),
            "--size=32M",
            &format!("--number_ios={ios}"),
            "--time_based=0",
            "--output-format=terse",
        ])
        .stdout(std::process::Stdio::null())
        .spawn()
        .expect("spawn fio");
    let status = child.wait().expect("wait for fio");
    let after = ALLOCS.load(Ordering::SeqCst);
    assert!(status.success(), "fio {rw} {bs} failed: {status}");
    after - before
}

#[test]
fn no_allocation_per_request() {
    if !fio_installed() {
        if std::env::var_os("CI").is_some() {
            panic!("fio is not installed, and CI is set");
        }
        println!("SKIPPED: fio is not installed");
        return;
    }
    let port = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let addr: SocketAddr = ([127, 0, 0, 1], port).into();
    let mut exports = Exports::default();
    exports.insert(Export::open("", &Spec::Memory(sluice_server::backend::MemorySpec::plain(64 << 20)), Options::default()).unwrap()).unwrap();
    let server = Server::bind(Config {
        tcp: vec![addr],
        tcp_ipv6_optional: false,
        unix: Vec::new(),
        threads: 1,
        pin_threads: false,
        busy_poll_us: 0,
        limits: Limits::default(),
        exports,
        access: Default::default(),
        metrics: None,
        tls: None,
        inherited: Vec::new(),
        qos: Default::default(),
    })
    .unwrap();
    let stopper = server.stopper();
    let serving = {
        let stopper = stopper.clone();
        std::thread::spawn(move || server.serve(&stopper))
    };
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(addr).is_err() {
        assert!(Instant::now() < deadline, "server not listening on {addr}");
        std::thread::sleep(Duration::from_millis(10));
    }

    let warm = fio(port, "randrw", 4096, 32, 20_000);
    let small_ios = 50_000;
    let small = fio(port, "randrw", 4096, 32, small_ios);
    let large = fio(port, "randrw", 1 << 20, 8, 2_000);
    println!("allocations: warm-up {warm} (20000 I/Os), 4K {small} ({small_ios} I/Os), 1M {large} (2000 I/Os)");

    stopper.stop();
    serving.join().unwrap().unwrap();

    assert!(small < small_ios / 100, "{small} allocations in {small_ios} 4K requests");
    assert!(large < 500, "{large} allocations in 2000 1M requests");
}
