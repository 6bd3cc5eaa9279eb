"""Experiment `qos`: does load restriction (docs/serve.md, LOAD RESTRICTION) hold what it
promises? Issue 27's benchmark rows, each against a sluice started with a configuration file
of its own, every export serving the bench image warm from the page cache:

1. a limit holds: bps = 100M with 1M reads QD8, iops = 2000 with 4K random reads QD32;
   the rate after the first second over the limit; and with burst = 2, the first second's
   rate over rate x (1 + burst);
2. shares: weights 100 and 300, two connections reading at once under a storage cap;
3. reservation: reservation-iops = 2000 while a second class of weight 10000 floods;
4. overhead: the same fio jobs against sluice without QoS and with a class whose limits are
   never reached, alternating, server CPU per I/O.

Run only with `--only qos`; qos_report.py prints the table and writes the files.
"""

import os
import threading
from dataclasses import dataclass, field, replace
from typing import Optional

import cache
import fio
import metrics
import qos_report as report
import servers
from measure import Context, Point, run_point
from qos_report import Row
from units import fmt

SECONDS, QUICK_SECONDS = 10, 3
# Row 1: the limits under test and the burst of the burst rows (seconds of the limit).
BPS_TEXT, BPS_LIMIT, IOPS_LIMIT, BURST = "100M", 100 << 20, 2000, 2
# Row 2: the weights, and the storage caps that make the two connections contend: (label,
# [limits], data path). The iops cap is far below what this machine serves warm, so the
# scheduler, not how two CPUs happen to be shared, divides it. The inflight cap (mClock's
# fixed queue depth) contends only where the storage is the slow stage: warm, a read leaves
# the storage stage at once and the CPUs decide, so that variant reads the disk (O_DIRECT),
# one request at a time: at 4 the VM's disk (~40k IOPS) kept up with what two busy CPUs
# sent, requests stopped queueing at the cap, and the ratio fell to 1.3 in one run of four.
WEIGHTS = (100, 300)
SHARE_CAPS = (("storage-iops = 8000, warm", {"storage-iops": 8000}, None),
              ("storage-inflight = 1, data-path direct (disk)", {"storage-inflight": 1}, "direct"))
# A run that has not ended this long after its runtime has requests stuck in the server.
GRACE_SECONDS = 15
# Row 3: the reservation, the cap both classes contend for, and the flood's weight (the
# most there is), so that without its reservation the reserved class would get ~1%.
RESERVATION, RESERVATION_CAP, FLOOD_WEIGHT = 2000, 4000, 10000
# Row 4: limits no job here reaches (the fastest does ~100k requests, ~3 GB/s, a second).
ROOMY = {"iops": 100_000_000, "bps": "1T"}
OVERHEAD_JOBS = (("4K randread QD32", "randread", 4096, 32), ("1M read QD8", "read", 1 << 20, 8))


@dataclass
class Setup:
    """One sluice configuration: classes, exports (name -> class) and storage caps."""
    name: str
    classes: dict
    exports: dict
    limits: dict = field(default_factory=dict)
    data_path: Optional[str] = None     # every export's; None: the server's default
    # --metrics, to show what a stuck run holds; off where CPU is compared with a server
    # started without it.
    metrics: bool = True


def _value(v) -> str:
    return f'"{v}"' if isinstance(v, str) else str(v)


def config_text(setup: Setup, image: str) -> str:
    """The TOML file: every export serves the same image, read-only."""
    lines = []
    if setup.limits:
        lines.append("[limits]")
        lines += [f"{k} = {_value(v)}" for k, v in setup.limits.items()]
    for name, keys in setup.classes.items():
        lines.append(f"[qos.{name}]")
        lines += [f"{k} = {_value(v)}" for k, v in keys.items()]
    for export, cls in setup.exports.items():
        lines += ["[[export]]", f'name = "{export}"', f"spec = {_value(image)}",
                  "read-only = true"]
        if cls:
            lines.append(f'qos = "{cls}"')
        if setup.data_path:
            lines.append(f'data-path = "{setup.data_path}"')
    return "\n".join(lines) + "\n"


def qos_server(ctx: Context, setup: Setup) -> servers.Server:
    path = os.path.join(ctx.workdir, f"qos-{setup.name}.toml")

    def write(launch: servers.Launch) -> None:
        with open(path, "w") as f:
            f.write(config_text(setup, launch.image))

    def argv(launch: servers.Launch) -> list:
        args = [ctx.binary, "serve", "--config", path, "--listen", f"127.0.0.1:{launch.port}",
                "--log-level", "warn"]
        if launch.metrics_port:
            args += ["--metrics", f"127.0.0.1:{launch.metrics_port}"]
        return args

    return servers.Server(name=f"sluice qos {setup.name}", kind="sluice", cache="page cache",
                          argv=argv, extra_files=write, metrics=setup.metrics)


def uri(running: servers.Running, export: str) -> str:
    return f"nbd://127.0.0.1:{running.launch.port}/{export}"


def fio_argv(targets: list, rw: str, bs: int, qd: int, seconds: int,
             log: Optional[str] = None) -> list:
    """One fio job (one connection) per (name, uri) target, all running at once."""
    argv = ["fio", "--ioengine=nbd", f"--rw={rw}", f"--bs={bs}", f"--iodepth={qd}",
            "--direct=1", f"--runtime={seconds}", "--time_based", "--thread",
            "--output-format=json"]
    if log:
        # Averages over whole seconds: the first line is the first second's rate.
        argv += [f"--write_bw_log={log}", f"--write_iops_log={log}", "--log_avg_msec=1000"]
    for name, target in targets:
        argv += [f"--name={name}", f"--uri={target}"]
    return argv


def first_second(log: str, kind: str, job: int = 1) -> float:
    """The first one-second window of fio's log of its job-th job: bytes (bw, logged in
    KiB/s) or requests (iops)."""
    with open(f"{log}_{kind}.{job}.log") as f:
        value = float(f.readline().split(",")[1])
    return value * 1024 if kind == "bw" else value


def after_first(result: fio.Result, first: float, kind: str) -> float:
    """The rate from the second second on: the run's total less the first second."""
    total = result.bytes if kind == "bw" else result.ios
    return (total - first) / (result.seconds - 1)


def _run_fio(ctx: Context, running, name: str, argv: list, seconds: int) -> list:
    """fio's results; a run still going shortly before it is killed has what sluice holds
    then taken down (once fio is killed, its connections close and nothing is held)."""
    seen = []
    watch = threading.Timer(seconds + GRACE_SECONDS - 2, lambda: seen.append(held_text(running)))
    watch.start()
    try:
        return fio.run_jobs(argv, seconds, os.path.join(ctx.fiodir, f"qos-{name}.json"),
                            GRACE_SECONDS)
    except fio.FioError as e:
        watch.cancel()  # a run that failed early: no snapshot; a late one: let it finish
        watch.join()
        raise fio.FioError(f"{e}; {seen[0] if seen else held_text(running)}")
    finally:
        watch.cancel()


def held_text(running) -> str:
    """What the server's scheduler holds now, from its metrics: evidence for a stuck run."""
    if not running.metrics_url:
        return "no metrics endpoint"
    try:
        samples = metrics.scrape(running.metrics_url)
    except OSError as e:
        return f"no metrics ({e})"
    held = {dict(k[1]).get("class"): v for k, v in samples.items()
            if k[0] == "sluice_qos_held_requests" and v}
    tokens = {dict(k[1]).get("class"): v for k, v in samples.items()
              if k[0] == "sluice_qos_tokens"}
    parts = [f"class {c}: {v:.0f} held, {tokens.get(c, float('nan')):.0f} tokens"
             for c, v in held.items()]
    return "sluice holds " + ("; ".join(parts) if parts else "no request")


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("qos: load restriction, limits, bursts, shares, reservations, overhead")
    seconds = QUICK_SECONDS if ctx.quick else SECONDS
    load_before = _loadavg()
    cache.warm(ctx.image)
    rows = _limit_rows(ctx, seconds) + _share_rows(ctx, seconds)
    rows += _reservation_rows(ctx, seconds)
    overhead, runs = _overhead_rows(ctx, seconds)
    report.show(ctx, rows + overhead, runs, seconds, (load_before, _loadavg()))


def _loadavg() -> str:
    with open("/proc/loadavg") as f:
        return " ".join(f.read().split()[:3])


# --- 1. a limit holds, and bursts ------------------------------------------------------------

LIMIT_CASES = (
    # (export, class keys, fio rw, bs, qd, the log to read, unit, limit)
    ("bps", {"bps": BPS_TEXT}, "read", 1 << 20, 8, "bw", "MB/s", BPS_LIMIT),
    ("iops", {"iops": IOPS_LIMIT}, "randread", 4096, 32, "iops", "IOPS", IOPS_LIMIT),
    ("bps-burst", {"bps": BPS_TEXT, "burst": BURST}, "read", 1 << 20, 8, "bw", "MB/s",
     BPS_LIMIT),
    ("iops-burst", {"iops": IOPS_LIMIT, "burst": BURST}, "randread", 4096, 32, "iops", "IOPS",
     IOPS_LIMIT),
)


def _limit_rows(ctx: Context, seconds: int) -> list:
    setup = Setup("limits", {c[0]: c[1] for c in LIMIT_CASES}, {c[0]: c[0] for c in LIMIT_CASES})
    running = ctx.start(qos_server(ctx, setup), ctx.image)
    if running is None:
        return []
    try:
        return [row for case in LIMIT_CASES for row in _limit_case(ctx, running, case, seconds)]
    finally:
        running.stop()


def _limit_case(ctx, running, case, seconds) -> list:
    export, keys, rw, bs, qd, kind, unit, limit = case
    log = os.path.join(ctx.workdir, f"qos-{export}")
    label = f"{export}: {', '.join(f'{k} = {v}' for k, v in keys.items())}"
    job = "1M read QD8" if bs == 1 << 20 else "4K randread QD32"
    argv = fio_argv([(export, uri(running, export))], rw, bs, qd, seconds, log)
    try:
        result = _run_fio(ctx, running, export, argv, seconds)[0]
        first = first_second(log, kind)
    except (fio.FioError, OSError, ValueError, IndexError) as e:
        return [Row("burst" if "burst" in keys else "limit", f"{label}, {job}", error=str(e))]
    total = result.bytes if kind == "bw" else result.ios
    ctx.report.progress(f"qos | {label} | first second {fmt(first / _scale(unit))} {unit}, "
                        f"run {fmt(total / result.seconds / _scale(unit))} {unit}")
    if "burst" in keys:
        return [report.burst_row(label, job, first, limit, keys["burst"], unit)]
    return report.limit_rows(label, job, seconds, first, result, after_first(result, first, kind),
                             limit, unit)


def _scale(unit: str) -> float:
    return 1e6 if unit == "MB/s" else 1.0


# --- 2. shares ---------------------------------------------------------------------------------

def _share_rows(ctx: Context, seconds: int) -> list:
    rows = []
    for cap_label, cap, data_path in SHARE_CAPS:
        classes = {f"w{w}": {"weight": w} for w in WEIGHTS}
        setup = Setup("shares-" + next(iter(cap)), classes, {c: c for c in classes}, cap,
                      data_path)
        rates = _contend(ctx, setup, list(classes), seconds)
        rows.append(report.share_row(cap_label, WEIGHTS, rates))
    return rows


def _contend(ctx: Context, setup: Setup, exports: list, seconds: int):
    """Each export's connection reading 4K at random at QD32, all at once: per export, in
    order, (IOPS from the second second on, IOPS over the whole run); or the error text."""
    running = ctx.start(qos_server(ctx, setup), ctx.image)
    if running is None:
        return "sluice did not start (see its log)"
    log = os.path.join(ctx.workdir, f"qos-{setup.name}")
    try:
        targets = [(e, uri(running, e)) for e in exports]
        results = _run_fio(ctx, running, setup.name,
                           fio_argv(targets, "randread", 4096, 32, seconds, log), seconds)
        rates = [(after_first(res, first_second(log, "iops", i + 1), "iops"), res.iops)
                 for i, res in enumerate(results)]
    except (fio.FioError, OSError, ValueError, IndexError) as e:
        return str(e)
    finally:
        running.stop()
    ctx.report.progress(f"qos | {setup.name} | " + ", ".join(
        f"{e} {fmt(steady)} IOPS (run {fmt(whole)})" for e, (steady, whole) in zip(exports, rates)))
    return rates


# --- 3. reservation ----------------------------------------------------------------------------

def _reservation_rows(ctx: Context, seconds: int) -> list:
    rows = []
    for reserved in (True, False):
        keys = {"reservation-iops": RESERVATION} if reserved else {}
        classes = {"critical": keys or {"weight": 100}, "flood": {"weight": FLOOD_WEIGHT}}
        setup = Setup("reservation" if reserved else "no-reservation", classes,
                      {c: c for c in classes}, {"storage-iops": RESERVATION_CAP})
        rates = _contend(ctx, setup, list(classes), seconds)
        rows.append(report.reservation_row(reserved, RESERVATION, RESERVATION_CAP,
                                           FLOOD_WEIGHT, rates))
    return rows


# --- 4. overhead -------------------------------------------------------------------------------

def _overhead_rows(ctx: Context, seconds: int) -> tuple:
    """Without QoS and with a roomy class, each job alternating which server goes first over
    at least two rounds, so slow drift of a busy machine falls on both."""
    plain = servers.sluice(ctx.binary)
    roomy = qos_server(ctx, Setup("roomy", {"roomy": ROOMY}, {"": "roomy"}, metrics=False))
    pair = [ctx.start(plain, ctx.image), ctx.start(roomy, ctx.image)]
    if None in pair:
        return [Row("overhead", "no QoS vs a roomy class", error="a server did not start")], []
    rounds = max(2, ctx.repeat)
    once = replace(ctx, repeat=1)
    rows, runs = [], []
    try:
        for label, rw, bs, qd in OVERHEAD_JOBS:
            points = _alternate(once, pair, fio.Job(rw, bs, qd, seconds), label, rounds)
            rows += report.overhead_rows(label, points)
            runs += [(label, side, i + 1, run) for side, point in zip(("none", "roomy"), points)
                     for i, run in enumerate(point.runs)]
    finally:
        for running in pair:
            running.stop()
    return rows, runs


def _alternate(ctx: Context, pair: list, job: fio.Job, label: str, rounds: int) -> list:
    runs = ([], [])
    for i in range(rounds):
        order = (0, 1) if i % 2 == 0 else (1, 0)
        for side in order:
            running = pair[side]
            name = f"qos-overhead-{label}-{'roomy' if side else 'none'}-run{i + 1}"
            point = run_point(ctx, running, fio.nbd_command(running.uri, job), job, name, False)
            runs[side].extend(point.runs)
            ctx.report.progress(f"qos | overhead {label} | {'roomy' if side else 'no QoS'} | "
                                f"round {i + 1}: {_run_text(point)}")
    return [Point(runs[0]), Point(runs[1])]


def _run_text(point: Point) -> str:
    if not point.ok:
        return f"failed: {point.error}"
    return f"{fmt(point.iops)} IOPS, {point.cpu_us_per_io:.2f} CPU µs/IO"

