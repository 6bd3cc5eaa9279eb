"""The measurements of bench/pool: fio's nbd engine against one or several URIs at once, and
`sluice copy` timed from start to exit; each repeated, with the host's CPU use over the run,
and reported as medians.

CPU use is read from /proc/stat for the whole machine, because on a small machine the
members, the coordinator and the client all compete for the same cores: a row whose cores
were busy throughout was bound by the CPU, whatever else it waited for.
"""

import os
import resource
import statistics
import subprocess
import time
from dataclasses import dataclass
from typing import Optional

import fio
import proc

BLOCK_BYTES = 1 << 20
DEPTH = 16
FIO_GRACE_SECONDS = 60      # beyond the runtime: connecting, a pool assembling, a stall


@dataclass
class Sample:
    mbps: Optional[float]   # 10^6 bytes per second; None when every run failed
    cpu: Optional[float]    # share of all cores this run's processes used (0..1)
    cpu_all: Optional[float] = None  # share of all cores busy on the machine, ours or not
    spread: str = ""        # lowest..highest MB/s of the runs
    error: str = ""         # the first failure, if any run failed


class Busy:
    """CPU use between start() and stop(), as shares of all cores: `ours`, by the processes of
    this run (fio or sluice copy, which exit inside the bracket, and the long-lived members
    and coordinator, whose pids are given), and `all`, by the whole machine. Kernel network
    work (veth, tbf) mostly runs in the sending process's context and counts as ours."""

    def __init__(self, pids: list):
        self.pids = pids

    def start(self) -> None:
        self._began = time.monotonic()
        self._ours = self._our_seconds()
        self._all = _cpu_ticks()

    def stop(self) -> tuple:
        wall = (time.monotonic() - self._began) * (os.cpu_count() or 1)
        busy0, total0 = self._all
        busy1, total1 = _cpu_ticks()
        ours = (self._our_seconds() - self._ours) / max(wall, 1e-6)
        return ours, (busy1 - busy0) / max(total1 - total0, 1)

    def _our_seconds(self) -> float:
        children = resource.getrusage(resource.RUSAGE_CHILDREN)  # those reaped so far
        return children.ru_utime + children.ru_stime + sum(proc.cpu_seconds(p) for p in self.pids)


def _cpu_ticks() -> tuple:
    """(busy, total) clock ticks of all CPUs since boot; waiting for I/O counts as idle."""
    with open("/proc/stat") as f:
        fields = [int(x) for x in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return sum(fields) - idle, sum(fields)


def repeated(run_once, repeat: int) -> Sample:
    """run_once() -> (mbps, (cpu ours, cpu all)); medians over `repeat` runs, failures noted."""
    speeds, cpus, alls, errors = [], [], [], []
    for _ in range(repeat):
        try:
            mbps, (cpu, cpu_all) = run_once()
            speeds.append(mbps)
            cpus.append(cpu)
            alls.append(cpu_all)
        except (fio.FioError, CopyError) as e:
            errors.append(str(e))
    if not speeds:
        return Sample(None, None, error=errors[0] if errors else "no run")
    spread = f"{min(speeds):.0f}..{max(speeds):.0f}" if len(speeds) > 1 else ""
    return Sample(statistics.median(speeds), statistics.median(cpus), statistics.median(alls),
                  spread, errors[0] if errors else "")


def fio_command(uris: list, rw: str, runtime: int, ramp: int = 0) -> list:
    """One fio process, one job (one NBD connection) per URI; group_reporting adds them up.
    Options before the first --name apply to every job."""
    argv = ["fio", "--ioengine=nbd", f"--rw={rw}", f"--bs={BLOCK_BYTES}", f"--iodepth={DEPTH}",
            "--direct=1", "--time_based", f"--runtime={runtime}", "--thread", "--group_reporting",
            "--output-format=json"]
    if ramp:
        argv.append(f"--ramp_time={ramp}")
    for k, uri in enumerate(uris):
        argv += [f"--name=m{k + 1}", f"--uri={uri}"]
    return argv


def run_fio(uris: list, rw: str, runtime: int, json_path: str, pids: list, ramp: int = 0) -> tuple:
    job = fio.Job(rw=rw, bs=BLOCK_BYTES, iodepth=DEPTH, runtime=runtime + ramp)
    busy = Busy(pids)
    busy.start()
    result = fio.run(fio_command(uris, rw, runtime, ramp), job, json_path)  # adds --output
    cpu = busy.stop()
    fio.cleanup(json_path)
    return result.bw / 1e6, cpu


class CopyError(Exception):
    pass


def run_copy(binary: str, src: str, dst: str, nbytes: int, timeout: float, log_path: str,
             pids: list, options: tuple = ()) -> tuple:
    """`sluice copy SRC DST` from start to exit: nbytes over the wall time (connecting,
    assembling a pool and the final flush included, as a user waits for them)."""
    busy = Busy(pids)
    with open(log_path, "a") as log:
        log.write(f"\n$ {binary} copy {' '.join(options)} {src} {dst}\n")
        log.flush()
        busy.start()
        began = time.monotonic()
        try:
            p = subprocess.run([binary, "copy", *options, src, dst], stdin=subprocess.DEVNULL,
                               stdout=log, stderr=log, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise CopyError(f"sluice copy {src} {dst}: killed after {timeout:.0f} s")
        wall = time.monotonic() - began
        cpu = busy.stop()
    if p.returncode != 0:
        raise CopyError(f"sluice copy {src} {dst}: exit {p.returncode}: {last_line(log_path)}")
    return nbytes / wall / 1e6, cpu


def last_line(path: str) -> str:
    try:
        with open(path) as f:
            lines = [l.strip() for l in f.read().splitlines() if l.strip() and not l.startswith("$ ")]
    except OSError:
        return "(no log)"
    return lines[-1] if lines else "(no message)"


def unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
