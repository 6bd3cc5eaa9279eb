//! Every limit and tuning constant of the server, named once with its unit last and the
//! reason for its value. `Limits` holds the budgets an operator may change (the `[limits]`
//! table of the configuration file); the constants below are fixed. Limits of the protocol
//! itself (string and option sizes, the largest request) live in `sluice_proto::limits`.

use serde::Deserialize;
use sluice_proto::limits::REQUEST_PAYLOAD_MAX_BYTES;

/// Pages are the unit of the page cache, of pipe capacity and of O_DIRECT alignment.
pub const PAGE_BYTES: usize = 4096;

/// A transparent huge page (x86-64, and arm64 with 4 KiB pages): buffer-pool slabs of at
/// least this size are aligned to it and asked to be backed by such pages.
pub const HUGE_PAGE_BYTES: usize = 2 * 1024 * 1024;

const REQUEST_MAX_BYTES: usize = REQUEST_PAYLOAD_MAX_BYTES as usize;

// ---- defaults of the configurable budgets ---------------------------------------------

/// Requests one connection may have in flight; more stay unread in the socket. 64 covers
/// the queue depths real clients use (the kernel client defaults to 128 tags over several
/// connections, qemu to 16 per connection).
pub const INFLIGHT_REQUESTS_PER_CONNECTION_DEFAULT: usize = 64;

/// Payload bytes one connection may have in flight: two maximal requests, so one client
/// can pipeline large requests without holding a whole worker's memory.
pub const INFLIGHT_BYTES_PER_CONNECTION_DEFAULT: usize = 2 * REQUEST_MAX_BYTES;

/// Payload bytes one worker's connections may hold together: four connections' full
/// budgets. With the per-connection cap, four stalled clients are needed to make others wait.
pub const INFLIGHT_BYTES_PER_WORKER_DEFAULT: usize = 4 * INFLIGHT_BYTES_PER_CONNECTION_DEFAULT;

/// Concurrent client connections, handshaking or transmitting, across the server.
pub const CONNECTIONS_DEFAULT: usize = 1024;

/// Connections one client (an address, or a Unix peer's uid) may hold at once: an eighth of
/// the server's, far above what one host uses (the kernel client's `-C`, qemu's and
/// nbdcopy's multi-conn use 4 to 16), so that one host cannot take every slot.
pub const CONNECTIONS_PER_CLIENT_DEFAULT: usize = CONNECTIONS_DEFAULT / 8;

/// Time a client has to finish the handshake before it is dropped.
pub const HANDSHAKE_TIMEOUT_MS_DEFAULT: u64 = 10_000;

/// Most registered memory per worker: two maximal requests, or 64 requests of 1 MiB, so
/// common queue depths never touch the heap fallback. A ceiling, not an allocation: the
/// pool maps and pins only what load asks for (`BUFFER_POOL_GROW_STEP_BYTES`).
pub const BUFFER_POOL_BYTES_PER_WORKER_DEFAULT: usize = 2 * REQUEST_MAX_BYTES;

/// Time a buffer slab must go unused before the worker gives it back: long enough that
/// traffic in bursts a few seconds apart keeps its buffers (mapping and registering a slab
/// costs about a millisecond), short enough that a server at rest soon holds nothing.
pub const BUFFER_POOL_QUIET_MS_DEFAULT: u64 = 5_000;

/// Time a request may spend at its backend before it is logged as slow and counted in
/// `sluice_requests_slow`. A local disk answers in milliseconds even when busy, and a Ceph
/// or remote backend that takes seconds is riding out a failure an operator wants to see;
/// well under the Linux nbd client's 30 s timeout, so the log speaks before clients give up.
pub const SLOW_REQUEST_MS_DEFAULT: u64 = 5_000;

// ---- how workers wait ----------------------------------------------------------------------

/// Longest a worker spins on its ring for more work before it sleeps, by default
/// (`--busy-poll`). Measured on the 2-core machine (docs/serve.md, "THREADS, PINNING AND
/// POLLING"): with client and server on different CPUs, or left to the scheduler, 50 µs
/// cut the 4K QD1 round trip by a third to two fifths; it cost a tenth when they shared
/// one CPU, where nothing has to be woken. About one cross-CPU wake-up in a VM.
pub const BUSY_POLL_DEFAULT_US: u64 = 50;

/// Largest `--busy-poll`: a spin longer than a millisecond saves nothing a sleep would cost.
pub const BUSY_POLL_MAX_US: u64 = 1000;

/// Fastest a client takes in reply bytes from its socket, in bytes per microsecond (10 GB/s:
/// one CPU copying out of the socket). Replies larger than the longest spin times this rate
/// cannot be taken in before the spin ends, so a wait for the client's next request after
/// them is not spun (`busy_poll.rs`): 500 KB at the default 50 µs. Measured on the 2-core VM
/// (fio's nbd engine, loopback, bench/results/2026-11-28-bulk-wait-vm): the spin caught the
/// next request after 256K replies often enough to keep them 10% faster, and after 1M
/// replies too rarely to pay for itself.
pub const CLIENT_TAKE_IN_BYTES_PER_US: u64 = 10_000;

/// A spin budget halved below this is not worth a clock read: the worker sleeps at once.
pub const BUSY_POLL_MIN_NS: u64 = 1000;

/// Times the spin loop looks at the ring between clock reads: a look is a few loads, a
/// clock read in a VM can cost as much as a hundred of them.
pub const BUSY_POLL_CHECKS_PER_CLOCK_READ: u32 = 64;

// ---- what the server advertises ---------------------------------------------------------

/// Block size clients are told to prefer: a page, so O_DIRECT and the page cache both see
/// whole pages.
pub const BLOCK_PREFERRED_BYTES: u32 = PAGE_BYTES as u32;

/// Extents in one BLOCK_STATUS reply; bounds reply size for a huge, fragmented range.
pub const EXTENTS_PER_REPLY_MAX: usize = 1024;

// ---- the transmission core --------------------------------------------------------------

/// Receive buffer for request headers; payloads that do not fit go straight to their buffer.
pub const RECV_BUFFER_BYTES: usize = 64 * 1024;

/// Replies gathered into one sendmsg: enough to answer a full queue of small requests in
/// one system call, few enough that the iovec array stays small.
pub const SEND_PARTS_MAX: usize = 32;

/// Ciphertext a TLS connection receives at once: several full records (16 KiB each), so a
/// large write's payload arrives in few receives.
pub const TLS_CIPHER_IN_BYTES: usize = 128 * 1024;

/// Plaintext a TLS connection encrypts before sending it: large enough that a 1 MiB reply
/// leaves in four sends, small enough that the ciphertext buffer stays modest.
pub const TLS_SEND_ROUND_BYTES: usize = 256 * 1024;

/// Ciphertext a TLS connection may hold waiting to be sent before it stops receiving: one
/// round of replies plus what OpenSSL answers while reading (key updates, alerts), so a
/// client that never reads cannot make the server buffer without end.
pub const TLS_OUTPUT_MAX_BYTES: usize = TLS_SEND_ROUND_BYTES + 64 * 1024;

// The ciphertext kept for a handoff to kTLS is bounded by sluice_ktls::TRANSCRIPT_MAX_BYTES,
// shared with the client.

/// Largest write issued when emulating WRITE_ZEROES by writing zeros.
pub const ZERO_FILL_CHUNK_BYTES: usize = 1024 * 1024;

/// Largest range one storage CACHE operation names: io_uring's fadvise carries a 32-bit
/// length, so a 64-bit CACHE (extended headers) goes to the storage in pieces of this.
pub const CACHE_PIECE_MAX_BYTES: u64 = 1 << 30;

/// Most pieces one read is split into; a huge read uses chunks larger than configured.
/// The chunk number of a storage operation is a u16.
pub const CHUNKS_PER_READ_MAX: usize = 256;

// ---- pipelined reads, `--chunk auto` (conn/pace.rs) ---------------------------------

/// Smallest chunk an automatic plan cuts. Below it each chunk's fixed cost (a storage
/// request, a completion, a reply header, a send) is paid too often, and the O_DIRECT
/// requests get too small for a disk's bandwidth; 128 KiB is still a whole number of
/// O_DIRECT blocks and buffer-pool blocks.
pub const CHUNK_AUTO_MIN_BYTES: usize = 128 * 1024;

/// What one more chunk adds to a pipelined read's time: the storage request's own latency
/// beyond its transfer, a completion and a send. From the 2-core VM's virtio disk, where
/// four 1 MiB O_DIRECT reads one after another took about 25 µs more than one of 4 MiB
/// (1,601 against 1,657 MB/s); the chunk rule weighs the pipeline's fill against it.
pub const CHUNK_COST_NS: u64 = 30_000;

/// Chunk reads of one request the storage works on at once under `--chunk auto`: two, so
/// the next chunk is already being read while the worker takes a completion and submits
/// the one after (a wake-up alone costs ~70 µs on the 2-core VM). More only queue inside
/// the device, where they finish together and delay the first chunk.
pub const CHUNK_WINDOW_COUNT: usize = 2;

/// Rate assumed for both stages before a connection has measured anything: about a local
/// NVMe disk's or the loopback network's, so a connection's first large reads are split as
/// for a cold disk (4 MiB reads get 512 KiB chunks, 1 MiB from a remote export), and warm
/// data is found out at once.
pub const RATE_ASSUMED_BYTES_PER_SEC: f64 = 2e9;

/// Smallest transfer that counts towards a rate: the time of a smaller one (a reply
/// header, a 4 KiB read) is mostly the operation's latency, which says little about how
/// fast a large read will stream.
pub const RATE_SAMPLE_MIN_BYTES: usize = 64 * 1024;

/// Bytes after which a rate sample counts half: four 4 MiB reads, so the estimates follow a
/// change (data becoming cached, a link getting busy) within a few reads, and one odd read
/// does not swing them.
pub const RATE_HALF_LIFE_BYTES: usize = 16 * 1024 * 1024;

/// Buffered writes up to this size are copied into the page cache by the worker itself:
/// cheaper than a round trip through io_uring's worker threads, where buffered writes run.
pub const INLINE_WRITE_MAX_BYTES: usize = 64 * 1024;

/// A read spliced from a socket (a remote export's) is cut into chunks of at most a share
/// of a pipe: 1/FIRST at first, halved each time a pipe fills before its chunk is in,
/// down to 1/MAX. A pipe holds a number of pieces of pages, and each fragment of a
/// socket's segments is one: over loopback fragments are whole pages or more (half a pipe
/// fits; a quarter ran 1M proxied reads about a tenth slower there), but a network card
/// with a 1500-byte MTU may give each packet's 1,448 bytes a piece of its own, so a 1 MiB
/// pipe (256 pieces) holds about 362 KiB of such data and a quarter fits. A pipe that
/// fills finishes its read in a buffer (backend/link.rs); at 1/16 a chunk is 64 KiB.
pub const SOCKET_SPLICE_PIPE_SHARE_FIRST: usize = 2;
pub const SOCKET_SPLICE_PIPE_SHARE_MAX: usize = 16;

/// Spliced reads smaller than this are copied: when the data is not cached or the socket
/// is full, a splice takes a trip through io_uring's worker threads, which costs more than
/// copying a few pages.
pub const SPLICE_MIN_BYTES: usize = 64 * 1024;

/// O_DIRECT alignment assumed when the kernel cannot say (statx DIOALIGN is Linux 6.1+):
/// the page size, which every device accepts and which our buffers already have.
pub const DIRECT_ALIGN_DEFAULT_BYTES: usize = PAGE_BYTES;

// ---- workers and the engine -------------------------------------------------------------

/// Smallest slab a worker's buffer pool maps and registers at once; later slabs double the
/// pool. 4 MiB holds a thousand 4 KiB buffers or four 1 MiB ones, so steady traffic grows
/// the pool a few times and then never, and mapping stays off the per-request path.
pub const BUFFER_POOL_GROW_STEP_BYTES: usize = 4 * 1024 * 1024;

/// Largest slab: io_uring registers at most 1 GiB as one fixed buffer.
pub const BUFFER_POOL_SLAB_MAX_BYTES: usize = 1 << 30;

/// Fixed-buffer slots a worker's ring sets aside for its pool's slabs; with the doubling
/// rule a pool has a few dozen slabs at most, whatever its budget.
pub const BUFFER_POOL_SLABS_MAX: usize = 1024;

/// Capacity asked for each splice pipe, which bounds the chunk of a spliced read. 1 MiB is
/// the default pipe-max-size, so unprivileged servers get it too.
pub const PIPE_BYTES: usize = 1024 * 1024;

/// Pipes one worker may have in use; beyond that, reads are copied. Each pipe is two file
/// descriptors, and the byte budget already bounds the data they hold.
pub const PIPES_PER_WORKER_MAX: usize = 128;

/// Submission queue entries per ring; completions get twice as many by io_uring's default.
pub const RING_ENTRIES: u32 = 1024;

/// Longest time between two looks for slow requests while requests are at a backend: the
/// age gauge is at most this stale. A look costs a pass over the worker's request slots,
/// nothing at all while no storage operation is in flight.
pub const SLOW_WATCH_INTERVAL_MAX_MS: u64 = 1_000;

/// Shortest time between two such looks, for a small `slow-request-ms`.
pub const SLOW_WATCH_INTERVAL_MIN_MS: u64 = 10;

/// Time given to in-flight requests to finish after SIGINT/SIGTERM before exiting anyway.
pub const SHUTDOWN_DRAIN_TIMEOUT_MS: u64 = 5_000;

/// How often a draining worker looks at the clock while it waits for its connections.
pub const SHUTDOWN_POLL_MS: u64 = 100;

/// Pause after a failed accept (out of descriptors, say): such errors last a while, and
/// retrying at once would spin and fill the log.
pub const ACCEPT_RETRY_DELAY_MS: u64 = 100;

// ---- remote exports --------------------------------------------------------------------

/// What one more chunk of a pipelined read costs a remote export (`Caps::chunk_cost_ns`):
/// a whole request through the runtime to another server and back, where a local device's
/// chunk costs `CHUNK_COST_NS`. Chosen within what the 2-core machine showed (2026-11-27,
/// loopback): a 4K read at QD1 took 100-200 µs through a proxy gateway against 39-42 µs
/// from its member directly, 60-160 µs more. With it a pool gateway cut its 1 MiB reads
/// mostly into 512 KiB chunks, where the old cost cut them mostly into 128 KiB ones (its
/// trace log); six interleaved rounds against the old rule
/// (bench/results/2026-11-27-gateway-chunk-cost-vm) gave 1M QD1 1,746 against 1,255 MB/s
/// (medians), and QD8 1,572 against 1,650, within its noise.
pub const REMOTE_CHUNK_COST_NS: u64 = 120_000;

/// Connections a remote export opens to its server when the server allows multi-conn: the
/// client library's default, enough to spread one export's traffic without holding many
/// of the remote server's connection slots.
pub const REMOTE_CONNECTIONS: usize = sluice_client::limits::CONNECTIONS_DEFAULT;

/// Threads of each remote export's runtime. They only move bytes between sockets and
/// buffers and wait, so one is enough, and it keeps a request's hops inside the runtime
/// (the request's task, a cached volume's task, the reply reader) on one thread, with no
/// cross-thread wake-ups between them. Measured on the 2-core machine (2026-11-27, loopback,
/// interleaved): one thread against two gave a cached volume's warm 4K QD1 hits 1.17x the
/// IOPS at 0.9x the gateway's CPU per read, QD32 1.01x, and a proxy of a RAM export the
/// same 1M QD8 and 4K QD32 rates. Not measured on 16 cores.
pub const REMOTE_RUNTIME_THREADS: usize = 1;

/// Workers that get a link of their own to a remote export (backend/link.rs); a worker
/// past them sends its requests through the export's client. One link is one of the
/// remote's connection slots (sluice allows 128 per client address by default).
pub const REMOTE_LINK_WORKERS_MAX: usize = 64;

/// A link's receive buffer: replies and small reads' data land here and are copied out. At
/// 128 KiB, 31 replies to 4 KiB reads fit in one receive.
pub const LINK_RECV_BYTES: usize = 128 * 1024;

/// Read data still to come of at least this many bytes, with none of it in hand, is
/// received straight into the request's buffer instead of through the receive buffer.
pub const LINK_DIRECT_RECV_MIN_BYTES: usize = 16 * 1024;

/// The largest member read of a pool that a worker's link carries; larger ones go through
/// the pool's own connections to the member (four under multi-conn). A link's replies
/// come one after another, and the member answers one connection from one worker, so
/// large reads queued on one link wait for each other: by hand on 2 cores (a 1-member
/// stripe over loopback, 1M reads at 8 in flight, each two 512 KiB member reads), all on
/// the link ran at 1,060-1,219 MiB/s against 1,325-1,340 on the pool's connections, and
/// reads over 128 KiB on those at 1,351-1,580. Small reads gain from the link (4K at 32 in
/// flight: 56-61K IOPS against 40-48K).
pub const POOL_LINK_READ_MAX_BYTES: usize = 128 * 1024;

/// Requests one send of a link carries; the rest wait for the next. Each is at most three
/// iovecs, well inside IOV_MAX.
pub const LINK_SEND_PARTS_MAX: usize = 64;

/// Time a remote export gets at shutdown to say goodbye. A server takes NBD_CMD_DISC at
/// once and a dead one fails it at once; a pool stops cleanly within its member timeout
/// (5 s by default) plus 2 s, releasing its superblocks (cut short, the next coordinator
/// waits out the lease and reconciles). Only a stalled remote costs this much.
pub const REMOTE_DISCONNECT_TIMEOUT_MS: u64 = 10_000;

/// How long a scrape waits for a cached volume's state. Its task answers between two
/// events, in microseconds (counting a large member's slots takes milliseconds); a scrape
/// must not hang on a task that is stuck, and Prometheus gives up after 10 s.
pub const REMOTE_STATUS_TIMEOUT_MS: u64 = 1_000;

/// How long an RBD export waits for the Ceph monitors at start (librados'
/// client_mount_timeout, when the Ceph configuration leaves it at Ceph's 300 s): an
/// unreachable cluster is an error at start, not five minutes of silence.
pub const RBD_CONNECT_TIMEOUT_S: u64 = 30;

/// How long one RBD operation may wait for its OSDs before it fails with EIO (librados'
/// rados_osd_op_timeout, when the Ceph configuration leaves it at 0, "forever"). Long
/// enough to ride out an OSD restart or a placement group peering; short enough that a
/// client learns its cluster is gone before its own NBD timeout (the Linux client's is 30 s)
/// cuts the connection.
pub const RBD_OP_TIMEOUT_S: u64 = 25;

/// Time an RBD image gets to close at shutdown: closing waits for operations in flight,
/// which a lost cluster never ends.
pub const RBD_CLOSE_TIMEOUT_MS: u64 = 10_000;

// ---- the metrics endpoint ------------------------------------------------------------

/// Time one scraper gets to send its request and take the whole reply. Scrapers answer
/// within milliseconds; a stalled one holds the endpoint, and a stop, no longer than this.
pub const METRICS_CLIENT_DEADLINE_MS: u64 = 2_000;

/// Largest request head read. A scraper's is a few hundred bytes; the bound is on memory a
/// peer controls.
pub const METRICS_REQUEST_HEAD_MAX_BYTES: usize = 8 * 1024;

/// Headers parsed in a request head; more is not a scraper.
pub const METRICS_REQUEST_HEADERS_MAX_COUNT: usize = 32;

/// Wait before accepting again after an error like EMFILE. Such errors last a while;
/// retrying sooner would only spin and fill the log.
pub const METRICS_ACCEPT_RETRY_DELAY_MS: u64 = 1_000;

/// Exports a running server can add by reloads beyond those it started with: each gets its
/// counters and a slot on every worker's board (16 bytes) from the start, so the hot path
/// indexes a fixed table. More than this takes a restart.
pub const METRICS_EXPORTS_ADDED_MAX: usize = 1024;

// ---- elastic RAM exports (`memory:SIZE,elastic`) --------------------------------------

/// How often the watcher reads the node's memory. The kernel's own PSI window is 10 s and
/// MemAvailable moves in seconds when jobs start; a read of two small /proc files a second
/// costs nothing.
pub const ELASTIC_WATCH_INTERVAL_MS: u64 = 1_000;

/// Least time between two give-backs. A step freed is seen in MemAvailable at once, but a
/// job's demand and the PSI average take a while to answer; pacing lets the first steps act
/// before more is taken, so a short spike does not empty every cache.
pub const ELASTIC_STEP_INTERVAL_MS: u64 = 2_000;

/// The node is short of memory when MemAvailable falls below this share of MemTotal (or
/// `ELASTIC_AVAILABLE_LOW_MIN_BYTES`, the larger): where the kernel's own watermarks and
/// earlyoom-like tools start to act, so the lent memory goes back before anything is killed.
pub const ELASTIC_AVAILABLE_LOW_PERCENT: u64 = 5;

/// The low mark on small nodes, where 5 % is only a few tens of MiB.
pub const ELASTIC_AVAILABLE_LOW_MIN_BYTES: u64 = 256 << 20;

/// Once giving back, keep on until MemAvailable is this much above the low mark (percent of
/// the mark): stopping at the mark itself would start again at the next small allocation.
pub const ELASTIC_HYSTERESIS_PERCENT: u64 = 25;

/// The node is short when PSI's memory "some avg10" passes this (percent of the last 10 s in
/// which some task waited for memory): 10 % is reclaim that jobs feel; lower is noise.
pub const ELASTIC_PRESSURE_HIGH_PERCENT: f64 = 10.0;

/// Once giving back for pressure, keep on until "some avg10" is below this.
pub const ELASTIC_PRESSURE_LOW_PERCENT: f64 = 5.0;

/// One give-back takes this share of what an export holds (1/N): enough that a real
/// shortage is answered within a few steps, little enough that the cache keeps most of its
/// hits while the node recovers.
pub const ELASTIC_STEP_FRACTION_DIVISOR: u64 = 8;

/// Memory is given back in aligned chunks of this size: a huge page (so tmpfs can free huge
/// pages whole), and the unit a cache over the export can lay its slots in so that a slot is
/// dropped whole or not at all. It is also the least one step gives back.
pub const ELASTIC_CHUNK_BYTES: u64 = HUGE_PAGE_BYTES as u64;

const _: () = assert!(INFLIGHT_BYTES_PER_CONNECTION_DEFAULT >= REQUEST_MAX_BYTES);
const _: () = assert!(ELASTIC_STEP_INTERVAL_MS >= ELASTIC_WATCH_INTERVAL_MS);
const _: () = assert!(ELASTIC_CHUNK_BYTES.is_power_of_two() && ELASTIC_CHUNK_BYTES >= PAGE_BYTES as u64);
const _: () = assert!(ELASTIC_AVAILABLE_LOW_PERCENT < 100 && ELASTIC_STEP_FRACTION_DIVISOR >= 2);
const _: () = assert!(ELASTIC_PRESSURE_LOW_PERCENT < ELASTIC_PRESSURE_HIGH_PERCENT);
const _: () = assert!(INFLIGHT_BYTES_PER_WORKER_DEFAULT >= INFLIGHT_BYTES_PER_CONNECTION_DEFAULT);
const _: () = assert!(BUFFER_POOL_BYTES_PER_WORKER_DEFAULT >= REQUEST_MAX_BYTES);
const _: () = assert!(BUFFER_POOL_GROW_STEP_BYTES.is_power_of_two() && BUFFER_POOL_GROW_STEP_BYTES >= PAGE_BYTES);
const _: () = assert!(BUFFER_POOL_SLAB_MAX_BYTES.is_power_of_two() && BUFFER_POOL_SLAB_MAX_BYTES >= REQUEST_MAX_BYTES);
const _: () = assert!(BUFFER_POOL_SLABS_MAX <= u16::MAX as usize);
const _: () = assert!(HUGE_PAGE_BYTES.is_multiple_of(PAGE_BYTES) && BUFFER_POOL_GROW_STEP_BYTES.is_multiple_of(HUGE_PAGE_BYTES));
const _: () = assert!(INFLIGHT_REQUESTS_PER_CONNECTION_DEFAULT <= u16::MAX as usize);
const _: () = assert!(RECV_BUFFER_BYTES >= 2 * sluice_proto::wire::EXTENDED_REQUEST_BYTES);
const _: () = assert!(CACHE_PIECE_MAX_BYTES <= u32::MAX as u64);
const _: () = assert!(BUSY_POLL_DEFAULT_US <= BUSY_POLL_MAX_US && BUSY_POLL_MIN_NS < 1000 * BUSY_POLL_MAX_US);
const _: () = assert!(SLOW_WATCH_INTERVAL_MIN_MS <= SLOW_WATCH_INTERVAL_MAX_MS);
const _: () = assert!(SLOW_WATCH_INTERVAL_MAX_MS <= SLOW_REQUEST_MS_DEFAULT);
const _: () = assert!(ZERO_FILL_CHUNK_BYTES <= REQUEST_MAX_BYTES);
const _: () = assert!(CHUNKS_PER_READ_MAX <= u16::MAX as usize + 1);
const _: () = assert!(CHUNK_AUTO_MIN_BYTES.is_power_of_two() && CHUNK_AUTO_MIN_BYTES >= PAGE_BYTES);
// The largest request in chunks of the smallest automatic size fits the chunk count.
const _: () = assert!(REQUEST_MAX_BYTES / CHUNK_AUTO_MIN_BYTES <= CHUNKS_PER_READ_MAX);
// Every automatic chunk read is large enough to be a rate sample.
const _: () = assert!(RATE_SAMPLE_MIN_BYTES <= CHUNK_AUTO_MIN_BYTES);
const _: () = assert!(CHUNK_WINDOW_COUNT >= 1 && CHUNK_WINDOW_COUNT <= CHUNKS_PER_READ_MAX);
// A remote chunk is a whole request: it costs more than a local device's.
const _: () = assert!(REMOTE_CHUNK_COST_NS > CHUNK_COST_NS);
const _: () = assert!(LINK_DIRECT_RECV_MIN_BYTES <= LINK_RECV_BYTES && 3 * LINK_SEND_PARTS_MAX <= 1024);
const _: () = assert!(REQUEST_PAYLOAD_MAX_BYTES.is_multiple_of(BLOCK_PREFERRED_BYTES));
const _: () = assert!(PIPE_BYTES.is_multiple_of(PAGE_BYTES) && PIPE_BYTES >= SPLICE_MIN_BYTES);
const _: () = assert!(SOCKET_SPLICE_PIPE_SHARE_FIRST.is_power_of_two() && SOCKET_SPLICE_PIPE_SHARE_FIRST <= SOCKET_SPLICE_PIPE_SHARE_MAX);
const _: () = assert!(PIPE_BYTES / SOCKET_SPLICE_PIPE_SHARE_MAX >= SPLICE_MIN_BYTES);
// A spliced read of the largest size fits the chunk count with pipe-sized chunks.
const _: () = assert!(REQUEST_MAX_BYTES / PIPE_BYTES < CHUNKS_PER_READ_MAX);

/// The budgets an operator may change.
#[derive(Clone, Copy, Debug, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields, rename_all = "kebab-case")]
pub struct Limits {
    pub inflight_requests_per_connection: usize,
    pub inflight_bytes_per_connection: usize,
    /// Payload bytes all connections of one worker thread may hold; bounds server memory.
    pub inflight_bytes_per_worker: usize,
    pub connections: usize,
    /// Connections one address (or one Unix peer's uid) may hold at once.
    pub connections_per_client: usize,
    pub handshake_timeout_ms: u64,
    /// Most registered buffer memory per worker thread.
    pub buffer_pool_bytes_per_worker: usize,
    /// Time an unused part of a buffer pool is kept before it is given back.
    pub buffer_pool_quiet_ms: u64,
    /// Time at the backend after which a request is logged and counted as slow; 0: never.
    pub slow_request_ms: u64,
    /// What all exports together may ask of the node's storage, in bytes and operations
    /// per second (issue 27), and how many requests may be at the storage at once: the QoS
    /// scheduler's server-wide caps (`sluice_qos::Limits`). None: no cap.
    #[serde(deserialize_with = "sluice_qos::class::size_opt")]
    pub storage_bps: Option<u64>,
    pub storage_iops: Option<u64>,
    pub storage_inflight: Option<u32>,
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            inflight_requests_per_connection: INFLIGHT_REQUESTS_PER_CONNECTION_DEFAULT,
            inflight_bytes_per_connection: INFLIGHT_BYTES_PER_CONNECTION_DEFAULT,
            inflight_bytes_per_worker: INFLIGHT_BYTES_PER_WORKER_DEFAULT,
            connections: CONNECTIONS_DEFAULT,
            connections_per_client: CONNECTIONS_PER_CLIENT_DEFAULT,
            handshake_timeout_ms: HANDSHAKE_TIMEOUT_MS_DEFAULT,
            buffer_pool_bytes_per_worker: BUFFER_POOL_BYTES_PER_WORKER_DEFAULT,
            buffer_pool_quiet_ms: BUFFER_POOL_QUIET_MS_DEFAULT,
            slow_request_ms: SLOW_REQUEST_MS_DEFAULT,
            storage_bps: None,
            storage_iops: None,
            storage_inflight: None,
        }
    }
}

impl Limits {
    /// The keys whose change a reload cannot apply: every budget but the connection counts
    /// and the handshake timeout is given to the workers when they start.
    pub fn changes_needing_restart(&self, next: &Limits) -> Vec<&'static str> {
        let fixed = [
            ("inflight-requests-per-connection", self.inflight_requests_per_connection != next.inflight_requests_per_connection),
            ("inflight-bytes-per-connection", self.inflight_bytes_per_connection != next.inflight_bytes_per_connection),
            ("inflight-bytes-per-worker", self.inflight_bytes_per_worker != next.inflight_bytes_per_worker),
            ("buffer-pool-bytes-per-worker", self.buffer_pool_bytes_per_worker != next.buffer_pool_bytes_per_worker),
            ("buffer-pool-quiet-ms", self.buffer_pool_quiet_ms != next.buffer_pool_quiet_ms),
            ("slow-request-ms", self.slow_request_ms != next.slow_request_ms),
        ];
        fixed.iter().filter(|(_, changed)| *changed).map(|(key, _)| *key).collect()
    }

    /// Refuses settings that would break an invariant the code relies on.
    pub fn check(&self) -> Result<(), String> {
        if self.inflight_requests_per_connection == 0 || self.inflight_requests_per_connection > u16::MAX as usize {
            return Err("inflight-requests-per-connection must be between 1 and 65535".into());
        }
        if self.inflight_bytes_per_connection < REQUEST_MAX_BYTES {
            return Err(format!(
                "inflight-bytes-per-connection must be at least {REQUEST_MAX_BYTES} (one maximal request)"
            ));
        }
        if self.inflight_bytes_per_worker < self.inflight_bytes_per_connection {
            return Err("inflight-bytes-per-worker must be at least inflight-bytes-per-connection".into());
        }
        if self.connections == 0 {
            return Err("connections must be at least 1".into());
        }
        if self.connections_per_client == 0 {
            return Err("connections-per-client must be at least 1".into());
        }
        self.storage().validate()
    }

    /// The server-wide storage caps, as the QoS scheduler takes them.
    pub fn storage(&self) -> sluice_qos::Limits {
        sluice_qos::Limits { storage_bps: self.storage_bps, storage_iops: self.storage_iops, storage_inflight: self.storage_inflight }
    }

    /// Whether any storage cap is set: then every connection goes through the scheduler.
    pub fn caps_storage(&self) -> bool {
        self.storage() != sluice_qos::Limits::default()
    }

    /// How often a worker looks for slow requests while any request is at a backend: a
    /// quarter of the threshold, so a slow request is reported within a quarter of its age.
    pub fn slow_watch_interval(&self) -> std::time::Duration {
        let ms = (self.slow_request_ms / 4).clamp(SLOW_WATCH_INTERVAL_MIN_MS, SLOW_WATCH_INTERVAL_MAX_MS);
        std::time::Duration::from_millis(ms)
    }
}
