"""The tables, notes, CSV files and chart of the `ceph` experiment (ceph.py measures).

Rows are ceph.Row objects, read only through their fields and methods, so this module needs
nothing from ceph.py and ceph.py can import it (the side names and the goal live here).
"""

import os
import statistics

import svg
from report import format_markdown
from units import fmt, fmt_sig

CEILING, SLUICE = "ceiling", "sluice"
SIDES = (CEILING, SLUICE)
# The bar: sluice through NBD at this share of the ceiling or better.
GOAL = 0.85
CEILING_COLOR, SLUICE_COLOR = "#7f7f7f", "#2ca02c"

TABLE_HEADERS = ["job", "ceiling IOPS", "ceiling MB/s", "ceiling lat µs", "sluice IOPS",
                 "sluice MB/s", "sluice lat µs", "sluice ÷ ceiling", "runs' ratios", "goal"]
CPU_HEADERS = ["job", "side", "MB/s", "sluice s/GiB", "sluice µs/IO", "OSD s/GiB", "OSD µs/IO",
               "fio s/GiB", "fio µs/IO", "sum s/GiB", "CPUs busy"]
CSV_HEADERS = [
    "job", "rw", "bs", "iodepth", "runtime_s", "runs_ceiling", "runs_sluice",
    "ceiling_mb_per_s", "ceiling_mb_per_s_min_max", "ceiling_iops", "ceiling_lat_us",
    "sluice_mb_per_s", "sluice_mb_per_s_min_max", "sluice_iops", "sluice_lat_us",
    "ratio", "ratio_runs_median", "ratio_runs_min_max", "goal", "meets_goal",
    "sluice_cpu_s_per_gib", "sluice_cpu_us_per_io",
    "osd_cpu_s_per_gib_ceiling", "osd_cpu_s_per_gib_sluice",
    "osd_cpu_us_per_io_ceiling", "osd_cpu_us_per_io_sluice",
    "fio_cpu_s_per_gib_ceiling", "fio_cpu_s_per_gib_sluice",
    "fio_cpu_us_per_io_ceiling", "fio_cpu_us_per_io_sluice",
    "sum_cpu_s_per_gib_ceiling", "sum_cpu_s_per_gib_sluice",
    "cpus_busy_pct_ceiling", "cpus_busy_pct_sluice", "error"]
RUN_CSV_HEADERS = ["job", "side", "run", "first", "mb_per_s", "iops", "lat_us", "bytes", "ios",
                   "seconds", "sluice_cpu_s", "osd_cpu_s", "fio_cpu_s", "cpus_busy_pct",
                   "after", "leftovers_cleared", "error"]


def publish(ctx, intro: list, rows: list, sluice_ok: bool) -> None:
    """Print both tables with their notes; write ceph.md, ceph.csv, ceph_runs.csv and
    ceph-ratio.svg."""
    r = ctx.report
    title = (f"[ceph] sluice over NBD against fio's rbd engine on one RBD image "
             f"(goal: sluice ≥ {GOAL:.2f}x the ceiling)")
    table = format_markdown(TABLE_HEADERS, [_table_row(ctx, row) for row in rows], left=1)
    cpu_title = "[ceph] CPU per GiB and per request, each side (lower is better)"
    cpu_table = format_markdown(CPU_HEADERS, [cells for row in rows for cells in _cpu_rows(row)],
                                left=2)
    notes = _notes(rows, sluice_ok)
    cpu_notes = _cpu_notes()
    r.say()
    r.say(title)
    r.say(table)
    for line in notes:
        r.say(line)
    r.say()
    r.say(cpu_title)
    r.say(cpu_table)
    for line in cpu_notes:
        r.say(line)
    with open(os.path.join(ctx.out_dir, "ceph.md"), "w", encoding="utf-8") as f:
        f.write(f"# {title}\n\n" + "\n\n".join(intro) + "\n\n" + table + "\n\n"
                + "\n\n".join(notes) + f"\n\n## {cpu_title}\n\n" + cpu_table + "\n\n"
                + "\n\n".join(cpu_notes) + "\n")
    r.csv("ceph.csv", CSV_HEADERS, [_csv_row(ctx, row) for row in rows])
    r.csv("ceph_runs.csv", RUN_CSV_HEADERS,
          [_run_row(row, s) for row in rows for s in sorted(row.samples,
                                                            key=lambda s: (s.rep, not s.first))])
    _chart(ctx, rows)


def _table_row(ctx, row) -> list:
    m = row.median
    ratio = row.ratio
    paired = row.paired
    runs = (f"{min(paired):.2f}..{max(paired):.2f}" if len(paired) > 1
            else "-" if not paired or ctx.repeat == 1 else f"{paired[0]:.2f}")
    return [row.label, fmt(m(CEILING, "iops")), fmt(m(CEILING, "mb_per_s")),
            fmt(m(CEILING, "lat_us")), fmt(m(SLUICE, "iops")), fmt(m(SLUICE, "mb_per_s")),
            fmt(m(SLUICE, "lat_us")), "-" if ratio is None else f"{ratio:.2f}x", runs,
            _goal_cell(ratio)]


def _goal_cell(ratio) -> str:
    if ratio is None:
        return "-"
    return "met" if ratio >= GOAL else "MISSED"


def _cpu_rows(row) -> list:
    out = []
    for side in SIDES:
        if not row.side(side):
            continue  # not run at all (no rbd backend in this sluice)
        m = lambda figure: row.median(side, figure)  # noqa: E731
        sluice_side = side == SLUICE
        out.append([row.label, side, fmt(m("mb_per_s")),
                    fmt_sig(m("sluice_s_per_gib")) if sluice_side else "-",
                    fmt_sig(m("sluice_us_per_io")) if sluice_side else "-",
                    fmt_sig(m("osd_s_per_gib")), fmt_sig(m("osd_us_per_io")),
                    fmt_sig(m("fio_s_per_gib")), fmt_sig(m("fio_us_per_io")),
                    fmt_sig(m("total_s_per_gib")), _pct(m("busy"))])
    return out


def _notes(rows: list, sluice_ok: bool) -> list:
    notes = ["Reading it: IOPS and MB/s (10^6 bytes/s) as fio reports them; lat µs is fio's "
             "mean completion latency; 'sluice ÷ ceiling' = sluice's median MB/s over the "
             "ceiling's (the same as IOPS: one request size per job); 'runs' ratios' = min..max "
             "of the same ratio within each repeat, where drift between repeats cancels; "
             f"'goal' = met when the ratio is {GOAL:.2f}x or more."]
    judged = [row for row in rows if row.ratio is not None]
    if judged:
        missed = [f"{row.label} ({row.ratio:.2f}x)" for row in judged if row.ratio < GOAL]
        verdict = (f"goal sluice ≥ {GOAL:.2f}x the ceiling: met on "
                   f"{len(judged) - len(missed)} of {len(judged)} jobs")
        notes.append(verdict + (f"; missed on {', '.join(missed)}." if missed else "."))
    elif not sluice_ok:
        notes.append("no verdict: the sluice side did not run (this sluice has no rbd backend).")
    else:
        notes.append("no verdict: no job has figures for both sides.")
    left = [(row, s) for row in rows for s in row.samples if s.leftover]
    if left:
        notes.append("LEFTOVERS: before these runs the image still had the watch (and, after "
                     "writes, the exclusive lock) of the client of the run before, which had "
                     "ended without closing the image. Left alone, the next client waits on "
                     "them (a writer about 30 s inside its run, until the OSD drops the watch "
                     "and the lock can be broken); the harness cleared them outside the "
                     "measured run (blocklisted the dead client, removed its lock): "
                     + "; ".join(f"{row.label} {s.side} run {s.rep + 1}, after {s.after}: "
                                 f"{s.leftover}" for row, s in left) + ".")
    for row in rows:
        for side in SIDES:
            error = row.error(side)
            if error:
                notes.append(f"  {row.label}, {side} {'partly failed' if row.good(side) else 'failed'}: "
                             f"{error}")
    return notes


def _cpu_notes() -> list:
    return ["Columns: CPU seconds per GiB moved and CPU µs per request of sluice (its process "
            "tree: NBD and librbd), the OSD and fio (the client: librbd on the ceiling side, "
            "libnbd on the sluice side), each over the same run; 'sum' = sluice + OSD + fio; "
            "'CPUs busy' = share of the CPUs not idle during the run. The OSD's figure on the "
            "sluice row against the ceiling row shows whether the OSD had the CPU it needed.",
            "Per request and per GiB are the same time divided two ways: read µs/IO for the "
            "4K jobs, s/GiB for the 1M job."]


def _csv_row(ctx, row) -> list:
    m = row.median
    paired = row.paired
    ratio = row.ratio
    return [row.label, row.rw, row.bs, row.iodepth, ctx.runtime, len(row.good(CEILING)),
            len(row.good(SLUICE)),
            _r(m(CEILING, "mb_per_s"), 2), row.spread(CEILING), _r(m(CEILING, "iops"), 1),
            _r(m(CEILING, "lat_us"), 2),
            _r(m(SLUICE, "mb_per_s"), 2), row.spread(SLUICE), _r(m(SLUICE, "iops"), 1),
            _r(m(SLUICE, "lat_us"), 2),
            _r(ratio, 4), _r(_median(paired), 4),
            f"{min(paired):.4f}..{max(paired):.4f}" if paired else None, GOAL,
            None if ratio is None else int(ratio >= GOAL),
            _r(m(SLUICE, "sluice_s_per_gib"), 4), _r(m(SLUICE, "sluice_us_per_io"), 3),
            _r(m(CEILING, "osd_s_per_gib"), 4), _r(m(SLUICE, "osd_s_per_gib"), 4),
            _r(m(CEILING, "osd_us_per_io"), 3), _r(m(SLUICE, "osd_us_per_io"), 3),
            _r(m(CEILING, "fio_s_per_gib"), 4), _r(m(SLUICE, "fio_s_per_gib"), 4),
            _r(m(CEILING, "fio_us_per_io"), 3), _r(m(SLUICE, "fio_us_per_io"), 3),
            _r(m(CEILING, "total_s_per_gib"), 4), _r(m(SLUICE, "total_s_per_gib"), 4),
            _r100(m(CEILING, "busy")), _r100(m(SLUICE, "busy")),
            "; ".join(e for e in (row.error(CEILING), row.error(SLUICE)) if e)]


def _run_row(row, s) -> list:
    res = s.result
    return [row.label, s.side, s.rep + 1, int(s.first), _r(s.mb_per_s, 2), _r(s.iops, 1),
            _r(s.lat_us, 2), res.bytes if res else None, res.ios if res else None,
            _r(res.seconds, 3) if res else None, _r(s.sluice_cpu, 3), _r(s.osd_cpu, 3),
            _r(s.fio_cpu, 3), _r100(s.busy), s.after, s.leftover,
            s.error]


def _chart(ctx, rows: list) -> None:
    """Each job's sluice MB/s as a share of its ceiling's: the ceiling is 100%."""
    ceiling = [100.0 if row.median(CEILING, "mb_per_s") else None for row in rows]
    sluice = [None if row.ratio is None else 100 * row.ratio for row in rows]
    svg.bar_chart(os.path.join(ctx.out_dir, "ceph-ratio.svg"),
                  "sluice over NBD as a share of fio's rbd engine (higher is better)",
                  [row.label for row in rows],
                  [svg.Series("ceiling: fio rbd engine", ceiling, CEILING_COLOR),
                   svg.Series("sluice: fio nbd engine", sluice, SLUICE_COLOR)],
                  "% of the ceiling's MB/s",
                  subtitle=f"goal: sluice at {100 * GOAL:.0f}% or more; medians, "
                           f"{ctx.runtime} s runs, {ctx.repeat} per side",
                  value_label=lambda v: f"{v:.0f}%")


def _pct(x) -> str:
    return "-" if x is None else f"{100 * x:.0f}%"


def _median(values: list):
    return statistics.median(values) if values else None


def _r(value, digits):
    return None if value is None else round(value, digits)


def _r100(value):
    return None if value is None else round(100 * value, 2)
