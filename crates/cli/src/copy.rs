//! `sluice copy`: placeholder until it is written.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct CopyArgs {}

pub fn run(_args: CopyArgs) -> ExitCode {
    eprintln!("sluice copy: not implemented yet");
    ExitCode::from(crate::EXIT_FAILURE)
}
