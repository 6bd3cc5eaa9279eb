//! `sluice info`: placeholder until it is written.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct InfoArgs {}

pub fn run(_args: InfoArgs) -> ExitCode {
    eprintln!("sluice info: not implemented yet");
    ExitCode::from(crate::EXIT_FAILURE)
}
