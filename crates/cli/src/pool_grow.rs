//! `sluice pool grow`: more servers join a pool (see sluice_client::pool::grow).

use sluice_client::pool::{self, GrowWhere, Status};
use sluice_client::Error;

#[derive(clap::Args)]
pub struct GrowArgs {
    /// The pool: pool:PATH, PATH being its pool file.
    #[arg(value_name = "pool:PATH")]
    pub pool: String,

    /// NBD URIs of the servers to add at the end of the member list: for raid10 a
    /// multiple of `copies` (whole mirror sets), for a mirror each is a copy more.
    #[arg(long, value_name = "URI", num_args = 1.., required = true)]
    add: Vec<String>,

    /// Overwrite new members even when they carry pool metadata (their pool loses them).
    #[arg(long)]
    force: bool,

    /// No one serves the pool: assemble it here and run the reshape to its end (needed
    /// for a stripe, which names no owner while served, unless --served).
    #[arg(long, conflicts_with = "served")]
    offline: bool,

    /// A server serves the pool: only edit the pool file; the server reshapes once it is
    /// reloaded (SIGHUP).
    #[arg(long)]
    served: bool,
}

pub async fn grow(a: &GrowArgs) -> Result<(), Error> {
    let path = a.pool.strip_prefix("pool:").unwrap_or(&a.pool);
    let place = match (a.offline, a.served) {
        (true, _) => GrowWhere::Here,
        (_, true) => GrowWhere::Served,
        _ => GrowWhere::Auto,
    };
    let shown = std::cell::Cell::new(String::new());
    let progress = |s: &Status| {
        let line = progress_line(s);
        if shown.replace(line.clone()) != line {
            eprintln!("{line}");
        }
    };
    let added = a.add.join(", ");
    match pool::grow(std::path::Path::new(path), &a.add, a.force, place, progress).await? {
        pool::Grown::Done => println!("added {added} to {path}; the volume is {} bytes, every member in sync", size_after(path).await?),
        pool::Grown::Served(by) => println!(
            "added {added} to {path}; {by}: reload that server (systemctl reload sluice, or SIGHUP) and it takes them (clients see a grown volume when they connect again)"
        ),
    }
    Ok(())
}

/// What is happening, in whole percent, so that a line is printed only when it moves.
fn progress_line(s: &Status) -> String {
    if let Some(r) = s.reshape {
        let percent = (r.done_bytes * 100).checked_div(r.total_bytes).unwrap_or(0);
        let rate = r.rate_bytes_per_s.map_or(String::new(), |b| format!(", {} MiB/s", b >> 20));
        return format!("reshaping {} -> {} members: {percent}%{rate}", r.from_members, r.to_members);
    }
    let copying: Vec<String> = s
        .members
        .iter()
        .filter_map(|m| match m.state {
            pool::MemberState::Resyncing { done, total } => Some(format!("{}: {}%", m.uri, (done * 100).checked_div(total).unwrap_or(0))),
            pool::MemberState::InSync => None,
            other => Some(format!("{}: {}", m.uri, other.name())),
        })
        .collect();
    format!("copying to {}", copying.join(", "))
}

async fn size_after(path: &str) -> Result<u64, Error> {
    let spec = pool::load(std::path::Path::new(path))?;
    Ok(pool::status(&spec).await?.size)
}
