//! `sluice info`: what a server says about an export (size, flags, block sizes, what was
//! negotiated), the list of its exports, or an export's allocation map from base:allocation.

use crate::client_cli::{self, fail, PoolArgs, TlsArgs};
use indicatif::HumanBytes;
use serde_json::{json, Value};
use sluice_client::{Client, Error, Export, Options, Uri};
use std::process::ExitCode;

#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  sluice info nbd://localhost/disk
  sluice info --list nbd://localhost
  sluice info --map 'nbd+unix:///disk?socket=/run/sluice.sock'
  sluice info --json nbd://localhost/disk | jq .size
  sluice info --tls-certificates /etc/pki/sluice nbds://server/disk
  sluice info 'nbds://alice@server/disk?tls-psk-file=/etc/sluice/keys.psk'

Exit status: 0 on success; 1 when the server cannot be reached, has no such export, fails a
request or TLS fails; 2 for a bad command line or URI, or TLS options or files that cannot
be used.")]
pub struct InfoArgs {
    /// NBD URI of the export: nbd://HOST[:PORT]/[EXPORT] or nbd+unix:///[EXPORT]?socket=PATH,
    /// nbds:// or nbds+unix:// for TLS, pool:PATH for a pool (see sluice pool), or
    /// cache:PATH for a cached volume (its counters and members are shown too).
    #[arg(value_name = "URI")]
    uri: String,

    /// List the server's exports, with each one's size, flags and description. The export
    /// name in URI is ignored.
    #[arg(long, conflicts_with = "map")]
    list: bool,

    /// Print the allocation map of the whole export, one line per run of equal state:
    /// offset, length, type (0 data, 1 hole, 2 zero, 3 hole,zero) and its name, as
    /// `nbdinfo --map` prints it. Adjacent runs of the same type are merged.
    #[arg(long)]
    map: bool,

    /// Print JSON instead of text (the schema is in docs/info.md).
    #[arg(long)]
    json: bool,

    #[command(flatten)]
    pool: PoolArgs,

    #[command(flatten)]
    tls: TlsArgs,
}

pub fn run(args: InfoArgs) -> ExitCode {
    // What the library warns of (a pool assembled degraded, a URI key it ignores) is shown.
    crate::logger::init(log::LevelFilter::Warn);
    let uri = match args.tls.uri(&args.uri) {
        Ok(u) => u,
        Err(e) => return fail("info", &e),
    };
    let rt = client_cli::runtime();
    let options = Options { degraded: args.pool.degraded, ..Options::default() };
    let result = rt.block_on(async {
        if args.list {
            list(&uri, args.json).await
        } else if args.map {
            map(&uri, &options, args.json).await
        } else {
            show(&uri, &options, args.json).await
        }
    });
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail("info", &e),
    }
}

/// Transmission flags by the names sluice uses everywhere, in the order the spec numbers
/// them; HAS_FLAGS is left out, it says nothing about the export.
fn flag_names(e: &Export) -> [(&'static str, bool); 10] {
    [
        ("read-only", e.read_only()),
        ("flush", e.can_flush()),
        ("fua", e.can_fua()),
        ("rotational", e.rotational()),
        ("trim", e.can_trim()),
        ("write-zeroes", e.can_zero()),
        ("df", e.can_df()),
        ("multi-conn", e.can_multi_conn()),
        ("cache", e.can_cache()),
        ("fast-zero", e.can_fast_zero()),
    ]
}

fn flags_text(e: &Export) -> String {
    let set: Vec<&str> = flag_names(e)
        .iter()
        .filter(|(_, on)| *on)
        .map(|(n, _)| *n)
        .collect();
    if set.is_empty() {
        "(none)".to_string()
    } else {
        set.join(" ")
    }
}

fn yes_no(b: bool) -> &'static str {
    if b {
        "yes"
    } else {
        "no"
    }
}

/// The facts about an export that NBD_OPT_INFO and NBD_OPT_GO both give.
fn export_json(e: &Export) -> serde_json::Map<String, Value> {
    let flags: serde_json::Map<String, Value> = flag_names(e)
        .iter()
        .map(|(n, on)| (n.to_string(), Value::Bool(*on)))
        .collect();
    let mut m = serde_json::Map::new();
    m.insert("name".into(), json!(e.name));
    m.insert("description".into(), json!(e.description));
    m.insert("size".into(), json!(e.size));
    m.insert("size_human".into(), json!(HumanBytes(e.size).to_string()));
    m.insert("transmission_flags".into(), json!(e.flags));
    m.insert("flags".into(), Value::Object(flags));
    m.insert(
        "block_size".into(),
        json!({"minimum": e.block_min, "preferred": e.block_preferred, "maximum": e.block_max}),
    );
    m
}

fn print_json(v: &Value) {
    println!(
        "{}",
        serde_json::to_string_pretty(v).expect("JSON from plain values")
    );
}

async fn show(uri: &Uri, options: &Options, as_json: bool) -> Result<(), Error> {
    let client = client_cli::connect(uri, options).await?;
    let e = client.export().clone();
    let cache = cache_status(&client).await;
    client.disconnect().await;
    if as_json {
        let mut m = export_json(&e);
        m.insert("structured_replies".into(), json!(e.structured));
        m.insert("extended_headers".into(), json!(e.extended));
        m.insert("base_allocation".into(), json!(e.base_allocation));
        m.insert("tls".into(), json!(e.tls));
        if let Some(c) = &cache {
            m.insert("cache".into(), crate::info_cache::json(c));
        }
        print_json(&Value::Object(m));
        return Ok(());
    }
    println!("export:             {:?}", e.name);
    if let Some(d) = &e.description {
        println!("description:        {d}");
    }
    println!("size:               {} ({})", e.size, HumanBytes(e.size));
    println!("flags:              {:#06x} {}", e.flags, flags_text(&e));
    println!(
        "block sizes:        minimum {}, preferred {}, maximum {}",
        e.block_min, e.block_preferred, e.block_max
    );
    println!("structured replies: {}", yes_no(e.structured));
    println!("extended headers:   {}", yes_no(e.extended));
    println!("base:allocation:    {}", yes_no(e.base_allocation));
    println!("TLS:                {}", e.tls.as_deref().unwrap_or("no"));
    if let Some(c) = &cache {
        crate::info_cache::print(c);
    }
    Ok(())
}

/// A cached volume's state once its members had their chance to connect (they connect in
/// the background as it opens); None for anything else.
async fn cache_status(client: &Client) -> Option<sluice_client::cache::Status> {
    let first = client.cache_status().await?;
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_millis(crate::info_cache::MEMBERS_WAIT_MS);
    let mut status = first;
    while status.members.iter().any(|m| !m.up && m.failures == 0) && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        status = client.cache_status().await?;
    }
    Some(status)
}

async fn list(uri: &Uri, as_json: bool) -> Result<(), Error> {
    let entries = sluice_client::list_exports(uri, true).await?;
    if as_json {
        let exports: Vec<Value> = entries
            .iter()
            .map(|entry| {
                let mut m = match &entry.details {
                    Some(d) => export_json(d),
                    None => serde_json::Map::new(),
                };
                m.insert("name".into(), json!(entry.name));
                m.insert("description".into(), json!(entry.description));
                Value::Object(m)
            })
            .collect();
        print_json(&json!({ "exports": exports }));
        return Ok(());
    }
    let rows: Vec<[String; 4]> = entries
        .iter()
        .map(|entry| {
            let (size, flags) = match &entry.details {
                Some(d) => (
                    format!("{} ({})", d.size, HumanBytes(d.size)),
                    flags_text(d),
                ),
                None => ("?".to_string(), "?".to_string()),
            };
            [
                format!("{:?}", entry.name),
                size,
                flags,
                entry.description.clone().unwrap_or_default(),
            ]
        })
        .collect();
    let header = ["NAME", "SIZE", "FLAGS", "DESCRIPTION"].map(String::from);
    let mut widths = [0usize; 3];
    for row in std::iter::once(&header).chain(&rows) {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.chars().count());
        }
    }
    for row in std::iter::once(&header).chain(&rows) {
        let line = format!(
            "{:w0$}  {:w1$}  {:w2$}  {}",
            row[0],
            row[1],
            row[2],
            row[3],
            w0 = widths[0],
            w1 = widths[1],
            w2 = widths[2]
        );
        println!("{}", line.trim_end());
    }
    Ok(())
}

/// One merged run of the allocation map.
struct Run {
    offset: u64,
    length: u64,
    /// base:allocation's state bits: 1 hole, 2 zero.
    kind: u32,
}

fn kind_name(kind: u32) -> &'static str {
    match kind {
        0 => "data",
        1 => "hole",
        2 => "zero",
        _ => "hole,zero",
    }
}

/// Walks the whole export with BLOCK_STATUS, merging neighbours of the same state.
async fn allocation_map(client: &Client) -> Result<Vec<Run>, Error> {
    let size = client.size();
    let mut runs: Vec<Run> = Vec::new();
    let mut at = 0u64;
    while at < size {
        let extents = client.block_status(at, size - at).await?;
        if extents.is_empty() {
            return Err(Error::Protocol(format!(
                "block status at offset {at} described nothing"
            )));
        }
        for x in extents {
            debug_assert_eq!(x.offset, at);
            let kind = u32::from(x.hole) | (u32::from(x.zero) << 1);
            match runs.last_mut() {
                Some(r) if r.kind == kind && r.offset + r.length == x.offset => {
                    r.length += x.length
                }
                _ => runs.push(Run {
                    offset: x.offset,
                    length: x.length,
                    kind,
                }),
            }
            at = x.offset + x.length;
        }
    }
    Ok(runs)
}

async fn map(uri: &Uri, options: &Options, as_json: bool) -> Result<(), Error> {
    let client = client_cli::connect(uri, options).await?;
    let runs = allocation_map(&client).await?;
    client.disconnect().await;
    if as_json {
        // One extent a line, as nbdinfo prints it: maps can be long.
        let lines: Vec<String> = runs
            .iter()
            .map(|r| json!({"offset": r.offset, "length": r.length, "type": r.kind, "description": kind_name(r.kind)}).to_string())
            .collect();
        if lines.is_empty() {
            println!("[]");
        } else {
            println!("[\n{}\n]", lines.join(",\n"));
        }
        return Ok(());
    }
    for r in &runs {
        println!(
            "{:10}  {:10}  {:3}  {}",
            r.offset,
            r.length,
            r.kind,
            kind_name(r.kind)
        );
    }
    Ok(())
}
