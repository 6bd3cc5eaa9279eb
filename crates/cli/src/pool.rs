//! `sluice pool`: write a new pool's metadata to its members (`init`), show the pool's
//! state as its members record it (`status`), put a server in a member's place
//! (`replace`), and add members (`grow`, in pool_grow.rs). Using the pool is not here:
//! every client subcommand takes `pool:PATH` where it takes a URI.

use crate::client_cli::{self, fail};
use crate::{pool_scrub, pool_status};
use sluice_client::pool::{self, PoolSpec};
use sluice_client::{Address, Error, Uri};
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(
    after_help = "A pool file describes one volume over several NBD servers:

  layout = \"raid10\"          # stripe | mirror | raid10
  stripe-unit = \"512K\"       # stripe and raid10: a power of two from 4K to 64M
  copies = 2                 # mirror and raid10 (default 2)
  placement = \"offset\"       # raid10: near (default) | offset: a lost member's
                             # reads spread over all the others (docs/pool.md)
  members = [\"nbd://10.0.0.1/disk\", \"nbd://10.0.0.2/disk\",
             \"nbd://10.0.0.3/disk\", \"nbd://10.0.0.4/disk\"]
  scrub-interval = \"7d\"      # optional: the serving coordinator checks the copies

Then `sluice pool init pool:FILE` once, and pool:FILE wherever sluice takes a URI:
`sluice copy disk.img pool:FILE`, `sluice serve --export vol=pool:FILE`.

Exit status: 0 on success (check: the copies agree); 1 when check finds copies that
differ, when a member refuses (it carries another pool's metadata,
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
    /// Put another server in a member's place: NEW is checked and its metadata area
    /// blanked, the pool file's members entry is rewritten (comments and layout kept), and
    /// NEW gets the data: here, when no coordinator serves the pool, else in the serving
    /// one once it is reloaded (SIGHUP). An OLD in sync goes on serving while everything
    /// is copied to NEW (and writes reach both), then NEW takes its place; a dead OLD's
    /// NEW is rebuilt from the other copies of its set. Refused for a stripe, for the last
    /// in-sync copy of a set, and for a live OLD while the pool is reshaped.
    #[command(after_help = "EXAMPLES:
  sluice pool replace pool:/etc/sluice/vol.toml nbd://10.0.0.2/disk nbd://10.0.0.9/disk
  systemctl reload sluice     # when a server serves the pool: it rebuilds the new member")]
    Replace(ReplaceArgs),
    /// Add a spare: URI is checked (large enough, writable) and its metadata area blanked,
    /// and it is added to the pool file's `spares`. A coordinator puts the first spare in
    /// the place of a member missing for `spare-after` (default 60s) and rebuilds it. A
    /// server that serves the pool uses it once reloaded (SIGHUP).
    #[command(name = "add-spare", after_help = "EXAMPLES:
  sluice pool add-spare pool:/etc/sluice/vol.toml nbd://10.0.0.9/disk
  systemctl reload sluice     # when a server serves the pool: it takes the spare into account")]
    AddSpare(AddSpareArgs),
    /// Compare every mirror set's in-sync copies, chunk by chunk at resync-rate with
    /// writes to the chunk held back, and report the regions and byte ranges (of each set's
    /// member data) where they differ. Exit status 1 when they differ, 2 for a stripe
    /// (nothing to compare).
    #[command(after_help = "EXAMPLES:
  sluice pool check pool:/etc/sluice/vol.toml
  sluice pool check --json pool:vol.toml | jq '.mismatched_regions'")]
    Check(pool_scrub::CheckArgs),
    /// Like check, and rewrite the copies that differ from the source: --from's member,
    /// or each set's first in-sync copy.
    #[command(after_help = "EXAMPLES:
  sluice pool repair pool:/etc/sluice/vol.toml
  sluice pool repair --from nbd://10.0.0.1/disk pool:vol.toml")]
    Repair(pool_scrub::RepairArgs),
    /// Add servers at the end of the member list and spread the volume over them while it
    /// is served: a stripe or a near raid10 (whole mirror sets) reshapes unit by unit with its
    /// position checkpointed in the superblocks (a crash resumes), and the volume grows when
    /// that is done (clients see the new size when they connect again); a mirror gets a
    /// copy more, synced in full. The new members are checked and blanked and the pool file
    /// edited (comments kept); the work runs here when no one serves the pool, else in the
    /// serving coordinator once it is reloaded (SIGHUP). Progress: `sluice pool status`.
    #[command(after_help = "EXAMPLES:
  sluice pool grow pool:/etc/sluice/vol.toml --add nbd://10.0.0.5/disk nbd://10.0.0.6/disk
  systemctl reload sluice     # when a server serves the pool: it reshapes onto them
  sluice pool grow pool:stripe.toml --add nbd://n3/disk --offline   # a stripe no one serves
  sluice pool grow pool:mirror.toml --add nbd://n3/disk             # a third copy")]
    Grow(crate::pool_grow::GrowArgs),
}

#[derive(clap::Args)]
struct AddSpareArgs {
    /// The pool: pool:PATH, PATH being its pool file.
    #[arg(value_name = "pool:PATH")]
    pool: String,

    /// The NBD URI of the spare.
    #[arg(value_name = "URI")]
    uri: String,

    /// Blank URI's metadata even when it carries pool metadata (its pool loses that member).
    #[arg(long)]
    force: bool,
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

#[derive(clap::Args)]
struct ReplaceArgs {
    /// The pool: pool:PATH, PATH being its pool file.
    #[arg(value_name = "pool:PATH")]
    pool: String,

    /// The member to replace, as the pool file names it.
    #[arg(value_name = "OLD")]
    old: String,

    /// The NBD URI of the server that takes its place.
    #[arg(value_name = "NEW")]
    new: String,

    /// Overwrite NEW even when it carries pool metadata (its pool loses that member).
    #[arg(long)]
    force: bool,
}

pub fn run(args: PoolArgs) -> ExitCode {
    let (arg, cmd) = match &args.command {
        PoolCommand::Init(a) => (&a.pool, "pool init"),
        PoolCommand::Status(a) => (&a.pool, "pool status"),
        PoolCommand::Replace(a) => (&a.pool, "pool replace"),
        PoolCommand::AddSpare(a) => (&a.pool, "pool add-spare"),
        PoolCommand::Check(a) => (&a.pool, "pool check"),
        PoolCommand::Repair(a) => (&a.pool, "pool repair"),
        PoolCommand::Grow(a) => (&a.pool, "pool grow"),
    };
    let spec = match load(arg) {
        Ok(spec) => spec,
        Err(e) => return fail(cmd, &e),
    };
    match &args.command {
        PoolCommand::Check(a) => return pool_scrub::run(cmd, &a.pool, false, None, a.json),
        PoolCommand::Repair(a) => return pool_scrub::run(cmd, &a.pool, true, a.from.as_deref(), a.json),
        _ => {}
    }
    let rt = client_cli::runtime();
    let result = rt.block_on(async {
        match &args.command {
            PoolCommand::Init(a) => pool::init(&spec, a.force)
                .await
                .map(|s| pool_status::initialized(&s)),
            PoolCommand::Status(a) => match pool::status_and_assembly(&spec, a.degraded).await {
                Ok((s, assembly)) => {
                    pool_status::print(&pool::with_live_scrub(s).await, &assembly, a.json);
                    Ok(())
                }
                Err(e) => Err(e),
            },
            PoolCommand::Replace(a) => replace(a).await,
            PoolCommand::AddSpare(a) => {
                let path = a.pool.strip_prefix("pool:").unwrap_or(&a.pool);
                let served = pool::add_spare(std::path::Path::new(path), &a.uri, a.force).await?;
                match served {
                    None => println!("added spare {} to {path}", a.uri),
                    Some(by) => println!("added spare {} to {path}; {by}: if it serves the pool, reload it (systemctl reload sluice, or SIGHUP) so that it takes the spare into account", a.uri),
                }
                Ok(())
            }
            PoolCommand::Check(_) | PoolCommand::Repair(_) => unreachable!("run above"),
            PoolCommand::Grow(a) => crate::pool_grow::grow(a).await,
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(cmd, &e),
    }
}

async fn replace(a: &ReplaceArgs) -> Result<(), Error> {
    let path = a.pool.strip_prefix("pool:").unwrap_or(&a.pool);
    let shown = std::cell::Cell::new((pool::Copying::Rebuild, u64::MAX));
    let progress = |what: pool::Copying, done: u64, total: u64| {
        let percent = (done * 100).checked_div(total).unwrap_or(0);
        if shown.replace((what, percent)) != (what, percent) {
            match what {
                pool::Copying::WhileOldServes => eprintln!("copying to {} while {} serves: {percent}%", a.new, a.old),
                pool::Copying::Rebuild => eprintln!("rebuilding {}: {percent}%", a.new),
            }
        }
    };
    match pool::replace(std::path::Path::new(path), &a.old, &a.new, a.force, progress).await? {
        pool::Replaced::Rebuilt => println!("replaced {} by {} in {path}; {} is in sync", a.old, a.new, a.new),
        pool::Replaced::Served(by) => println!(
            "replaced {} by {} in {path}; {by}: reload that server (systemctl reload sluice, or SIGHUP) and it rebuilds {}",
            a.old, a.new, a.new
        ),
    }
    Ok(())
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
