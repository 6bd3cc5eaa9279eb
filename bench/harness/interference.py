"""Experiment `interference`: how much does serving remote reads slow down a memory-bound job
running on the serving node, and how much I/O does the server keep while the job runs?

The claim under test (bench/README.md, Experiment 6): a server whose data path makes no CPU
copies (splice, O_DIRECT) barely disturbs the job, while copying servers take memory bandwidth
from it. The job is triad.c (a STREAM-style triad) on cores of its own; the server and fio run
on the others, so what the job loses is memory bandwidth and cache, not CPU time. Run only
with `--only interference`.

Two passes: full speed (each server as fast as fio reads), then equal load (each server held
to one rate with fio --rate), because where the server's CPUs and the job's are not
independent (SMT siblings, shared vCPUs) a busy server CPU slows the job by itself and every
server is busy at full speed; at one rate the slowdown compares cost per byte.
interference_report.py prints and writes both.
"""

import os
import statistics
import time
from dataclasses import dataclass, field, replace
from typing import Optional

import cache
import fio
import interference_limit
import interference_report as report
import machine
import proc
import servers
import triadjob
from interference_report import CONTROL_NAME, cores, pct
from measure import Context, Run, run_point
from scale import cpu_list
from units import fmt, parse_size

# sluice's rows, in table order: the copying path first, then the short ones.
DATA_PATHS = ("copy", "splice", "direct", "splice-direct")
UNCACHED_PATHS = ("direct", "splice-direct")
# The remote reader's load: one connection, 1M sequential reads, 8 outstanding.
LOAD_LABEL, LOAD_RW, LOAD_BS, LOAD_QD = "1M seq read QD8", "read", "1M", 8
# After SIGCONT the job's next sample spans the pause; skip it before an alone window.
SETTLE_SECONDS = 0.3
# The equal-load pass's default rate: this share of the slowest server's full speed (its I/O
# alone), so that every row still reaches it with the job running and its I/O kept below
# 100%, rounded down to a step so that runs on one machine tend to share a rate.
RATE_SHARE, RATE_STEP_MB = 0.6, 50
MB = 1000 * 1000


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
    if "splice" in paths and "--busy-poll" in ctx.features:
        # The same path without the spin before sleeping: what the spin costs the job on a
        # core of its own (docs/serve.md, THREADS, PINNING AND POLLING).
        out.append(servers.sluice(ctx.binary, data_path="splice", busy_poll=0))
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
    setup = report.Setup(ctx, place, mib, _describe(ctx, place, llc, mib), LOAD_LABEL)
    for line in setup.intro:
        r.say(line)
    saved = os.sched_getaffinity(0)
    if place.separated:
        # The harness itself (its fio and triad reader threads, the page-cache warming) keeps
        # off the job's cores too; servers and fio are pinned on their own.
        os.sched_setaffinity(0, set(place.server + place.client))
    try:
        _passes(setup, binary)
    finally:
        os.sched_setaffinity(0, saved)


def _passes(setup: report.Setup, binary: str) -> None:
    """Full speed, reported as soon as it is done, so that an interrupted equal-load pass
    loses none of it; then every server again at one rate, chosen from the first pass; then
    sluice with and without a storage cap beside the node's own disk reader
    (interference_limit.py). --interference-passes picks among them."""
    ctx, place, mib = setup.ctx, setup.place, setup.mib
    rows = []
    if "full" in ctx.interference_passes:
        rows = [_control_row(ctx, place, binary, mib)] if place.separated else []
        rows += _server_rows(ctx, place, binary, mib, None)
        report.full(setup, rows)
    if "equal" in ctx.interference_passes:
        rate, why = equal_rate(ctx, rows)
        if rate is None:
            report.skipped(setup, why)
        else:
            report.equal(setup, _server_rows(ctx, place, binary, mib, rate), rate, why, rows)
    if "restricted" in ctx.interference_passes:
        interference_limit.run_pass(setup, binary)


def _server_rows(ctx: Context, place: Placement, binary: str, mib: int,
                 rate: Optional[int]) -> list:
    rows = (_measure_row(ctx, server, place, binary, mib, rate) for server in lineup(ctx, place))
    return [row for row in rows if row is not None]


def equal_rate(ctx: Context, rows: list) -> tuple:
    """(MB/s, how it was chosen) for the equal-load pass, or (None, why there is none)."""
    if ctx.interference_rate is not None:
        if ctx.interference_rate == 0:
            return None, "--interference-rate 0"
        return ctx.interference_rate, "--interference-rate"
    if not rows:
        return None, "no full-speed pass to choose a rate from (give --interference-rate)"
    speeds = [(row.median("io_alone_mb"), row.name) for row in rows
              if row.kind != "control" and row.median("io_alone_mb")]
    if not speeds:
        return None, "no server row served in the full-speed pass"
    slowest, name = min(speeds)
    share = slowest * RATE_SHARE
    # Below one step (a very slow disk): whole MB/s rather than no pass at all.
    rate = int(share // RATE_STEP_MB * RATE_STEP_MB) or max(1, int(share))
    return rate, (f"{RATE_SHARE:.0%} of the lowest full-speed 'I/O alone MB/s', "
                  f"{slowest:,.0f} ({name}), rounded down to a multiple of {RATE_STEP_MB}")


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
    fio_text = "fio on the same" if shared else f"fio on {cores(place.client)}"
    return (f"server on {cores(place.server)} (taskset -c), {fio_text} (taskset -c and "
            f"--cpus_allowed), job on {cores(place.job)} (taskset -c, a thread pinned per core)")


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
                 "'other CPUs busy', or better the equal-load table, where all serve alike.")
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
                 mib: int, rate: Optional[int] = None) -> Optional[Row]:
    """One server's row; with `rate` (MB/s) fio is held to it (the equal-load pass)."""
    if server.data_path not in UNCACHED_PATHS:
        cache.warm(ctx.image)
    running = ctx.start(server, ctx.image)
    if running is None:
        return None
    job = fio.Job(rw=LOAD_RW, bs=parse_size(LOAD_BS), iodepth=LOAD_QD, runtime=ctx.runtime,
                  cpus=cpu_list(place.client) if place.separated else None,
                  rate=rate * MB if rate else None)
    command = _fio_command(running.uri, job)
    # The job's own time limit, in case the harness cannot stop it: the whole row, generously.
    guard = ctx.repeat * (4 * ctx.runtime + 2 * fio.FIO_GRACE_SECONDS) + 60
    row = Row(server.name, _cache_label(server), server.kind, server.data_path or "")
    name = f"interference-{server.name}" + (f"-{rate}MBps" if rate else "")
    label = server.name + (f" at {rate} MB/s" if rate else "")
    try:
        triad = triadjob.Triad(binary, cpu_list(place.job) if place.separated else None, mib,
                               guard, os.path.join(ctx.logdir, "triad.log"))
        try:
            for i in range(ctx.repeat):
                rep = _repetition(ctx, place, running, triad, command, job, name, i)
                row.reps.append(rep)
                ctx.report.progress(f"interference | {label} | run {i + 1}: "
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
    if job.rate is None:
        # Not at equal load: there the I/O is the rate whether the job runs or not.
        rep.io_alone = _io_alone(once, running, triad, command, job, f"{name}-io-alone{suffix}")
    rep.before, n_before = triad.median(*triad.alone(ctx.runtime))
    started, ticks = time.time(), proc.cpu_ticks(place.others)
    rep.io_with = run_point(once, running, command, job, name=f"{name}-with-job{suffix}",
                            drop_cache=False).runs[0]
    rep.busy = _busy(ticks, proc.cpu_ticks(place.others))
    rep.with_io, n_with = triad.median(*_io_window(rep.io_with, started, time.time(), ctx.runtime))
    rep.after, n_after = triad.median(*triad.alone(ctx.runtime))
    rep.samples = (n_before, n_with, n_after)
    return rep


def _io_alone(once, running, triad, command, job, name) -> Run:
    """The I/O with the job paused (SIGSTOP)."""
    triad.pause()
    try:
        run = run_point(once, running, command, job, name=name, drop_cache=False).runs[0]
    finally:
        triad.resume()
    time.sleep(SETTLE_SECONDS)
    return run


def _control_row(ctx: Context, place: Placement, binary: str, mib: int) -> Row:
    """The job alone, beside a CPU-only load on the server's and fio's CPUs, alone again."""
    row = Row(CONTROL_NAME, f"no I/O: spin on {cores(place.others)}", "control")
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
          if rep.io_alone else f"; I/O {fmt(rep.io_with_mb)} MB/s" if rep.io_with else "")
    return (f"job {fmt(rep.baseline)} MB/s alone, {fmt(rep.with_io)} with the load "
            f"({pct(rep.slowdown)} slower), other CPUs {pct(rep.busy)} busy{io}; "
            f"samples {rep.samples}" + (f"; {rep.error}" if rep.error else ""))


def _cache_label(server: servers.Server) -> str:
    if server.data_path in UNCACHED_PATHS:
        return "O_DIRECT, from disk"
    return server.cache + ", warm"
