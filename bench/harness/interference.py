"""Experiment `interference`: how much does serving remote reads slow down a memory-bound job
running on the serving node, and how much I/O does the server keep while the job runs?

The claim under test (bench/README.md, Experiment 6): a server whose data path makes no CPU
copies (splice, O_DIRECT) barely disturbs the job, while copying servers take memory bandwidth
from it. The job is triad.c (a STREAM-style triad) on cores of its own; the server and fio run
on the others, so what the job loses is memory bandwidth and cache, not CPU time. Run only
with `--only interference`.
"""

import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Optional

import cache
import fio
import machine
import proc
import servers
import svg
import triadjob
from measure import Context, Run, run_point
from report import format_markdown
from scale import cpu_list
from units import fmt, fmt_sig, parse_size, ratio

# sluice's rows, in table order: the copying path first, then the short ones.
DATA_PATHS = ("copy", "splice", "direct", "splice-direct")
UNCACHED_PATHS = ("direct", "splice-direct")
# The remote reader's load: one connection, 1M sequential reads, 8 outstanding.
LOAD_LABEL, LOAD_RW, LOAD_BS, LOAD_QD = "1M seq read QD8", "read", "1M", 8
# After SIGCONT the job's next sample spans the pause; skip it before an alone window.
SETTLE_SECONDS = 0.3
SLOWDOWN_COLOR, ALONE_COLOR, WITH_COLOR = "#d62728", "#1f77b4", "#ff7f0e"
CONTROL_NAME = "control: CPU spin"

HEADERS = ["server", "cache", "job alone MB/s", "drift", "job w/ I/O MB/s", "job slowdown",
           "other CPUs busy", "I/O alone MB/s", "I/O w/ job MB/s", "I/O kept", "CPU s/GiB alone",
           "CPU s/GiB w/ job", "slowdown per GB/s", "slowdown ÷ nbdkit", "I/O ÷ nbdkit"]
CSV_HEADERS = ["server", "cache", "data_path", "server_cpus", "client_cpus", "job_cpus",
               "array_mib", "runs", "job_alone_mb_per_s", "job_alone_min_max",
               "job_before_mb_per_s", "job_after_mb_per_s", "drift_pct", "job_with_io_mb_per_s",
               "job_with_io_min_max", "slowdown_pct", "other_cpus_busy_pct", "io_alone_mb_per_s",
               "io_with_job_mb_per_s", "io_with_job_min_max", "io_kept_pct",
               "cpu_s_per_gib_alone", "cpu_s_per_gib_with_job", "slowdown_pct_per_gb_s",
               "slowdown_vs_nbdkit", "io_vs_nbdkit", "error"]
RUN_CSV_HEADERS = ["server", "run", "job_before_mb_per_s", "job_after_mb_per_s",
                   "job_with_io_mb_per_s", "samples_before_with_after", "other_cpus_busy_pct",
                   "io_alone_mb_per_s",
                   "io_with_job_mb_per_s", "cpu_s_per_gib_alone", "cpu_s_per_gib_with_job",
                   "error"]


@dataclass
class Placement:
    server: list
    client: list
    job: list

    @property
    def separated(self) -> bool:
        """The job has cores that neither the server nor fio may use."""
        return not set(self.job) & set(self.server + self.client)

    @property
    def others(self) -> list:
        """The server's and fio's CPUs together."""
        return sorted(set(self.server + self.client))


def placement(cpus=None) -> Placement:
    """4+ cores: server on the first quarter, fio on the second, the job on the second half.
    2-3 cores: the job on the last core, server and fio together on the others. One core:
    nothing can be separated."""
    cpus = sorted(cpus if cpus is not None else os.sched_getaffinity(0))
    if len(cpus) >= 4:
        half = len(cpus) // 2
        quarter = max(1, half // 2)
        return Placement(cpus[:quarter], cpus[quarter:half], cpus[half:])
    if len(cpus) >= 2:
        return Placement(cpus[:-1], cpus[:-1], cpus[-1:])
    return Placement(cpus, cpus, cpus)


@dataclass
class Rep:
    """One repetition of a row: the job alone before, with the I/O, alone after; the I/O alone
    (job paused) and with the job."""
    io_alone: Optional[Run] = None
    io_with: Optional[Run] = None
    before: Optional[float] = None      # job MB/s, median of its samples in each window
    with_io: Optional[float] = None
    after: Optional[float] = None
    samples: tuple = (0, 0, 0)          # how many samples each window held
    busy: Optional[float] = None        # share of the server's and fio's CPUs busy meanwhile

    @property
    def baseline(self):
        """The job alone: the mean of just before and just after, so slow drift cancels."""
        known = [v for v in (self.before, self.after) if v is not None]
        return sum(known) / len(known) if known else None

    @property
    def drift(self):
        return self.after / self.before - 1 if self.before and self.after else None

    @property
    def slowdown(self):
        base = self.baseline
        return 1 - self.with_io / base if base and self.with_io is not None else None

    io_alone_mb = property(lambda self: self.io_alone.mb_per_s if self.io_alone else None)
    io_with_mb = property(lambda self: self.io_with.mb_per_s if self.io_with else None)

    @property
    def kept(self):
        a, w = self.io_alone_mb, self.io_with_mb
        return w / a if a and w is not None else None

    @property
    def slowdown_per_gbs(self):
        """Percent of the job lost per GB/s served: rows that serve at different rates (the
        O_DIRECT rows are held to the disk's) compare per unit of work."""
        s, w = self.slowdown, self.io_with_mb
        return 100 * s / (w / 1000) if s is not None and w else None

    cpu_alone = property(lambda self: self.io_alone.cpu_s_per_gib if self.io_alone else None)
    cpu_with = property(lambda self: self.io_with.cpu_s_per_gib if self.io_with else None)

    @property
    def error(self) -> str:
        errors = [r.error for r in (self.io_alone, self.io_with) if r is not None and r.error]
        if self.with_io is None or self.baseline is None:
            errors.append("no job sample inside a window (runtime shorter than a sample?)")
        return "; ".join(errors)


@dataclass
class Row:
    name: str
    cache: str
    kind: str                           # the server's kind, or "control"
    data_path: str = ""                 # sluice's --data-path
    reps: list = field(default_factory=list)

    def median(self, figure: str):
        values = [v for v in (getattr(r, figure) for r in self.reps) if v is not None]
        return statistics.median(values) if values else None

    def spread(self, figure: str):
        values = [v for v in (getattr(r, figure) for r in self.reps) if v is not None]
        return f"{min(values):.1f}..{max(values):.1f}" if values else None

    @property
    def error(self) -> str:
        return "; ".join(dict.fromkeys(r.error for r in self.reps if r.error))


def lineup(ctx: Context, place: Placement) -> list:
    paths = [p for p in DATA_PATHS if p in ctx.data_paths] if ctx.data_paths else [None]
    out = [servers.sluice(ctx.binary, data_path=p) for p in paths]
    if ctx.have("nbdkit"):
        out.append(servers.nbdkit_file(False, ctx.nbdkit_cache_none))
    if ctx.have("qemu-nbd"):
        out.append(servers.qemu_nbd(False, ctx.qemu_aio))
    if not place.separated:
        return out
    return [replace(s, cpus=cpu_list(place.server)) for s in out]


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("interference: a memory-bound job on the serving node, with and without remote reads")
    binary = triadjob.compile_triad(r, ctx.workdir, ctx.allow_install)
    if binary is None:
        raise RuntimeError("no triad job: it needs a C compiler (cc, from build-essential)")
    place = placement()
    llc = triadjob.llc_bytes()
    mib = triadjob.array_mib(llc)
    intro = _describe(ctx, place, llc, mib)
    for line in intro:
        r.say(line)
    saved = os.sched_getaffinity(0)
    if place.separated:
        # The harness itself (its fio and triad reader threads, the page-cache warming) keeps
        # off the job's cores too; servers and fio are pinned on their own.
        os.sched_setaffinity(0, set(place.server + place.client))
    try:
        rows = [_control_row(ctx, place, binary, mib)] if place.separated else []
        for server in lineup(ctx, place):
            row = _measure_row(ctx, server, place, binary, mib)
            if row is not None:
                rows.append(row)
    finally:
        os.sched_setaffinity(0, saved)
    _report(ctx, place, mib, rows, intro)


def _describe(ctx: Context, place: Placement, llc: Optional[int], mib: int) -> list:
    """The lines above the table, printed and kept in interference.md."""
    threads = len(place.job)
    llc_text = f"{llc >> 20} MiB last-level cache" if llc else "no cache size in /sys"
    lines = [f"machine: {machine.one_line()}",
             f"placement: {_placement_line(place)}",
             f"job: triad.c (cc {' '.join(triadjob.CFLAGS)}), a[i] = b[i] + s*c[i] over 3 x "
             f"{mib} MiB of doubles ({llc_text}; the arrays span at least "
             f"{triadjob.LLC_MULTIPLE}x it), {threads} thread{'s' if threads > 1 else ''}, one "
             f"per job core; MB/s counts 24 bytes per element (STREAM's convention), median of "
             f"its {triadjob.SAMPLE_MS} ms samples inside each window.",
             f"load: fio nbd engine, {LOAD_LABEL}, one connection, {ctx.runtime} s per run, on "
             f"{ctx.image} ({ctx.image_size >> 20} MiB). copy, splice, nbdkit and qemu-nbd read "
             "it warm from the page cache (read once before each row); direct and splice-direct "
             "read it with O_DIRECT from the disk whatever the cache holds.",
             "each run: (b) the I/O alone, job paused (SIGSTOP); the job alone for the runtime; "
             "(c) the I/O with the job running; the job alone again. 'job alone' is the mean of "
             "the two alone windows (the baseline used), 'drift' how far the second lay from "
             "the first. " + _repeat_text(ctx),
             f"note: {_separation_note(place)}"]
    return lines


def _placement_line(place: Placement) -> str:
    if not place.separated:
        return (f"one core ({cpu_list(place.job)}): server, fio and job share it, nothing "
                "pinned; the job's slowdown includes the CPU time the server and fio take")
    shared = place.server == place.client
    fio_text = "fio on the same" if shared else f"fio on {_cores(place.client)}"
    return (f"server on {_cores(place.server)} (taskset -c), {fio_text} (taskset -c and "
            f"--cpus_allowed), job on {_cores(place.job)} (taskset -c, a thread pinned per core)")


def _cores(cpus: list) -> str:
    return ("CPU " if len(cpus) == 1 else "CPUs ") + cpu_list(cpus)


def _separation_note(place: Placement) -> str:
    if not place.separated:
        return ("with one core the job competes for CPU time as well as memory; run on 2+ "
                "cores to see memory contention alone.")
    text = ("server and fio run only on CPUs the job does not use, so the job's slowdown is "
            "memory-bus and cache contention, not CPU time taken from it, provided the "
            f"'{CONTROL_NAME}' row shows no slowdown: it keeps those CPUs busy with a loop in "
            "registers and no memory traffic, so whatever it costs the job comes from sharing "
            "the processor (a hypervisor time-slicing vCPUs, SMT siblings, a power budget), and "
            "an I/O row can only be read above it. The client (fio) runs on the serving node "
            "too (loopback): its own receive copy (socket to its buffer) adds bus traffic equal "
            "for all servers, a floor no server can go below.")
    if place.server == place.client:
        text += (" On this small machine server and fio also share one core, so a server that "
                 "needs more CPU per GiB serves less; compare 'slowdown per GB/s' and "
                 "'other CPUs busy'.")
    return text


def _repeat_text(ctx: Context) -> str:
    if ctx.repeat == 1:
        return "One run per row (--repeat 1)."
    return f"Medians of {ctx.repeat} runs per row, each figure on its own."


def _fio_command(uri: str, job: fio.Job) -> list:
    command = fio.nbd_command(uri, job)
    # --cpus_allowed pins fio's I/O thread only; taskset keeps its main thread off the job too.
    return ["taskset", "-c", job.cpus] + command if job.cpus else command


def _measure_row(ctx: Context, server: servers.Server, place: Placement, binary: str,
                 mib: int) -> Optional[Row]:
    if server.data_path not in UNCACHED_PATHS:
        cache.warm(ctx.image)
    running = ctx.start(server, ctx.image)
    if running is None:
        return None
    job = fio.Job(rw=LOAD_RW, bs=parse_size(LOAD_BS), iodepth=LOAD_QD, runtime=ctx.runtime,
                  cpus=cpu_list(place.client) if place.separated else None)
    command = _fio_command(running.uri, job)
    # The job's own time limit, in case the harness cannot stop it: the whole row, generously.
    guard = ctx.repeat * (4 * ctx.runtime + 2 * fio.FIO_GRACE_SECONDS) + 60
    row = Row(server.name, _cache_label(server), server.kind, server.data_path or "")
    try:
        triad = triadjob.Triad(binary, cpu_list(place.job) if place.separated else None, mib,
                               guard, os.path.join(ctx.logdir, "triad.log"))
        try:
            for i in range(ctx.repeat):
                rep = _repetition(ctx, place, running, triad, command, job,
                                  f"interference-{server.name}", i)
                row.reps.append(rep)
                ctx.report.progress(f"interference | {server.name} | run {i + 1}: "
                                    f"{_rep_summary(rep)}")
        finally:
            triad.stop()
    finally:
        running.stop()
    return row


def _repetition(ctx, place, running, triad, command, job, name, i) -> Rep:
    once = replace(ctx, repeat=1)
    suffix = f"-run{i + 1}"
    rep = Rep()
    triad.pause()
    try:
        rep.io_alone = run_point(once, running, command, job, name=f"{name}-io-alone{suffix}",
                                 drop_cache=False).runs[0]
    finally:
        triad.resume()
    time.sleep(SETTLE_SECONDS)
    rep.before, n_before = triad.median(*triad.alone(ctx.runtime))
    started, ticks = time.time(), proc.cpu_ticks(place.others)
    rep.io_with = run_point(once, running, command, job, name=f"{name}-with-job{suffix}",
                            drop_cache=False).runs[0]
    rep.busy = _busy(ticks, proc.cpu_ticks(place.others))
    rep.with_io, n_with = triad.median(*_io_window(rep.io_with, started, time.time(), ctx.runtime))
    rep.after, n_after = triad.median(*triad.alone(ctx.runtime))
    rep.samples = (n_before, n_with, n_after)
    return rep


def _control_row(ctx: Context, place: Placement, binary: str, mib: int) -> Row:
    """The job alone, beside a CPU-only load on the server's and fio's CPUs, alone again."""
    row = Row(CONTROL_NAME, f"no I/O: spin on {_cores(place.others)}", "control")
    guard = ctx.repeat * (4 * ctx.runtime + 30) + 60
    log = os.path.join(ctx.logdir, "triad.log")
    triad = triadjob.Triad(binary, cpu_list(place.job), mib, guard, log)
    try:
        for i in range(ctx.repeat):
            rep = Rep()
            rep.before, n_before = triad.median(*triad.alone(ctx.runtime))
            spin = triadjob.Triad(binary, cpu_list(place.others), None, ctx.runtime + 60, log)
            try:
                ticks = proc.cpu_ticks(place.others)
                window = triad.alone(ctx.runtime)  # alone but for the spin
                rep.busy = _busy(ticks, proc.cpu_ticks(place.others))
            finally:
                spin.stop()
            rep.with_io, n_with = triad.median(*window)
            rep.after, n_after = triad.median(*triad.alone(ctx.runtime))
            rep.samples = (n_before, n_with, n_after)
            row.reps.append(rep)
            ctx.report.progress(f"interference | {CONTROL_NAME} | run {i + 1}: "
                                f"{_rep_summary(rep)}")
    finally:
        triad.stop()
    return row


def _busy(before: tuple, after: tuple):
    busy, total = after[0] - before[0], after[1] - before[1]
    return busy / total if total > 0 else None


def _io_window(run: Run, started: float, ended: float, runtime: int) -> tuple:
    """The seconds fio did I/O: from its report's timestamp back by its runtime; without a
    timestamp, the last `runtime` seconds before fio exited."""
    result = run.result
    if result is not None and result.ended and started <= result.ended <= ended + 1:
        return result.ended - result.seconds, result.ended
    return max(started, ended - runtime), ended


def _rep_summary(rep: Rep) -> str:
    io = (f"; I/O {fmt(rep.io_alone_mb)} MB/s alone, {fmt(rep.io_with_mb)} with the job"
          if rep.io_alone else "")
    return (f"job {fmt(rep.baseline)} MB/s alone, {fmt(rep.with_io)} with the load "
            f"({_pct(rep.slowdown)} slower), other CPUs {_pct(rep.busy)} busy{io}; "
            f"samples {rep.samples}" + (f"; {rep.error}" if rep.error else ""))


def _pct(x, signed: bool = False) -> str:
    if x is None:
        return "-"
    return f"{100 * x:+.1f}%" if signed else f"{100 * x:.1f}%"


def _cache_label(server: servers.Server) -> str:
    if server.data_path in UNCACHED_PATHS:
        return "O_DIRECT, from disk"
    return server.cache + ", warm"


def _report(ctx: Context, place: Placement, mib: int, rows: list, intro: list) -> None:
    r = ctx.report
    reference = next((row for row in rows if row.kind == "nbdkit"), None)
    table = [_table_row(row, reference) for row in rows]
    markdown = format_markdown(HEADERS, table, left=2)
    title = (f"[interference] job slowdown and I/O kept, {LOAD_LABEL} against a triad on "
             f"{_cores(place.job)}")
    r.say()
    r.say(title)
    r.say(markdown)
    notes = _notes(rows, reference)
    for line in notes:
        r.say(line)
    with open(os.path.join(ctx.out_dir, "interference.md"), "w", encoding="utf-8") as f:
        f.write(f"# {title}\n\n" + "\n\n".join(intro) + "\n\n" + markdown + "\n\n"
                + "\n\n".join(notes) + "\n")
    r.csv("interference.csv", CSV_HEADERS, [_csv_row(row, reference, place, mib) for row in rows])
    r.csv("interference_runs.csv", RUN_CSV_HEADERS,
          [_run_csv_row(row, i, rep) for row in rows for i, rep in enumerate(row.reps)])
    _charts(ctx, place, rows)


def _table_row(row: Row, ref: Optional[Row]) -> list:
    m = row.median
    return [row.name, row.cache, fmt(m("baseline")),
            _pct(m("drift"), signed=True), fmt(m("with_io")), _pct(m("slowdown")), _pct(m("busy")),
            fmt(m("io_alone_mb")), fmt(m("io_with_mb")), _pct(m("kept")),
            fmt_sig(m("cpu_alone")), fmt_sig(m("cpu_with")), _per_gbs(m("slowdown_per_gbs")),
            _vs(m("slowdown"), ref.median("slowdown") if ref else None),
            ratio(m("io_with_mb"), ref.median("io_with_mb") if ref else None)]


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


def _notes(rows: list, ref: Optional[Row]) -> list:
    notes = ["Reading it: 'job slowdown' = 1 - job w/ I/O ÷ job alone; 'other CPUs busy' = the "
             "share of the server's and fio's CPUs not idle (/proc/stat) during that run; 'I/O "
             "kept' = I/O w/ job ÷ I/O alone; CPU s/GiB = the server's user + system time per "
             "GiB served, with the I/O alone and with the job; 'slowdown per GB/s' = the "
             "slowdown over the GB/s served with the job; the last two columns divide this "
             "row's slowdown and its I/O with the job by nbdkit's ('-': nbdkit's slowdown is "
             f"not above zero). '{CONTROL_NAME}': the same windows with a register-only loop on "
             "the other CPUs instead of I/O; an I/O row's slowdown beyond it is what its memory "
             "traffic costs the job. A slowdown of a few tenths of a percent, or below zero, is "
             "within noise."]
    if ref is None:
        notes.append("note: no nbdkit row, so no ratio columns.")
    alone = [v for row in rows for rep in row.reps for v in (rep.before, rep.after) if v]
    if alone:
        mid = statistics.median(alone)
        notes.append(f"job alone over every window of every row: median {mid:,.0f} MB/s, "
                     f"{min(alone):,.0f}..{max(alone):,.0f} ({100 * (max(alone) - min(alone)) / mid:.1f}% "
                     f"of the median, {len(alone)} windows): a slowdown smaller than this spread "
                     "needs more --repeat or a longer --runtime before it means anything.")
    for row in rows:
        if row.error:
            notes.append(f"  {row.name}: {row.error}")
    return notes


def _csv_row(row: Row, ref: Optional[Row], place: Placement, mib: int) -> list:
    m = row.median
    return [row.name, row.cache, row.data_path,
            cpu_list(place.server), cpu_list(place.client), cpu_list(place.job), mib,
            len(row.reps), _r(m("baseline"), 1), row.spread("baseline"), _r(m("before"), 1),
            _r(m("after"), 1), _r100(m("drift")), _r(m("with_io"), 1), row.spread("with_io"),
            _r100(m("slowdown")), _r100(m("busy")), _r(m("io_alone_mb"), 1), _r(m("io_with_mb"), 1),
            row.spread("io_with_mb"), _r100(m("kept")), _r(m("cpu_alone"), 4),
            _r(m("cpu_with"), 4), _r(m("slowdown_per_gbs"), 2),
            _r(_slowdown_ratio(m("slowdown"), ref.median("slowdown") if ref else None), 3),
            _r(_ratio(m("io_with_mb"), ref.median("io_with_mb") if ref else None), 3), row.error]


def _run_csv_row(row: Row, i: int, rep: Rep) -> list:
    return [row.name, i + 1, _r(rep.before, 1), _r(rep.after, 1), _r(rep.with_io, 1),
            "/".join(map(str, rep.samples)), _r100(rep.busy), _r(rep.io_alone_mb, 1), _r(rep.io_with_mb, 1),
            _r(rep.cpu_alone, 4), _r(rep.cpu_with, 4), rep.error]


def _charts(ctx: Context, place: Placement, rows: list) -> None:
    where = f"job on {_cores(place.job)}, server on {_cores(place.server)}"
    names = [_short(row) for row in rows]
    slowdown = [None if s is None else 100 * s for s in (row.median("slowdown") for row in rows)]
    svg.bar_chart(os.path.join(ctx.out_dir, "interference-slowdown.svg"),
                  f"Job slowdown while the server serves {LOAD_LABEL} (lower is better)", names,
                  [svg.Series("job slowdown %", slowdown, SLOWDOWN_COLOR)], "job slowdown %",
                  subtitle=f"triad, {where}; sluice rows named by data path; 'spin': no I/O, "
                           "the other CPUs busy in registers",
                  value_label=lambda v: f"{v:.1f}%")
    served = [row for row in rows if row.kind != "control"]
    svg.bar_chart(os.path.join(ctx.out_dir, "interference-cpu.svg"),
                  "Server CPU per GiB served (lower is better)", [_short(row) for row in served],
                  [svg.Series("I/O alone", [row.median("cpu_alone") for row in served], ALONE_COLOR),
                   svg.Series("with the job", [row.median("cpu_with") for row in served],
                              WITH_COLOR)],
                  "CPU s/GiB", subtitle=f"user + system time of the server; {where}",
                  value_label=lambda v: f"{v:.3g}")


def _short(row: Row) -> str:
    """A bar's label: sluice rows by data path, the control as 'spin'."""
    if row.kind == "control":
        return "spin"
    return row.data_path or row.name


def _ratio(a, b):
    return a / b if a is not None and b else None


def _r(value, digits):
    return None if value is None else round(value, digits)


def _r100(value):
    return None if value is None else round(100 * value, 2)
