//! The --metrics endpoint answers in Prometheus text format and its counters follow traffic.
mod common;
mod raw;
use common::*;
use raw::*;

#[test]
fn metrics_endpoint_counts_requests_bytes_connections_and_phases() {
    let port = free_port();
    let addr = format!("127.0.0.1:{port}");
    let s = Sluice::start(&["memory:16M", "--metrics", &addr]);
    let (status, before) = http_get(port, "/metrics");
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

    let (_, during) = http_get(port, "/metrics");
    assert_eq!(sample(&during, r#"sluice_connections{export=""}"#), 1.0, "one client connected");
    // Counted once the connection is closed: a request is recorded after its reply is sent.
    c.disconnect();
    let after = metrics_after_close(port, "");
    assert_eq!(sample(&after, r#"sluice_connections_total{export=""}"#), 1.0);
    assert_eq!(sample(&after, r#"sluice_requests_total{export="",op="write"}"#), 10.0);
    assert_eq!(sample(&after, r#"sluice_requests_total{export="",op="read"}"#), 20.0);
    assert_eq!(sample(&after, r#"sluice_request_bytes_total{export="",op="read"}"#), 20.0 * 65536.0);
    assert_eq!(sample(&after, r#"sluice_request_bytes_total{export="",op="write"}"#), 10.0 * 65536.0);
    assert_eq!(sample(&after, r#"sluice_request_errors_total{export="",op="read"}"#), 0.0);
    for phase in ["receive", "storage", "queue", "send", "total"] {
        let count = sample(&after, &format!(r#"sluice_request_phase_seconds_count{{export="",op="read",phase="{phase}"}}"#));
        assert_eq!(count, 20.0, "every read is timed in phase {phase}");
    }
    let total = sample(&after, r#"sluice_request_phase_seconds_sum{export="",op="write",phase="total"}"#);
    let receive = sample(&after, r#"sluice_request_phase_seconds_sum{export="",op="write",phase="receive"}"#);
    assert!(total > 0.0 && total >= receive, "write time {total} s, receiving {receive} s");
    assert!(http_get(port, "/nothing").0.contains("404"));
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
