//! `sluice bench`: the research's experiments from the client side. Sweeps request size x
//! queue depth for reads (and, when allowed, writes), sequential and random, over one
//! export; prints a table as it goes, writes `bench.csv` and draws the plots.
//!
//! The sweep is planned and checked in full before anything is sent, so a mistake in the
//! command line never costs a half-finished run, and writes need `--write`.

use std::fs::File;
use std::io::{BufWriter, Write as _};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use sluice_client::{Client, Options};

use crate::client_cli::{self, TlsArgs};
use crate::exit::{EXIT_FAILURE, EXIT_USAGE};

// The measuring, the drawing and the words they share live beside this file; main.rs
// calls only `bench`.
use crate::bench_point::{self, Point};
use crate::bench_plot;
use crate::bench_result::{human_size, Op, Pattern, PointResult};

/// Request sizes swept by default: 4 KiB to 4 MiB in steps of four.
const DEFAULT_SIZES: &[u64] = &[4 << 10, 16 << 10, 64 << 10, 256 << 10, 1 << 20, 4 << 20];
/// Queue depths swept by default.
const DEFAULT_DEPTHS: &[u32] = &[1, 2, 4, 8, 16, 32];
/// Measured time per point by default: long enough for a few thousand large requests on a
/// fast link, short enough that the default sweep (72 points) takes under three minutes.
const DEFAULT_RUNTIME_MS: u64 = 2000;
/// Unmeasured time at the start of each point, so the queue is full and connection
/// buffers are warm before counting starts.
const DEFAULT_WARMUP_MS: u64 = 250;

/// `--quick`: 4 sizes x 2 depths x 2 patterns = 16 points per operation, 0.5 s each, so a
/// read-only sweep takes about 8 s and one with writes about 16 s.
const QUICK_SIZES: &[u64] = &[4 << 10, 64 << 10, 1 << 20, 4 << 20];
const QUICK_DEPTHS: &[u32] = &[1, 8];
const QUICK_RUNTIME_MS: u64 = 400;
const QUICK_WARMUP_MS: u64 = 100;

/// Deepest queue accepted; far beyond what any server keeps in flight per connection.
const DEPTH_MAX: u32 = 1024;
/// Largest request size accepted.
const REQUEST_SIZE_MAX_BYTES: u64 = 1 << 30;
/// Buffer memory one point may use (request size x depth): each worker owns one buffer.
const POINT_BUFFER_MAX_BYTES: u64 = 4 << 30;
/// Longest runtime or warm-up accepted for one point.
const POINT_SECONDS_MAX: f64 = 3600.0;
/// Connections one client opens at most (the client library's own limit).
const CONNECTIONS_MAX: usize = sluice_client::limits::CONNECTIONS_MAX;

const _: () = assert!(REQUEST_SIZE_MAX_BYTES * DEPTH_MAX as u64 > POINT_BUFFER_MAX_BYTES);

#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  sluice bench nbd://server/disk                      # read sweep, 4K..4M x QD 1..32, ~3 min
  sluice bench --quick nbd://server/disk              # small sweep, under 30 s
  sluice bench --sizes 64K,1M --depths 1,16 --runtime 5 nbd://server/disk
  sluice bench --write --ops write --patterns rand nbd://server/scratch   # overwrites data!
  sluice bench --connections 4 --out results/ nbd+unix:///disk?socket=/run/sluice.sock

Results go to --out DIR (default: a new ./sluice-bench-YYYYmmdd-HHMMSS, UTC): bench.csv,
bandwidth.svg, latency.svg, latency-vs-depth.svg, and PNG copies when a system font
(DejaVu Sans or Liberation Sans) is installed.

Exit status: 0 when the sweep finished; 1 when the server cannot be reached, the export is
read-only and writes were asked for, a request fails, the results cannot be written, or
the run was interrupted, or TLS fails; 2 for a bad command line or URI, TLS options or
files that cannot be used, writes without --write, or a sweep that does not fit the
export.")]
pub struct BenchArgs {
    /// NBD URI of the export to measure: nbd://HOST[:PORT]/EXPORT or
    /// nbd+unix:///EXPORT?socket=PATH, nbds:// or nbds+unix:// for TLS, or pool:PATH for a
    /// pool.
    #[arg(value_name = "URI")]
    uri: String,

    /// Request sizes to sweep, comma-separated; K, M and G mean KiB, MiB and GiB.
    /// Default: 4K,16K,64K,256K,1M,4M (--quick: 4K,64K,1M,4M).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = parse_request_size)]
    sizes: Vec<u64>,

    /// Queue depths to sweep (requests kept in flight), comma-separated.
    /// Default: 1,2,4,8,16,32 (--quick: 1,8).
    #[arg(long, value_name = "LIST", value_delimiter = ',', value_parser = clap::value_parser!(u32).range(1..=DEPTH_MAX as i64))]
    depths: Vec<u32>,

    /// Operations to measure: read, write, or read,write. Writing needs --write.
    /// Default: read, or read,write when --write is given.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    ops: Vec<Op>,

    /// Allow writes. Writing overwrites the data in the measured region of the export with
    /// a test pattern; without this flag, sluice bench never writes.
    #[arg(long)]
    write: bool,

    /// Access patterns: seq (sequential), rand (random), or both. Default: seq,rand.
    #[arg(long, value_name = "LIST", value_delimiter = ',')]
    patterns: Vec<Pattern>,

    /// Measured time per point, in seconds (fractions and an `ms` suffix are accepted).
    /// Default: 2 (--quick: 0.4).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    runtime: Option<Duration>,

    /// Unmeasured time at the start of each point, in seconds: requests run but are not
    /// counted. Default: 0.25 (--quick: 0.1).
    #[arg(long, value_name = "SECONDS", value_parser = parse_seconds)]
    warmup: Option<Duration>,

    /// Start of the region to use, in bytes (K/M/G suffixes). Default: 0.
    #[arg(long, value_name = "OFFSET", value_parser = parse_byte_count)]
    offset: Option<u64>,

    /// Length of the region to use, in bytes (K/M/G suffixes). Default: from --offset to
    /// the end of the export.
    #[arg(long, value_name = "LENGTH", value_parser = parse_byte_count)]
    span: Option<u64>,

    /// Connections to open (multi-conn); requests go to the least busy one. More than one
    /// is used only if the server allows multi-conn.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u64).range(1..=CONNECTIONS_MAX as u64))]
    connections: u64,

    /// Directory for bench.csv and the plots; created if missing, files in it replaced.
    /// Default: a new directory ./sluice-bench-YYYYmmdd-HHMMSS (UTC time).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,

    /// Seed for the random offsets; the same seed gives the same offsets.
    #[arg(long, value_name = "N", default_value_t = 1)]
    seed: u64,

    /// A small sweep that finishes in under 30 seconds: sizes 4K,64K,1M,4M, depths 1,8,
    /// 0.4 s per point. Options given explicitly still apply.
    #[arg(long)]
    quick: bool,

    #[command(flatten)]
    tls: TlsArgs,
}

/// The sweep, resolved from the arguments; valid before anything is sent.
struct Plan {
    sizes: Vec<u64>,
    depths: Vec<u32>,
    ops: Vec<Op>,
    patterns: Vec<Pattern>,
    runtime: Duration,
    warmup: Duration,
}

impl Plan {
    fn points(&self) -> usize {
        self.ops.len() * self.patterns.len() * self.depths.len() * self.sizes.len()
    }

    fn writes(&self) -> bool {
        self.ops.contains(&Op::Write)
    }
}

pub fn run(args: BenchArgs) -> ExitCode {
    let plan = match plan(&args) {
        Ok(p) => p,
        Err(m) => return usage(&m),
    };
    client_cli::runtime().block_on(run_async(args, plan))
}

fn usage(message: &str) -> ExitCode {
    eprintln!("sluice bench: {message}");
    ExitCode::from(EXIT_USAGE)
}

fn failure(message: &str) -> ExitCode {
    eprintln!("sluice bench: {message}");
    ExitCode::from(EXIT_FAILURE)
}

fn plan(args: &BenchArgs) -> Result<Plan, String> {
    let mut ops = dedup(&args.ops);
    if ops.is_empty() {
        ops = if args.write { vec![Op::Read, Op::Write] } else { vec![Op::Read] };
    }
    if ops.contains(&Op::Write) && !args.write {
        return Err("measuring writes overwrites data on the export; add --write to allow it".into());
    }
    let mut patterns = dedup(&args.patterns);
    if patterns.is_empty() {
        patterns = vec![Pattern::Seq, Pattern::Rand];
    }
    let (sizes, depths, runtime_ms, warmup_ms) = if args.quick {
        (QUICK_SIZES, QUICK_DEPTHS, QUICK_RUNTIME_MS, QUICK_WARMUP_MS)
    } else {
        (DEFAULT_SIZES, DEFAULT_DEPTHS, DEFAULT_RUNTIME_MS, DEFAULT_WARMUP_MS)
    };
    let mut sizes = if args.sizes.is_empty() { sizes.to_vec() } else { args.sizes.clone() };
    sizes.sort_unstable();
    sizes.dedup();
    let mut depths = if args.depths.is_empty() { depths.to_vec() } else { args.depths.clone() };
    depths.sort_unstable();
    depths.dedup();
    let runtime = args.runtime.unwrap_or(Duration::from_millis(runtime_ms));
    if runtime.is_zero() {
        return Err("--runtime must be more than 0".into());
    }
    let warmup = args.warmup.unwrap_or(Duration::from_millis(warmup_ms));
    let (largest, deepest) = (sizes[sizes.len() - 1], depths[depths.len() - 1]);
    if largest * deepest as u64 > POINT_BUFFER_MAX_BYTES {
        return Err(format!(
            "request size {} at queue depth {deepest} needs {} of buffers; the limit is {}",
            human_size(largest),
            human_size(largest * deepest as u64),
            human_size(POINT_BUFFER_MAX_BYTES)
        ));
    }
    Ok(Plan { sizes, depths, ops, patterns, runtime, warmup })
}

fn dedup<T: PartialEq + Copy>(v: &[T]) -> Vec<T> {
    let mut out = Vec::new();
    for x in v {
        if !out.contains(x) {
            out.push(*x);
        }
    }
    out
}

/// The part of the export the sweep uses, checked against the export and the sweep. Default
/// sizes that do not fit in a small export are left out; sizes the user asked for are not.
fn region(args: &BenchArgs, plan: &mut Plan, client: &Client) -> Result<(u64, u64), String> {
    let export = client.export();
    let size = export.size;
    let offset = args.offset.unwrap_or(0);
    if offset >= size {
        return Err(format!("--offset {offset} is not inside the export ({size} bytes)"));
    }
    let span = args.span.unwrap_or(size - offset);
    if span == 0 || offset.checked_add(span).is_none_or(|end| end > size) {
        return Err(format!("--offset {offset} --span {span} does not fit in the export ({size} bytes)"));
    }
    if args.sizes.is_empty() && plan.sizes.iter().any(|&s| s > span) {
        let dropped: Vec<_> = plan.sizes.iter().filter(|&&s| s > span).map(|&s| human_size(s)).collect();
        eprintln!("sluice bench: leaving out request sizes larger than the region ({span} bytes): {}", dropped.join(","));
        plan.sizes.retain(|&s| s <= span);
        if plan.sizes.is_empty() {
            return Err(format!("the region ({span} bytes) is smaller than every request size; choose --sizes"));
        }
    }
    let largest = plan.sizes[plan.sizes.len() - 1];
    if largest > span {
        return Err(format!(
            "request size {} is larger than the region used ({span} bytes); choose smaller --sizes or a larger --span",
            human_size(largest)
        ));
    }
    let align = export.block_min.max(1) as u64;
    if !offset.is_multiple_of(align) {
        return Err(format!("--offset {offset} is not a multiple of the export's minimum block size ({align})"));
    }
    if let Some(s) = plan.sizes.iter().find(|&&s| !s.is_multiple_of(align)) {
        return Err(format!("request size {s} is not a multiple of the export's minimum block size ({align})"));
    }
    Ok((offset, span))
}

async fn run_async(args: BenchArgs, plan: Plan) -> ExitCode {
    let options = Options { connections: args.connections as usize, block_status: false, ..Options::default() };
    let uri = match args.tls.uri(&args.uri) {
        Ok(u) => u,
        Err(e) => return client_cli::fail("bench", &e),
    };
    let client = match client_cli::connect(&uri, &options).await {
        Ok(c) => c,
        Err(e) => return client_cli::fail("bench", &e),
    };
    let code = measure(&args, plan, &client).await;
    client.disconnect().await;
    code
}

async fn measure(args: &BenchArgs, mut plan: Plan, client: &Client) -> ExitCode {
    if plan.writes() && client.export().read_only() {
        return failure(&format!(
            "{}: the export is read-only, so writes cannot be measured; measure reads only (without --write)",
            args.uri
        ));
    }
    let (offset, span) = match region(args, &mut plan, client) {
        Ok(r) => r,
        Err(m) => return usage(&m),
    };
    if args.connections > 1 && client.connections() == 1 {
        eprintln!("sluice bench: the server does not allow multi-conn; using 1 connection");
    }
    let request_max = client.export().request_max_bytes() as u64;
    if let Some(s) = plan.sizes.iter().find(|&&s| s > request_max) {
        eprintln!(
            "sluice bench: note: requests larger than the server's maximum ({}) are split into several, starting with {}",
            human_size(request_max),
            human_size(*s)
        );
    }
    let dir = match output_dir(args.out.as_deref()) {
        Ok(d) => d,
        Err(m) => return failure(&m),
    };
    let csv_path = dir.join("bench.csv");
    let mut csv = match Csv::create(&csv_path) {
        Ok(c) => c,
        Err(e) => return failure(&format!("cannot write {}: {e}", csv_path.display())),
    };

    let per_point = plan.warmup + plan.runtime;
    let export = client.export();
    say(&format!(
        "sluice bench: {} ({} bytes, {} connection{}), region {}..{}, {} points x {:.2} s (+{:.2} s warm-up), about {}",
        args.uri,
        export.size,
        client.connections(),
        if client.connections() == 1 { "" } else { "s" },
        offset,
        offset + span,
        plan.points(),
        plan.runtime.as_secs_f64(),
        plan.warmup.as_secs_f64(),
        human_duration(per_point * plan.points() as u32)
    ));
    say(&table_header());

    let interrupted = Arc::new(AtomicBool::new(false));
    watch_interrupt(interrupted.clone());

    let started = Instant::now();
    let mut results = Vec::with_capacity(plan.points());
    let mut failed = None;
    let mut index = 0u64;
    'sweep: for &op in &plan.ops {
        for &pattern in &plan.patterns {
            for &depth in &plan.depths {
                for &size in &plan.sizes {
                    let point = Point {
                        op,
                        pattern,
                        size,
                        depth,
                        offset,
                        span,
                        runtime: plan.runtime,
                        warmup: plan.warmup,
                        seed: args.seed ^ index.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    };
                    index += 1;
                    match bench_point::run(client, &point, &interrupted).await {
                        Ok(Some(r)) => {
                            say(&table_row(&r));
                            if let Err(e) = csv.row(&r) {
                                return failure(&format!("cannot write {}: {e}", csv_path.display()));
                            }
                            results.push(r);
                        }
                        Ok(None) => {
                            failed = Some("interrupted; the results so far are saved".to_string());
                            break 'sweep;
                        }
                        Err(m) => {
                            failed = Some(m);
                            break 'sweep;
                        }
                    }
                    if op == Op::Write {
                        // Untimed: the next point should not pay for this one's write-back.
                        if let Err(e) = client.flush().await {
                            failed = Some(format!("flush after writing: {e}"));
                            break 'sweep;
                        }
                    }
                }
            }
        }
    }
    drop(csv);

    let mut files = vec![("bench.csv", "one row per point, the columns of the table")];
    let mut plot_error = None;
    if !results.is_empty() {
        match bench_plot::draw(&dir, &results, &args.uri) {
            Ok(drawn) => files.extend(drawn.files),
            Err(m) => plot_error = Some(m),
        }
    }
    say(&format!("sluice bench: {} points in {}; results in {}/", results.len(), human_duration(started.elapsed()), dir.display()));
    for (name, what) in &files {
        say(&format!("  {name:<22} {what}"));
    }
    if let Some(m) = failed {
        return failure(&m);
    }
    if let Some(m) = plot_error {
        return failure(&format!("cannot draw the plots: {m}"));
    }
    ExitCode::SUCCESS
}

/// A line of the report on stdout. A closed stdout (`| head`) does not stop the sweep: the
/// results still go to the files.
fn say(line: &str) {
    let _ = writeln!(std::io::stdout(), "{line}");
}

/// The first SIGINT stops the sweep at the end of the current request (the partial point is
/// dropped, the finished ones are saved and plotted); a second one exits at once.
fn watch_interrupt(flag: Arc<AtomicBool>) {
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_err() {
            return;
        }
        eprintln!("sluice bench: interrupted; stopping after the requests in flight (again to quit now)");
        flag.store(true, Ordering::Relaxed);
        if tokio::signal::ctrl_c().await.is_ok() {
            std::process::exit(130);
        }
    });
}

/// Creates the output directory: the one asked for (and its parents), or a new one named
/// after the current UTC time, with a suffix if that name is taken.
fn output_dir(out: Option<&Path>) -> Result<PathBuf, String> {
    if let Some(dir) = out {
        std::fs::create_dir_all(dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        return Ok(dir.to_path_buf());
    }
    let stamp = utc_stamp(SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()));
    for n in 1..100 {
        let name = if n == 1 { format!("sluice-bench-{stamp}") } else { format!("sluice-bench-{stamp}-{n}") };
        let dir = PathBuf::from(name);
        match std::fs::create_dir(&dir) {
            Ok(()) => return Ok(dir),
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(format!("cannot create {}: {e}", dir.display())),
        }
    }
    Err("cannot find a free name for the output directory; use --out".into())
}

/// `YYYYmmdd-HHMMSS` for seconds since the epoch, in UTC (civil-from-days, proleptic
/// Gregorian calendar).
fn utc_stamp(secs: u64) -> String {
    let days = (secs / 86400) as i64;
    let rem = secs % 86400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}{month:02}{day:02}-{:02}{:02}{:02}", rem / 3600, rem / 60 % 60, rem % 60)
}

const CSV_HEADER: &str =
    "op,pattern,size_bytes,depth,connections,seconds,ios,bytes,mb_per_s,iops,lat_mean_us,lat_p50_us,lat_p99_us,lat_max_us";

/// `bench.csv`, written a row at a time so an interrupted or failed run keeps what it measured.
struct Csv {
    out: BufWriter<File>,
}

impl Csv {
    fn create(path: &Path) -> std::io::Result<Csv> {
        let mut out = BufWriter::new(File::create(path)?);
        writeln!(out, "{CSV_HEADER}")?;
        out.flush()?;
        Ok(Csv { out })
    }

    fn row(&mut self, r: &PointResult) -> std::io::Result<()> {
        writeln!(
            self.out,
            "{},{},{},{},{},{:.6},{},{},{:.3},{:.1},{:.2},{:.2},{:.2},{:.2}",
            r.op.name(),
            r.pattern.name(),
            r.size,
            r.depth,
            r.connections,
            r.seconds,
            r.ios,
            r.bytes,
            r.mb_per_s(),
            r.iops(),
            r.lat_mean_us,
            r.lat_p50_us,
            r.lat_p99_us,
            r.lat_max_us
        )?;
        self.out.flush()
    }
}

fn table_header() -> String {
    format!(
        "{:<5} {:<4} {:>6} {:>5} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "op", "pat", "size", "depth", "MB/s", "IOPS", "mean(us)", "p50(us)", "p99(us)"
    )
}

fn table_row(r: &PointResult) -> String {
    format!(
        "{:<5} {:<4} {:>6} {:>5} {:>10.1} {:>10.0} {:>10.1} {:>10.1} {:>10.1}",
        r.op.name(),
        r.pattern.name(),
        human_size(r.size),
        r.depth,
        r.mb_per_s(),
        r.iops(),
        r.lat_mean_us,
        r.lat_p50_us,
        r.lat_p99_us
    )
}

fn human_duration(d: Duration) -> String {
    let s = d.as_secs_f64();
    if s < 60.0 {
        format!("{s:.1} s")
    } else {
        format!("{}m{:02}s", (s / 60.0) as u64, (s % 60.0) as u64)
    }
}

fn parse_byte_count(s: &str) -> Result<u64, String> {
    sluice_server::export::parse_size(s).map_err(|e| e.to_string())
}

fn parse_request_size(s: &str) -> Result<u64, String> {
    let n = parse_byte_count(s)?;
    if n == 0 || n > REQUEST_SIZE_MAX_BYTES {
        return Err(format!("request size {s:?} must be between 1 and {}", human_size(REQUEST_SIZE_MAX_BYTES)));
    }
    Ok(n)
}

/// Seconds as a decimal number, optionally with `s` or `ms`.
fn parse_seconds(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let (num, scale) = match t.strip_suffix("ms") {
        Some(n) => (n, 0.001),
        None => (t.strip_suffix('s').unwrap_or(t), 1.0),
    };
    let v: f64 = num.trim().parse().map_err(|_| format!("{s:?} is not a number of seconds (like 2, 0.5 or 250ms)"))?;
    let v = v * scale;
    if !v.is_finite() || !(0.0..=POINT_SECONDS_MAX).contains(&v) {
        return Err(format!("{s:?} must be between 0 and {POINT_SECONDS_MAX} seconds"));
    }
    Ok(Duration::from_secs_f64(v))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seconds_parse_with_units() {
        assert_eq!(parse_seconds("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_seconds("0.25s").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_seconds("250ms").unwrap(), Duration::from_millis(250));
        assert!(parse_seconds("-1").is_err());
        assert!(parse_seconds("soon").is_err());
        assert!(parse_seconds("inf").is_err());
    }

    #[test]
    fn request_sizes_parse_within_bounds() {
        assert_eq!(parse_request_size("64K").unwrap(), 65536);
        assert!(parse_request_size("0").is_err());
        assert!(parse_request_size("2G").is_err());
    }

    #[test]
    fn utc_stamps_match_known_dates() {
        assert_eq!(utc_stamp(0), "19700101-000000");
        assert_eq!(utc_stamp(951_782_400), "20000229-000000");
        assert_eq!(utc_stamp(1_700_000_000), "20231114-221320");
    }
}
