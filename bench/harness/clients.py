"""Experiment `clients`: 1 to 256 connections, each writing 64K at random offsets with one
request outstanding. A server that owns its flow control keeps aggregate throughput flat as
clients grow, and its memory inside its budget."""

import os

import cache
import fio
import proc
import servers
from measure import Context, repeat_note, run_point
from units import fmt, fmt_sig

COUNTS = [1 << i for i in range(9)]       # 1 ... 256
QUICK_COUNTS = [1, 16, 256]
REQUEST_BYTES = 64 << 10
FLAT_WITHIN = 0.10                        # "flat": the last count within 10% of the peak

# sluice's defaults (README, Limits): per worker thread, 256 MiB of payload in flight and a
# 64 MiB pool of registered buffers; one worker per CPU it may run on.
SLUICE_INFLIGHT_BYTES_PER_WORKER = 256 << 20
SLUICE_BUFFER_POOL_BYTES_PER_WORKER = 64 << 20
MIB = 1 << 20

HEADERS = ["clients", "MB/s", "IOPS", "lat µs", "peak RSS MiB", "CPU s/GiB"]


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("clients: many connections, 64K random writes, one request outstanding each")
    counts = QUICK_COUNTS if ctx.quick else COUNTS
    # Every connection comes from 127.0.0.1, and sluice by default lets one client address
    # hold 128 (`[limits] connections-per-client`): the largest N must fit.
    limits = os.path.join(ctx.workdir, "clients-limits.toml")
    with open(limits, "w") as f:
        f.write(f"[limits]\nconnections-per-client = {max(counts)}\n")
    lineup = [servers.sluice(ctx.binary, config=limits)]
    if ctx.have("nbdkit"):
        lineup.append(servers.nbdkit_file(cold=False, has_cache_none=ctx.nbdkit_cache_none))
    r.say(f"fio numjobs=N --thread: N connections, {ctx.runtime} s per run, writes to the scratch "
          "image through the page cache (buffered). sluice runs its default data path "
          f"({ctx.serve_defaults.get('--data-path', 'as the binary chooses')}), with "
          f"[limits] connections-per-client = {max(counts)} (its default, 128 per client "
          "address, would refuse the rest: every connection comes from 127.0.0.1). "
          f"{repeat_note(ctx)} Each server starts fresh for each N and serves all its runs, so "
          "its peak RSS (VmHWM over its process tree) is the peak over that N's runs.")

    csv_rows = []
    for server in lineup:
        rows, results = [], []
        for n in counts:
            # Every server starts with the scratch image cached, whatever ran before it.
            cache.warm(ctx.scratch)
            running = ctx.start(server, ctx.scratch)
            if running is None:
                break
            job = fio.Job(rw="randwrite", bs=REQUEST_BYTES, iodepth=1, runtime=ctx.runtime,
                          numjobs=n)
            try:
                point = run_point(ctx, running, fio.nbd_command(running.uri, job), job,
                                  name=f"clients-{server.name}-{n}", drop_cache=False, op="write")
                rss = proc.peak_rss_bytes(running.pid)
            finally:
                running.stop()
            r.progress(f"clients | {server.name} | {n} connections: {point.summary()}"
                       + (f", peak RSS {rss / MIB:,.0f} MiB" if point.ok else ""))
            results.append((n, point, rss))
            rows.append([n, fmt(point.mb_per_s), fmt(point.iops), fmt(point.lat_us),
                         fmt(rss / MIB), fmt_sig(point.cpu_s_per_gib),
                         "ok" if point.ok else "failed (below)"])
            csv_rows.append([server.name, n, _round(point.mb_per_s, 2), point.mb_spread,
                             len(point.good), _round(point.iops, 1), _round(point.lat_us, 2), rss,
                             _round(point.cpu_s_per_gib, 4), point.error])
        if rows:
            if all(row[-1] == "ok" for row in rows):
                rows = [row[:-1] for row in rows]
                headers = HEADERS
            else:
                headers = HEADERS + ["fio"]
            r.table(server.name, headers, rows, left=0)
            for n, p, _ in results:
                if p.error:
                    r.say(f"  {n} clients {'partly failed' if p.ok else 'failed'}: {p.error}")
            _verdicts(ctx, server, results)
    r.csv("clients.csv", ["server", "clients", "mb_per_s", "mb_per_s_min_max", "runs", "iops",
                          "lat_us", "peak_rss_bytes", "cpu_s_per_gib", "error"], csv_rows)


def sluice_budget_bytes() -> tuple:
    workers = len(os.sched_getaffinity(0))
    per_worker = SLUICE_INFLIGHT_BYTES_PER_WORKER + SLUICE_BUFFER_POOL_BYTES_PER_WORKER
    return workers * per_worker, (f"{workers} workers × ({SLUICE_INFLIGHT_BYTES_PER_WORKER // MIB} "
                                  f"MiB in flight + {SLUICE_BUFFER_POOL_BYTES_PER_WORKER // MIB} "
                                  f"MiB registered buffers)")


def _verdicts(ctx, server, results) -> None:
    r = ctx.report
    ok = [(n, p, rss) for n, p, rss in results if p.ok]
    if not ok:
        return
    peak_n, peak_p, _ = max(ok, key=lambda t: t[1].mb_per_s)
    last_n, last_p, _ = ok[-1]
    share = last_p.mb_per_s / peak_p.mb_per_s if peak_p.mb_per_s else 0
    flat = share >= 1 - FLAT_WITHIN
    r.say(f"{server.name}: {last_n} clients reach {share:.1%} of the peak "
          f"({peak_p.mb_per_s:,.0f} MB/s at {peak_n}): "
          f"{'flat (within 10%)' if flat else 'NOT within 10% of the peak'}")
    max_rss = max(rss for _, _, rss in results)
    if server.is_sluice:
        budget, how = sluice_budget_bytes()
        within = max_rss <= budget
        r.say(f"{server.name}: peak RSS {max_rss / MIB:,.0f} MiB against a budget of "
              f"{budget / MIB:,.0f} MiB = {how}: {'within' if within else 'OVER'} budget")
    else:
        r.say(f"{server.name}: peak RSS {max_rss / MIB:,.0f} MiB (no memory budget to compare with)")


def _round(value, digits):
    return None if value is None else round(value, digits)
