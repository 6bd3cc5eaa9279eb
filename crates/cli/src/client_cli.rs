//! What the client subcommands (info, copy, bench, mount) share: the runtime, connecting by
//! URI with errors a user can act on, and the exit codes.

use crate::exit::{EXIT_FAILURE, EXIT_USAGE};
use sluice_client::{Client, Error, Options, Uri};
use std::process::ExitCode;

/// A multi-threaded runtime with one worker per core (at most 4): the client's work is
/// I/O submission and reply parsing, which a few threads keep ahead of the network.
pub fn runtime() -> tokio::runtime::Runtime {
    let threads = std::thread::available_parallelism().map_or(2, |n| n.get()).min(4);
    tokio::runtime::Builder::new_multi_thread().worker_threads(threads).enable_all().build().expect("tokio runtime")
}

/// The exit status for a client error: 2 for a URI the user mistyped or a pool that cannot
/// be opened (a bad pool file, a member that cannot be reached), 1 for the rest.
pub fn exit_code(e: &Error) -> u8 {
    match e {
        Error::Uri(_) | Error::Pool(_) => EXIT_USAGE,
        _ => EXIT_FAILURE,
    }
}

/// Prints `sluice CMD: error` and returns the matching exit status.
pub fn fail(cmd: &str, e: &Error) -> ExitCode {
    eprintln!("sluice {cmd}: {e}");
    ExitCode::from(exit_code(e))
}

/// Parses and connects, naming the URI in any error.
pub async fn connect(uri: &str, options: &Options) -> Result<Client, Error> {
    let parsed = Uri::parse(uri)?;
    Client::connect_with(&parsed, options).await.map_err(|e| match e {
        Error::Io(io) => Error::Io(std::sync::Arc::new(std::io::Error::new(io.kind(), format!("{uri}: {io}")))),
        other => other,
    })
}
