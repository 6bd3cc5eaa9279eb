"""One measured point: fio against a running server, with the server's CPU time bracketed
around the fio run and, for sluice with --metrics, its phase histogram scraped around it."""

import os
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
    data_paths: tuple            # --data-path values to measure; () when there is no such option
    image: str
    scratch: str
    image_size: int
    runtime: int
    quick: bool
    cold_ok: bool
    cold_reason: str
    nbdkit_cache_none: bool
    qemu_aio: str
    missing: list                # programs not installed
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
class Point:
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


def run_point(ctx: Context, running: Optional[servers.Running], command: list, job: fio.Job,
              name: str, drop_cache: bool, op: str = "read") -> Point:
    """Measure one fio run. running None: a local run with no server (the disk curve)."""
    if drop_cache:
        cache.drop()
    else:
        os.sync()  # dirty pages of an earlier write job must not be written back during this one
    point = Point()
    json_path = os.path.join(ctx.fiodir, _slug(name) + ".json")
    before = _scrape(running)
    cpu0 = proc.cpu_seconds(running.pid) if running else None
    try:
        point.result = fio.run(command, job, json_path)
        fio.cleanup(json_path)
    except fio.FioError as e:
        point.error = str(e)
    if running:
        point.cpu_seconds = proc.cpu_seconds(running.pid) - cpu0
        after = _scrape(running)
        if before is not None and after is not None:
            point.phases = metrics.phase_means_us(before, after, op=op,
                                                  export=running.server.export)
    return point


def _scrape(running):
    if running is None or not running.metrics_url:
        return None
    try:
        return metrics.scrape(running.metrics_url)
    except OSError:
        return None


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)
