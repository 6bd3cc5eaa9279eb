"""Experiment `peers`: sluice against nbdkit, qemu-nbd and nbd-server on the same jobs,
with nbdkit's null plugin as the network ceiling. Warm (page cache holds the image) and
cold (page cache dropped before each job; servers use their O_DIRECT or no-cache option)."""

import cache
import fio
import servers
import tlskeys
from build import UNCACHED_DATA_PATHS
from measure import Context, repeat_note, run_point
from units import fmt, fmt_sig, parse_size, percent, ratio

# (label, fio rw, request size, outstanding requests per connection, connections). With
# several connections, each is its own fio job (--numjobs) over its own slice of the image.
JOBS = [
    ("1M seq read QD1", "read", "1M", 1, 1),
    ("1M seq read QD4", "read", "1M", 4, 1),
    ("4K randread QD1", "randread", "4K", 1, 1),
    ("4K randread QD32", "randread", "4K", 32, 1),
    ("1M seq write QD4", "write", "1M", 4, 1),
    ("4K randwrite QD32", "randwrite", "4K", 32, 1),
    ("4K randread QD32 x 8 conns", "randread", "4K", 32, 8),
    ("1M seq read QD8 x 4 conns", "read", "1M", 8, 4),
    ("4K randwrite QD32 x 4 conns", "randwrite", "4K", 32, 4),
]
QUICK_JOBS = ("1M seq read QD4", "4K randread QD32", "4K randwrite QD32",
              "4K randread QD32 x 8 conns")
# Warm reads over TLS (TLS 1.3, AES-GCM as negotiated), sluice against nbdkit --tls=require.
TLS_JOBS = [
    ("1M seq read QD1", "read", "1M", 1),
    ("1M seq read QD8", "read", "1M", 8),
    ("4K randread QD32", "randread", "4K", 32),
]
TLS_HEADERS = ["job", "server", "MB/s", "IOPS", "CPU s/GiB", "CPU µs/IO", "sluice ÷ nbdkit MB/s",
               "sluice ÷ nbdkit CPU/GiB"]
PEER_KINDS = ("nbdkit", "qemu-nbd", "nbd-server")
# The sluice row the overview compares with the peers: what a user gets without tuning.
# Warm: sluice's default data path (splice; read from `sluice serve --help` when it says).
# Cold: direct, the page-cache-free path one sets when the cache is not to be used (splice
# reads through the page cache, so it has no cold rows).
DEFAULT_DATA_PATH = "splice"
COLD_DATA_PATH = "direct"

HEADERS = ["server", "cache", "MB/s", "IOPS", "lat µs", "CPU s/GiB", "CPU µs/IO", "% null",
           "best sluice ÷"]
CSV_HEADERS = ["variant", "job", "rw", "bs", "iodepth", "connections", "server", "cache", "mb_per_s",
               "mb_per_s_min_max", "runs", "iops", "lat_us", "cpu_seconds", "cpu_s_per_gib",
               "cpu_us_per_io", "pct_of_null", "best_sluice_ratio", "bytes", "ios", "seconds",
               "error"]


def server_list(ctx: Context, cold: bool) -> list:
    lineup = []
    if ctx.data_paths:
        for path in ctx.data_paths:
            if not cold or path in UNCACHED_DATA_PATHS:
                lineup.append(servers.sluice(ctx.binary, data_path=path))
    else:
        lineup.append(servers.sluice(ctx.binary))
    if ctx.have("nbdkit"):
        lineup.append(servers.nbdkit_file(cold, ctx.nbdkit_cache_none))
    if ctx.have("qemu-nbd"):
        lineup.append(servers.qemu_nbd(cold, ctx.qemu_aio))
    if ctx.have("nbd-server"):
        lineup.append(servers.nbd_server())
    if ctx.have("nbdkit"):
        lineup.append(servers.nbdkit_null(ctx.image_size))
    return lineup


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("peers: sluice and other NBD servers, same jobs, same client")
    jobs = [j for j in JOBS if not ctx.quick or j[0] in QUICK_JOBS]
    variants = ["warm"]
    if ctx.cold_ok:
        variants.append("cold")
    else:
        r.say(f"note: {ctx.cold_reason}")
    if not ctx.data_paths:
        r.say("note: this sluice binary has no --data-path; sluice runs its default path only "
              "(the per-path rows are skipped)")
    r.say(repeat_note(ctx) + f" fio nbd engine, one connection unless the job says 'x N conns' "
          f"(then N fio jobs, each its own connection over its own 1/N of the image); "
          f"{ctx.runtime} s per run. "
          "Warm: the image (for writes, its scratch copy) is read into the page cache before each "
          "server's runs. Cold: page cache dropped before each "
          "run, and the run stops after one pass over the image (or at the runtime) so no block "
          "is read twice.")
    r.say("Reads use the image, writes its scratch copy. 'best sluice ÷' = MB/s of the fastest "
          "sluice row over this row; '% null' = this row's MB/s over the null ceiling's. sluice "
          f"rows use the default chunk ({ctx.serve_defaults.get('--chunk', 'of the binary')}).")

    csv_rows, overview = [], []
    for variant in variants:
        cold = variant == "cold"
        for label, rw, bs, qd, conns in jobs:
            write = "write" in rw
            img = ctx.scratch if write else ctx.image
            job = fio.Job(rw=rw, bs=parse_size(bs), iodepth=qd, runtime=ctx.runtime,
                          time_based=not cold, numjobs=conns,
                          slice_bytes=fio.slice_for(ctx.image_size, conns, parse_size(bs)))
            measured = []
            for server in server_list(ctx, cold):
                if not cold:
                    # Before each server, not once per job: an O_DIRECT writer (sluice's
                    # direct rows) drops every page it writes from the cache, and the server
                    # after it would write into an uncached file, at a fraction of the rate.
                    cache.warm(img)
                running = ctx.start(server, img)
                if running is None:
                    continue
                try:
                    point = run_point(ctx, running, fio.nbd_command(running.uri, job), job,
                                      name=f"peers-{variant}-{label}-{server.name}",
                                      drop_cache=cold, op="write" if write else "read")
                finally:
                    running.stop()
                r.progress(f"peers {variant} | {label} | {server.name}: {point.summary()}")
                measured.append((server, point))
            _job_table(ctx, variant, (label, rw, bs, qd, conns), measured, csv_rows, overview)
    _tls(ctx, csv_rows)
    r.csv("peers.csv", CSV_HEADERS, csv_rows)
    _overview(ctx, overview)


def _tls(ctx: Context, csv_rows: list) -> None:
    """The TLS rows: the same client and image, both servers requiring TLS."""
    r = ctx.report
    if not ctx.have("nbdkit"):
        r.say("note: no TLS rows (nbdkit is missing)")
        return
    keys = tlskeys.make(ctx.workdir)
    if keys is None:
        r.say("note: no TLS rows (certtool from gnutls-bin is missing)")
        return
    certs, home = keys
    r.say("TLS rows: warm reads, both servers with --tls=require and the same X.509 certificate; "
          "fio's nbd engine (libnbd, GnuTLS) negotiates TLS 1.3 with AES-GCM. sluice encrypts in "
          "user space (no kTLS on this kernel unless the log says otherwise); the CPU columns "
          "are the server's.")
    rows = []
    jobs = [j for j in TLS_JOBS if not ctx.quick or j[0] != "1M seq read QD1"]
    for label, rw, bs, qd in jobs:
        cache.warm(ctx.image)
        job = fio.Job(rw=rw, bs=parse_size(bs), iodepth=qd, runtime=ctx.runtime, time_based=True)
        measured = {}
        for server in (servers.sluice(ctx.binary, tls=certs),
                       servers.nbdkit_file(False, ctx.nbdkit_cache_none, tls=certs)):
            running = ctx.start(server, ctx.image)
            if running is None:
                continue
            try:
                command = ["env", f"HOME={home}"] + fio.nbd_command(running.uri, job)
                point = run_point(ctx, running, command, job, name=f"peers-tls-{label}-{server.name}",
                                  drop_cache=False)
            finally:
                running.stop()
            r.progress(f"peers tls | {label} | {server.name}: {point.summary()}")
            measured[server.kind] = (server, point)
        s, n = measured.get("sluice"), measured.get("nbdkit")
        mb = ratio(s[1].mb_per_s, n[1].mb_per_s) if s and n and s[1].ok and n[1].ok else "-"
        cpu = ratio(s[1].cpu_s_per_gib, n[1].cpu_s_per_gib) if s and n and s[1].ok and n[1].ok else "-"
        for kind, (server, p) in measured.items():
            first = kind == "sluice"
            rows.append([label if first else "", server.name, fmt(p.mb_per_s), fmt(p.iops),
                         fmt_sig(p.cpu_s_per_gib), fmt_sig(p.cpu_us_per_io),
                         mb if first else "", cpu if first else ""])
            csv_rows.append(["tls", label, rw, bs, qd, 1, server.name, server.cache,
                             _r(p.mb_per_s, 2), p.mb_spread, len(p.good), _r(p.iops, 1),
                             _r(p.lat_us, 2), _r(p.cpu_seconds, 3), _r(p.cpu_s_per_gib, 4),
                             _r(p.cpu_us_per_io, 3), None, None, _int(p.bytes), _int(p.ios),
                             _r(p.seconds, 3), p.error])
            if p.error:
                r.say(f"  {server.name} {'partly failed' if p.ok else 'failed'}: {p.error}")
    r.table("[tls] sluice and nbdkit, both --tls=require (X.509), warm", TLS_HEADERS, rows, left=2)


def _job_table(ctx, variant, spec, measured, csv_rows, overview) -> None:
    label = spec[0]
    sluice_rows = [(s, p) for s, p in measured if s.is_sluice and p.ok]
    best = max(sluice_rows, key=lambda sp: sp[1].mb_per_s, default=(None, None))
    best_mb = best[1].mb_per_s if best[1] else None
    null_mb = next((p.mb_per_s for s, p in measured if s.kind == "null" and p.ok), None)
    rows = []
    for server, p in measured:
        vs = ratio(best_mb, p.mb_per_s) if server.kind != "null" else "-"
        rows.append([server.name, server.cache, fmt(p.mb_per_s), fmt(p.iops), fmt(p.lat_us),
                     fmt_sig(p.cpu_s_per_gib), fmt_sig(p.cpu_us_per_io),
                     percent(p.mb_per_s, null_mb), vs if p.ok else "failed (below)"])
        csv_rows.append([variant, *spec, server.name, server.cache,
                         _r(p.mb_per_s, 2), p.mb_spread, len(p.good), _r(p.iops, 1),
                         _r(p.lat_us, 2), _r(p.cpu_seconds, 3),
                         _r(p.cpu_s_per_gib, 4), _r(p.cpu_us_per_io, 3),
                         _r(100 * p.mb_per_s / null_mb if p.ok and null_mb else None, 1),
                         _r(best_mb / p.mb_per_s if p.ok and best_mb and p.mb_per_s else None, 3),
                         _int(p.bytes), _int(p.ios), _r(p.seconds, 3), p.error])
    ctx.report.table(f"[{variant}] {label}", HEADERS, rows, left=2)
    for server, p in measured:
        if p.error:
            ctx.report.say(f"  {server.name} {'partly failed' if p.ok else 'failed'}: {p.error}")
    peers = {}
    for server, p in measured:
        if server.kind in PEER_KINDS and p.ok:
            peers[server.kind] = p.mb_per_s
    preferred = _preferred(ctx, variant, sluice_rows)
    pref_mb = preferred[1].mb_per_s if preferred else None
    overview.append([label, variant, preferred[0].name if preferred else "-",
                     best[0].name if best[0] else "-", fmt(pref_mb), fmt(best_mb)]
                    + [ratio(pref_mb, peers.get(k)) for k in PEER_KINDS]
                    + [percent(pref_mb, null_mb)])


def _preferred_path(ctx, variant):
    """The data path of the overview's sluice row; None: the binary has no --data-path, so
    its one sluice row (default path) is it."""
    if not ctx.data_paths:
        return None
    if variant == "cold":
        return COLD_DATA_PATH
    return ctx.serve_defaults.get("--data-path", DEFAULT_DATA_PATH)


def _preferred(ctx, variant, sluice_rows):
    """The (server, point) of the overview's sluice row, or None when it did not run."""
    path = _preferred_path(ctx, variant)
    return next(((s, p) for s, p in sluice_rows if s.data_path == path), None)


def _overview(ctx, overview) -> None:
    if not overview:
        return
    which = (f"sluice {_preferred_path(ctx, 'warm')} (the default data path) warm, "
             f"sluice {_preferred_path(ctx, 'cold')} cold"
             if ctx.data_paths else "sluice's default data path")
    ctx.report.table(f"peers overview: {which} (MB/s, × each peer, % null), "
                     "beside the fastest sluice row (best MB/s)",
                     ["job", "cache", "sluice", "best sluice", "MB/s", "best MB/s", "× nbdkit",
                      "× qemu-nbd", "× nbd-server", "% null"], overview, left=4)


def _r(value, digits):
    return None if value is None else round(value, digits)


def _int(value):
    return None if value is None else int(round(value))
