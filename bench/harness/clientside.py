"""Experiment `client`: sluice's client tools against libnbd's and fio's, on one sluice
server serving the warm image. Two comparisons, each in the same run on the same server:

- copy: the whole image out to a file in /dev/shm (RAM, so the destination is not the
  limit), and that file in to a sluice memory export, `sluice copy` against `nbdcopy`;
- requests: fixed size and queue depth, `sluice bench` against fio's nbd engine (libnbd);
- mount: the export as a FUSE file read start to end with dd, `sluice mount` against
  libnbd's `nbdfuse`.

Besides throughput it reports the client's own CPU time (user + system, from wait4) per GiB
moved: the client-side half of "CPU per byte"."""

import csv
import os
import shutil
import statistics
import subprocess
import tempfile
import threading

import cache
import fio
import proc
import servers
from measure import Context
from units import fmt, fmt_sig

GIB = 1 << 30
KILL_AFTER_SECONDS = 300

# (pattern, size, depth): the corners of the sweep that matter most to a client.
REQUEST_POINTS = [("seq", 4096, 1), ("rand", 4096, 32), ("seq", 1 << 20, 1), ("seq", 1 << 20, 8)]
QUICK_REQUEST_POINTS = [("rand", 4096, 32), ("seq", 1 << 20, 8)]


def timed(argv: list) -> tuple:
    """Runs argv; returns (ok, wall seconds, client CPU seconds, stderr tail)."""
    import time
    err = tempfile.TemporaryFile()
    began = time.monotonic()
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=err)
    killer = threading.Timer(KILL_AFTER_SECONDS, p.kill)
    killer.start()
    try:
        _, status, usage = os.wait4(p.pid, 0)
    finally:
        killer.cancel()
    p.returncode = os.waitstatus_to_exitcode(status)
    wall = time.monotonic() - began
    err.seek(0)
    tail = err.read().decode(errors="replace").strip().splitlines()[-3:]
    return p.returncode == 0, wall, usage.ru_utime + usage.ru_stime, " | ".join(tail)


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("client: sluice's client tools against nbdcopy and fio's nbd engine (libnbd)")
    running = ctx.start(servers.sluice(ctx.binary), ctx.image)
    if running is None:
        return
    # Every tool reads the same warm image: the first one must not pay for the disk.
    cache.warm(ctx.image)
    rows_csv = []
    try:
        _copy(ctx, running, rows_csv)
        _requests(ctx, running, rows_csv)
        _mount(ctx, running, rows_csv)
    finally:
        running.stop()
    r.csv("client.csv", ["test", "tool", "pattern", "size_bytes", "depth", "mb_per_s", "client_cpu_s_per_gib",
                         "runs", "error"], rows_csv)


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def _copy(ctx, running, rows_csv) -> None:
    r = ctx.report
    if not shutil.which("nbdcopy"):
        r.say("note: nbdcopy is not installed; the copy comparison is skipped")
        return
    local = "/dev/shm/sluice-bench-copy.img"
    size = ctx.image_size
    r.say(f"copy out: the whole {size / GIB:.1f} GiB image from {running.uri} over a file of the "
          f"same size in {local} (RAM); copy in: that file to a sluice memory:{size} export. "
          f"{ctx.repeat} run(s) each, median. The file is made once and overwritten in place, so "
          "no run pays for allocating RAM (that varied by 3x run to run); the memory export is "
          "written over and over, so only its first run allocates (each tool gets one such run "
          "before the measured ones).")
    shutil.copyfile(ctx.image, local)
    try:
        _copy_direction(ctx, rows_csv, "copy out", running.uri, local, size)
        target = ctx.start(servers.sluice(ctx.binary), f"memory:{size}")
        if target is None:
            return
        try:
            _copy_direction(ctx, rows_csv, "copy in", local, target.uri, size, warm_up=True)
        finally:
            target.stop()
    finally:
        _unlink(local)


def _copy_direction(ctx, rows_csv, title, src, dst, size, warm_up=False) -> None:
    r = ctx.report
    results = {}
    for name, argv in (("sluice copy", [ctx.binary, "copy", src, dst]), ("nbdcopy", ["nbdcopy", src, dst])):
        if warm_up:
            timed(argv)
        speeds, cpus, errors = [], [], []
        for _ in range(ctx.repeat):
            ok, wall, cpu, err = timed(argv)
            if ok and (dst.startswith("nbd") or os.path.getsize(dst) == size):
                speeds.append(size / wall / 1e6)
                cpus.append(cpu / (size / GIB))
            else:
                errors.append(err or "wrong output size")
        results[name] = (_median(speeds), _median(cpus))
        r.progress(f"client | {title} | {name}: {fmt(results[name][0])} MB/s, "
                   f"{fmt_sig(results[name][1])} CPU s/GiB" + (f" ({errors[0]})" if errors else ""))
        rows_csv.append([title.replace(" ", "_"), name, "seq", "", "", _round(results[name][0]),
                         _round(results[name][1], 4), len(speeds), "; ".join(errors)])
    _table(r, title, results, "sluice copy", "nbdcopy")


def _requests(ctx, running, rows_csv) -> None:
    r = ctx.report
    points = QUICK_REQUEST_POINTS if ctx.quick else REQUEST_POINTS
    r.say(f"requests: one connection, {ctx.runtime} s per run, {ctx.repeat} run(s), median. fio runs "
          "its nbd engine with --direct=1; sluice bench runs one point with --warmup 0.")
    for pattern, bs, qd in points:
        results = {}
        rw = "read" if pattern == "seq" else "randread"
        job = fio.Job(rw=rw, bs=bs, iodepth=qd, runtime=ctx.runtime)
        fio_json = os.path.join(ctx.fiodir, f"client-{rw}-{bs}-{qd}.json")
        out_dir = tempfile.mkdtemp(prefix="sluice-bench-client-")
        try:
            for name in ("sluice bench", "fio nbd"):
                speeds, cpus, errors = [], [], []
                for _ in range(ctx.repeat):
                    if name == "fio nbd":
                        argv = fio.nbd_command(running.uri, job) + [f"--output={fio_json}"]
                    else:
                        argv = [ctx.binary, "bench", running.uri, "--ops", "read", "--patterns", pattern,
                                "--sizes", str(bs), "--depths", str(qd), "--runtime", str(ctx.runtime),
                                "--warmup", "0", "--out", out_dir]
                    ok, wall, cpu, err = timed(argv)
                    moved = _moved(name, fio_json, out_dir) if ok else None
                    if moved:
                        nbytes, seconds = moved
                        speeds.append(nbytes / seconds / 1e6)
                        cpus.append(cpu / (nbytes / GIB))
                    else:
                        errors.append(err or "no result")
                results[name] = (_median(speeds), _median(cpus))
                r.progress(f"client | {pattern} {bs} QD{qd} | {name}: {fmt(results[name][0])} MB/s, "
                           f"{fmt_sig(results[name][1])} CPU s/GiB" + (f" ({errors[0]})" if errors else ""))
                rows_csv.append(["requests", name, pattern, bs, qd, _round(results[name][0]),
                                 _round(results[name][1], 4), len(speeds), "; ".join(errors)])
        finally:
            shutil.rmtree(out_dir, ignore_errors=True)
            fio.cleanup(fio_json)
        _table(r, f"{pattern} read, {bs // 1024}K, QD{qd}", results, "sluice bench", "fio nbd")


def _mounted(path: str) -> bool:
    with open("/proc/self/mounts") as f:
        return any(line.split()[1] == path for line in f if len(line.split()) > 1)


def _mount(ctx, running, rows_csv) -> None:
    """Each tool mounts the export fresh (so the client's page cache starts empty), dd reads
    the whole file with 1 MiB reads through the page cache, then the mount is ended. The
    client CPU is dd's plus the mount process's over the read."""
    import time
    r = ctx.report
    if os.geteuid() != 0 or not os.path.exists("/dev/fuse"):
        r.say("note: the mount comparison needs root and /dev/fuse; skipped")
        return
    if not shutil.which("nbdfuse"):
        r.say("note: nbdfuse is not installed; the mount comparison is skipped")
        return
    size = ctx.image_size
    r.say(f"mount: dd reads the whole {size / GIB:.1f} GiB export through a fresh FUSE mount, "
          f"bs=1M, {ctx.repeat} run(s), median.")
    results = {}
    for name in ("sluice mount", "nbdfuse"):
        speeds, cpus, errors = [], [], []
        for _ in range(ctx.repeat):
            top = tempfile.mkdtemp(prefix="sluice-bench-mount-")
            if name == "sluice mount":
                path = os.path.join(top, "disk")
                argv = [ctx.binary, "mount", running.uri, path]
            else:
                path = os.path.join(top, "nbd")
                argv = ["nbdfuse", top, running.uri]
            mounted_at = path if name == "sluice mount" else top
            p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
            try:
                deadline = time.monotonic() + 10
                while not _mounted(mounted_at) and time.monotonic() < deadline and p.poll() is None:
                    time.sleep(0.05)
                if not _mounted(mounted_at):
                    errors.append("did not mount")
                    continue
                before = proc.cpu_seconds(p.pid)
                ok, wall, dd_cpu, err = timed(["dd", f"if={path}", "of=/dev/null", "bs=1M"])
                mount_cpu = proc.cpu_seconds(p.pid) - before
                if ok:
                    speeds.append(size / wall / 1e6)
                    cpus.append((dd_cpu + mount_cpu) / (size / GIB))
                else:
                    errors.append(err or "dd failed")
            finally:
                subprocess.run(["fusermount3", "-u", mounted_at], stderr=subprocess.DEVNULL)
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
                shutil.rmtree(top, ignore_errors=True)
        results[name] = (_median(speeds), _median(cpus))
        r.progress(f"client | mount | {name}: {fmt(results[name][0])} MB/s, "
                   f"{fmt_sig(results[name][1])} CPU s/GiB" + (f" ({errors[0]})" if errors else ""))
        rows_csv.append(["mount", name, "seq", 1 << 20, "", _round(results[name][0]), _round(results[name][1], 4),
                         len(speeds), "; ".join(errors)])
    _table(r, "mount (dd bs=1M through the FUSE file)", results, "sluice mount", "nbdfuse")


def _moved(name, fio_json, out_dir):
    """(bytes, seconds) the run reports, or None."""
    if name == "fio nbd":
        try:
            res = fio.parse(fio_json)
        except Exception:
            return None
        return (res.bytes, res.seconds) if res.bytes else None
    path = os.path.join(out_dir, "bench.csv")
    try:
        with open(path) as f:
            row = next(csv.DictReader(f))
    except (OSError, StopIteration):
        return None
    nbytes, seconds = int(row["bytes"]), float(row["seconds"])
    return (nbytes, seconds) if nbytes and seconds else None


def _table(r, title, results, ours, theirs) -> None:
    rows = [[name, fmt(mb), fmt_sig(cpu)] for name, (mb, cpu) in results.items()]
    r.table(title, ["client", "MB/s", "client CPU s/GiB"], rows)
    (a_mb, a_cpu), (b_mb, b_cpu) = results[ours], results[theirs]
    if a_mb and b_mb:
        line = f"{ours} / {theirs}: {a_mb / b_mb:.2f}x throughput"
        if a_cpu and b_cpu:
            line += f", {a_cpu / b_cpu:.2f}x CPU per GiB (lower is better)"
        r.say(line)


def _round(value, digits=2):
    return None if value is None else round(value, digits)


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
