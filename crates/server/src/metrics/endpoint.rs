//! The `/metrics` HTTP endpoint: one thread that accepts scrapers and answers them one at a
//! time, each under a deadline. It sleeps in poll(2) on the listener and on a pipe whose
//! write end the handle holds, so dropping the handle wakes it at once.

use std::io::{self, ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::OwnedFd;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags, Timespec};

use super::recorder::Metrics;
use crate::limits::{
    METRICS_ACCEPT_RETRY_DELAY_MS as ACCEPT_RETRY_DELAY_MS, METRICS_CLIENT_DEADLINE_MS as CLIENT_DEADLINE_MS,
    METRICS_REQUEST_HEADERS_MAX_COUNT as REQUEST_HEADERS_MAX_COUNT, METRICS_REQUEST_HEAD_MAX_BYTES as REQUEST_HEAD_MAX_BYTES,
};

/// What `TextEncoder` writes (`prometheus::TEXT_FORMAT`), with the charset; Prometheus picks
/// its parser by this header.
const EXPOSITION_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// The running `/metrics` endpoint. Dropping it, or `stop()`, closes the socket and joins
/// the thread.
pub struct MetricsServer {
    addr: SocketAddr,
    /// Closing it wakes the thread to stop.
    wake: Option<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

/// Serves GET /metrics on `addr` from a background thread; other paths get 404, other
/// methods 405. Binds here, so a bad address is an error at start-up.
///
/// Meant for a trusted scraper: scrapers are served one at a time, so one that stalls
/// delays the next by up to `CLIENT_DEADLINE_MS`.
pub fn serve_http(addr: SocketAddr, metrics: Arc<Metrics>) -> io::Result<MetricsServer> {
    let listener = TcpListener::bind(addr)?;
    let addr = listener.local_addr()?;
    // Poll may report a connection that is gone by the time accept runs; a blocking accept
    // would then wait there, deaf to a stop.
    listener.set_nonblocking(true)?;
    let (stopping, wake) = rustix::pipe::pipe_with(rustix::pipe::PipeFlags::CLOEXEC)?;
    let thread = thread::Builder::new()
        .name("sluice-metrics".to_string())
        .spawn(move || serve(&listener, &stopping, &metrics))?;
    Ok(MetricsServer { addr, wake: Some(wake), thread: Some(thread) })
}

impl MetricsServer {
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn stop(self) {
        // Drop does the work, so a handle that is merely dropped stops too.
        drop(self);
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        drop(self.wake.take());
        if let Some(thread) = self.thread.take() {
            // A panic there has already been reported; stopping should not add another.
            let _ = thread.join();
        }
    }
}

/// What woke `wait`.
#[derive(Debug, PartialEq, Eq)]
enum Wake {
    Stop,
    Connection,
    Timeout,
}

/// Sleeps until the handle is dropped, `listener` (when given) has a connection waiting, or
/// `timeout` (when given) passes. A signal ends it with `Interrupted`.
fn wait(stopping: &OwnedFd, listener: Option<&TcpListener>, timeout: Option<Duration>) -> io::Result<Wake> {
    let timeout = timeout.map(Timespec::try_from).transpose().map_err(io::Error::other)?;
    let mut fds = vec![PollFd::new(stopping, PollFlags::IN)];
    fds.extend(listener.map(|listener| PollFd::new(listener, PollFlags::IN)));
    rustix::event::poll(&mut fds, timeout.as_ref())?;
    // The closed write end shows as POLLHUP.
    let woke = |i: usize| fds.get(i).is_some_and(|fd| !fd.revents().is_empty());
    Ok(if woke(0) {
        Wake::Stop
    } else if woke(1) {
        Wake::Connection
    } else {
        Wake::Timeout
    })
}

fn serve(listener: &TcpListener, stopping: &OwnedFd, metrics: &Metrics) {
    loop {
        let accepted = match wait(stopping, Some(listener), None) {
            Ok(Wake::Stop) => return,
            Ok(_) => listener.accept(),
            Err(e) => Err(e),
        };
        match accepted {
            Ok((stream, peer)) => {
                if let Err(e) = answer(stream, metrics) {
                    log::debug!("metrics endpoint: {peer}: {e}");
                }
            }
            Err(e) if is_fleeting(&e) => {}
            Err(e) => {
                if back_off(stopping, &e) {
                    return;
                }
            }
        }
    }
}

/// Errors about one connection or one wake-up, not the listener: nothing to wait out. The
/// connection went away before accept, or a signal came.
fn is_fleeting(e: &io::Error) -> bool {
    matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::ConnectionAborted | ErrorKind::Interrupted)
}

/// Logs `e` and waits `ACCEPT_RETRY_DELAY_MS`, or less if the handle is dropped meanwhile;
/// true in that case.
fn back_off(stopping: &OwnedFd, e: &io::Error) -> bool {
    log::warn!("metrics endpoint: accepting failed: {e}; retrying in {ACCEPT_RETRY_DELAY_MS} ms");
    let delay = Duration::from_millis(ACCEPT_RETRY_DELAY_MS);
    match wait(stopping, None, Some(delay)) {
        Ok(woke) => woke == Wake::Stop,
        Err(_) => {
            // Poll itself failing must not turn into a spin either.
            thread::sleep(delay);
            false
        }
    }
}

/// What the scraper asked for, as far as the answer depends on it.
#[derive(Debug, PartialEq, Eq)]
enum Asked {
    Metrics { head_only: bool },
    WrongMethod,
    NotFound,
    Malformed,
}

fn answer(mut stream: TcpStream, metrics: &Metrics) -> io::Result<()> {
    let deadline = Instant::now() + Duration::from_millis(CLIENT_DEADLINE_MS);
    // Accepted sockets do not inherit the listener's O_NONBLOCK on Linux; elsewhere they may.
    stream.set_nonblocking(false)?;
    let Some(asked) = read_request(&mut stream, deadline)? else {
        return Ok(());
    };
    write_by(&mut stream, &reply(&asked, metrics), deadline)?;
    linger(&mut stream, deadline)
}

/// One read, again after EINTR: a read with a timeout set fails with it when the process is
/// stopped and continued (signal(7)), which is no fault of the client's.
fn read_some(stream: &mut TcpStream, buf: &mut [u8]) -> io::Result<usize> {
    loop {
        match stream.read(buf) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            other => return other,
        }
    }
}

/// Reads up to the end of the request head; None when the client closed before sending one.
fn read_request(stream: &mut TcpStream, deadline: Instant) -> io::Result<Option<Asked>> {
    let mut head = [0; REQUEST_HEAD_MAX_BYTES];
    let mut len = 0;
    while len < head.len() {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        let n = read_some(stream, &mut head[len..])?;
        if n == 0 {
            return Ok(None);
        }
        len += n;
        let mut headers = [httparse::EMPTY_HEADER; REQUEST_HEADERS_MAX_COUNT];
        let mut request = httparse::Request::new(&mut headers);
        match request.parse(&head[..len]) {
            Ok(httparse::Status::Partial) => {}
            Ok(httparse::Status::Complete(_)) => {
                // A complete head always has both.
                let (method, target) = (request.method.unwrap_or_default(), request.path.unwrap_or_default());
                return Ok(Some(classify(method, target)));
            }
            Err(_) => return Ok(Some(Asked::Malformed)),
        }
    }
    // No end of head within the bound.
    Ok(Some(Asked::Malformed))
}

/// The path decides before the method, so any method on an unknown path is a 404.
fn classify(method: &str, target: &str) -> Asked {
    let path = target.split('?').next().unwrap_or_default();
    match (path, method) {
        ("/metrics", "GET") => Asked::Metrics { head_only: false },
        ("/metrics", "HEAD") => Asked::Metrics { head_only: true },
        ("/metrics", _) => Asked::WrongMethod,
        _ => Asked::NotFound,
    }
}

/// The whole response. A known length instead of chunks, so the simplest client can read
/// it, and one buffer, so the head and body leave in the same segments.
fn reply(asked: &Asked, metrics: &Metrics) -> Vec<u8> {
    let mut body = String::new();
    let (status, headers) = match asked {
        Asked::Metrics { .. } => {
            metrics.render(&mut body);
            ("200 OK", format!("Content-Type: {EXPOSITION_CONTENT_TYPE}\r\n"))
        }
        Asked::WrongMethod => {
            body.push_str("method not allowed\n");
            ("405 Method Not Allowed", "Allow: GET, HEAD\r\n".to_string())
        }
        Asked::NotFound => {
            body.push_str("not found\n");
            ("404 Not Found", String::new())
        }
        Asked::Malformed => {
            body.push_str("bad request\n");
            ("400 Bad Request", String::new())
        }
    };
    let length = body.len();
    let mut out = format!("HTTP/1.1 {status}\r\n{headers}Content-Length: {length}\r\nConnection: close\r\n\r\n");
    if !matches!(asked, Asked::Metrics { head_only: true }) {
        out.push_str(&body);
    }
    out.into_bytes()
}

fn write_by(stream: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> io::Result<()> {
    while !bytes.is_empty() {
        stream.set_write_timeout(Some(remaining(deadline)?))?;
        match stream.write(bytes) {
            Ok(0) => return Err(ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// Closes our side, then discards what the client still sends until it closes too:
/// closing with unread bytes makes the kernel reset the connection, which can destroy the
/// reply before the client has read it.
fn linger(stream: &mut TcpStream, deadline: Instant) -> io::Result<()> {
    stream.shutdown(Shutdown::Write)?;
    let mut discard = [0; 1024];
    loop {
        stream.set_read_timeout(Some(remaining(deadline)?))?;
        if read_some(stream, &mut discard)? == 0 {
            return Ok(());
        }
    }
}

fn remaining(deadline: Instant) -> io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(io::Error::new(ErrorKind::TimedOut, "the client took too long"));
    }
    Ok(left)
}

#[cfg(test)]
mod tests {
    use super::super::recorder::{Op, Phases};
    use super::*;
    use std::sync::mpsc;

    /// One request over a fresh connection; returns the status code and the whole response.
    fn get(addr: SocketAddr, request_line: &str) -> (u16, String) {
        let mut stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        write!(stream, "{request_line}\r\nHost: test\r\nConnection: close\r\n\r\n").unwrap();
        let mut response = String::new();
        stream.read_to_string(&mut response).unwrap();
        let status = response.split(' ').nth(1).and_then(|s| s.parse().ok()).unwrap_or(0);
        (status, response)
    }

    /// Runs `stop` on another thread so a stop that hangs fails the test instead of hanging it.
    fn returns_promptly(stop: impl FnOnce() + Send + 'static) {
        let (done, finished) = mpsc::channel();
        thread::spawn(move || {
            stop();
            let _ = done.send(());
        });
        // A hang detector, not a timing check: generous for a loaded machine.
        finished.recv_timeout(Duration::from_secs(30)).expect("stopping took over 30 s");
    }

    fn assert_not_listening(addr: SocketAddr) {
        // Joining the thread dropped the listener, so the port is closed by now.
        assert!(TcpStream::connect(addr).is_err(), "still listening on {addr} after stop");
    }

    fn start(exports: &[&str]) -> MetricsServer {
        let names: Vec<String> = exports.iter().map(|s| s.to_string()).collect();
        serve_http("127.0.0.1:0".parse().unwrap(), Metrics::new(&names)).unwrap()
    }

    #[test]
    fn http_serves_metrics_and_refuses_the_rest() {
        let metrics = Metrics::new(&["web".to_string()]);
        metrics.record(0, Op::Write, &Phases::default(), 512, true);
        let server = serve_http("127.0.0.1:0".parse().unwrap(), metrics).unwrap();
        let addr = server.local_addr();
        assert_ne!(addr.port(), 0);

        let (status, response) = get(addr, "GET /metrics HTTP/1.1");
        assert_eq!(status, 200, "{response}");
        let (head, body) = response.split_once("\r\n\r\n").unwrap();
        let head = head.to_ascii_lowercase();
        assert!(head.contains("content-type: text/plain; version=0.0.4; charset=utf-8\r\n"), "{head}");
        assert!(head.contains(&format!("content-length: {}\r\n", body.len())), "{head}");
        assert!(body.contains("sluice_request_bytes_total{export=\"web\",op=\"write\"} 512\n"));
        assert!(body.ends_with('\n') && !body.contains("# EOF"));

        assert_eq!(get(addr, "GET /metrics?x=1 HTTP/1.1").0, 200);
        assert_eq!(get(addr, "GET /other HTTP/1.1").0, 404);
        assert_eq!(get(addr, "POST /other HTTP/1.1").0, 404);
        let (status, response) = get(addr, "POST /metrics HTTP/1.1");
        assert_eq!(status, 405);
        assert!(response.contains("Allow: GET, HEAD\r\n"), "{response}");
        let (status, response) = get(addr, "HEAD /metrics HTTP/1.1");
        assert_eq!(status, 200);
        assert!(response.ends_with("\r\n\r\n"), "HEAD has no body: {response}");

        // A client speaking nonsense must not take the endpoint down.
        let mut junk = TcpStream::connect(addr).unwrap();
        junk.write_all(b"\x00\xff not http at all\r\n\r\n").unwrap();
        drop(junk);
        assert_eq!(get(addr, "GET /metrics HTTP/1.0").0, 200);

        returns_promptly(move || server.stop());
        assert_not_listening(addr);
    }

    #[test]
    fn an_oversized_request_head_is_refused_and_its_reply_arrives() {
        let server = start(&[]);
        let padding = "x".repeat(REQUEST_HEAD_MAX_BYTES);
        let (status, response) = get(server.local_addr(), &format!("GET /metrics HTTP/1.1\r\nX-Pad: {padding}"));
        assert_eq!(status, 400, "{response}");
    }

    #[test]
    fn a_silent_client_holds_the_endpoint_no_longer_than_the_deadline() {
        let server = start(&["a"]);
        let _silent = TcpStream::connect(server.local_addr()).unwrap();
        // Served once the silent client's deadline has passed, however long that takes here.
        assert_eq!(get(server.local_addr(), "GET /metrics HTTP/1.1").0, 200);
    }

    #[test]
    fn http_bind_errors_come_back_at_start_up() {
        let taken = TcpListener::bind("127.0.0.1:0").unwrap();
        let err = serve_http(taken.local_addr().unwrap(), Metrics::new(&[])).err().unwrap();
        assert_eq!(err.kind(), ErrorKind::AddrInUse);
    }

    #[test]
    fn dropping_the_handle_stops_the_server() {
        let server = start(&[]);
        let addr = server.local_addr();
        returns_promptly(move || drop(server));
        assert_not_listening(addr);
    }

    #[test]
    fn back_off_waits_the_delay_unless_stopped() {
        let (stopping, wake) = rustix::pipe::pipe().unwrap();
        let e = io::Error::from_raw_os_error(libc::EMFILE);
        let started = Instant::now();
        assert!(!back_off(&stopping, &e));
        assert!(started.elapsed() >= Duration::from_millis(ACCEPT_RETRY_DELAY_MS));

        // A stop already asked for ends the wait at once (a hang would fail the test run).
        drop(wake);
        assert!(back_off(&stopping, &e));
    }

    #[test]
    fn wait_tells_a_connection_from_a_stop() {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let (stopping, wake) = rustix::pipe::pipe().unwrap();
        let short = Some(Duration::from_millis(10));
        assert_eq!(wait(&stopping, Some(&listener), short).unwrap(), Wake::Timeout);
        let _client = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
        assert_eq!(wait(&stopping, Some(&listener), None).unwrap(), Wake::Connection);
        drop(wake);
        assert_eq!(wait(&stopping, Some(&listener), None).unwrap(), Wake::Stop);
    }

    #[test]
    fn the_content_type_is_the_encoders() {
        assert_eq!(EXPOSITION_CONTENT_TYPE, format!("{}; charset=utf-8", prometheus::TEXT_FORMAT));
    }

    #[test]
    fn classify_checks_the_path_before_the_method() {
        assert_eq!(classify("GET", "/metrics"), Asked::Metrics { head_only: false });
        assert_eq!(classify("GET", "/metrics?name[]=x"), Asked::Metrics { head_only: false });
        assert_eq!(classify("HEAD", "/metrics"), Asked::Metrics { head_only: true });
        assert_eq!(classify("DELETE", "/metrics"), Asked::WrongMethod);
        assert_eq!(classify("DELETE", "/"), Asked::NotFound);
        assert_eq!(classify("GET", "/metrics/"), Asked::NotFound);
    }
}
