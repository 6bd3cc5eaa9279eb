//! The --metrics endpoint answers in Prometheus text format and its counters follow traffic.
mod common;
mod raw;
use std::io::{Read, Write};

use common::*;
use raw::*;

/// GET http://127.0.0.1:port/path with a plain socket; returns (status line, body).
fn get(port: u16, path: &str) -> (String, String) {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to the metrics endpoint");
    s.set_read_timeout(Some(std::time::Duration::from_secs(5))).unwrap();
    write!(s, "GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).expect("read the response");
    let (head, body) = text.split_once("\r\n\r\n").expect("a header and a body");
    (head.lines().next().unwrap_or_default().to_owned(), body.to_owned())
}

/// The value of the sample `name{labels}` (labels exactly as rendered), or 0 when absent.
fn sample(body: &str, series: &str) -> f64 {
    body.lines()
        .find_map(|l| l.strip_prefix(series).and_then(|rest| rest.strip_prefix(' ')))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

#[test]
fn metrics_endpoint_counts_requests_bytes_connections_and_phases() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let s = Sluice::start(&["memory:16M", "--metrics", &addr]);
    let (status, before) = get(port, "/metrics");
    assert!(status.contains("200"), "{status}");
    assert!(before.contains("# TYPE sluice_request_phase_seconds histogram"), "{before}");
    assert_eq!(sample(&before, r#"sluice_requests_total{export="",op="read"}"#), 0.0);

    let (mut c, _) = Client::connect(&s.socket, "", true, false);
    let data = pattern(65536, 3);
    for i in 0..10u64 {
        c.write(i * 65536, &data);
    }
    for i in 0..20u64 {
        assert!(c.read((i % 10) * 65536, 65536) == data);
    }
    // A refused read (past the end) counts as neither a read nor an error of a read.
    c.call(0, CMD_READ, 16 << 20, 4096).assert_structured_error(EINVAL);

    let (_, during) = get(port, "/metrics");
    assert_eq!(sample(&during, r#"sluice_connections{export=""}"#), 1.0, "one client connected");
    assert_eq!(sample(&during, r#"sluice_requests_total{export="",op="write"}"#), 10.0);
    assert_eq!(sample(&during, r#"sluice_requests_total{export="",op="read"}"#), 20.0);
    assert_eq!(sample(&during, r#"sluice_request_bytes_total{export="",op="read"}"#), 20.0 * 65536.0);
    assert_eq!(sample(&during, r#"sluice_request_bytes_total{export="",op="write"}"#), 10.0 * 65536.0);
    assert_eq!(sample(&during, r#"sluice_request_errors_total{export="",op="read"}"#), 0.0);
    for phase in ["receive", "storage", "queue", "send", "total"] {
        let count = sample(&during, &format!(r#"sluice_request_phase_seconds_count{{export="",op="read",phase="{phase}"}}"#));
        assert_eq!(count, 20.0, "every read is timed in phase {phase}");
    }
    let total = sample(&during, r#"sluice_request_phase_seconds_sum{export="",op="write",phase="total"}"#);
    let receive = sample(&during, r#"sluice_request_phase_seconds_sum{export="",op="write",phase="receive"}"#);
    assert!(total > 0.0 && total >= receive, "write time {total} s, receiving {receive} s");

    c.disconnect();
    std::thread::sleep(std::time::Duration::from_millis(200));
    let (_, after) = get(port, "/metrics");
    assert_eq!(sample(&after, r#"sluice_connections{export=""}"#), 0.0, "the client left");
    assert_eq!(sample(&after, r#"sluice_connections_total{export=""}"#), 1.0);
    assert!(get(port, "/nothing").0.contains("404"));
    assert_eq!(s.stop().code(), Some(0));
}

#[test]
fn metrics_address_in_use_is_a_startup_error() {
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap().to_string();
    let dir = tempfile::tempdir().unwrap();
    let sock = dir.path().join("x.sock");
    let (ok, _, err) = run(SLUICE, &["serve", "--unix", sock.to_str().unwrap(), "--metrics", &addr]);
    assert!(!ok);
    assert!(err.contains("metrics") && err.contains("in use"), "{err}");
}
