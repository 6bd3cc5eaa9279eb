//! `sluice mount`: placeholder until it is written.

use std::process::ExitCode;

#[derive(clap::Args)]
pub struct MountArgs {}

pub fn run(_args: MountArgs) -> ExitCode {
    eprintln!("sluice mount: not implemented yet");
    ExitCode::from(crate::EXIT_FAILURE)
}
