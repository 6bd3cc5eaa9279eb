"""One measured point: fio against a running server, repeated, with the server's CPU time
bracketed around each fio run and, for sluice with --metrics, its phase histogram scraped
around it; the point reports the median of each figure over its runs."""

import os
import statistics
from dataclasses import dataclass, field
from typing import Optional

import cache
import fio
import metrics
import proc
import servers

GIB = 1 << 30


@dataclass
class Context:
    """Everything the experiments share for one run of bench/run."""
    report: object
    out_dir: str
    workdir: str                 # temporary files (server configs, pid files)
    binary: str
    features: set                # optional sluice serve flags the binary has
    serve_defaults: dict         # {flag: default} that `sluice serve --help` states
    data_paths: tuple            # --data-path values to measure; () when there is no such option
    image: str
    scratch: str
    image_size: int
    runtime: int
    repeat: int                  # fio runs per measured point; the tables show their medians
    quick: bool
    cold_ok: bool
    cold_reason: str
    nbdkit_cache_none: bool
    qemu_aio: str
    missing: list                # programs not installed
    allow_install: bool = True   # an experiment may apt-get install what only it needs
    # interference's equal-load pass: fio's rate in MB/s; None: chosen from the full-speed
    # pass; 0: no equal-load pass.
    interference_rate: Optional[int] = None
    # interference's passes to run: full, equal, restricted (interference.py).
    interference_passes: tuple = ("full", "equal", "restricted")
    _failed: dict = field(default_factory=dict)

    @property
    def logdir(self) -> str:
        return os.path.join(self.out_dir, "logs")

    @property
    def fiodir(self) -> str:
        return os.path.join(self.out_dir, "fio")

    def have(self, program: str) -> bool:
        return program not in self.missing

    def start(self, server: servers.Server, image: str) -> Optional[servers.Running]:
        """The running server, or None (said once per server) when it cannot start."""
        if server.name in self._failed:
            return None
        try:
            return servers.start(server, image, self.workdir, self.logdir)
        except servers.StartError as e:
            self._failed[server.name] = str(e)
            self.report.say(f"note: skipping {server.name}: {e}")
            return None


@dataclass
class Run:
    """One fio run."""
    result: Optional[fio.Result] = None
    cpu_seconds: Optional[float] = None
    phases: dict = field(default_factory=dict)
    error: str = ""

    @property
    def ok(self) -> bool:
        return self.result is not None

    @property
    def mb_per_s(self):
        return self.result.bw / 1e6 if self.result else None

    @property
    def iops(self):
        return self.result.iops if self.result else None

    @property
    def lat_us(self):
        return self.result.lat_us if self.result else None

    @property
    def cpu_s_per_gib(self):
        if not self.result or self.cpu_seconds is None or not self.result.bytes:
            return None
        return self.cpu_seconds / (self.result.bytes / GIB)

    @property
    def cpu_us_per_io(self):
        if not self.result or self.cpu_seconds is None or not self.result.ios:
            return None
        return self.cpu_seconds * 1e6 / self.result.ios


class Point:
    """A measured point: the same fio run repeated. Every figure is the median of that figure
    over the runs that succeeded, each on its own (the median MB/s and the median latency may
    come from different runs), so one disturbed run does not move the number."""

    def __init__(self, runs: list):
        self.runs = runs
        self.good = [r for r in runs if r.ok]

    @property
    def ok(self) -> bool:
        return bool(self.good)

    @property
    def error(self) -> str:
        """'' when every run succeeded; else what went wrong, and how often."""
        errors = [r.error for r in self.runs if not r.ok]
        if not errors:
            return ""
        text = "; ".join(dict.fromkeys(errors))
        if len(self.runs) == 1:
            return text
        return f"{len(errors)} of {len(self.runs)} runs failed: {text}"

    def _median(self, figure: str):
        values = [v for v in (getattr(r, figure) for r in self.good) if v is not None]
        return statistics.median(values) if values else None

    mb_per_s = property(lambda self: self._median("mb_per_s"))
    iops = property(lambda self: self._median("iops"))
    lat_us = property(lambda self: self._median("lat_us"))
    cpu_seconds = property(lambda self: self._median("cpu_seconds"))
    cpu_s_per_gib = property(lambda self: self._median("cpu_s_per_gib"))
    cpu_us_per_io = property(lambda self: self._median("cpu_us_per_io"))

    def _median_result(self, figure: str):
        values = [getattr(r.result, figure) for r in self.good]
        return statistics.median(values) if values else None

    bytes = property(lambda self: self._median_result("bytes"))
    ios = property(lambda self: self._median_result("ios"))
    seconds = property(lambda self: self._median_result("seconds"))

    @property
    def mb_spread(self):
        """'min..max' of MB/s over the runs that succeeded (CSV), or None."""
        values = [r.mb_per_s for r in self.good]
        return f"{min(values):.2f}..{max(values):.2f}" if values else None

    @property
    def phases(self) -> dict:
        names = {ph for r in self.good for ph in r.phases}
        out = {}
        for ph in names:
            values = [r.phases[ph] for r in self.good if r.phases.get(ph) is not None]
            out[ph] = statistics.median(values) if values else None
        return out

    def summary(self) -> str:
        """The progress line's verdict: '1,234 MB/s', with the spread when runs were repeated."""
        if not self.ok:
            return f"failed: {self.error}"
        text = f"{self.mb_per_s:,.0f} MB/s"
        if len(self.runs) > 1:
            lo, hi = min(r.mb_per_s for r in self.good), max(r.mb_per_s for r in self.good)
            text += f" (median of {len(self.good)}: {lo:,.0f}..{hi:,.0f})"
        if self.error:
            text += f"; {self.error}"
        return text


def repeat_note(ctx: Context) -> str:
    """The sentence every experiment prints about repetitions."""
    if ctx.repeat == 1:
        return "One run per point (--repeat 1): values are that run's."
    return (f"Values are medians of {ctx.repeat} runs, each figure on its own; the CSV has the "
            "min..max of MB/s.")


def run_point(ctx: Context, running: Optional[servers.Running], command: list, job: fio.Job,
              name: str, drop_cache: bool, op: str = "read") -> Point:
    """Measure one point: ctx.repeat fio runs, one after another, against the same server.
    running None: a local run with no server (the disk curve)."""
    runs = []
    for i in range(ctx.repeat):
        suffix = f"-run{i + 1}" if ctx.repeat > 1 else ""
        runs.append(_run_once(ctx, running, command, job, name + suffix, drop_cache, op))
    return Point(runs)


def _run_once(ctx, running, command, job, name, drop_cache, op) -> Run:
    if drop_cache:
        cache.drop()
    else:
        os.sync()  # dirty pages of an earlier write job must not be written back during this one
    run = Run()
    json_path = os.path.join(ctx.fiodir, _slug(name) + ".json")
    before = _scrape(running)
    cpu0 = proc.cpu_seconds(running.pid) if running else None
    try:
        run.result = fio.run(command, job, json_path)
        fio.cleanup(json_path)
    except fio.FioError as e:
        run.error = str(e)
    if running:
        run.cpu_seconds = proc.cpu_seconds(running.pid) - cpu0
        after = _scrape(running)
        if before is not None and after is not None:
            run.phases = metrics.phase_means_us(before, after, op=op,
                                                export=running.server.export)
    return run


def _scrape(running):
    if running is None or not running.metrics_url:
        return None
    try:
        return metrics.scrape(running.metrics_url)
    except OSError:
        return None


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)
