//! `sluice copy SRC DST`: copies between NBD exports, files, block devices and
//! stdin/stdout with many requests in flight, keeping holes. The source is cut into work
//! items in offset order (copy_source.rs); a fixed set of workers each take the next item,
//! read it, and write it (copy_dest.rs) wherever it belongs, so requests complete in any
//! order — except into a stream, where each worker waits for its turn to write.

#[path = "copy_dest.rs"]
mod copy_dest;
#[path = "copy_failure.rs"]
mod failure;
#[path = "copy_source.rs"]
mod copy_source;
#[path = "copy_os.rs"]
mod os;
#[path = "copy_progress.rs"]
mod progress;

use crate::client_cli::{self, exit_code, PoolArgs, TlsArgs};
use copy_dest::{Dest, FileZeros, Target};
use copy_source::{Planner, Source, SourceKind, What};
use failure::Failure;
use progress::Progress;
use sluice_client::{Client, Error, Options, Uri};
use std::fs::{File, OpenOptions};
use std::io::{Seek, SeekFrom};
use std::os::fd::AsFd;
use std::os::unix::fs::FileTypeExt;
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use tokio::sync::{watch, Mutex};

/// Requests in flight by default: enough to keep a disk array and a fast network busy.
const REQUESTS_DEFAULT: usize = 16;
/// Upper bound on --requests: each one holds a buffer of --request-size.
const REQUESTS_MAX: usize = 1024;
/// Default bytes per read or write request.
const REQUEST_SIZE_DEFAULT: &str = "1M";
/// Smallest --request-size accepted: one sector.
const REQUEST_SIZE_MIN_BYTES: u64 = 512;
/// Largest --request-size accepted: the largest request NBD servers commonly take (and
/// sluice's own limit). Exports that name a smaller maximum lower it further.
const REQUEST_SIZE_MAX_BYTES: u64 = 32 << 20;
/// Connections per export by default, when the server allows multi-conn.
const CONNECTIONS_DEFAULT: usize = 4;
/// Longest zero range one work item covers when zeroing is cheap (WRITE_ZEROES, hole
/// punching); the client splits it further into requests the server takes.
const ZERO_ITEM_MAX_BYTES: u64 = 1 << 30;

const _: () = assert!(REQUEST_SIZE_MIN_BYTES <= REQUEST_SIZE_MAX_BYTES);
const _: () = assert!(ZERO_ITEM_MAX_BYTES >= REQUEST_SIZE_MAX_BYTES);

#[derive(clap::Args)]
#[command(after_help = "EXAMPLES:
  sluice copy disk.img nbd://server/disk           # upload an image, keeping holes
  sluice copy nbd://server/disk backup.img         # download it
  sluice copy nbd://a/disk 'nbd+unix:///disk?socket=/run/b.sock'
  xz -dc disk.img.xz | sluice copy - nbd://server/disk
  sluice copy --progress nbd://server/disk - | gzip > disk.img.gz
  sluice copy --tls-certificates /etc/pki/sluice disk.img nbds://server/disk

Exit status: 0 when everything was copied and flushed; 1 when anything failed (connecting,
an unknown or read-only export, a destination too small, a read, write, flush or fsync
error, TLS); 2 for a bad command line or URI, or TLS options or files that cannot be used.")]
pub struct CopyArgs {
    /// What to copy: an NBD URI (nbd://HOST[:PORT]/EXPORT, nbd+unix:///EXPORT?socket=PATH,
    /// nbds:// or nbds+unix:// for TLS), a pool (pool:PATH), a cached volume (cache:PATH), a
    /// file or block device, or - for standard input.
    #[arg(value_name = "SRC")]
    src: String,

    /// Where to copy to: an NBD URI, a pool (pool:PATH), a cached volume (cache:PATH), a
    /// file (created if missing, set to SRC's size) or block device, or - for standard
    /// output.
    #[arg(value_name = "DST")]
    dst: String,

    /// Requests in flight at once (each holds one buffer of --request-size).
    #[arg(long, value_name = "N", default_value_t = REQUESTS_DEFAULT,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=REQUESTS_MAX as u64))]
    requests: usize,

    /// Bytes per read and write request, with an optional K or M suffix (512 to 32M). Lowered
    /// to the largest request an export accepts.
    #[arg(long, value_name = "SIZE", default_value = REQUEST_SIZE_DEFAULT, value_parser = parse_request_size)]
    request_size: u64,

    /// Connections per export, used when the server allows multi-conn (otherwise one).
    #[arg(long, value_name = "N", default_value_t = CONNECTIONS_DEFAULT,
          value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=sluice_client::limits::CONNECTIONS_MAX as u64))]
    connections: usize,

    /// Print a progress line to standard error every second (and one at the end) when
    /// standard error is not a terminal. On a terminal a progress bar is always shown.
    #[arg(long)]
    progress: bool,

    /// Write zeros instead of leaving holes: zero ranges are written as zero bytes to
    /// files and block devices, and as WRITE_ZEROES without permission to punch holes to
    /// exports.
    #[arg(long)]
    no_sparse: bool,

    /// Applies to SRC and DST alike, whichever are pool: URIs.
    #[command(flatten)]
    pool: PoolArgs,

    /// Apply to SRC and DST alike, whichever are nbds:// or nbds+unix:// URIs.
    #[command(flatten)]
    tls: TlsArgs,
}

fn parse_request_size(s: &str) -> Result<u64, String> {
    let n = sluice_server::export::parse_size(s).map_err(|e| e.to_string())?;
    if !(REQUEST_SIZE_MIN_BYTES..=REQUEST_SIZE_MAX_BYTES).contains(&n) {
        return Err(format!(
            "{n} bytes is outside {REQUEST_SIZE_MIN_BYTES}..={REQUEST_SIZE_MAX_BYTES}"
        ));
    }
    Ok(n)
}

/// SRC or DST as given on the command line.
enum Endpoint {
    Nbd(Uri),
    Path(PathBuf),
    Std,
}

impl Endpoint {
    fn parse(arg: &str) -> Result<Endpoint, Error> {
        if arg == "-" {
            Ok(Endpoint::Std)
        } else if arg.contains("://") || arg.starts_with("pool:") || arg.starts_with("cache:") {
            Uri::parse(arg).map(Endpoint::Nbd)
        } else {
            Ok(Endpoint::Path(PathBuf::from(arg)))
        }
    }

    fn uri(&mut self) -> Option<&mut Uri> {
        match self {
            Endpoint::Nbd(uri) => Some(uri),
            _ => None,
        }
    }
}

pub fn run(args: CopyArgs) -> ExitCode {
    // What the library warns of (a pool assembled degraded, a URI key it ignores) is shown.
    crate::logger::init(log::LevelFilter::Warn);
    // Both arguments are checked before anything is opened, so a typo costs nothing.
    let parsed = Endpoint::parse(&args.src).and_then(|s| Ok((s, Endpoint::parse(&args.dst)?)));
    let parsed = parsed.and_then(|(mut src, mut dst)| {
        let mut uris: Vec<&mut Uri> = [&mut src, &mut dst].into_iter().filter_map(Endpoint::uri).collect();
        args.tls.apply(&mut uris)?;
        Ok((src, dst))
    });
    let (src, dst) = match parsed {
        Ok(pair) => pair,
        Err(e) => return client_cli::fail("copy", &e),
    };
    let rt = client_cli::runtime();
    let result = rt.block_on(copy(&args, src, dst));
    // A worker blocked on a pipe after a failure must not hold up the exit.
    rt.shutdown_background();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(f) => {
            eprintln!("sluice copy: {}", f.message);
            ExitCode::from(f.code)
        }
    }
}

async fn connect(arg: &str, uri: &Uri, options: &Options) -> Result<Client, Failure> {
    client_cli::connect(uri, options)
        .await
        .map_err(|e| match e {
            // These already name the URI.
            Error::Io(_) => Failure {
                code: exit_code(&e),
                message: e.to_string(),
            },
            _ => Failure::client(arg, &e),
        })
}

/// A copy of a standard stream's descriptor as a File: unbuffered, so large writes go
/// straight to the kernel.
fn std_stream(fd: std::os::fd::BorrowedFd<'_>, name: &str) -> Result<Arc<File>, Failure> {
    let owned = fd.try_clone_to_owned().map_err(|e| Failure::io(name, e))?;
    Ok(Arc::new(File::from(owned)))
}

fn block_device_size(mut f: &File, name: &str) -> Result<u64, Failure> {
    f.seek(SeekFrom::End(0))
        .map_err(|e| Failure::io(&format!("finding the size of {name}"), e))
}

async fn open_source(arg: &str, ep: Endpoint, options: &Options) -> Result<Source, Failure> {
    match ep {
        Endpoint::Nbd(uri) => {
            let client = connect(arg, &uri, options).await?;
            let size = client.size();
            Ok(Source {
                kind: SourceKind::Nbd(client),
                name: arg.to_string(),
                size: Some(size),
            })
        }
        Endpoint::Std => {
            let file = std_stream(std::io::stdin().as_fd(), "standard input")?;
            Ok(Source {
                kind: SourceKind::Stream(file),
                name: "standard input".into(),
                size: None,
            })
        }
        Endpoint::Path(path) => {
            let file = File::open(&path).map_err(|e| Failure::io(arg, e))?;
            let meta = file.metadata().map_err(|e| Failure::io(arg, e))?;
            let kind = meta.file_type();
            let name = arg.to_string();
            if kind.is_dir() {
                Err(Failure::new(format!("{arg}: is a directory")))
            } else if kind.is_file() {
                Ok(Source {
                    kind: SourceKind::File {
                        file: Arc::new(file),
                        map: true,
                    },
                    name,
                    size: Some(meta.len()),
                })
            } else if kind.is_block_device() {
                let size = block_device_size(&file, arg)?;
                Ok(Source {
                    kind: SourceKind::File {
                        file: Arc::new(file),
                        map: false,
                    },
                    name,
                    size: Some(size),
                })
            } else {
                Ok(Source {
                    kind: SourceKind::Stream(Arc::new(file)),
                    name,
                    size: None,
                })
            }
        }
    }
}

/// The opened destination, and how many bytes it holds when that bounds the copy.
struct Opened {
    target: Target,
    name: String,
    capacity: Option<u64>,
}

fn too_small(dst: &str, capacity: u64, src: &Source) -> Failure {
    let size = src.size.unwrap_or(0);
    Failure::new(format!(
        "{dst} ({capacity} bytes) is smaller than {} ({size} bytes); nothing was copied",
        src.name
    ))
}

/// Opens (or creates) the destination and checks it can take the source. A regular file
/// is set to the source's size here, when that is known.
async fn open_dest(
    arg: &str,
    ep: Endpoint,
    options: &Options,
    src: &Source,
    sparse: bool,
) -> Result<Opened, Failure> {
    let name = arg.to_string();
    let opened = match ep {
        Endpoint::Nbd(uri) => {
            let client = connect(arg, &uri, options).await?;
            if client.export().read_only() {
                return Err(Failure::new(format!(
                    "{arg}: the export is read-only; nothing was copied"
                )));
            }
            let capacity = client.size();
            if src.size.is_some_and(|s| s > capacity) {
                return Err(too_small(arg, capacity, src));
            }
            Opened {
                target: Target::Nbd(client),
                name,
                capacity: Some(capacity),
            }
        }
        Endpoint::Std => {
            let file = std_stream(std::io::stdout().as_fd(), "standard output")?;
            Opened {
                target: Target::Stream(file),
                name: "standard output".into(),
                capacity: None,
            }
        }
        Endpoint::Path(path) => {
            let (file, created) = match OpenOptions::new().write(true).create_new(true).open(&path)
            {
                Ok(f) => (f, true),
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => (
                    OpenOptions::new()
                        .write(true)
                        .open(&path)
                        .map_err(|e| Failure::io(arg, e))?,
                    false,
                ),
                Err(e) => return Err(Failure::io(arg, e)),
            };
            let meta = file.metadata().map_err(|e| Failure::io(arg, e))?;
            let kind = meta.file_type();
            if kind.is_file() {
                let fresh = created || meta.len() == 0;
                let zeros = match (sparse, fresh) {
                    (false, _) => FileZeros::Write,
                    (true, true) => FileZeros::Leave,
                    (true, false) => FileZeros::Punch,
                };
                if let Some(size) = src.size {
                    file.set_len(size)
                        .map_err(|e| Failure::io(&format!("setting the size of {arg}"), e))?;
                }
                Opened {
                    target: Target::File {
                        file: Arc::new(file),
                        zeros,
                        regular: true,
                    },
                    name,
                    capacity: None,
                }
            } else if kind.is_block_device() {
                let capacity = block_device_size(&file, arg)?;
                if src.size.is_some_and(|s| s > capacity) {
                    return Err(too_small(arg, capacity, src));
                }
                let zeros = if sparse {
                    FileZeros::Punch
                } else {
                    FileZeros::Write
                };
                Opened {
                    target: Target::File {
                        file: Arc::new(file),
                        zeros,
                        regular: false,
                    },
                    name,
                    capacity: Some(capacity),
                }
            } else {
                Opened {
                    target: Target::Stream(Arc::new(file)),
                    name,
                    capacity: None,
                }
            }
        }
    };
    Ok(opened)
}

fn request_max(kind: &SourceKind) -> u64 {
    match kind {
        SourceKind::Nbd(c) => c.export().request_max_bytes() as u64,
        _ => u64::MAX,
    }
}

async fn copy(args: &CopyArgs, src_ep: Endpoint, dst_ep: Endpoint) -> Result<(), Failure> {
    let options = Options {
        connections: args.connections,
        degraded: args.pool.degraded,
        ..Options::default()
    };
    let source = open_source(&args.src, src_ep, &options).await?;
    let opened = open_dest(&args.dst, dst_ep, &options, &source, !args.no_sparse).await?;
    let dst_max = match &opened.target {
        Target::Nbd(c) => c.export().request_max_bytes() as u64,
        _ => u64::MAX,
    };
    let request_bytes = args
        .request_size
        .min(request_max(&source.kind))
        .min(dst_max) as usize;
    let dest = Arc::new(Dest::new(
        opened.target,
        opened.name,
        !args.no_sparse,
        request_bytes,
    ));
    let zero_item_bytes = if dest.zeroing_is_cheap() {
        ZERO_ITEM_MAX_BYTES
    } else {
        request_bytes as u64
    };
    let capacity = if source.size.is_none() {
        opened.capacity
    } else {
        None
    };
    let planner = Arc::new(Mutex::new(Planner::new(
        source.clone(),
        request_bytes,
        zero_item_bytes,
        capacity,
    )));
    // Into a stream, items must land in order: this counts the items written so far.
    let turn = matches!(dest.target, Target::Stream(_)).then(|| Arc::new(watch::channel(0u64).0));
    let progress = Progress::start(source.size, args.progress);

    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..args.requests {
        let w = Worker {
            planner: planner.clone(),
            source: source.clone(),
            dest: dest.clone(),
            turn: turn.clone(),
            progress: progress.clone(),
        };
        workers.spawn(w.run(request_bytes));
    }
    let mut failure = None;
    while let Some(joined) = workers.join_next().await {
        let result = joined.unwrap_or_else(|e| {
            Err(Failure::new(format!(
                "internal error: a copy worker failed: {e}"
            )))
        });
        if let Err(f) = result {
            // The first failure ends the copy; the rest are consequences of stopping.
            workers.abort_all();
            failure.get_or_insert(f);
        }
    }
    if let Some(f) = failure {
        progress.abandon();
        return Err(f);
    }
    let copied = planner.lock().await.planned_bytes();
    if let Err(f) = dest.finish(copied, source.size.is_some()).await {
        progress.abandon();
        return Err(f);
    }
    progress.finish();
    if let SourceKind::Nbd(c) = &source.kind {
        c.disconnect().await;
    }
    Ok(())
}

/// One of the --requests workers: takes items until there are none, one request each.
struct Worker {
    planner: Arc<Mutex<Planner>>,
    source: Source,
    dest: Arc<Dest>,
    turn: Option<Arc<watch::Sender<u64>>>,
    progress: Arc<Progress>,
}

impl Worker {
    async fn run(self, request_bytes: usize) -> Result<(), Failure> {
        let mut buf = Vec::with_capacity(request_bytes);
        let mut my_turn = self.turn.as_ref().map(|t| t.subscribe());
        loop {
            let next = self.planner.lock().await.next(&mut buf).await?;
            let Some(item) = next else { return Ok(()) };
            if item.what == What::Read {
                buf = self
                    .source
                    .read(item.offset, buf, item.len as usize)
                    .await?;
            }
            if let Some(rx) = &mut my_turn {
                rx.wait_for(|&written| written == item.seq)
                    .await
                    .map_err(|_| Failure::new("internal error: the copy's turn keeper is gone"))?;
            }
            match item.what {
                What::Zero => self.dest.zero(item.offset, item.len).await?,
                What::Read | What::Filled => {
                    debug_assert_eq!(buf.len() as u64, item.len);
                    buf = self.dest.put(item.offset, buf).await?;
                }
            }
            if let Some(t) = &self.turn {
                t.send_replace(item.seq + 1);
            }
            self.progress.add(item.len);
        }
    }
}
