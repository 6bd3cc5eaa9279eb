"""Experiment `gateway`: what a re-exporting server costs, over loopback, in one sitting.

The member is `sluice serve` of a copy of the bench image (a file export, the default data
path). The same fio jobs run against it and against three gateways in front of it:
- the member directly;
- `sluice serve --export vol=pool:FILE`, FILE a stripe pool of that one member
  (`sluice pool init --force` first, which writes the pool's metadata into the member's
  first MiB: that is why the member serves a copy made for this experiment, never the image);
- `sluice serve --export vol=nbd://...`, a plain proxy of the member;
- nbdkit's nbd plugin, the same proxy in nbdkit.
Every row moves the same bytes of the file: the pool's volume starts after the member's
1 MiB of metadata, so the other rows start there too (which also keeps their writes off the
pool's superblock). Warm only: the file is read once before each job, so what differs from
row to row is the hop, not the disk. The member runs with `--busy-poll 0` (it stands for
another node; see `_measure_job`).

For each job the member and the gateways start fresh and run side by side; the rows then
take turns, one run each per round (member, pool, proxy, nbdkit), --repeat rounds, so the
drift of a busy machine falls on every row alike; each figure is the median over the rounds.
CPU: the gateway's process tree and the member's, each bracketed around every fio run.
Run only with `--only gateway`.
"""

import dataclasses
import os
import subprocess
from dataclasses import dataclass
from typing import Optional

import cache
import fio
import image
import proc
import servers
from measure import GIB, Context, Point, Run, repeat_note
from report import format_markdown
from units import fmt, fmt_sig, parse_size, ratio

# (label, fio rw, request size, outstanding requests), one connection each; in table order.
JOBS = [
    ("1M seq read QD8", "read", "1M", 8),
    ("4K randread QD32", "randread", "4K", 32),
    ("1M seq write QD8", "write", "1M", 8),
]
# The goals for the pool row: its rate at least this share of the member's, and
# ahead of nbdkit's nbd plugin. The write job is reported, not judged.
GOALS = {"1M seq read QD8": 0.8, "4K randread QD32": 0.7}
# (key, name in the tables and logs), in the order each round runs them.
ROWS = (("member", "member (sluice)"), ("pool", "sluice pool"), ("proxy", "sluice proxy"),
        ("nbdkit", "nbdkit nbd"))
NAMES = dict(ROWS)
# Where the pool's volume starts on its member (docs/pool.md, "The metadata on the members").
POOL_METADATA = 1 << 20
# The span every row ranges over is rounded down to this: whole 1M requests, and never past
# the pool's volume (member data rounded down to the stripe unit, 512K by default).
SPAN_ALIGN = 1 << 20
POOL_INIT_SECONDS = 60

HEADERS = ["job", "row", "MB/s", "IOPS", "lat µs", "÷ member", "gw CPU s/GiB", "gw CPU µs/IO",
           "member CPU s/GiB", "member CPU µs/IO", "goals (pool row)"]
CSV_HEADERS = ["job", "rw", "bs", "iodepth", "row", "mb_per_s", "mb_per_s_min_max", "runs",
               "iops", "lat_us", "ratio_to_member", "ratio_runs_min_max", "gateway_cpu_seconds",
               "gateway_cpu_s_per_gib", "gateway_cpu_us_per_io", "member_cpu_seconds",
               "member_cpu_s_per_gib", "member_cpu_us_per_io", "goal_vs_member", "met_vs_member",
               "ratio_to_nbdkit", "met_vs_nbdkit", "bytes", "ios", "seconds", "error"]


@dataclass
class GatewayRun(Run):
    """One fio run of a row. Run's cpu_seconds is the gateway's (None on the member's own
    row); member_cpu is the member's over the same run."""
    member_cpu: Optional[float] = None

    @property
    def member_s_per_gib(self):
        if not self.result or self.member_cpu is None or not self.result.bytes:
            return None
        return self.member_cpu / (self.result.bytes / GIB)

    @property
    def member_us_per_io(self):
        if not self.result or self.member_cpu is None or not self.result.ios:
            return None
        return self.member_cpu * 1e6 / self.result.ios


class GatewayPoint(Point):
    member_cpu = property(lambda self: self._median("member_cpu"))
    member_s_per_gib = property(lambda self: self._median("member_s_per_gib"))
    member_us_per_io = property(lambda self: self._median("member_us_per_io"))


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("gateway: what re-exporting a sluice member costs (pool, proxy, nbdkit nbd)")
    copy = image.ensure_scratch(ctx.image, r, role="gateway",
                                purpose="for the gateway's member (the pool's metadata goes there)")
    span = (image.size_of(copy) - POOL_METADATA) // SPAN_ALIGN * SPAN_ALIGN
    notes = _notes(ctx, copy, span)
    for line in notes:
        r.say(line)
    skipped = {}
    if not ctx.have("nbdkit"):
        skipped["nbdkit"] = "nbdkit is missing"
    measured = [(spec, _measure_job(ctx, spec, copy, span, skipped)) for spec in JOBS]
    _publish(ctx, measured, notes + [f"{NAMES[k]} not measured: {why}"
                                     for k, why in skipped.items()])


# --- the servers --------------------------------------------------------------------------

def _start_gateways(ctx: Context, member: servers.Running, skipped: dict, out: list) -> None:
    """Start the pool, the proxy and nbdkit in front of the member, appending (key, Running)
    to `out` as each comes up (so the caller stops whatever started); a row that cannot
    start is skipped, and said once (ctx.start, or here for the pool's init)."""
    wanted = []
    if "pool" not in skipped:
        pool_file, why = _init_pool(ctx, member.uri)
        if pool_file:
            wanted.append(("pool", servers.sluice_gateway(ctx.binary, NAMES["pool"],
                                                          f"pool:{pool_file}"), pool_file))
        else:
            skipped["pool"] = why
            ctx.report.say(f"note: skipping {NAMES['pool']}: {why}")
    wanted.append(("proxy", servers.sluice_gateway(ctx.binary, NAMES["proxy"], member.uri),
                   member.uri))
    if "nbdkit" not in skipped:
        wanted.append(("nbdkit", servers.nbdkit_nbd(member.uri), member.uri))
    for key, server, what in wanted:
        running = ctx.start(server, what)
        if running is not None:
            out.append((key, running))
        else:  # ctx.start said why, and will not try it again in the next jobs
            skipped.setdefault(key, f"it did not start (logs/{servers.log_name(server)})")


def _init_pool(ctx: Context, member_uri: str) -> tuple:
    """Write the one-member stripe's pool file and `sluice pool init --force` it:
    (the file, '') or (None, why)."""
    path = os.path.join(ctx.workdir, "gateway-pool.toml")
    with open(path, "w") as f:
        f.write(f'layout = "stripe"\nmembers = ["{member_uri}"]\n')
    argv = [ctx.binary, "pool", "init", "--force", f"pool:{path}"]
    log_path = os.path.join(ctx.logdir, "gateway-pool-init.log")
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        try:
            status = subprocess.run(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                    timeout=POOL_INIT_SECONDS).returncode
        except subprocess.TimeoutExpired:
            return None, f"sluice pool init did not finish within {POOL_INIT_SECONDS} s"
    if status != 0:
        return None, f"sluice pool init exited with {status} (logs/gateway-pool-init.log)"
    return path, ""


# --- one job ------------------------------------------------------------------------------

def _measure_job(ctx: Context, spec: tuple, copy: str, span: int, skipped: dict) -> dict:
    """{row key: GatewayPoint} of one job: the member and its gateways started fresh, the
    rounds run, everything stopped (gateways first: the pool releases itself on the member)."""
    label = spec[0]
    cache.warm(copy)
    # The member stands for another node: spinning after its work (busy-poll) would take
    # the cores the gateway and fio share with it here, which on a cluster are another
    # machine's. Measured on the 2-core VM: with its default spin, the member's four
    # connections from a sluice gateway kept two of its workers spinning, and the gateway
    # rows fell by up to a fifth; nbdkit's one connection kept one.
    member_server = dataclasses.replace(servers.sluice(ctx.binary, busy_poll=0), name=NAMES["member"])
    member = ctx.start(member_server, copy)
    if member is None:
        raise RuntimeError("the member did not start (see the note above and logs/)")
    gateways, runs = [], {}
    try:
        _start_gateways(ctx, member, skipped, gateways)
        for i in range(ctx.repeat):
            for key, running in [("member", member)] + gateways:
                name = f"gateway-{label}-{key}" + (f"-run{i + 1}" if ctx.repeat > 1 else "")
                job = _job(spec, ctx.runtime, span, pool=key == "pool")
                gateway = running if key != "member" else None
                runs.setdefault(key, []).append(_run_once(ctx, member, gateway, running.uri,
                                                          job, name))
    finally:
        for _, running in reversed(gateways):
            running.stop()
        member.stop()
    points = {key: GatewayPoint(rs) for key, rs in runs.items()}
    for key, point in points.items():
        ctx.report.progress(f"gateway | {label} | {NAMES[key]}: {point.summary()}")
    return points


def _job(spec: tuple, runtime: int, span: int, pool: bool) -> fio.Job:
    """The pool's volume starts at the member's byte POOL_METADATA; every other row starts
    there, so all rows move the same bytes of the file."""
    _, rw, bs, qd = spec
    return fio.Job(rw=rw, bs=parse_size(bs), iodepth=qd, runtime=runtime,
                   offset=None if pool else POOL_METADATA, size=span)


def _run_once(ctx: Context, member: servers.Running, gateway: Optional[servers.Running],
              uri: str, job: fio.Job, name: str) -> GatewayRun:
    """One fio run against uri, with the gateway's CPU (if any) and the member's around it."""
    os.sync()  # as measure.py: an earlier write run's dirty pages go out before, not during
    run = GatewayRun()
    json_path = os.path.join(ctx.fiodir, _slug(name) + ".json")
    gateway0 = proc.cpu_seconds(gateway.pid) if gateway else None
    member0 = proc.cpu_seconds(member.pid)
    try:
        run.result = fio.run(fio.nbd_command(uri, job), job, json_path)
        fio.cleanup(json_path)
    except fio.FioError as e:
        run.error = str(e)
    run.member_cpu = proc.cpu_seconds(member.pid) - member0
    if gateway:
        run.cpu_seconds = proc.cpu_seconds(gateway.pid) - gateway0
    return run


# --- the report ---------------------------------------------------------------------------

def _notes(ctx: Context, copy: str, span: int) -> list:
    cores = len(os.sched_getaffinity(0))
    return [
        repeat_note(ctx) + f" fio's nbd engine, one connection, {ctx.runtime} s per run, "
        f"warm: {copy} (a copy of the image made for this experiment: the pool's metadata is "
        "written into it) is read once before each job, and reads and writes both go to it.",
        f"Rows: {NAMES['member']}: `sluice serve COPY` (file export, default data path); "
        f"{NAMES['pool']}: `sluice serve --export vol=pool:FILE`, FILE `layout = \"stripe\"` "
        "over that one member (default stripe unit 512K, so a 1M request reaches the member "
        "as two), `sluice pool init --force` before each job; "
        f"{NAMES['proxy']}: `sluice serve --export vol=nbd://127.0.0.1:PORT/`; "
        f"{NAMES['nbdkit']}: `nbdkit nbd uri=nbd://127.0.0.1:PORT/`. sluice's gateways run "
        "their default data path: the pool's is `copy` (its member data arrives in memory); "
        "the proxy splices reads of 64 KiB and more from its own connection to the member "
        "once a worker has one, and copies the rest.",
        f"Every row moves the same {span >> 20} MiB of the file: the pool's volume from 0, the "
        f"others from {POOL_METADATA >> 20} MiB, where the pool's volume starts on its member.",
        "For each job the member and the three gateways start fresh and run side by side; "
        "each round runs every row once, in the order of the table, so drift falls on all "
        "rows alike. '÷ member' = the row's MB/s over the member's, read directly (medians; "
        "the CSV also has each round's ratio, min..max).",
        "gw CPU: the re-exporting server's own process tree (user + system, /proc), per GiB "
        "and per I/O; member CPU: the member's over the same runs (on its own row, the "
        "server's). The client's CPU is in neither. "
        f"fio, the member and the gateway share this machine's {cores} cores, so a "
        "gateway's CPU comes out of what the member and fio could use.",
        "Goals (the pool row, as the issue states them): 1M seq read QD8 >= 0.80x the member, "
        "4K randread QD32 >= 0.70x, and ahead of nbdkit's nbd plugin on both. Judged on "
        "the medians; with one round a single run decides, so judge them on the full run.",
    ]


def _publish(ctx: Context, measured: list, notes: list) -> None:
    r = ctx.report
    table, csv_rows, goals = [], [], []
    for spec, points in measured:
        first = True
        for key, name in ROWS:
            point = points.get(key)
            if point is None:
                continue
            judged = _goals(spec[0], points) if key == "pool" else []
            goals += [(spec[0], g) for g in judged]
            table.append(_table_row(spec[0] if first else "", name, point, points, judged))
            csv_rows.append(_csv_row(spec, name, point, points, judged))
            first = False
    title = "[warm] the member read directly, and through each gateway"
    r.table(title, HEADERS, table, left=2)
    for spec, points in measured:
        for key, point in points.items():
            if point.error:
                r.say(f"  {spec[0]} | {NAMES[key]} "
                      f"{'partly failed' if point.ok else 'failed'}: {point.error}")
    verdict = _verdict(goals)
    r.say(verdict)
    r.csv("gateway.csv", CSV_HEADERS, csv_rows)
    with open(os.path.join(ctx.out_dir, "gateway.md"), "w", encoding="utf-8") as f:
        f.write("# gateway: what a re-exporting server costs\n\n"
                + format_markdown(HEADERS, table, left=2) + "\n\n" + verdict + "\n\n"
                + "\n\n".join(notes) + "\n")


def _over(a: Optional[Point], b: Optional[Point]):
    """a's median MB/s over b's, or None when either did not run."""
    if a is None or b is None or not a.ok or not b.ok or not b.mb_per_s:
        return None
    return a.mb_per_s / b.mb_per_s


def _goals(label: str, points: dict) -> list:
    """The pool row's goals in this job: (what, ratio, met) each, met None when a side is
    missing; [] for a job without goals."""
    low = GOALS.get(label)
    if low is None:
        return []
    pool = points.get("pool")
    vs_member, vs_nbdkit = _over(pool, points.get("member")), _over(pool, points.get("nbdkit"))
    return [(f">= {low:.2f}x member", vs_member, None if vs_member is None else vs_member >= low),
            ("ahead of nbdkit", vs_nbdkit, None if vs_nbdkit is None else vs_nbdkit > 1)]


def _met(met: Optional[bool]) -> str:
    return "not measured" if met is None else "met" if met else "not met"


def _table_row(label: str, name: str, p: GatewayPoint, points: dict, judged: list) -> list:
    vs = ratio(p.mb_per_s, points["member"].mb_per_s) if p.ok and "member" in points else "-"
    # The member ratio is in the row already; the nbdkit one is not.
    text = "; ".join(what + (f" ({value:.2f}x)" if "nbdkit" in what and value else "")
                     + f": {_met(met)}" for what, value, met in judged)
    return [label, name, fmt(p.mb_per_s), fmt(p.iops), fmt(p.lat_us), vs if p.ok else "failed",
            fmt_sig(p.cpu_s_per_gib), fmt_sig(p.cpu_us_per_io), fmt_sig(p.member_s_per_gib),
            fmt_sig(p.member_us_per_io), text]


def _round_ratios(p: Point, ref: Optional[Point]):
    """'min..max' of the row's MB/s over the member's within each round, or None."""
    if ref is None:
        return None
    values = [a.mb_per_s / b.mb_per_s for a, b in zip(p.runs, ref.runs)
              if a.ok and b.ok and b.mb_per_s]
    return f"{min(values):.3f}..{max(values):.3f}" if values else None


def _csv_row(spec: tuple, name: str, p: GatewayPoint, points: dict, judged: list) -> list:
    ref = points.get("member")
    vs_member = _over(p, ref)
    goal = judged[0] if judged else (None, None, None)
    nbdkit = judged[1] if judged else (None, _over(p, points.get("nbdkit")), None)
    yes_no = lambda met: None if met is None else "yes" if met else "no"  # noqa: E731
    return [*spec, name, _r(p.mb_per_s, 2), p.mb_spread, len(p.good), _r(p.iops, 1),
            _r(p.lat_us, 2), _r(vs_member, 3), _round_ratios(p, ref), _r(p.cpu_seconds, 3),
            _r(p.cpu_s_per_gib, 4), _r(p.cpu_us_per_io, 3), _r(p.member_cpu, 3),
            _r(p.member_s_per_gib, 4), _r(p.member_us_per_io, 3),
            GOALS.get(spec[0]) if judged else None, yes_no(goal[2]),
            _r(nbdkit[1], 3) if name != NAMES["nbdkit"] else None, yes_no(nbdkit[2]),
            _int(p.bytes), _int(p.ios), _r(p.seconds, 3), p.error]


def _verdict(goals: list) -> str:
    """One line: how many of the pool row's goals were met, and which were not."""
    if not goals:
        return "goals: none judged (the pool row did not run)"
    met = [g for g in goals if g[1][2]]
    missed = [f"{label} {what} ({value:.2f}x)" for label, (what, value, ok) in goals
              if ok is False]
    absent = [f"{label} {what}" for label, (what, _, ok) in goals if ok is None]
    return (f"goals (pool row): met {len(met)} of {len(goals)}"
            + (f"; not met: {', '.join(missed)}" if missed else "")
            + (f"; not measured: {', '.join(absent)}" if absent else ""))


def _r(value, digits):
    return None if value is None else round(value, digits)


def _int(value):
    return None if value is None else int(round(value))


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-." else "_" for c in name)
