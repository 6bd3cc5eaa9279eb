//! What the client subcommands (info, copy, bench, mount) share: the runtime, the TLS
//! options, connecting by URI with errors a user can act on, and the exit codes.

use crate::exit::{EXIT_FAILURE, EXIT_USAGE};
use sluice_client::{Client, Error, Options, Uri};
use std::path::PathBuf;
use std::process::ExitCode;

/// The TLS options of every client subcommand. They set up `nbds://` and `nbds+unix://`
/// URIs, over what the URI's `tls-*` keys and user say; with only plain URIs they are a
/// mistake, refused.
#[derive(clap::Args, Clone, Debug, Default)]
#[command(next_help_heading = "TLS options (for nbds:// and nbds+unix:// URIs)")]
pub struct TlsArgs {
    /// X.509: a directory with ca-cert.pem (the CA that signed the server's certificate),
    /// and optionally client-cert.pem with client-key.pem (shown to servers that check
    /// clients) and ca-crl.pem. Without it (and without --tls-psk-file), the system's CA
    /// certificates. URI key: tls-certificates.
    #[arg(long, value_name = "DIR")]
    tls_certificates: Option<PathBuf>,

    /// Pre-shared keys instead of certificates: a file of USERNAME:HEXKEY lines, as
    /// psktool writes it. URI key: tls-psk-file.
    #[arg(long, value_name = "FILE")]
    tls_psk_file: Option<PathBuf>,

    /// The PSK identity, looked up in --tls-psk-file. Default: the URI's user
    /// (nbds://NAME@host/), else the login name.
    #[arg(long, value_name = "NAME")]
    tls_username: Option<String>,

    /// Whether to check the server's certificate: signed by a trusted CA and made out to
    /// the host name. true (the default) or false; false accepts any server, which only
    /// encryption then protects. URI key: tls-verify-peer.
    #[arg(long, value_name = "BOOL", value_parser = parse_bool)]
    tls_verify_peer: Option<bool>,

    /// The host name the server's certificate must carry, instead of the URI's host (for
    /// nbds+unix://, which has none, the name is checked only when given). URI key:
    /// tls-hostname.
    #[arg(long, value_name = "NAME")]
    tls_hostname: Option<String>,
}

/// What the client subcommands take for `pool:` URIs.
#[derive(clap::Args, Clone, Debug, Default)]
pub struct PoolArgs {
    /// For a pool: URI of a mirror or raid10 pool: assemble it even when members cannot be
    /// reached, as long as every set keeps an in-sync copy. The missing members are tried
    /// again in the background and rebuilt when they answer. Only for members known to
    /// hold nothing newer than the others (mdadm's --run).
    #[arg(long)]
    pub degraded: bool,
}

fn parse_bool(s: &str) -> Result<bool, String> {
    sluice_client::parse_bool(s).ok_or_else(|| format!("{s:?} is not true or false"))
}

impl TlsArgs {
    fn given(&self) -> bool {
        let t = self;
        t.tls_certificates.is_some() || t.tls_psk_file.is_some() || t.tls_username.is_some() || t.tls_verify_peer.is_some() || t.tls_hostname.is_some()
    }

    /// Sets up the TLS URIs among `uris` with the options. Options with no TLS URI to
    /// apply to are refused.
    pub fn apply(&self, uris: &mut [&mut Uri]) -> Result<(), Error> {
        if self.given() && !uris.iter().any(|u| u.tls.is_some()) {
            return Err(Error::TlsConfig("the --tls-* options apply to nbds:// and nbds+unix:// URIs only: use nbds:// for TLS".into()));
        }
        for t in uris.iter_mut().filter_map(|u| u.tls.as_mut()) {
            if let Some(d) = &self.tls_certificates {
                t.certificates = Some(d.clone());
            }
            if let Some(f) = &self.tls_psk_file {
                t.psk_file = Some(f.clone());
            }
            if let Some(u) = &self.tls_username {
                t.username = Some(u.clone());
            }
            if let Some(v) = self.tls_verify_peer {
                t.verify_peer = v;
            }
            if let Some(h) = &self.tls_hostname {
                t.hostname = Some(h.clone());
            }
        }
        Ok(())
    }

    /// Parses the one URI of a command line and sets it up.
    pub fn uri(&self, arg: &str) -> Result<Uri, Error> {
        let mut uri = Uri::parse(arg)?;
        self.apply(&mut [&mut uri])?;
        Ok(uri)
    }
}

/// A multi-threaded runtime with one worker per core (at most 4): the client's work is
/// I/O submission and reply parsing, which a few threads keep ahead of the network.
pub fn runtime() -> tokio::runtime::Runtime {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4);
    tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build().expect("tokio runtime")
}

/// The exit status for a client error: 2 for a URI the user mistyped, TLS files or options
/// that cannot be used, or a pool or cached volume that cannot be opened (a bad pool or
/// cache file, a member that cannot be reached), 1 for the rest (TLS the server refused or
/// failed included).
pub fn exit_code(e: &Error) -> u8 {
    match e {
        Error::Uri(_) | Error::TlsConfig(_) | Error::Pool(_) | Error::Cache(_) => EXIT_USAGE,
        _ => EXIT_FAILURE,
    }
}

/// Prints `sluice CMD: error` and returns the matching exit status.
pub fn fail(cmd: &str, e: &Error) -> ExitCode {
    eprintln!("sluice {cmd}: {e}");
    ExitCode::from(exit_code(e))
}

/// Connects, naming the URI in any error.
pub async fn connect(uri: &Uri, options: &Options) -> Result<Client, Error> {
    Client::connect_with(uri, options).await.map_err(|e| match e {
        Error::Io(io) => Error::Io(std::sync::Arc::new(std::io::Error::new(io.kind(), format!("{uri}: {io}")))),
        other => other,
    })
}
