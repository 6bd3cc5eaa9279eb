//! `sluice bench`: placeholder until it is written.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct BenchArgs {}

pub fn run(_args: BenchArgs) -> ExitCode {
    eprintln!("sluice bench: not implemented yet");
    ExitCode::from(crate::EXIT_FAILURE)
}
