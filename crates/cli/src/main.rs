//! The `sluice` command. Subcommands are thin: they parse, then call the library crates.
#![forbid(unsafe_code)]

mod attach;
mod bench;
mod bench_plot;
mod bench_point;
mod bench_result;
mod client_cli;
mod config;
mod copy;
mod exit;
mod info;
mod info_cache;
mod logger;
mod manual;
mod mount;
mod mount_fs;
mod pid_file;
mod pool;
mod pool_scrub;
mod pool_grow;
mod pool_status;
mod serve;
mod serve_access;
mod serve_catalog;
mod serve_export;
mod serve_qos;
mod serve_run;
mod serve_settings;
mod serve_systemd;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

#[derive(Parser)]
#[command(name = "sluice", version, about = "Network block devices over NBD, on the shortest data path Linux allows")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve files, block devices, RAM or a null device over NBD.
    Serve(Box<serve::ServeArgs>),
    /// Show an export's size, flags and block sizes, list exports, or map its allocation.
    Info(info::InfoArgs),
    /// Copy between NBD exports, files and stdin/stdout, in parallel, keeping holes.
    Copy(copy::CopyArgs),
    /// Measure an export: bandwidth and latency over request size and queue depth.
    Bench(bench::BenchArgs),
    /// Expose an export as a single file through FUSE (for losetup, mkfs, mount).
    Mount(mount::MountArgs),
    /// Create a pool (one volume striped and mirrored over several NBD servers), show its
    /// state, replace a member, add a spare, check or repair its copies, or grow it.
    Pool(pool::PoolArgs),
    /// Attach an export as a kernel block device (/dev/nbdN) that rides through server
    /// restarts, or list the attached devices.
    Attach(attach::AttachArgs),
    /// Disconnect a device attached with `sluice attach`.
    Detach(attach::DetachArgs),
    /// Write the man pages and shell completions (scripts/package calls it).
    #[command(hide = true)]
    GenerateManual(manual::ManualArgs),
}

/// A reader that stops reading our output early is not an error. The print macros panic
/// on EPIPE (Rust ignores SIGPIPE, so that sockets report a vanished peer as an error the
/// client can handle, and they still do); this ends the command quietly instead, as a
/// SIGPIPE would, with any other panic reported as before.
fn quiet_when_stdout_closes() {
    let report = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let message = info.payload().downcast_ref::<String>().map(String::as_str).unwrap_or_default();
        let epipe = std::io::Error::from_raw_os_error(libc::EPIPE).to_string();
        if message.starts_with("failed printing to stdout") && message.ends_with(&epipe) {
            std::process::exit(exit::EXIT_STDOUT_CLOSED);
        }
        report(info)
    }));
}

fn main() -> ExitCode {
    quiet_when_stdout_closes();
    let cli = Cli::parse();
    match cli.command {
        Command::Serve(args) => serve::run(*args),
        Command::Info(args) => info::run(args),
        Command::Copy(args) => copy::run(args),
        Command::Bench(args) => bench::run(args),
        Command::Mount(args) => mount::run(args),
        Command::Pool(args) => pool::run(args),
        Command::Attach(args) => attach::run(args),
        Command::Detach(args) => attach::detach(args),
        Command::GenerateManual(args) => manual::run(args, <Cli as clap::CommandFactory>::command()),
    }
}
