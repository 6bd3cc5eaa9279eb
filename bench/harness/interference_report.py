"""The tables, notes, CSV files and charts of the `interference` experiment (interference.py
measures): the full-speed pass, where every server serves as fast as it can, and the
equal-load pass, where fio holds every server to one rate.

Rows are interference.Row objects, read only through their fields and median(), so this
module needs nothing from interference.py and interference.py can import it.
"""

import os
import statistics
from dataclasses import dataclass


import svg
from report import format_markdown
from scale import cpu_list
from units import fmt, fmt_sig, ratio

CONTROL_NAME = "control: CPU spin"
SLOWDOWN_COLOR, ALONE_COLOR, WITH_COLOR = "#d62728", "#1f77b4", "#ff7f0e"
# An equal-load row whose I/O fell more than this far below the rate served less than the
# others, which flatters its slowdown: the table flags it.
SHORT_SHARE = 0.05

HEADERS = ["server", "cache", "job alone MB/s", "drift", "job w/ I/O MB/s", "job slowdown",
           "other CPUs busy", "I/O alone MB/s", "I/O w/ job MB/s", "I/O kept", "CPU s/GiB alone",
           "CPU s/GiB w/ job", "slowdown per GB/s", "slowdown ÷ nbdkit", "I/O ÷ nbdkit"]
EQUAL_HEADERS = ["server", "cache", "job alone MB/s", "drift", "job w/ I/O MB/s",
                 "job slowdown", "I/O MB/s", "of rate", "other CPUs busy", "CPU s/GiB",
                 "slowdown ÷ nbdkit"]
# Both passes' CSV files open with these columns, one row per server (and the control).
CSV_HEAD = ["server", "cache", "data_path", "server_cpus", "client_cpus", "job_cpus",
            "array_mib", "runs"]
CSV_HEADERS = CSV_HEAD + [
    "job_alone_mb_per_s", "job_alone_min_max", "job_before_mb_per_s", "job_after_mb_per_s",
    "drift_pct", "job_with_io_mb_per_s", "job_with_io_min_max", "slowdown_pct",
    "other_cpus_busy_pct", "io_alone_mb_per_s", "io_with_job_mb_per_s", "io_with_job_min_max",
    "io_kept_pct", "cpu_s_per_gib_alone", "cpu_s_per_gib_with_job", "slowdown_pct_per_gb_s",
    "slowdown_vs_nbdkit", "io_vs_nbdkit", "error"]
EQUAL_CSV_HEADERS = CSV_HEAD + [
    "rate_mb_per_s", "job_alone_mb_per_s", "job_alone_min_max", "drift_pct",
    "job_with_io_mb_per_s", "job_with_io_min_max", "slowdown_pct", "io_mb_per_s",
    "io_min_max", "io_of_rate_pct", "io_short", "other_cpus_busy_pct", "cpu_s_per_gib",
    "slowdown_vs_nbdkit", "error"]
RUN_CSV_HEADERS = ["server", "run", "job_before_mb_per_s", "job_after_mb_per_s",
                   "job_with_io_mb_per_s", "samples_before_with_after", "other_cpus_busy_pct",
                   "io_alone_mb_per_s", "io_with_job_mb_per_s", "cpu_s_per_gib_alone",
                   "cpu_s_per_gib_with_job", "error"]


@dataclass
class Setup:
    """What every table, file and chart of one run shares."""
    ctx: object                 # measure.Context
    place: object               # interference.Placement
    mib: int                    # the job's array size
    intro: list                 # the lines above each table: machine, placement, job, load
    load: str                   # the load's label, e.g. "1M seq read QD8"

    @property
    def where(self) -> str:
        return f"job on {cores(self.place.job)}, server on {cores(self.place.server)}"


def cores(cpus: list) -> str:
    return ("CPU " if len(cpus) == 1 else "CPUs ") + cpu_list(cpus)


def pct(x, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def full(setup: Setup, rows: list) -> None:
    """The full-speed pass: printed, interference.md, .csv, _runs.csv and two charts."""
    ref = _reference(rows)
    title = (f"[interference] job slowdown and I/O kept, {setup.load} against a triad on "
             f"{cores(setup.place.job)}")
    markdown = format_markdown(HEADERS, [_table_row(row, ref) for row in rows], left=2)
    publish(setup, "interference", title, markdown, _notes(rows, ref))
    r = setup.ctx.report
    r.csv("interference.csv", CSV_HEADERS, [_csv_row(setup, row, ref) for row in rows])
    _runs_csv(setup, "interference_runs.csv", rows)
    _slowdown_chart(setup, rows, "interference-slowdown.svg",
                    f"Job slowdown while the server serves {setup.load} (lower is better)",
                    "'spin': no I/O, the other CPUs busy in registers")
    _cpu_chart(setup, [row for row in rows if row.kind != "control"])


def equal(setup: Setup, rows: list, rate: int, why: str, full_rows: list) -> None:
    """The equal-load pass at `rate` MB/s: printed, interference_equal.md, .csv, _runs.csv
    and a chart. full_rows: the full-speed pass, for its control row."""
    ref = _reference(rows)
    title = f"[interference] equal load: every server at {rate:,} MB/s ({setup.load})"
    markdown = format_markdown(EQUAL_HEADERS, [_equal_row(row, ref, rate) for row in rows],
                               left=2)
    notes = _equal_notes(rows, rate, why, _control(full_rows))
    publish(setup, "interference_equal", title, markdown, notes)
    setup.ctx.report.csv("interference_equal.csv", EQUAL_CSV_HEADERS,
                         [_equal_csv_row(setup, row, ref, rate) for row in rows])
    _runs_csv(setup, "interference_equal_runs.csv", rows)
    _slowdown_chart(setup, rows, "interference-equal-slowdown.svg",
                    f"Job slowdown with every server at {rate:,} MB/s (lower is better)",
                    f"{setup.load}, fio --rate")


def skipped(setup: Setup, why: str) -> None:
    setup.ctx.report.say()
    setup.ctx.report.say(f"[interference] no equal-load pass: {why}")


def publish(setup: Setup, name: str, title: str, markdown: str, notes: list) -> None:
    """Print a table under its title with its notes, and keep the same as NAME.md."""
    r = setup.ctx.report
    r.say()
    r.say(title)
    r.say(markdown)
    for line in notes:
        r.say(line)
    with open(os.path.join(setup.ctx.out_dir, name + ".md"), "w", encoding="utf-8") as f:
        f.write(f"# {title}\n\n" + "\n\n".join(setup.intro) + "\n\n" + markdown + "\n\n"
                + "\n\n".join(notes) + "\n")


def _reference(rows: list):
    return next((row for row in rows if row.kind == "nbdkit"), None)


def _control(rows: list):
    return next((row for row in rows if row.kind == "control"), None)


def _ref_median(ref, figure: str):
    return ref.median(figure) if ref else None


def _job_cells(row) -> list:
    """The job's columns, the same in both tables."""
    m = row.median
    return [fmt(m("baseline")), pct(m("drift"), signed=True), fmt(m("with_io")),
            pct(m("slowdown"))]


def _table_row(row, ref) -> list:
    m = row.median
    return [row.name, row.cache] + _job_cells(row) + [
        pct(m("busy")), fmt(m("io_alone_mb")), fmt(m("io_with_mb")), pct(m("kept")),
        fmt_sig(m("cpu_alone")), fmt_sig(m("cpu_with")), _per_gbs(m("slowdown_per_gbs")),
        _vs(m("slowdown"), _ref_median(ref, "slowdown")),
        ratio(m("io_with_mb"), _ref_median(ref, "io_with_mb"))]


def _equal_row(row, ref, rate: int) -> list:
    m = row.median
    return [row.name, row.cache] + _job_cells(row) + [
        fmt(m("io_with_mb")), _of_rate_cell(m("io_with_mb"), rate), pct(m("busy")),
        fmt_sig(m("cpu_with")), _vs(m("slowdown"), _ref_median(ref, "slowdown"))]


def _of_rate(io_mb, rate: int):
    return io_mb / rate if io_mb is not None and rate else None


def _short(io_mb, rate: int) -> bool:
    share = _of_rate(io_mb, rate)
    return share is not None and share < 1 - SHORT_SHARE


def _of_rate_cell(io_mb, rate: int) -> str:
    text = pct(_of_rate(io_mb, rate))
    return text + " SHORT" if _short(io_mb, rate) else text


def _per_gbs(x) -> str:
    return "-" if x is None else f"{x:.1f}%"


def _vs(value, reference) -> str:
    """A slowdown over nbdkit's; '-' when nbdkit's is not above zero (within noise of none)."""
    x = _slowdown_ratio(value, reference)
    return "-" if x is None else f"{x:.2f}x"


def _slowdown_ratio(value, reference):
    if value is None or reference is None or reference <= 0:
        return None
    return value / reference


def _notes(rows: list, ref) -> list:
    notes = ["Reading it: 'job slowdown' = 1 - job w/ I/O ÷ job alone; 'other CPUs busy' = the "
             "share of the server's and fio's CPUs not idle (/proc/stat) during that run; 'I/O "
             "kept' = I/O w/ job ÷ I/O alone; CPU s/GiB = the server's user + system time per "
             "GiB served, with the I/O alone and with the job; 'slowdown per GB/s' = the "
             "slowdown over the GB/s served with the job; the last two columns divide this "
             "row's slowdown and its I/O with the job by nbdkit's ('-': nbdkit's slowdown is "
             f"not above zero). '{CONTROL_NAME}': the same windows with a register-only loop on "
             "the other CPUs instead of I/O; an I/O row's slowdown beyond it is what its memory "
             "traffic costs the job. A slowdown of a few tenths of a percent, or below zero, is "
             "within noise.",
             "Full speed: every server serves as fast as it can, so the rows serve different "
             "rates and, where the server's CPUs are all busy, each row's slowdown mixes how "
             "much it serves with what each byte costs; the equal-load table below holds every "
             "server to one rate and compares the cost per byte."]
    if ref is None:
        notes.append("note: no nbdkit row, so no ratio columns.")
    return notes + _spread_notes(rows)


def _equal_notes(rows: list, rate: int, why: str, control) -> list:
    notes = [f"Equal load: each server row again with fio held to {rate:,} MB/s (--rate; {why}), "
             "the job alone just before and just after as in the full-speed pass, no 'I/O "
             "alone' run. Every row now does the same work, so the job's slowdown compares "
             "what each server costs per byte served. 'of rate' = I/O ÷ the rate, SHORT when "
             f"it fell more than {SHORT_SHARE:.0%} below (that row served less, which "
             "flatters its slowdown); 'other CPUs busy' = the share of the server's and fio's "
             "CPUs not idle (/proc/stat); CPU s/GiB = the server's, with the job running; "
             "'slowdown ÷ nbdkit' = this row's slowdown over nbdkit's at the same rate.",
             "Why this is the fair comparison: where the server's CPUs and the job's are not "
             "independent (SMT siblings, a hypervisor's vCPUs on shared cores) a busy server "
             "CPU slows the job whatever it does; at full speed every server keeps its CPUs "
             "busy, so that floor hides the memory traffic. At an equal rate a server that "
             "needs less CPU and less memory traffic per byte leaves both idle more of the "
             "time, and the job shows it." + _control_text(control)]
    short = [row.name for row in rows if _short(row.median("io_with_mb"), rate)]
    if short:
        notes.append(f"SHORT: {', '.join(short)} served more than {SHORT_SHARE:.0%} below "
                     f"{rate:,} MB/s; lower --interference-rate to compare them.")
    if _reference(rows) is None:
        notes.append("note: no nbdkit row, so no ratio column.")
    return notes + _spread_notes(rows)


def _control_text(control) -> str:
    """The full-speed spin control's figures, to read the busy column against."""
    if control is None:
        return ""
    return (f" The full-speed '{CONTROL_NAME}' row held the same CPUs "
            f"{pct(control.median('busy'))} busy and slowed the job by "
            f"{pct(control.median('slowdown'))}, with no memory traffic: read each row's "
            "'other CPUs busy' against that.")


def _spread_notes(rows: list) -> list:
    """How far the job alone wandered over the pass, and each row's errors."""
    notes = []
    alone = [v for row in rows for rep in row.reps for v in (rep.before, rep.after) if v]
    if alone:
        mid = statistics.median(alone)
        spread = 100 * (max(alone) - min(alone)) / mid
        notes.append(f"job alone over every window of every row: median {mid:,.0f} MB/s, "
                     f"{min(alone):,.0f}..{max(alone):,.0f} ({spread:.1f}% of the median, "
                     f"{len(alone)} windows): a slowdown smaller than this spread needs more "
                     "--repeat or a longer --runtime before it means anything.")
    return notes + [f"  {row.name}: {row.error}" for row in rows if row.error]


def _csv_head(setup: Setup, row) -> list:
    place = setup.place
    return [row.name, row.cache, row.data_path, cpu_list(place.server),
            cpu_list(place.client), cpu_list(place.job), setup.mib, len(row.reps)]


def _csv_row(setup: Setup, row, ref) -> list:
    m = row.median
    return _csv_head(setup, row) + [
        _r(m("baseline"), 1), row.spread("baseline"), _r(m("before"), 1), _r(m("after"), 1),
        _r100(m("drift")), _r(m("with_io"), 1), row.spread("with_io"), _r100(m("slowdown")),
        _r100(m("busy")), _r(m("io_alone_mb"), 1), _r(m("io_with_mb"), 1),
        row.spread("io_with_mb"), _r100(m("kept")), _r(m("cpu_alone"), 4),
        _r(m("cpu_with"), 4), _r(m("slowdown_per_gbs"), 2),
        _r(_slowdown_ratio(m("slowdown"), _ref_median(ref, "slowdown")), 3),
        _r(_ratio(m("io_with_mb"), _ref_median(ref, "io_with_mb")), 3), row.error]


def _equal_csv_row(setup: Setup, row, ref, rate: int) -> list:
    m = row.median
    return _csv_head(setup, row) + [
        rate, _r(m("baseline"), 1), row.spread("baseline"), _r100(m("drift")),
        _r(m("with_io"), 1), row.spread("with_io"), _r100(m("slowdown")),
        _r(m("io_with_mb"), 1), row.spread("io_with_mb"),
        _r100(_of_rate(m("io_with_mb"), rate)), int(_short(m("io_with_mb"), rate)),
        _r100(m("busy")), _r(m("cpu_with"), 4),
        _r(_slowdown_ratio(m("slowdown"), _ref_median(ref, "slowdown")), 3), row.error]


def _runs_csv(setup: Setup, name: str, rows: list) -> None:
    setup.ctx.report.csv(name, RUN_CSV_HEADERS,
                         [_run_csv_row(row, i, rep) for row in rows
                          for i, rep in enumerate(row.reps)])


def _run_csv_row(row, i: int, rep) -> list:
    return [row.name, i + 1, _r(rep.before, 1), _r(rep.after, 1), _r(rep.with_io, 1),
            "/".join(map(str, rep.samples)), _r100(rep.busy), _r(rep.io_alone_mb, 1),
            _r(rep.io_with_mb, 1), _r(rep.cpu_alone, 4), _r(rep.cpu_with, 4), rep.error]


def _slowdown_chart(setup: Setup, rows: list, name: str, title: str, about: str) -> None:
    slowdown = [None if s is None else 100 * s for s in (row.median("slowdown") for row in rows)]
    svg.bar_chart(os.path.join(setup.ctx.out_dir, name), title, [_label(row) for row in rows],
                  [svg.Series("job slowdown %", slowdown, SLOWDOWN_COLOR)], "job slowdown %",
                  subtitle=f"triad, {setup.where}; sluice rows named by data path; {about}",
                  value_label=lambda v: f"{v:.1f}%")


def _cpu_chart(setup: Setup, served: list) -> None:
    svg.bar_chart(os.path.join(setup.ctx.out_dir, "interference-cpu.svg"),
                  "Server CPU per GiB served (lower is better)", [_label(row) for row in served],
                  [svg.Series("I/O alone", [row.median("cpu_alone") for row in served],
                              ALONE_COLOR),
                   svg.Series("with the job", [row.median("cpu_with") for row in served],
                              WITH_COLOR)],
                  "CPU s/GiB", subtitle=f"user + system time of the server; {setup.where}",
                  value_label=lambda v: f"{v:.3g}")


def _label(row) -> str:
    """A bar's label: sluice rows by data path, the control as 'spin'."""
    if row.kind == "control":
        return "spin"
    if row.kind == "sluice" and "busy-poll=0" in row.name:
        return f"{row.data_path} bp0"
    return row.data_path or row.name


def _ratio(a, b):
    return a / b if a is not None and b else None


def _r(value, digits):
    return None if value is None else round(value, digits)


def _r100(value):
    return None if value is None else round(100 * value, 2)
