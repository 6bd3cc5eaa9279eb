"""interference's third pass, "restricted": does a storage cap on the server leave the node's own
work its share of the disk? (issue 27's row; docs/serve.md, LOAD RESTRICTION).

The disk is the bench image behind a loop device throttled to DISK_MBPS (slowdisk.py), one
budget shared by sluice and the node's own disk reader, as one disk is: this VM's own disk sits
on the host's cache, and its rate swung 1.1-3.2 GB/s between runs. The node runs two jobs of
its own on the job's cores: triad (memory-bound, as in the other passes) and a local fio
reading the disk with O_DIRECT, one 1M read at a time (a backup or a build reading files). A
remote reader (fio's nbd engine, 1M QD32, a busy client) reads it through
`sluice serve --data-path direct`, so every remote byte is a disk read too. Rows: sluice with
no cap, then with `[limits] storage-bps` at half the disk's rate, measured first (1M QD8 O_DIRECT reads alone).
Each run: the node's jobs alone, then with the remote reader.
"""

import os
import statistics
import threading
from dataclasses import dataclass, field, replace
from typing import Optional

import fio
import interference_report as report
import qos
import slowdisk
import triadjob
from interference_report import pct
from report import format_markdown
from scale import cpu_list
from units import fmt

LIMIT_SHARE = 0.5
# The disk: fast enough that the VM's own disk stays well above it, slow enough that the
# server's and the local reader's requests queue for it, as for a SATA SSD.
DISK_MBPS = 400
CGROUP = "sluice-interference"
# fio reports from this many seconds in: the server-wide cap lets a burst of 1 s of its rate
# through after a quiet spell (docs/serve.md), and each run follows one (the node's jobs
# alone). A reader that wants x over the cap spends the burst in 1 s x cap / x, so what is
# left of it in the measured window, averaged over that window, is at most
# cap / (ramp + runtime) whatever x is: the notes state that bound.
RAMP_SECONDS = 3
# The disk's rate: reads as deep as the remote load's.
DISK_ARGS = ["--ioengine=io_uring", "--rw=read", "--bs=1M", "--iodepth=8", "--direct=1"]
LOCAL_ARGS = ["--ioengine=psync", "--rw=read", "--bs=1M", "--direct=1"]
REMOTE_ARGS = ["--ioengine=nbd", "--rw=read", "--bs=1M", "--iodepth=32", "--direct=1"]
REMOTE_LABEL = "1M seq read QD32"
MB = 1000 * 1000
HEADERS = ["server", "storage cap", "local alone MB/s", "local w/ remote MB/s", "local kept",
           "local ÷ (disk - cap)", "remote MB/s", "remote ÷ cap", "disk used", "job alone MB/s",
           "job w/ remote MB/s", "job slowdown"]
CSV_HEADERS = ["server", "cap_bytes_per_s", "disk_mb_per_s", "runs", "local_alone_mb_per_s",
               "local_with_remote_mb_per_s", "local_kept_pct", "local_of_rest_pct",
               "remote_mb_per_s",
               "remote_of_cap_pct", "disk_used_pct", "job_alone_mb_per_s",
               "job_with_remote_mb_per_s", "job_slowdown_pct", "error"]


@dataclass
class Rep:
    local_alone: Optional[float] = None     # MB/s
    job_alone: Optional[float] = None
    local_with: Optional[float] = None
    remote: Optional[float] = None
    job_with: Optional[float] = None
    error: str = ""

    @property
    def local_kept(self):
        a, w = self.local_alone, self.local_with
        return w / a if a and w is not None else None

    @property
    def job_slowdown(self):
        a, w = self.job_alone, self.job_with
        return 1 - w / a if a and w is not None else None


@dataclass
class Row:
    name: str
    cap: Optional[int]                      # bytes per second; None: no cap
    reps: list = field(default_factory=list)

    def median(self, figure: str):
        values = [v for v in (getattr(r, figure) for r in self.reps) if v is not None]
        return statistics.median(values) if values else None

    @property
    def error(self) -> str:
        return "; ".join(dict.fromkeys(r.error for r in self.reps if r.error))


def run_pass(setup: report.Setup, binary: str) -> None:
    ctx = setup.ctx
    if ctx.data_paths and "direct" not in ctx.data_paths:
        ctx.report.say("\n[interference] no restricted pass: this sluice has no direct path")
        return
    try:
        disk = slowdisk.Disk(ctx.image, CGROUP)
    except OSError as e:
        ctx.report.say(f"\n[interference] no restricted pass: no slow disk ({e})")
        return
    try:
        disk.throttle(DISK_MBPS)
        _measure(setup, binary, disk)
    finally:
        for problem in disk.remove():
            ctx.report.say(f"note: cleanup: {problem}")


def _measure(setup: report.Setup, binary: str, disk: slowdisk.Disk) -> None:
    ctx, place = setup.ctx, setup.place
    job_cpus = cpu_list(place.job) if place.separated else None
    cpus = (job_cpus, cpu_list(place.client) if place.separated else None)
    guard = 4 * (len(_caps(1)) * ctx.repeat + 1) * (ctx.runtime + RAMP_SECONDS + 30) + 60
    triad = triadjob.Triad(binary, job_cpus, setup.mib, guard,
                           os.path.join(ctx.logdir, "triad.log"))
    try:
        triad.pause()
        try:
            local = ("disk", job_cpus, _on_disk(ctx, disk, DISK_ARGS, half=0))
            rate = _together(ctx, "restricted-disk", disk, None, local)[1]
        finally:
            triad.resume()
        rows = [_row(ctx, place, triad, disk, name, cap, cpus) for name, cap in _caps(rate.bw)]
    finally:
        triad.stop()
    _publish(setup, rate, rows)


def _caps(disk_bytes: float) -> list:
    """(row name, cap in bytes per second or None), in table order."""
    cap = int(disk_bytes * LIMIT_SHARE)
    return [("sluice direct, no cap", None),
            (f"sluice direct, storage-bps = {cap}", cap)]


def _row(ctx, place, triad, disk, name: str, cap: Optional[int], cpus: tuple) -> Row:
    limits = {"storage-bps": str(cap)} if cap else {}
    setup = qos.Setup(f"restricted-{'cap' if cap else 'open'}", {}, {"": None}, limits,
                      data_path="direct", metrics=False)
    server = qos.qos_server(ctx, setup)
    if place.separated:
        server = replace(server, cpus=cpu_list(place.server))
    running = ctx.start(server, disk.device)
    row = Row(name, cap)
    if running is None:
        return row
    try:
        disk.join(running.pid)
        for i in range(ctx.repeat):
            row.reps.append(_rep(ctx, triad, disk, running.uri, f"{setup.name}-run{i + 1}",
                                 cpus))
            ctx.report.progress(f"interference restricted | {name} | run {i + 1}: "
                                f"{_summary(row.reps[-1])}")
    finally:
        running.stop()
    return row


def _rep(ctx, triad, disk, uri: str, name: str, cpus: tuple) -> Rep:
    rep = Rep()
    job_cpus, remote_cpus = cpus
    local = ("local", job_cpus, _on_disk(ctx, disk, LOCAL_ARGS, half=1))
    remote = ("remote", remote_cpus,
              REMOTE_ARGS + [f"--uri={uri}", f"--size={ctx.image_size // 2}"])
    try:
        alone = _together(ctx, f"{name}-alone", disk, None, local)[1]
        rep.local_alone = alone.bw / MB
        rep.job_alone = triad.median(*_window(alone))[0]
        far, near = _together(ctx, f"{name}-with-remote", disk, remote, local)
        rep.remote, rep.local_with = far.bw / MB, near.bw / MB
        rep.job_with = triad.median(*_window(near))[0]
    except fio.FioError as e:
        rep.error = str(e)
    return rep


def _on_disk(ctx, disk, args: list, half: int) -> list:
    """fio's target on the slow disk; half=1: its second half, away from the remote reader."""
    start = ctx.image_size // 2 * half
    return args + [f"--filename={disk.device}", f"--offset={start}",
                   f"--size={ctx.image_size - start}"]


def _together(ctx, name: str, disk, remote, local) -> tuple:
    """(remote Result or None, local Result): two fios at once, each job (name, cpus, args);
    the local one inside the disk's cgroup, where its reads share the disk with sluice's."""
    results, errors = [None, None], []

    def one(i, job, argv):
        try:
            path = os.path.join(ctx.fiodir, f"interference-{name}-{job[0]}.json")
            results[i] = fio.run_jobs(argv, ctx.runtime + RAMP_SECONDS, path)[0]
        except fio.FioError as e:
            errors.append(f"{job[0]}: {e}")

    threads = [threading.Thread(target=one, args=(1, local, disk.joined(_fio_argv(ctx, local))))]
    if remote:
        threads.append(threading.Thread(target=one, args=(0, remote, _fio_argv(ctx, remote))))
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise fio.FioError("; ".join(errors))
    return tuple(results)


def _fio_argv(ctx, job) -> list:
    name, cpus, args = job
    return (["fio", "--thread", "--output-format=json", "--time_based",
             f"--runtime={ctx.runtime}", f"--ramp_time={RAMP_SECONDS}", f"--name={name}"]
            + ([f"--cpus_allowed={cpus}"] if cpus else []) + args)


def _window(result: fio.Result) -> tuple:
    """The seconds fio measured (after its ramp), for the job's samples."""
    return result.ended - result.seconds, result.ended


def _summary(rep: Rep) -> str:
    if rep.error:
        return rep.error
    return (f"local {fmt(rep.local_alone)} MB/s alone, {fmt(rep.local_with)} with the remote "
            f"reader ({pct(rep.local_kept)} kept); remote {fmt(rep.remote)} MB/s; job "
            f"{pct(rep.job_slowdown)} slower")


def _publish(setup: report.Setup, disk: fio.Result, rows: list) -> None:
    disk_mb = disk.bw / MB
    cells = [_cells(row, disk_mb) for row in rows]
    title = (f"[interference] restricted: the node's own jobs beside a remote reader "
             f"({REMOTE_LABEL}, data-path direct), with and without a storage cap")
    report.publish(setup, "interference_restricted", title,
                   format_markdown(HEADERS, cells, left=2), _notes(setup, disk_mb, rows))
    setup.ctx.report.csv("interference_restricted.csv", CSV_HEADERS,
                         [_csv(row, disk_mb, setup.ctx.repeat) for row in rows])


def _cells(row: Row, disk_mb: float) -> list:
    m = row.median
    remote, local = m("remote"), m("local_with")
    cap_mb = row.cap / MB if row.cap else None
    used = (remote + local) / disk_mb if remote is not None and local is not None else None
    return [row.name, f"{fmt(cap_mb)} MB/s" if cap_mb else "none", fmt(m("local_alone")),
            fmt(local), pct(m("local_kept")), pct(_of_rest(local, cap_mb, disk_mb)), fmt(remote),
            pct(remote / cap_mb) if cap_mb and remote is not None else "-", pct(used),
            fmt(m("job_alone")), fmt(m("job_with")), pct(m("job_slowdown"))]


def _csv(row: Row, disk_mb: float, runs: int) -> list:
    m = row.median
    remote, local = m("remote"), m("local_with")
    cap_mb = row.cap / MB if row.cap else None
    used = (remote + local) / disk_mb if remote is not None and local is not None else None
    return [row.name, row.cap, round(disk_mb, 1), runs, _r(m("local_alone")), _r(local),
            _r100(m("local_kept")), _r100(_of_rest(local, cap_mb, disk_mb)), _r(remote),
            _r100(remote / cap_mb) if cap_mb and remote is not None else None, _r100(used),
            _r(m("job_alone")), _r(m("job_with")), _r100(m("job_slowdown")), row.error]


def _of_rest(local, cap_mb, disk_mb):
    """What the node's reader got of what the cap leaves it."""
    if local is None or not cap_mb or disk_mb <= cap_mb:
        return None
    return local / (disk_mb - cap_mb)


def _r(x):
    return None if x is None else round(x, 1)


def _r100(x):
    return None if x is None else round(100 * x, 1)


def _notes(setup: report.Setup, disk_mb: float, rows: list) -> list:
    ctx = setup.ctx
    notes = [f"disk: {ctx.image} behind a loop device whose readers share one blkio budget "
             f"of {DISK_MBPS} MB/s (slowdisk.py); measured {fmt(disk_mb)} MB/s with fio 1M "
             "O_DIRECT reads QD8 alone (the job paused) before the rows. The cap is "
             f"{LIMIT_SHARE:.0%} of what was measured (storage-bps counts bytes; MB here are "
             "10^6 bytes).",
             "node's jobs, on the job's cores: triad, and a local fio reading the image's "
             "second half with O_DIRECT, one 1M read at a time (psync). Remote: fio's nbd "
             f"engine, {REMOTE_LABEL}, over the image's first half, on the other cores; sluice "
             "serves it with data-path direct, so each remote byte is read from the disk.",
             f"each run: the node's jobs alone, then with the remote reader, {ctx.runtime} s "
             f"each after a {RAMP_SECONDS} s ramp that fio leaves out; medians of {ctx.repeat} "
             "runs. 'local kept' = local w/ remote ÷ "
             "local alone; 'remote ÷ cap' = what the server read over its cap; 'disk used' = "
             "(local + remote) ÷ the disk's rate; 'local ÷ (disk - cap)' = what the local reader "
             "got of what the cap leaves the node; 'job slowdown' = 1 - triad w/ remote ÷ alone.",
             "The cap's burst (1 s of its rate, refilled while the node's jobs ran alone) can "
             "lift 'remote ÷ cap' in the measured window by at most 1 s ÷ (ramp + runtime) = "
             f"{1 / (RAMP_SECONDS + ctx.runtime):.0%} here, whatever the reader asks.",
             "Reading it: without a cap the remote reader takes what the disk gives it; with "
             "one, the server stays near the cap and the node's reader keeps the rest."]
    errors = [f"{row.name}: {row.error}" for row in rows if row.error]
    return notes + [f"errors: {e}" for e in errors]
