"""Experiment `scale`: throughput and server CPU per request as connections and server
threads grow. sluice (`--threads T`) against nbdkit (`-t T`), each beside a null ceiling
run the same way, on 4K random reads at QD32 and 1M sequential reads at QD8 per connection.
With four or more cores the server is pinned to the first half of them and fio to the
other half, so client and server do not take each other's cores; on fewer cores they
share every core and nothing is pinned."""

import os
from dataclasses import dataclass, replace
from typing import Optional

import cache
import fio
import servers
import svg
from measure import Context, repeat_note, run_point
from units import fmt, fmt_sig, parse_size, percent, ratio

CONNECTIONS = [1, 2, 4, 8, 16]
QUICK_CONNECTIONS = [1, 4, 16]
# (label, fio rw, request size, outstanding requests per connection, headline figure, unit)
JOBS = [
    ("4K randread QD32", "randread", "4K", 32, "iops", "IOPS"),
    ("1M seq read QD8", "read", "1M", 8, "mb_per_s", "MB/s"),
]
# Pinning needs a half for each side; with fewer cores the halves would be a single core.
PIN_MIN_CORES = 4
# nbdkit's -t is per connection (nbdkit(1)); without -t a connection gets 16 workers.
NBDKIT_DEFAULT_THREADS = 16

# One color per server family; the shade darkens as threads grow; ceilings are dashed.
FAMILY_COLORS = {"sluice": "#2ca02c", "sluice --busy-poll 0": "#d62728", "nbdkit": "#1f77b4",
                 "null (sluice)": "#bcbd22", "null (nbdkit)": "#7f7f7f"}
CEILING_DASH = "7 4"

CSV_HEADERS = ["job", "rw", "bs", "iodepth", "server", "threads", "connections", "server_cpus",
               "client_cpus", "mb_per_s", "mb_per_s_min_max", "runs", "iops", "lat_us",
               "cpu_seconds", "cpu_s_per_gib", "cpu_us_per_io", "bytes", "ios", "seconds", "error"]


@dataclass
class Placement:
    server_cpus: list
    client_cpus: list

    @property
    def pinned(self) -> bool:
        return self.server_cpus != self.client_cpus


@dataclass
class Series:
    """One server at one thread count: a line in the charts, a row in the tables."""
    family: str                 # sluice, sluice --busy-poll 0, nbdkit, null (sluice), null (nbdkit)
    threads: Optional[int]      # None: the server's default
    server: servers.Server
    reads_image: bool           # serves the image (warm the page cache first)

    @property
    def threads_label(self) -> str:
        if self.threads is not None:
            return str(self.threads)
        return f"default ({NBDKIT_DEFAULT_THREADS}/conn)"

    @property
    def label(self) -> str:
        flag = "--threads" if "sluice" in self.family else "-t"
        return (f"{self.family} {flag} {self.threads}" if self.threads is not None
                else f"{self.family} ({NBDKIT_DEFAULT_THREADS}/conn)")


def placement() -> Placement:
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < PIN_MIN_CORES:
        return Placement(cpus, cpus)
    half = len(cpus) // 2
    return Placement(cpus[:half], cpus[half:])


def cpu_list(cpus: list) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8', as taskset -c and fio's --cpus_allowed read it."""
    parts, start = [], None
    for i, c in enumerate(cpus):
        if start is None:
            start = c
        if i + 1 == len(cpus) or cpus[i + 1] != c + 1:
            parts.append(str(start) if start == c else f"{start}-{c}")
            start = None
    return ",".join(parts)


def thread_counts(cores: int, quick: bool) -> list:
    """Powers of two up to the server's cores, and the core count itself; quick: 1 and max."""
    if quick:
        return sorted({1, cores})
    counts = [1 << i for i in range(cores.bit_length()) if 1 << i <= cores]
    return counts if counts[-1] == cores else counts + [cores]


def lineup(ctx: Context, counts: list, place: Placement) -> list:
    size = ctx.image_size
    out = [Series("sluice", t, servers.sluice(ctx.binary, threads=t), True) for t in counts]
    if "--busy-poll" in ctx.features:
        # The default spins before sleeping; this row shows what that buys, at each count.
        out += [Series("sluice --busy-poll 0", t, servers.sluice(ctx.binary, threads=t, busy_poll=0), True)
                for t in counts]
    nbdkit_counts = counts + ([] if NBDKIT_DEFAULT_THREADS in counts else [None])
    if ctx.have("nbdkit"):
        out += [Series("nbdkit", t, servers.nbdkit_file(False, ctx.nbdkit_cache_none, threads=t),
                       True) for t in nbdkit_counts]
    out += [Series("null (sluice)", t, servers.sluice_null(ctx.binary, size, threads=t), False)
            for t in counts]
    if ctx.have("nbdkit"):
        out += [Series("null (nbdkit)", t, servers.nbdkit_null(size, threads=t), False)
                for t in nbdkit_counts]
    if place.pinned:
        for s in out:
            s.server = replace(s.server, cpus=cpu_list(place.server_cpus))
    return out


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("scale: connections x server threads, sluice and nbdkit, with their null ceilings")
    place = placement()
    counts = thread_counts(len(place.server_cpus), ctx.quick)
    conns = QUICK_CONNECTIONS if ctx.quick else CONNECTIONS
    _describe(ctx, place, counts, conns)
    client_cpus = cpu_list(place.client_cpus) if place.pinned else None

    points, csv_rows = {}, []
    series = lineup(ctx, counts, place)
    for s in series:
        if s.reads_image:
            cache.warm(ctx.image)
        running = ctx.start(s.server, ctx.image)
        if running is None:
            continue
        try:
            for label, rw, bs, qd, _, _ in JOBS:
                for n in conns:
                    job = fio.Job(rw=rw, bs=parse_size(bs), iodepth=qd, runtime=ctx.runtime,
                                  numjobs=n, cpus=client_cpus,
                                  slice_bytes=fio.slice_for(ctx.image_size, n, parse_size(bs)))
                    point = run_point(ctx, running, fio.nbd_command(running.uri, job), job,
                                      name=f"scale-{label}-{s.label}-{n}", drop_cache=False)
                    r.progress(f"scale | {label} | {s.label} | {n} conn{'s' if n > 1 else ''}: "
                               f"{point.summary()}")
                    points[(label, s.label, n)] = point
                    csv_rows.append(_csv_row((label, rw, bs, qd), s, n, place, point))
        finally:
            running.stop()
    r.csv("scale.csv", CSV_HEADERS, csv_rows)
    for spec in JOBS:
        _job_tables(ctx, spec, series, conns, points)
        _charts(ctx, spec, series, counts, conns, points, place)


def _describe(ctx: Context, place: Placement, counts: list, conns: list) -> None:
    r = ctx.report
    if place.pinned:
        r.say(f"{len(place.server_cpus) + len(place.client_cpus)} cores: servers pinned to "
              f"{_cores(place.server_cpus)} (taskset -c), fio to {_cores(place.client_cpus)} "
              "(--cpus_allowed).")
    else:
        r.say(f"note: {len(place.server_cpus)} cores (fewer than {PIN_MIN_CORES}): server and fio "
              "share every core and nothing is pinned, so fio takes CPU from the server it "
              f"measures; threads go up to {len(place.server_cpus)}. Run on {PIN_MIN_CORES}+ cores "
              "for pinned numbers.")
    r.say(f"Threads {', '.join(map(str, counts))}; connections {', '.join(map(str, conns))}; "
          f"{ctx.runtime} s per run. {repeat_note(ctx)} Each connection is its own fio job "
          "(--numjobs) over its own 1/N of the image; the image is warm (read once before each "
          "server starts). Each server at each thread count starts once and serves every point.")
    r.say(f"sluice --threads T: T workers in all. nbdkit -t T: T workers per connection "
          f"(nbdkit's default, {NBDKIT_DEFAULT_THREADS}, is its own row), so nbdkit at C "
          "connections runs C x T workers; both run on the same cores. The ceilings "
          "(`sluice serve null:SIZE`, nbdkit's null plugin) vary threads the same way. "
          "CPU µs/IO: the server's user + system time over the requests.")


def _cores(cpus: list) -> str:
    return ("core " if len(cpus) == 1 else "cores ") + cpu_list(cpus)


def _csv_row(spec, s: Series, n: int, place: Placement, p) -> list:
    return [*spec, s.family, s.threads_label, n, cpu_list(place.server_cpus),
            cpu_list(place.client_cpus), _r(p.mb_per_s, 2), p.mb_spread, len(p.good),
            _r(p.iops, 1), _r(p.lat_us, 2), _r(p.cpu_seconds, 3), _r(p.cpu_s_per_gib, 4),
            _r(p.cpu_us_per_io, 3), _int(p.bytes), _int(p.ios), _r(p.seconds, 3), p.error]


def _job_tables(ctx, spec, series, conns, points) -> None:
    label, _, _, _, figure, unit = spec
    r = ctx.report
    headers = ["server", "threads"] + [f"{n} conn" + ("s" if n > 1 else "") for n in conns]
    for title, value, cell in ((unit, figure, fmt), ("server CPU µs/IO", "cpu_us_per_io", fmt_sig)):
        rows = []
        for s in series:
            row = [s.family, s.threads_label]
            for n in conns:
                p = points.get((label, s.label, n))
                row.append("not run" if p is None else cell(getattr(p, value)) if p.ok else "failed")
            rows.append(row)
        r.table(f"[scale] {label}: {title}", headers, rows, left=2)
    for s in series:
        for n in conns:
            p = points.get((label, s.label, n))
            if p is not None and p.error:
                r.say(f"  {s.label}, {n} conns {'partly failed' if p.ok else 'failed'}: {p.error}")
    _best_table(ctx, spec, series, conns, points)


def _best(series, family, label, conns_n, points, figure):
    """(series, point) of the family's thread count with the highest figure, or (None, None)."""
    found = [(s, points.get((label, s.label, conns_n))) for s in series if s.family == family]
    found = [(s, p) for s, p in found if p is not None and p.ok]
    return max(found, key=lambda sp: getattr(sp[1], figure), default=(None, None))


def _best_table(ctx, spec, series, conns, points) -> None:
    label, _, _, _, figure, unit = spec
    rows = []
    for n in conns:
        s, sp = _best(series, "sluice", label, n, points, figure)
        k, kp = _best(series, "nbdkit", label, n, points, figure)
        _, sn = _best(series, "null (sluice)", label, n, points, figure)
        _, kn = _best(series, "null (nbdkit)", label, n, points, figure)
        s_val, k_val = _value(sp, figure), _value(kp, figure)
        rows.append([n, fmt(s_val), s.threads_label if s else "-", fmt(k_val),
                     k.threads_label if k else "-", ratio(s_val, k_val),
                     fmt_sig(_value(sp, "cpu_us_per_io")), fmt_sig(_value(kp, "cpu_us_per_io")),
                     percent(s_val, _value(sn, figure)), percent(k_val, _value(kn, figure))])
    ctx.report.table(
        f"[scale] {label}: each server at its best thread count ({unit}; % of its own ceiling "
        "at its best)",
        ["conns", f"sluice {unit}", "threads", f"nbdkit {unit}", "threads", "sluice ÷ nbdkit",
         "sluice µs/IO", "nbdkit µs/IO", "sluice % null", "nbdkit % null"], rows, left=0)


def _value(point, figure: str):
    return getattr(point, figure) if point is not None else None


def _charts(ctx, spec, series, counts, conns, points, place) -> None:
    label, _, bs, qd, figure, unit = spec
    where = (f"server on {_cores(place.server_cpus)}, fio on {_cores(place.client_cpus)}"
             if place.pinned else f"{len(place.server_cpus)} cores shared, not pinned")
    stem = f"scale-{bs.lower()}"
    lines = []
    for s in series:
        pts = [(n, getattr(p, figure)) for n in conns
               for p in [points.get((label, s.label, n))] if p is not None and p.ok]
        lines.append(svg.Series(s.label, pts, _shade(s, series),
                                CEILING_DASH if s.family.startswith("null") else ""))
    svg.line_chart(os.path.join(ctx.out_dir, f"{stem}-{unit.lower().replace('/', '')}.svg"),
                   f"{label}: {unit} vs connections", lines, "connections", unit,
                   subtitle=f"one line per server and thread count; {where}")

    # CPU per request against threads, at one connection and at the most; nbdkit's default
    # (-t per connection, not a count of threads in all) has no place on this axis.
    lines = []
    for family, color in FAMILY_COLORS.items():
        for n, dash in ((conns[0], "7 4"), (conns[-1], "")):
            pts = [(s.threads, p.cpu_us_per_io) for s in series
                   if s.family == family and s.threads is not None
                   for p in [points.get((label, s.label, n))]
                   if p is not None and p.ok and p.cpu_us_per_io is not None]
            if any(s.family == family for s in series):
                lines.append(svg.Series(f"{family}, {n} conn" + ("s" if n > 1 else ""), pts,
                                        color, dash))
    svg.line_chart(os.path.join(ctx.out_dir, f"{stem}-cpu.svg"),
                   f"{label}: server CPU µs per request vs threads", lines, "server threads",
                   "CPU µs/IO", subtitle=f"dashed: {conns[0]} connection, solid: {conns[-1]}; "
                   f"threads {', '.join(map(str, counts))}; {where}")


def _shade(s: Series, series: list) -> str:
    """The family's color, lighter for fewer threads (the default, most threads, darkest)."""
    same = [x for x in series if x.family == s.family]
    rank = same.index(s)
    mix = 0.6 * (len(same) - 1 - rank) / max(1, len(same) - 1)
    base = FAMILY_COLORS[s.family]
    rgb = [int(base[i:i + 2], 16) for i in (1, 3, 5)]
    return "#" + "".join(f"{round(c + (255 - c) * mix):02x}" for c in rgb)


def _r(value, digits):
    return None if value is None else round(value, digits)


def _int(value):
    return None if value is None else int(round(value))
