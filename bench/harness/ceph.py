"""Experiment `ceph`: how close does sluice, serving an RBD image over NBD, come to fio's own
rbd engine on the same image? The ceiling talks to the cluster straight through librbd (no
NBD hop); the sluice side is fio's nbd engine over a Unix socket to `sluice serve --export
bench=rbd:rbd/bench`, where librbd runs inside sluice. Run only with `--only ceph`.

A throwaway single-node cluster (scripts/ceph-cluster: mon, mgr, one memstore OSD, auth off,
pool `rbd` of one copy) is started in the run's temporary directory and always stopped at the
end. One 1 GiB image is created and filled once with 1M sequential writes, so reads hit
real objects. Each job runs ceiling and sluice alternately (which goes first alternates from
one repeat to the next), because a small machine drifts; the tables show medians.
ceph_report.py prints and writes the results (bench/README.md, Experiment 7).
"""

import json
import os
import re
import resource
import shutil
import signal
import socket
import statistics
import subprocess
import time
from dataclasses import dataclass, field
from typing import Optional

import ceph_report as report
import fio
import machine
import proc
import servers
import tools
from ceph_report import CEILING, SIDES, SLUICE
from measure import Context
from units import fmt, parse_size

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CLUSTER_SCRIPT = os.path.join(REPO, "scripts", "ceph-cluster")
# The programs scripts/ceph-cluster and this experiment run, and the Debian package of each.
PROGRAMS = {"ceph-mon": "ceph-mon", "ceph-osd": "ceph-osd", "ceph-mgr": "ceph-mgr",
            "monmaptool": "ceph-base", "ceph": "ceph-common", "rbd": "ceph-common"}

POOL, IMAGE, CLIENT = "rbd", "bench", "admin"
EXPORT = "bench"                 # sluice's export name, in the NBD URI
IMAGE_BYTES = 1 << 30
# The OSD keeps every object in RAM (memstore) and refuses writes once it is nearly full, so
# it gets room for the image three times over; CEPH_OSD_BYTES in the environment overrides.
OSD_BYTES = 3 * IMAGE_BYTES
CLUSTER_START_SECONDS = 300      # scripts/ceph-cluster needs about 12 s; it waits 120 s itself
CLUSTER_STOP_SECONDS = 60
SLUICE_START_SECONDS = 30        # exec to accepting on the socket, librbd's connect included
SLUICE_STOP_SECONDS = 8          # as servers.py: sluice drains for up to 5 s after SIGTERM
# A client that ends without closing the image leaves its watch on the image until the OSD
# times it out (osd_client_watch_timeout, 30 s), and, if it wrote, the exclusive lock
# recorded as held. The next client then waits: a writer for the watch to time out before
# it breaks the lock, inside its measured run; any client for its notifications to the dead
# watcher to time out when it opens and closes the image. Between runs no client of the
# image is alive, so the harness clears such leftovers before the next run (blocklists the
# dead client, which drops its watch at once, and removes its lock) and says so.
LEFTOVER_GONE_SECONDS = 15
# (label, fio rw, request size, outstanding requests), in table order.
JOBS = [
    ("4K randread QD32", "randread", "4K", 32),
    ("4K randwrite QD32", "randwrite", "4K", 32),
    ("1M seq read QD8", "read", "1M", 8),
]
GIB = 1 << 30


@dataclass
class Cluster:
    dir: str
    conf: str
    osd_pid: Optional[int]
    osd_bytes: int
    fill: Optional[fio.Result] = None
    features: str = ""           # the image's features, as `rbd info` lists them
    last_client: str = "the fill"  # the side whose run used the image last


@dataclass
class Sample:
    """One fio run on one side, with the CPU time each process took during it."""
    side: str
    rep: int                     # which repeat, from 0
    first: bool                  # this side ran first in its repeat
    result: Optional[fio.Result] = None
    error: str = ""
    sluice_cpu: Optional[float] = None   # seconds; None on the ceiling side
    osd_cpu: Optional[float] = None
    fio_cpu: Optional[float] = None
    busy: Optional[float] = None         # share of this run's CPUs not idle (/proc/stat)
    after: str = ""                      # the side that used the image before this run
    leftover: str = ""                   # the watch and lock that run's client left on the
                                         # image, cleared before this run; '' when none

    @property
    def ok(self) -> bool:
        return self.result is not None

    mb_per_s = property(lambda self: self.result.bw / 1e6 if self.result else None)
    iops = property(lambda self: self.result.iops if self.result else None)
    lat_us = property(lambda self: self.result.lat_us if self.result else None)

    def per_gib(self, cpu: Optional[float]):
        if cpu is None or not self.result or not self.result.bytes:
            return None
        return cpu / (self.result.bytes / GIB)

    def per_io(self, cpu: Optional[float]):
        if cpu is None or not self.result or not self.result.ios:
            return None
        return cpu * 1e6 / self.result.ios

    @property
    def total_cpu(self):
        """sluice + OSD + fio: every process this run measured."""
        parts = [self.sluice_cpu, self.osd_cpu, self.fio_cpu]
        if self.osd_cpu is None or self.fio_cpu is None:
            return None
        return sum(p for p in parts if p is not None)

    sluice_s_per_gib = property(lambda self: self.per_gib(self.sluice_cpu))
    sluice_us_per_io = property(lambda self: self.per_io(self.sluice_cpu))
    osd_s_per_gib = property(lambda self: self.per_gib(self.osd_cpu))
    osd_us_per_io = property(lambda self: self.per_io(self.osd_cpu))
    fio_s_per_gib = property(lambda self: self.per_gib(self.fio_cpu))
    fio_us_per_io = property(lambda self: self.per_io(self.fio_cpu))
    total_s_per_gib = property(lambda self: self.per_gib(self.total_cpu))


@dataclass
class Row:
    """One job: its samples on both sides, and the medians the tables show."""
    label: str
    rw: str
    bs: str
    iodepth: int
    samples: list = field(default_factory=list)

    def side(self, side: str) -> list:
        return [s for s in self.samples if s.side == side]

    def good(self, side: str) -> list:
        return [s for s in self.side(side) if s.ok]

    def median(self, side: str, figure: str):
        values = [v for v in (getattr(s, figure) for s in self.good(side)) if v is not None]
        return statistics.median(values) if values else None

    def spread(self, side: str, figure: str = "mb_per_s"):
        values = [getattr(s, figure) for s in self.good(side)]
        return f"{min(values):.2f}..{max(values):.2f}" if values else None

    @property
    def ratio(self):
        """Median MB/s of sluice over the ceiling's (the same as IOPS: one request size)."""
        s, c = self.median(SLUICE, "mb_per_s"), self.median(CEILING, "mb_per_s")
        return s / c if s is not None and c else None

    @property
    def paired(self) -> list:
        """sluice ÷ ceiling within each repeat, where both sides ran: drift between repeats
        cancels in each pair."""
        out = []
        for rep in sorted({s.rep for s in self.samples}):
            c = [s for s in self.good(CEILING) if s.rep == rep]
            k = [s for s in self.good(SLUICE) if s.rep == rep]
            if c and k and c[0].mb_per_s:
                out.append(k[0].mb_per_s / c[0].mb_per_s)
        return out

    def error(self, side: str) -> str:
        errors = [s.error for s in self.side(side) if s.error]
        if not errors:
            return ""
        text = "; ".join(dict.fromkeys(errors))
        n = len(self.side(side))
        return text if n == 1 else f"{len(errors)} of {n} runs failed: {text}"


def missing_programs() -> list:
    return [p for p in PROGRAMS if shutil.which(p) is None]


def has_rbd_engine() -> bool:
    try:
        out = subprocess.run(["fio", "--enghelp"], capture_output=True, text=True,
                             timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired):
        return False
    return any(line.strip() == "rbd" for line in out.splitlines())


def sluice_has_rbd(binary: str) -> bool:
    """`sluice serve --help` defines --rbd-conf (an option line that starts with it)."""
    text = tools.help_text([binary, "serve", "--help"])
    return re.search(r"^\s*--rbd-conf(?:[\s=<]|$)", text, re.MULTILINE) is not None


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("ceph: sluice serving an RBD image over NBD against fio's rbd engine (the ceiling)")
    why = _cannot_run()
    if why:
        r.say()
        r.say(f"[ceph] SKIPPED: {why}")
        return
    sluice_ok = sluice_has_rbd(ctx.binary)
    if not sluice_ok:
        r.say()
        r.say(f"[ceph] WARNING: {ctx.binary} has no rbd backend (`sluice serve --help` names no "
              "--rbd-conf): only the ceiling is measured, the sluice columns stay empty.")
    osd_bytes = int(os.environ.get("CEPH_OSD_BYTES") or OSD_BYTES)
    directory = os.path.join(ctx.workdir, "ceph")
    cluster = Cluster(directory, os.path.join(directory, "ceph.conf"), None, osd_bytes)
    # Stopped whatever happens from here on, an interrupted start included: the daemons
    # leave the script's process group as they start, so an interrupt does not reach them.
    try:
        _start_cluster(ctx, cluster)
        _prepare_image(ctx, cluster)
        intro = describe(ctx, cluster, sluice_ok)
        for line in intro:
            r.say(line)
        rows = [_measure_job(ctx, cluster, spec, sluice_ok) for spec in JOBS]
        report.publish(ctx, intro, rows, sluice_ok)
    finally:
        _stop_cluster(ctx, cluster)


def _cannot_run() -> str:
    """Why this machine cannot run the experiment, or ''."""
    absent = missing_programs()
    if absent:
        packages = sorted({PROGRAMS[p] for p in absent})
        return (f"the Ceph programs {', '.join(absent)} are missing; install them with: "
                f"apt-get install {' '.join(packages)} (and librbd1, which fio's rbd engine "
                "and sluice's backend load)")
    if not os.access(CLUSTER_SCRIPT, os.X_OK):
        return (f"no {CLUSTER_SCRIPT}: the cluster is started by that script, which a tree "
                "unpacked from bench/pack does not carry")
    if not has_rbd_engine():
        return "this fio has no rbd engine (`fio --enghelp` does not list rbd; Debian's fio has it)"
    return ""


def describe(ctx: Context, cluster: Cluster, sluice_ok: bool) -> list:
    """The lines above the tables, printed and kept in ceph.md."""
    cores = len(os.sched_getaffinity(0))
    fill = cluster.fill
    sluice_cmd = " ".join(sluice_argv("sluice", cluster, "SOCK")).replace(cluster.conf, "CONF")
    return [
        f"machine: {machine.one_line()}",
        f"ceph: {_ceph_version()}; a throwaway single-node cluster (scripts/ceph-cluster): one "
        f"monitor, one manager, one OSD whose objects live in RAM (memstore, "
        f"{cluster.osd_bytes / GIB:.1f} GiB), authentication off, pool `{POOL}` with one copy, "
        f"all on 127.0.0.1. Image {POOL}/{IMAGE}: {IMAGE_BYTES >> 20} MiB, features "
        f"{cluster.features}, written once end to end (1M sequential writes through fio's rbd "
        f"engine, {fmt(fill.bw / 1e6) if fill else '-'} MB/s) so that reads hit real objects.",
        f"ceiling: fio --ioengine=rbd --clientname={CLIENT} --pool={POOL} --rbdname={IMAGE} "
        "with CEPH_CONF=CONF: librbd inside fio, straight to the cluster, no NBD hop.",
        f"sluice: `{sluice_cmd}` (its default threads), started fresh for each sluice run and "
        f"stopped after it; fio --ioengine=nbd --uri={sluice_uri('SOCK')}. librbd runs inside "
        "sluice; both sides' librbd read the same ceph.conf."
        + ("" if sluice_ok else " NOT RUN: this sluice has no rbd backend (no --rbd-conf)."),
        f"each run: one fio job (one connection, one librbd client), --direct=1 --time_based, "
        f"{ctx.runtime} s. {_repeat_text(ctx)}",
        "CPU: user + system seconds over each fio run: sluice's process tree (/proc; librbd's "
        "threads included), the OSD's (ceph-osd) and fio's (the harness's child, getrusage; on "
        "the ceiling side that includes librbd, on the sluice side libnbd). The monitor and "
        "manager are idle and not counted. 'sum' adds the three; 'CPUs busy' is the share of "
        "the run's CPUs not idle (/proc/stat, a hypervisor's steal included), whoever used "
        "them.",
        f"note: {cores} core{'s' if cores != 1 else ''}, nothing pinned: the OSD, sluice and "
        "fio share them. The ceiling has one process fewer in the path, and CPU time sluice "
        "takes is CPU time the OSD cannot use, so where the CPUs are all busy the ratio "
        "measures sluice's CPU cost per request as much as its latency. On a real cluster the "
        "OSDs run on other machines.",
    ]


def _ceph_version() -> str:
    try:
        out = subprocess.run(["ceph", "--version"], capture_output=True, text=True,
                             timeout=10).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "version unknown"
    return out.splitlines()[0] if out else "version unknown"


def _repeat_text(ctx: Context) -> str:
    if ctx.repeat == 1:
        return "One run per side and job (--repeat 1): ceiling first, then sluice."
    return (f"{ctx.repeat} runs per side and job, interleaved: ceiling then sluice, then sluice "
            "then ceiling, and so on, so that a drifting machine weighs on both; each figure "
            "is the median of its runs, on its own.")


# --- the cluster --------------------------------------------------------------------------

def _start_cluster(ctx: Context, cluster: Cluster) -> None:
    """scripts/ceph-cluster start, tried twice: a start now and then stops short (a monitor
    command refused while the cluster settles); the second try begins from an empty DIR."""
    r = ctx.report
    env = dict(os.environ, CEPH_OSD_BYTES=str(cluster.osd_bytes))
    r.say()
    r.say(f"starting a single-node Ceph cluster in {cluster.dir} (scripts/ceph-cluster, "
          f"memstore OSD of {cluster.osd_bytes / GIB:.1f} GiB) ...")
    for attempt in (1, 2):
        began = time.monotonic()
        try:
            done = subprocess.run([CLUSTER_SCRIPT, "start", cluster.dir], env=env,
                                  stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                  timeout=CLUSTER_START_SECONDS)
        except subprocess.TimeoutExpired:
            raise RuntimeError(f"scripts/ceph-cluster start took over {CLUSTER_START_SECONDS} "
                               f"s; the cluster's logs are in "
                               f"{os.path.join(ctx.logdir, 'ceph')}")
        if done.returncode == 0:
            break
        why = (f"scripts/ceph-cluster start failed ({done.returncode}): "
               f"{done.stderr.strip()[-600:] or 'no message'}")
        if attempt == 2:
            raise RuntimeError(f"{why}; the cluster's logs are in "
                               f"{os.path.join(ctx.logdir, 'ceph')}")
        r.say(f"  {why}; stopping what it started and trying once more")
        _stop_cluster(ctx, cluster, keep_logs="ceph-failed-start")
        shutil.rmtree(cluster.dir, ignore_errors=True)
    lines = done.stdout.strip().splitlines()
    if lines and os.path.exists(lines[-1]):
        cluster.conf = lines[-1]
    cluster.osd_pid = _pid(os.path.join(cluster.dir, "run", "osd.0.pid"))
    r.say(f"  up in {time.monotonic() - began:.0f} s; ceph.conf {cluster.conf}, "
          f"OSD pid {cluster.osd_pid or 'unknown (its CPU is not measured)'}")


def _stop_cluster(ctx: Context, cluster: Cluster, keep_logs: str = "ceph") -> None:
    """Stop every daemon the script started (it kills by pid), then keep the cluster's own
    logs (small: a few hundred KiB) beside the servers', in logs/KEEP_LOGS/."""
    try:
        subprocess.run([CLUSTER_SCRIPT, "stop", cluster.dir], stdin=subprocess.DEVNULL,
                       capture_output=True, timeout=CLUSTER_STOP_SECONDS)
    except (OSError, subprocess.TimeoutExpired) as e:
        ctx.report.say(f"warning: scripts/ceph-cluster stop {cluster.dir} failed: {e}; "
                       "stop its daemons by the pids in its run/ directory")
    logs = os.path.join(cluster.dir, "log")
    if os.path.isdir(logs):
        shutil.copytree(logs, os.path.join(ctx.logdir, keep_logs), dirs_exist_ok=True)


def _pid(path: str) -> Optional[int]:
    try:
        with open(path) as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _rbd(cluster: Cluster, *args) -> str:
    done = subprocess.run(["rbd", "-c", cluster.conf, *args], stdin=subprocess.DEVNULL,
                          capture_output=True, text=True, timeout=120)
    if done.returncode != 0:
        raise RuntimeError(f"rbd {' '.join(args)} failed: {done.stderr.strip()[-400:]}")
    return done.stdout


def _prepare_image(ctx: Context, cluster: Cluster) -> None:
    """Create the image (rbd's default features) and write all of it once with 1M sequential
    writes through fio's rbd engine, so reads find real objects rather than holes."""
    r = ctx.report
    _rbd(cluster, "create", "--size", f"{IMAGE_BYTES >> 20}M", f"{POOL}/{IMAGE}")
    info = _rbd(cluster, "info", f"{POOL}/{IMAGE}")
    found = re.search(r"^\s*features:\s*(.*)$", info, re.MULTILINE)
    cluster.features = found.group(1).strip() if found else "unknown"
    job = fio.Job(rw="write", bs=1 << 20, iodepth=8, runtime=600, time_based=False)
    path = os.path.join(ctx.fiodir, "ceph-fill.json")
    try:
        cluster.fill = fio.run(ceiling_command(cluster, job), job, path)
        fio.cleanup(path)
    except fio.FioError as e:
        raise RuntimeError(f"filling {POOL}/{IMAGE} with fio's rbd engine failed: {e}")
    if cluster.fill.bytes < IMAGE_BYTES:
        raise RuntimeError(f"filling {POOL}/{IMAGE} wrote {cluster.fill.bytes} of "
                           f"{IMAGE_BYTES} bytes")
    r.say(f"  {POOL}/{IMAGE}: {IMAGE_BYTES >> 20} MiB, features {cluster.features}; filled "
          f"once at {fmt(cluster.fill.bw / 1e6)} MB/s (1M sequential writes, QD8)")


# --- the two sides ------------------------------------------------------------------------

def ceiling_command(cluster: Cluster, job: fio.Job) -> list:
    """fio's rbd engine: librbd inside fio, straight to the cluster. The engine takes the
    cluster's configuration from CEPH_CONF only; env execs fio, so the pid and the CPU time
    measured are fio's."""
    # fio._common: the job options every fio command line of the harness shares.
    return (["env", f"CEPH_CONF={cluster.conf}", "fio", "--ioengine=rbd",
             f"--clientname={CLIENT}", f"--pool={POOL}", f"--rbdname={IMAGE}"]
            + fio._common(job))


def sluice_argv(binary: str, cluster: Cluster, sock: str) -> list:
    return [binary, "serve", "--unix", sock, "--export", f"{EXPORT}=rbd:{POOL}/{IMAGE}",
            "--rbd-conf", cluster.conf, "--log-level", "warn"]


def sluice_uri(sock: str) -> str:
    return f"nbd+unix:///{EXPORT}?socket={sock}"


class SluiceServer:
    """sluice serving the image on a Unix socket: servers.py starts TCP servers only, so
    this experiment starts its own, the same way (own session, dies with the harness)."""

    def __init__(self, ctx: Context, cluster: Cluster):
        self.sock = os.path.join(cluster.dir, "sluice.sock")
        self.log_path = os.path.join(ctx.logdir, "sluice-rbd.log")
        self.uri = sluice_uri(self.sock)
        try:
            os.unlink(self.sock)
        except OSError:
            pass
        argv = sluice_argv(ctx.binary, cluster, self.sock)
        with open(self.log_path, "a") as log:
            log.write(f"\n$ {' '.join(argv)}\n")
            log.flush()
            self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                          stderr=log, start_new_session=True,
                                          preexec_fn=servers._die_with_parent)
        self.pid = self.popen.pid
        try:
            self._wait_accepting()
        except BaseException:
            self.stop()
            raise

    def _wait_accepting(self) -> None:
        deadline = time.monotonic() + SLUICE_START_SECONDS
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise servers.StartError(f"sluice exited with status {self.popen.returncode}: "
                                         f"{servers._tail(self.log_path)}")
            try:
                with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
                    s.settimeout(0.5)
                    s.connect(self.sock)
                    return
            except OSError:
                time.sleep(0.02)
        raise servers.StartError(f"sluice did not accept connections on {self.sock} within "
                                 f"{SLUICE_START_SECONDS} s: {servers._tail(self.log_path)}")

    def stop(self) -> None:
        for sig, wait in ((signal.SIGTERM, SLUICE_STOP_SECONDS), (signal.SIGKILL, 5)):
            if self.popen.poll() is not None:
                return
            try:
                os.killpg(self.pid, sig)   # it leads its own session: its pid is its group
            except (ProcessLookupError, PermissionError):
                pass
            try:
                self.popen.wait(timeout=wait)
                return
            except subprocess.TimeoutExpired:
                continue


def _measure_job(ctx: Context, cluster: Cluster, spec: tuple, sluice_ok: bool) -> Row:
    label, rw, bs, qd = spec
    row = Row(label, rw, bs, qd)
    job = fio.Job(rw=rw, bs=parse_size(bs), iodepth=qd, runtime=ctx.runtime)
    sluice_failed = "" if sluice_ok else "no rbd backend in this sluice"
    for rep in range(ctx.repeat):
        order = SIDES if rep % 2 == 0 else SIDES[::-1]
        for position, side in enumerate(order):
            sample = Sample(side, rep, position == 0)
            if side == SLUICE and sluice_failed:
                if sluice_ok:       # it failed to start: said once, recorded for every run
                    sample.error = sluice_failed
                    row.samples.append(sample)
                continue
            name = f"ceph-{label}-{side}" + (f"-run{rep + 1}" if ctx.repeat > 1 else "")
            sample.after = cluster.last_client
            sample.leftover = _clear_leftovers(cluster)
            cluster.last_client = side
            if side == CEILING:
                _fio_run(ctx, cluster, ceiling_command(cluster, job), job, name, sample, None)
            else:
                try:
                    server = SluiceServer(ctx, cluster)
                except servers.StartError as e:
                    sluice_failed = f"sluice did not start: {e}"
                    ctx.report.say(f"note: {sluice_failed}")
                    sample.error = sluice_failed
                    row.samples.append(sample)
                    continue
                try:
                    _fio_run(ctx, cluster, fio.nbd_command(server.uri, job), job, name, sample,
                             server.pid)
                finally:
                    server.stop()
            row.samples.append(sample)
        ctx.report.progress(f"ceph | {label} | run {rep + 1} ({' then '.join(order)}): "
                            f"{_rep_summary(row, rep)}")
    return row


def watchers(cluster: Cluster) -> list:
    """The clients watching the image (`rbd status`); [] also when rbd cannot say."""
    try:
        out = _rbd(cluster, "status", "--format", "json", f"{POOL}/{IMAGE}")
        return json.loads(out).get("watchers", [])
    except (RuntimeError, ValueError, subprocess.TimeoutExpired):
        return []


def lockers(cluster: Cluster) -> list:
    """The holders of the image's locks (`rbd lock ls`: the exclusive lock shows as an 'auto'
    lock); [] also when rbd cannot say."""
    try:
        return json.loads(_rbd(cluster, "lock", "ls", "--format", "json", f"{POOL}/{IMAGE}"))
    except (RuntimeError, ValueError, subprocess.TimeoutExpired):
        return []


def _clear_leftovers(cluster: Cluster) -> str:
    """Clear what the client of the previous run left on the image: it has ended (fio exited,
    sluice was stopped and reaped) and nothing else uses this image, so every watcher and
    lock holder now is a dead client. Its lock is removed (`rbd lock rm`, which also
    blocklists it) and every watcher's address is blocklisted, which makes the OSD drop its
    watch. '' when there was nothing; else what was cleared, and what could not be."""
    done = []
    for lock in lockers(cluster):
        what = f"lock of {lock.get('locker', '?')}"
        try:
            _rbd(cluster, "lock", "rm", f"{POOL}/{IMAGE}", lock["id"], lock["locker"])
            done.append(what)
        except (RuntimeError, KeyError, subprocess.TimeoutExpired) as e:
            done.append(f"{what} NOT removed: {e}")
    for watcher in watchers(cluster):
        address = watcher.get("address", "?")
        done.append(f"watch of client.{watcher.get('client', '?')} ({address})")
        try:
            subprocess.run(["ceph", "-c", cluster.conf, "osd", "blocklist", "add", address],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            pass
    if not done:
        return ""
    deadline = time.monotonic() + LEFTOVER_GONE_SECONDS
    while watchers(cluster) and time.monotonic() < deadline:
        time.sleep(0.2)
    if watchers(cluster):
        done.append(f"a watch was still there after {LEFTOVER_GONE_SECONDS} s")
    return ", ".join(done)


def _fio_run(ctx: Context, cluster: Cluster, command: list, job: fio.Job, name: str,
             sample: Sample, sluice_pid: Optional[int]) -> None:
    """One fio run, with the CPU time of sluice (its process tree), the OSD and fio (a child
    of this process: RUSAGE_CHILDREN grows by its time when it is reaped) bracketed around
    it, and how busy this run's CPUs were."""
    json_path = os.path.join(ctx.fiodir, _slug(name) + ".json")
    cpus = sorted(os.sched_getaffinity(0))
    osd0 = _cpu(cluster.osd_pid)
    sluice0 = _cpu(sluice_pid)
    child0 = _children_cpu()
    ticks0 = proc.cpu_ticks(cpus)
    try:
        sample.result = fio.run(command, job, json_path)
        fio.cleanup(json_path)
    except fio.FioError as e:
        sample.error = str(e)
    ticks1 = proc.cpu_ticks(cpus)
    sample.fio_cpu = _children_cpu() - child0
    sample.sluice_cpu = _delta(sluice0, _cpu(sluice_pid))
    sample.osd_cpu = _delta(osd0, _cpu(cluster.osd_pid))
    total = ticks1[1] - ticks0[1]
    sample.busy = (ticks1[0] - ticks0[0]) / total if total > 0 else None


def _cpu(pid: Optional[int]) -> Optional[float]:
    if pid is None or not proc.alive(pid):
        return None
    return proc.cpu_seconds(pid)


def _delta(before, after):
    return after - before if before is not None and after is not None else None


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _rep_summary(row: Row, rep: int) -> str:
    parts = []
    for side in SIDES:
        s = next((x for x in row.samples if x.side == side and x.rep == rep), None)
        if s is None:
            continue
        if not s.ok:
            parts.append(f"{side} failed: {s.error}")
            continue
        text = f"{side} {fmt(s.mb_per_s)} MB/s, {fmt(s.iops)} IOPS"
        if side == SLUICE and s.sluice_s_per_gib is not None:
            text += f", sluice CPU {s.sluice_s_per_gib:.3g} s/GiB"
        parts.append(text)
    c = next((x for x in row.good(CEILING) if x.rep == rep), None)
    k = next((x for x in row.good(SLUICE) if x.rep == rep), None)
    if c and k and c.mb_per_s:
        parts.append(f"sluice ÷ ceiling {k.mb_per_s / c.mb_per_s:.2f}x")
    cleared = [x.side for x in row.samples if x.rep == rep and x.leftover]
    if cleared:
        parts.append(f"LEFTOVERS of the client before cleared before the "
                     f"{' and '.join(cleared)} run (it ended without closing the image)")
    return "; ".join(parts)


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)
