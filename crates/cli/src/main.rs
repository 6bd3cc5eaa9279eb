//! The `sluice` command. Subcommands are thin: they parse, then call the library crates.

mod config;
mod logger;
mod serve;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// Exit status when the server could not start or failed while running.
pub const EXIT_FAILURE: u8 = 1;
/// Exit status for a bad command line or configuration (clap also uses 2).
pub const EXIT_USAGE: u8 = 2;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Network block devices over NBD, on the shortest data path Linux allows")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve files, block devices, RAM or a null device over NBD.
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(args),
    }
}
