"""bench/pool's reshape rows: a stripe pool on members 1 and 2, filled and served by
`sluice serve --export vol=pool:FILE`, grows to members 1..4 while it is served
(`sluice pool grow FILE --add URI3 URI4 --served`, then SIGHUP to the server, as
docs/pool.md says for a served stripe). fio reads through the server before the grow,
while the reshape runs (the reshape's rate meanwhile from the coordinator's /metrics), and
after it, on a new connection that sees the grown volume.

The reshape is paced by the pool's `resync-rate` (crates/pool/src/coordinator/reshape.rs
claims a unit only when the rate allows it). It runs at half a link, as the rebuild row
does: its reads come from members 1 and 2, the links the foreground read uses too, so the
reshape takes a quarter of their read capacity and leaves the rest to the foreground. Units
already moved are read from all four members, so the foreground may get more than the
three quarters of two links that the old layout leaves it.

The reshape's progress comes from the coordinator's /metrics (sluice_pool_reshape_done_bytes
and _total_bytes); when the endpoint lacks those families, from `sluice pool status --json`,
which asks the serving coordinator, and the note says so.

`pool` is bench/pool's own namespace (its Row, Coordinator, pool_file, sluice, ...): the
rows are built and measured as the other pool rows are."""

import json
import os
import signal
import subprocess
import time
import urllib.request

import pooljobs
from pooljobs import Sample

RESHAPE_SHARE = 0.5         # resync-rate: this share of one link
START_SECONDS = 20          # from the SIGHUP to the reshape showing in /metrics
# From the SIGHUP to the grown volume: this many times the reshape's paced duration, and a
# minute for the tail (zeroing the new space) and a busy machine.
RESHAPE_SLACK, RESHAPE_EXTRA_SECONDS = 3, 60
POLL_SECONDS = 0.2
AFTER_GOAL = 0.9            # the issue: after the grow, reads >= 0.9 x 4 members
LABEL = "stripe 2 → 4"


def scrape(port: int):
    """(done, total) bytes of the reshape of export "vol"; (0, 0) when none runs, None when
    the coordinator does not answer or its /metrics lacks the reshape families."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return None
    found = {}
    for line in text.splitlines():
        for key in ("done", "total"):
            if line.startswith(f'sluice_pool_reshape_{key}_bytes{{export="vol"}} '):
                found[key] = float(line.rsplit(" ", 1)[1])
    return (found.get("done", 0), found.get("total", 0)) if found else None


def status(binary: str, spec: str):
    """(done, total) bytes of the reshape as `sluice pool status --json` shows it (asked of
    the serving coordinator); (0, 0) when none runs, None when it fails."""
    try:
        p = subprocess.run([binary, "pool", "status", "--json", spec], capture_output=True, text=True, timeout=10)
        r = json.loads(p.stdout).get("reshape") if p.returncode == 0 else None
    except (OSError, ValueError, AttributeError, subprocess.TimeoutExpired):
        return None
    return (r["done_bytes"], r["total_bytes"]) if r else (0, 0)


class Progress:
    """The reshape as the coordinator's /metrics show it (else `pool status`, named in
    `source`), with the first and last sample seen while it ran."""

    def __init__(self, b, port: int, spec: str):
        self.b, self.port, self.spec = b, port, spec
        self.first, self.last, self.ended, self.source = None, None, None, ""

    def read(self):
        m = scrape(self.port)
        if m is not None:
            self.source = "/metrics"
            return m
        m = status(self.b.binary, self.spec)
        if m is not None:
            self.source = "`sluice pool status --json` (/metrics had no sluice_pool_reshape_* families)"
        return m

    def poll(self):
        """(done, total) now, also kept as first/last while running; None if no answer."""
        now, m = time.monotonic(), self.read()
        if m and m[1] > 0:
            self.first = self.first or (now, m[0])
            self.last = (now, m[0])
        elif m and self.last and not self.ended:
            self.ended = now
        return m

    def until(self, test, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if test(self.poll()):
                return True
            time.sleep(POLL_SECONDS)
        return False

    def rate(self):
        """Bytes per second from the first progress seen to the last, or None."""
        if not self.first or not self.last or self.last[0] <= self.first[0]:
            return None
        return (self.last[1] - self.first[1]) / (self.last[0] - self.first[0])


def rows(b, pool) -> dict:
    one = b.base.get(("fio", "read"))
    r = {
        "before": pool.Row(f"{LABEL}: read before the grow", pool.FIO_SERVE, Sample(None, None), 2),
        "during": pool.Row(f"{LABEL}: read while reshaping at half a link", pool.FIO_SERVE, Sample(None, None), 2),
        "reshape": pool.Row(f"{LABEL}: the reshape, resync-rate half a link", "coordinator: members 1, 2 → 1..4",
                            Sample(None, None)),
        "after": pool.Row(f"{LABEL}: read after the grow, new connection", pool.FIO_SERVE, Sample(None, None), 4),
    }
    for row in r.values():
        row.ideal = row.links * one if one and row.links else None
    r["after"].goal = (AFTER_GOAL, r["after"].ideal, "4 × one member")
    return r


def measure(b, pool) -> None:
    """The four rows: filled in, or each given the reason they could not be."""
    r = rows(b, pool)
    b.rows.extend(r.values())
    link = b.base.get(("fio", "read"))
    why = b.pool_missing or ("" if link else "no one-member baseline")
    pace = int(link * 1e6 * RESHAPE_SHARE) if link else 0
    spec = "" if why else "pool:" + pool_file(b, pool, pace)
    why = why or pool.sluice(b, ["pool", "init", spec, "--force"], "reshape") or fill(b, pool, spec)
    if not why:
        why = serve_and_grow(b, pool, spec, r, pace)
    for row in r.values():
        if row.sample.mbps is None and not row.note:
            row.note = why or "not measured"


def pool_file(b, pool, pace: int) -> str:
    path = os.path.join(b.work, "reshape.toml")
    os.replace(pool.pool_file(b, "stripe", 2, f'resync-rate = "{pace}"'), path)
    return path


def fill(b, pool, spec: str) -> str:
    """Writes random data over the whole 2-member volume, once; '' or why not."""
    size = pool.volume_bytes(b, spec, "stripe", 2)
    try:
        pooljobs.run_copy(b.binary, pool.source(b, size), spec, size, 60 + size / 10e6, b.log("reshape"), b.pids())
    except pooljobs.CopyError as e:
        return str(e)
    return ""


def serve_and_grow(b, pool, spec: str, r: dict, pace: int) -> str:
    """Serves the pool, reads, grows it while reading, reads the grown volume; '' or why not."""
    port, sock = pool.servers.free_port(), os.path.join(b.work, "reshape.sock")
    coordinator = pool.Coordinator(b, spec, sock, "reshape-serve", ["--metrics", f"127.0.0.1:{port}"])
    uri = f"nbd+unix:///vol?socket={sock}"
    try:
        why = coordinator.start()
        if why:
            return why
        size = pool.volume_bytes(b, uri, "stripe", 2)
        r["before"].sample = pool.serve_fio(b, uri, "read", "reshape-before")
        why = grow(b, pool, spec, coordinator)
        progress = Progress(b, port, spec)
        if not why and not progress.until(lambda m: m and m[1] > 0, START_SECONDS):
            why = f"no reshape seen within {START_SECONDS} s of the SIGHUP; {logs(b, coordinator)}"
        if why:
            return why
        during(b, pool, uri, r, progress, pace)
        seconds = RESHAPE_EXTRA_SECONDS + RESHAPE_SLACK * size / pace
        why = wait_grown(b, pool, uri, size, progress, coordinator, seconds)
        reshape_row(b, pool, r["reshape"], progress, pace)
        if why:
            return why
        r["after"].sample = pool.serve_fio(b, uri, "read", "reshape-after")
        grown = pool.volume_bytes(b, uri, "stripe", 4)
        r["after"].note = f"volume {pool.size_label(size)} → {pool.size_label(grown)}, read whole on a new connection"
        return ""
    finally:
        coordinator.stop()


def grow(b, pool, spec: str, coordinator) -> str:
    """`pool grow --served` edits the file; SIGHUP has the serving coordinator take it."""
    uris = [pool.netns.member_uri(i) for i in (3, 4)]
    why = pool.sluice(b, ["pool", "grow", spec, "--add", *uris, "--served", "--force"], "reshape")
    if why:
        return why
    coordinator.popen.send_signal(signal.SIGHUP)
    return ""


def during(b, pool, uri: str, r: dict, progress: Progress, pace: int) -> None:
    """fio reads while the reshape runs; the reshape's rate meanwhile goes in the note."""
    m0 = progress.poll()
    t0 = progress.last[0] if progress.last else time.monotonic()
    json_path = os.path.join(b.logs, "reshape-during.json")
    row = r["during"]
    row.sample = pooljobs.repeated(lambda: pooljobs.run_fio([uri], "read", b.runtime, json_path, b.pids()), 1)
    m1 = progress.poll()
    t1 = progress.last[0] if progress.last else time.monotonic()
    notes = []
    before = r["before"].sample.mbps
    if row.sample.mbps and before:
        notes.append(f"{row.sample.mbps / before:.2f} of the read before the grow (moved units are read from 4 members)")
    if m0 and m1 and m1[1] > 0:
        mbps = (m1[0] - m0[0]) / (t1 - t0) / 1e6
        notes.append(f"reshape meanwhile {mbps:.0f} MB/s = {mbps / (pace / RESHAPE_SHARE / 1e6):.2f} of a link")
    else:
        notes.append("**the reshape ended during the read**: the read is not all under the reshape")
    row.note = "; ".join(notes)
    b.progress(f"{row.name}: {pool.fmt(row.sample.mbps)} MB/s; {row.note}")


def wait_grown(b, pool, uri: str, size: int, progress: Progress, coordinator, seconds: float) -> str:
    """Until /metrics shows no reshape and a new connection sees the grown size; '' or why not."""
    def grown(m) -> bool:
        return bool(m) and m[1] == 0 and pool.volume_bytes(b, uri, "stripe", 0) == 2 * size
    if progress.until(grown, seconds):
        return ""
    return f"the volume did not grow within {seconds:.0f} s of waiting; {logs(b, coordinator)}"


def reshape_row(b, pool, row, progress: Progress, pace: int) -> None:
    rate = progress.rate()
    row.sample = Sample(rate / 1e6 if rate else None, None)
    pace_mbps = pace / 1e6
    if rate and rate >= pool.LINK_BOUND * pace:
        row.bound_by = "resync-rate (its pace)"
    tail = ""
    if progress.ended and progress.last:
        tail = f"; zeroing the new space and growing took {progress.ended - progress.last[0]:.1f} s after"
    row.note = (f"MB/s from {progress.source or '/metrics'} while it ran; paced at {pace_mbps:.0f} MB/s (resync-rate, half a link): "
                f"{rate / pace if rate else 0:.2f} of its pace{tail}")
    b.progress(f"{row.name}: {pool.fmt(row.sample.mbps)} MB/s; {row.note}")


def logs(b, coordinator) -> str:
    return (f"serve: {pooljobs.last_line(coordinator.log_path)} (log {coordinator.log_path}); "
            f"pool grow: {pooljobs.last_line(b.log('reshape'))} (log {b.log('reshape')})")
