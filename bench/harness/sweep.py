"""Experiment `sweep`: read bandwidth against request size at 1, 2 and 4 outstanding
requests, for each sluice data path with and without pipelined chunks, beside the local
disk and the network ceiling. This is the research's main figure, redrawn on this machine."""

import os
from dataclasses import dataclass
from typing import Optional

import fio
import metrics
import servers
import svg
from measure import Context, repeat_note, run_point
from units import fmt, size_label

SIZES = [1 << e for e in range(12, 23)]          # 4K ... 4M
QUICK_SIZES = [4 << 10, 1 << 20]
DEPTHS = [1, 2, 4]
QUICK_DEPTHS = [1, 4]

PATH_COLORS = {"copy": "#1f77b4", "direct": "#d62728", "splice": "#2ca02c",
               "splice-direct": "#ff7f0e", None: "#9467bd"}


# Chunk of the pipelined sweep curves (the server's default is larger, 1M).
SWEEP_CHUNK = "128K"


@dataclass
class Series:
    key: str                  # column header in the tables
    label: str                # legend in the plots
    server: Optional[servers.Server]   # None: fio on the local file, no server
    disk_bound: bool          # reads the image from the disk: cold cache applies
    color: str
    dash: str = ""


def series_list(ctx: Context) -> list:
    paths = ctx.data_paths or (None,)
    # Pipelined curves use a chunk well below the largest sizes, so splitting shows across
    # most of the sweep; the dashed twins never split.
    chunks = (SWEEP_CHUNK, "0") if "--chunk" in ctx.features else (None,)
    out = []
    for path in paths:
        for chunk in chunks:
            server = servers.sluice(ctx.binary, data_path=path, chunk=chunk,
                                    metrics="--metrics" in ctx.features)
            key = (path or "sluice") + ("/c0" if chunk == "0" else "")
            label = f"sluice {path or '(default path)'}" + (", chunk 0" if chunk == "0" else
                                                           f", chunk {chunk}" if chunk else "")
            out.append(Series(key, label, server, True, PATH_COLORS.get(path, "#8c564b"),
                              "7 4" if chunk == "0" else ""))
    out.append(Series("disk", "local disk (fio, O_DIRECT)", None, True, "#000000"))
    if ctx.have("nbdkit"):
        out.append(Series("null", "ceiling (nbdkit null)", servers.nbdkit_null(ctx.image_size),
                          False, "#7f7f7f", "2 3"))
    return out


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("sweep: read bandwidth vs request size and outstanding requests")
    sizes = QUICK_SIZES if ctx.quick else SIZES
    depths = QUICK_DEPTHS if ctx.quick else DEPTHS
    cold = ctx.cold_ok
    if not cold:
        r.say(f"note: {ctx.cold_reason}; the disk-bound curves run with whatever the page cache holds")
    if not ctx.data_paths:
        r.say("note: this sluice binary has no --data-path: one sluice curve, its default path")
    if "--chunk" not in ctx.features:
        r.say("note: this sluice binary has no --chunk: no 'chunk 0' (unpipelined) curves")
    r.say(f"Sequential reads, {ctx.runtime} s per run. {repeat_note(ctx)} "
          + ("Disk-bound points (sluice, local disk) start with a dropped page cache and stop "
             "after one pass over the image or at the runtime. " if cold else "")
          + "The null ceiling has no storage behind it.")
    if "--chunk" in ctx.features:
        r.say(f"Solid sluice curves split reads into {SWEEP_CHUNK} chunks, all read at once and "
              "each sent as soon as it is read (pipelined); a read no larger than that is never "
              "split, so up to that size a dashed /c0 curve (never split) runs the same "
              "configuration as its solid twin.")

    all_series = series_list(ctx)
    points = {}   # (series key, depth, size) -> Point
    for series in all_series:
        running = None
        if series.server is not None:
            running = ctx.start(series.server, ctx.image)
            if running is None:
                continue
        try:
            for depth in depths:
                for size in sizes:
                    job = fio.Job(rw="read", bs=size, iodepth=depth, runtime=ctx.runtime,
                                  time_based=not (cold and series.disk_bound))
                    command = (fio.nbd_command(running.uri, job) if running
                               else fio.local_command(ctx.image, job))
                    point = run_point(ctx, running, command, job,
                                      name=f"sweep-{series.key}-qd{depth}-{size_label(size)}",
                                      drop_cache=cold and series.disk_bound)
                    points[(series.key, depth, size)] = point
                    r.progress(f"sweep | {series.label} | QD{depth} {size_label(size)}: "
                               + point.summary())
        finally:
            if running:
                running.stop()

    ran = [s for s in all_series if any(k[0] == s.key for k in points)]
    r.say()
    r.say("columns:")
    width = max((len(s.key) for s in ran), default=0)
    for s in ran:
        r.say(f"  {s.key.ljust(width)}  {s.label}")
    for depth in depths:
        rows = [[size_label(size)] + [fmt(_mb(points.get((s.key, depth, size)))) for s in ran]
                for size in sizes]
        r.table(f"MB/s at QD{depth}", ["size"] + [s.key for s in ran], rows)
        path = os.path.join(ctx.out_dir, f"sweep-qd{depth}.svg")
        svg.line_chart(path, f"Read bandwidth vs request size, {depth} outstanding "
                             f"request{'s' if depth > 1 else ''}" + (" (cold cache)" if cold else ""),
                       [svg.Series(s.label, [(size, _mb(points[(s.key, depth, size)]))
                                             for size in sizes
                                             if _mb(points.get((s.key, depth, size))) is not None],
                                   s.color, s.dash) for s in ran],
                       "request size (bytes, log2 scale)", "MB/s (10^6 bytes/s)", size_label,
                       subtitle=f"sequential reads, fio nbd engine, {_runs_text(ctx)}; "
                                f"{os.path.basename(ctx.out_dir)}")
    for (key, depth, size), p in points.items():
        if p.error:
            r.say(f"  {key} QD{depth} {size_label(size)} {'partly failed' if p.ok else 'failed'}: "
                  f"{p.error}")
    _phase_tables(ctx, ran, points, depths, sizes)
    _write_csv(ctx, ran, points, depths, sizes)
    r.say()
    r.say(f"plots: {', '.join(f'sweep-qd{d}.svg' for d in depths)} in {ctx.out_dir}")


def _phase_tables(ctx, ran, points, depths, sizes) -> None:
    r = ctx.report
    sluice_series = [s for s in ran if s.server is not None and s.server.is_sluice]
    if "--metrics" not in ctx.features:
        r.say()
        r.say("note: this sluice binary has no --metrics: no per-phase breakdown")
        return
    for s in sluice_series:
        rows = []
        for depth in depths:
            for size in sizes:
                p = points.get((s.key, depth, size))
                if p is None or not p.phases:
                    continue
                rows.append([size_label(size), depth, fmt(_mb(p))]
                            + [fmt(p.phases.get(ph), 1) for ph in metrics.PHASES])
        if rows:
            r.table(f"{s.label}: mean µs per request in each phase (from /metrics)",
                    ["size", "QD", "MB/s"] + list(metrics.PHASES), rows)
        else:
            r.say()
            r.say(f"note: {s.label}: /metrics gave no {metrics.PHASE_METRIC} samples")


def _write_csv(ctx, ran, points, depths, sizes) -> None:
    rows, phase_rows = [], []
    for s in ran:
        for depth in depths:
            for size in sizes:
                p = points.get((s.key, depth, size))
                if p is None:
                    continue
                rows.append([s.key, s.label, depth, size, _round(_mb(p), 2), p.mb_spread,
                             len(p.good), _round(p.iops, 1), _round(p.lat_us, 2),
                             _round(p.cpu_s_per_gib, 4), p.error])
                if p.phases:
                    phase_rows.append([s.key, depth, size, _round(_mb(p), 2)]
                                      + [_round(p.phases.get(ph), 2) for ph in metrics.PHASES])
    ctx.report.csv("sweep.csv", ["series", "label", "iodepth", "bs", "mb_per_s",
                                 "mb_per_s_min_max", "runs", "iops", "lat_us", "cpu_s_per_gib",
                                 "error"], rows)
    if phase_rows:
        ctx.report.csv("sweep_phases.csv", ["series", "iodepth", "bs", "mb_per_s"]
                       + [f"{ph}_us" for ph in metrics.PHASES], phase_rows)


def _runs_text(ctx) -> str:
    if ctx.repeat == 1:
        return f"{ctx.runtime} s per point"
    return f"median of {ctx.repeat} runs of {ctx.runtime} s per point"


def _mb(point):
    return point.mb_per_s if point is not None and point.ok else None


def _round(value, digits):
    return None if value is None else round(value, digits)
