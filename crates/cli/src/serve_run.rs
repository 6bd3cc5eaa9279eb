//! Captive mode (`sluice serve --run COMMAND`, as nbdkit's `--run`): once the server
//! accepts connections, COMMAND runs under `/bin/sh -c` with the URI of the export in its
//! environment; when it exits, the server stops and exits with its status. Without a
//! listener of its own, the server listens on a private Unix socket in a directory made
//! for it and removed at exit.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus};
use std::sync::mpsc;
use std::sync::Arc;
use std::time::Duration;

use sluice_client::{Address, Tls, Uri};
use sluice_server::{Endpoint, Exports, Stopper, TlsSettings};

use crate::serve_systemd::Notifier;

/// Time COMMAND gets to end after SIGTERM when the server was stopped under it.
const COMMAND_STOP_TIMEOUT_MS: u64 = 10_000;

/// A directory only this user can enter, holding the server's socket.
pub struct PrivateSocket {
    dir: tempfile::TempDir,
}

impl PrivateSocket {
    pub fn new() -> std::io::Result<PrivateSocket> {
        // TempDir makes it with mode 0700.
        Ok(PrivateSocket { dir: tempfile::Builder::new().prefix("sluice-").tempdir()? })
    }

    pub fn path(&self) -> PathBuf {
        self.dir.path().join("nbd.sock")
    }
}

/// What COMMAND is told, as the variables nbdkit's `--run` sets.
#[derive(Debug, PartialEq, Eq)]
pub struct Place {
    pub uri: String,
    pub unixsocket: String,
    pub port: String,
    pub exportname: String,
}

/// The export COMMAND is pointed at: the default one, else the only one, else the first
/// by name; and the listener: a Unix socket if there is one, else the first TCP address
/// (a wildcard address is reached through loopback).
pub fn place(endpoints: &[Endpoint], exports: &Exports, tls: Option<&TlsSettings>) -> Option<Place> {
    let export = if exports.get("").is_some() { String::new() } else { exports.iter().next()?.name.clone() };
    let unix = endpoints.iter().find_map(|e| if let Endpoint::Unix(p) = e { Some(p.clone()) } else { None });
    let tcp = endpoints.iter().find_map(|e| if let Endpoint::Tcp(a) = e { Some(*a) } else { None });
    let address = match (&unix, tcp) {
        (Some(p), _) => Address::Unix(p.clone()),
        (None, Some(a)) => Address::Tcp { host: loopback_for(a.ip()).to_string(), port: a.port() },
        (None, None) => return None,
    };
    let tls = tls.map(|t| Tls { certificates: t.certificates.clone(), psk_file: t.psk.clone(), username: psk_username(t), ..Tls::default() });
    let uri = Uri { address, export: export.clone(), tls }.to_string();
    Some(Place {
        uri,
        unixsocket: unix.as_ref().map(|p| p.display().to_string()).unwrap_or_default(),
        port: if unix.is_none() { tcp.map(|a| a.port().to_string()).unwrap_or_default() } else { String::new() },
        exportname: export,
    })
}

fn loopback_for(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(a) if a.is_unspecified() => IpAddr::V4(Ipv4Addr::LOCALHOST),
        IpAddr::V6(a) if a.is_unspecified() => IpAddr::V6(Ipv6Addr::LOCALHOST),
        ip => ip,
    }
}

/// With PSK, the first identity in the server's file, so that the URI names a key the
/// server knows.
fn psk_username(t: &TlsSettings) -> Option<String> {
    let keys = sluice_server::tls::read_psk_file(t.psk.as_deref()?).ok()?;
    let mut identities: Vec<String> = keys.into_keys().collect();
    identities.sort();
    identities.into_iter().next()
}

/// COMMAND running, and the thread that stops the server when it exits.
pub struct Captive {
    /// COMMAND's process, to signal it by: a pidfd names that one process even once it
    /// has been reaped, so a signal can never reach another that took its pid. None when
    /// COMMAND never started.
    pidfd: Option<std::os::fd::OwnedFd>,
    exited: mpsc::Receiver<std::io::Result<ExitStatus>>,
}

impl Captive {
    /// Runs COMMAND; when it exits (or cannot start), the server is stopped. A command
    /// that cannot start ends the server with status 1.
    pub fn spawn(command: &str, place: Option<Place>, stopper: Stopper, notifier: Arc<Notifier>) -> Captive {
        let (tell, exited) = mpsc::channel();
        let started = place
            .ok_or_else(|| "there is no export or no listener to point the command at".to_owned())
            .and_then(|place| start(command, &place).map_err(|e| format!("cannot start /bin/sh: {e}")));
        let mut child = match started {
            Ok(child) => child,
            Err(e) => {
                log::error!("--run: {e}");
                stopper.stop();
                let _ = tell.send(Err(std::io::Error::other(e)));
                return Captive { pidfd: None, exited };
            }
        };
        // Opened before anyone waits for the child, so the pid is still its own.
        let pidfd = rustix::process::Pid::from_raw(child.id() as i32)
            .and_then(|pid| rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty()).ok());
        std::thread::spawn(move || {
            let status = child.wait();
            log::info!("the --run command ended ({}); stopping", describe(&status));
            // The status first: whoever sees the stop finds it there.
            let _ = tell.send(status);
            stopper.stop();
            notifier.stopping();
        });
        Captive { pidfd, exited }
    }

    /// The exit status to pass on: COMMAND's, or 128 + the signal that ended it. A command
    /// still running (the server was stopped by a signal) gets SIGTERM first, then SIGKILL.
    pub fn finish(self) -> u8 {
        let status = match self.exited.try_recv() {
            Ok(s) => s,
            Err(_) => {
                self.signal(rustix::process::Signal::TERM);
                match self.exited.recv_timeout(Duration::from_millis(COMMAND_STOP_TIMEOUT_MS)) {
                    Ok(s) => s,
                    Err(_) => {
                        self.signal(rustix::process::Signal::KILL);
                        self.exited.recv().unwrap_or_else(|_| Err(std::io::Error::other("the command's waiter is gone")))
                    }
                }
            }
        };
        exit_code(&status)
    }

    /// Signals COMMAND's shell (not what it started: a command that must stop its own
    /// children should `exec` the last of them or trap SIGTERM).
    fn signal(&self, signal: rustix::process::Signal) {
        if let Some(pidfd) = &self.pidfd {
            let _ = rustix::process::pidfd_send_signal(pidfd, signal);
        }
    }
}

/// COMMAND under /bin/sh, with the variables nbdkit's `--run` sets, and without those that
/// speak to sluice's own service manager.
fn start(command: &str, place: &Place) -> std::io::Result<Child> {
    log::info!("running {command:?} with uri={}", place.uri);
    Command::new("/bin/sh")
        .arg("-c")
        .arg(command)
        .env("uri", &place.uri)
        .env("unixsocket", &place.unixsocket)
        .env("port", &place.port)
        .env("exportname", &place.exportname)
        .env_remove("NOTIFY_SOCKET")
        .env_remove("WATCHDOG_USEC")
        .env_remove("WATCHDOG_PID")
        .spawn()
}

fn exit_code(status: &std::io::Result<ExitStatus>) -> u8 {
    match status {
        Ok(s) => match (s.code(), s.signal()) {
            (Some(code), _) => code as u8,
            (None, Some(sig)) => 128u8.wrapping_add(sig as u8),
            (None, None) => 1,
        },
        Err(_) => 1,
    }
}

fn describe(status: &std::io::Result<ExitStatus>) -> String {
    match status {
        Ok(s) => s.to_string(),
        Err(e) => format!("cannot wait for it: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use sluice_server::export::Options;
    use sluice_server::{Export, Spec};

    fn exports(names: &[&str]) -> Exports {
        let mut e = Exports::default();
        for n in names {
            e.insert(Export::open(n, &Spec::Null(1 << 20), Options::default()).unwrap()).unwrap();
        }
        e
    }

    #[test]
    fn a_unix_socket_is_preferred_and_the_default_export_named() {
        let ends = [Endpoint::Tcp("0.0.0.0:10809".parse().unwrap()), Endpoint::Unix("/tmp/d/nbd.sock".into())];
        let p = place(&ends, &exports(&["", "b"]), None).unwrap();
        assert_eq!(p.uri, "nbd+unix:///?socket=/tmp/d/nbd.sock");
        assert_eq!((p.unixsocket.as_str(), p.port.as_str(), p.exportname.as_str()), ("/tmp/d/nbd.sock", "", ""));
    }

    #[test]
    fn a_wildcard_address_is_reached_through_loopback() {
        let p = place(&[Endpoint::Tcp("[::]:7000".parse().unwrap())], &exports(&["only"]), None).unwrap();
        assert_eq!(p.uri, "nbd://[::1]:7000/only");
        assert_eq!((p.port.as_str(), p.exportname.as_str()), ("7000", "only"));
    }

    #[test]
    fn tls_gives_an_nbds_uri_with_the_servers_certificates() {
        let tls = TlsSettings { certificates: Some("/etc/pki".into()), ..TlsSettings::default() };
        let p = place(&[Endpoint::Tcp("127.0.0.1:1".parse().unwrap())], &exports(&[""]), Some(&tls)).unwrap();
        assert_eq!(p.uri, "nbds://127.0.0.1:1/?tls-certificates=/etc/pki");
    }

    #[test]
    fn nothing_to_point_at_is_none() {
        assert_eq!(place(&[], &exports(&[""]), None), None);
        assert_eq!(place(&[Endpoint::Unix("/s".into())], &exports(&[]), None), None);
    }

    #[test]
    fn signals_map_to_128_plus_their_number() {
        assert_eq!(exit_code(&Ok(ExitStatus::from_raw(3 << 8))), 3);
        assert_eq!(exit_code(&Ok(ExitStatus::from_raw(15))), 143);
    }
}
