//! `sluice pool`: write a new pool's metadata to its members (`init`), and show the pool's
//! state as its members record it (`status`). Using the pool is not here: every client
//! subcommand takes `pool:PATH` where it takes a URI.

use crate::client_cli::{self, fail};
use crate::pool_status;
use sluice_client::pool::{self, PoolSpec};
use sluice_client::{Address, Error, Uri};
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(
    after_help = "A pool file describes one volume over several NBD servers:

  layout = \"raid10\"          # stripe | mirror | raid10
  stripe-unit = \"512K\"       # stripe and raid10: a power of two from 4K to 64M
  copies = 2                 # mirror and raid10 (default 2)
  members = [\"nbd://10.0.0.1/disk\", \"nbd://10.0.0.2/disk\",
             \"nbd://10.0.0.3/disk\", \"nbd://10.0.0.4/disk\"]

Then `sluice pool init pool:FILE` once, and pool:FILE wherever sluice takes a URI:
`sluice copy disk.img pool:FILE`, `sluice serve --export vol=pool:FILE`.

Exit status: 0 on success; 1 when a member refuses (it carries another pool's metadata,
it is read-only) or an I/O error occurs; 2 for a bad command line, a bad pool file, or a
member that cannot be reached."
)]
pub struct PoolArgs {
    #[command(subcommand)]
    command: PoolCommand,
}

#[derive(clap::Subcommand)]
enum PoolCommand {
    /// Write a new pool's metadata (superblock and write-intent bitmap) to every member.
    #[command(after_help = "EXAMPLES:
  sluice pool init pool:/etc/sluice/vol.toml
  sluice pool init --force pool:vol.toml    # members that carried another pool's data")]
    Init(InitArgs),
    /// Show the pool's state as its members record it: layout, size, events, dirty
    /// regions, each member's state, and whether a start could assemble it now.
    #[command(after_help = "EXAMPLES:
  sluice pool status pool:/etc/sluice/vol.toml
  sluice pool status --json pool:vol.toml | jq '.members[].state'
  sluice pool status --degraded pool:vol.toml   # could it start without a dead member?")]
    Status(StatusArgs),
}

#[derive(clap::Args)]
struct InitArgs {
    /// The pool: pool:PATH, PATH being its pool file.
    #[arg(value_name = "pool:PATH")]
    pool: String,

    /// Overwrite members that already carry pool metadata (their pool is lost).
    #[arg(long)]
    force: bool,
}

#[derive(clap::Args)]
struct StatusArgs {
    /// The pool: pool:PATH, PATH being its pool file.
    #[arg(value_name = "pool:PATH")]
    pool: String,

    /// Print JSON instead of text (the schema is in docs/pool.md).
    #[arg(long)]
    json: bool,

    /// Say whether a degraded start (serve, copy or info with --degraded) could assemble
    /// the pool from the members that answer now, instead of a start with every member.
    #[arg(long)]
    degraded: bool,
}

pub fn run(args: PoolArgs) -> ExitCode {
    let (arg, cmd) = match &args.command {
        PoolCommand::Init(a) => (&a.pool, "pool init"),
        PoolCommand::Status(a) => (&a.pool, "pool status"),
    };
    let spec = match load(arg) {
        Ok(spec) => spec,
        Err(e) => return fail(cmd, &e),
    };
    let rt = client_cli::runtime();
    let result = rt.block_on(async {
        match &args.command {
            PoolCommand::Init(a) => pool::init(&spec, a.force)
                .await
                .map(|s| pool_status::initialized(&s)),
            PoolCommand::Status(a) => pool::status_and_assembly(&spec, a.degraded)
                .await
                .map(|(s, assembly)| pool_status::print(&s, &assembly, a.json)),
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(cmd, &e),
    }
}

/// The pool file `pool:PATH` names, read and checked.
fn load(arg: &str) -> Result<PoolSpec, Error> {
    match Uri::parse(arg) {
        Ok(Uri {
            address: Address::Pool(path),
            ..
        }) => pool::load(&path),
        _ => Err(Error::Pool(format!(
            "{arg:?} is not pool:PATH (pool: and the path of a pool file)"
        ))),
    }
}
