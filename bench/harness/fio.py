"""The one client: fio, over NBD (nbd engine, libnbd) or on the local file (io_uring engine)."""

import json
import os
import subprocess
from dataclasses import dataclass
from typing import Optional

# fio gets this long beyond its own runtime (connection setup, 256 threads starting,
# a server that stops answering) before it is killed and the point counts as failed.
FIO_GRACE_SECONDS = 60


@dataclass
class Job:
    rw: str                 # read, randread, write, randwrite
    bs: int                 # request size in bytes
    iodepth: int            # outstanding requests per connection
    runtime: int            # seconds
    time_based: bool = True  # False: stop after one pass over the image or at runtime, whichever first
    numjobs: int = 1        # connections (fio threads), each with iodepth outstanding requests
    # With numjobs > 1: each connection keeps to its own slice of this many bytes (connection
    # i starts at i x slice), so no block is read twice in a cold pass and sequential readers
    # do not walk in step over the same blocks. None: every connection ranges over the image.
    slice_bytes: Optional[int] = None
    cpus: Optional[str] = None  # --cpus_allowed: the cores fio may run on; None: any
    # --rate: bytes per second per job (connection) and direction, a plain number because
    # fio reads a suffix like 400m in binary units (kb_base=1024). None: as fast as it goes.
    rate: Optional[int] = None
    # --offset and --size: the bytes the job ranges over, when not the whole export (a
    # re-exported pool's volume starts past its member's metadata). None: fio's default.
    offset: Optional[int] = None
    size: Optional[int] = None


@dataclass
class Result:
    bytes: int
    ios: int
    seconds: float
    bw: float           # bytes per second, all connections together
    iops: float
    lat_us: float       # mean latency, submission to completion, in microseconds
    # When fio wrote its report (seconds since the epoch), right after the I/O ended: the I/O
    # ran from ended - seconds to ended. None when the JSON has no timestamp_ms.
    ended: Optional[float] = None


class FioError(Exception):
    pass


def nbd_command(uri: str, job: Job) -> list:
    return ["fio", "--ioengine=nbd", f"--uri={uri}"] + _common(job)


def local_command(path: str, job: Job) -> list:
    return ["fio", "--ioengine=io_uring", f"--filename={path}"] + _common(job)


def _common(job: Job) -> list:
    args = [
        "--name=bench",
        f"--rw={job.rw}",
        f"--bs={job.bs}",
        f"--iodepth={job.iodepth}",
        "--direct=1",
        f"--runtime={job.runtime}",
        f"--numjobs={job.numjobs}",
        "--thread",
        "--group_reporting",
        "--output-format=json",
    ]
    if job.time_based:
        args.append("--time_based")
    if job.slice_bytes:
        args += [f"--size={job.slice_bytes}", f"--offset_increment={job.slice_bytes}"]
    if job.cpus:
        args.append(f"--cpus_allowed={job.cpus}")
    if job.rate:
        args.append(f"--rate={job.rate}")
    if job.offset:
        args.append(f"--offset={job.offset}")
    if job.size:
        args.append(f"--size={job.size}")
    return args


def slice_for(image_bytes: int, connections: int, bs: int):
    """Job.slice_bytes for `connections` connections over an image: an equal share, whole
    requests; None for one connection."""
    if connections <= 1:
        return None
    return image_bytes // connections // bs * bs


def run(command: list, job: Job, json_path: str) -> Result:
    """Run fio, keep its JSON at json_path, and return the totals over reads and writes."""
    _execute(command, job.runtime, json_path)
    return parse(json_path)


def run_jobs(command: list, runtime: int, json_path: str, grace: int = FIO_GRACE_SECONDS) -> list:
    """Run fio with several jobs (no --group_reporting): one Result per job, in order.
    grace: seconds past the runtime before fio is killed."""
    _execute(command, runtime, json_path, grace)
    return parse_jobs(json_path)


def _execute(command: list, runtime: int, json_path: str, grace: int = FIO_GRACE_SECONDS) -> None:
    timeout = runtime + grace
    with open(json_path + ".stderr", "w") as err:
        try:
            proc = subprocess.run(command + [f"--output={json_path}"], stdin=subprocess.DEVNULL,
                                  stdout=subprocess.DEVNULL, stderr=err, timeout=timeout)
        except subprocess.TimeoutExpired:
            raise FioError(f"fio did not finish within {timeout} s (killed)")
    if proc.returncode != 0:
        why = _error_line(json_path) or _tail(json_path + ".stderr") or "no message"
        raise FioError(f"fio exited with {proc.returncode}: {why}")


def _error_line(json_path: str) -> str:
    """fio puts its error messages ('fio: pid=..., error=...') in --output, before the JSON."""
    try:
        with open(json_path) as f:
            for line in f:
                if line.startswith("{"):
                    break
                if "err" in line:
                    return line.strip()
    except OSError:
        pass
    return ""


def parse(json_path: str) -> Result:
    """The first job's totals: with --group_reporting, all connections together."""
    return parse_jobs(json_path)[0]


def parse_jobs(json_path: str) -> list:
    with open(json_path) as f:
        text = f.read()
    # The nbd engine prints "fio: connected to NBD server" lines before the JSON.
    start = text.find("\n{") + 1 if not text.startswith("{") else 0
    try:
        data = json.loads(text[start:])
    except ValueError:
        raise FioError(f"no JSON from fio in {json_path}")
    ended = data["timestamp_ms"] / 1000.0 if "timestamp_ms" in data else None
    return [_job_result(job, ended) for job in data["jobs"]]


def _job_result(job: dict, ended) -> Result:
    if job.get("error"):
        raise FioError(f"fio job error {job['error']}")
    total_bytes = total_ios = 0
    bw = iops = lat_weighted = 0.0
    for direction in ("read", "write"):
        d = job[direction]
        total_bytes += d["io_bytes"]
        total_ios += d["total_ios"]
        bw += d["bw_bytes"]
        iops += d["iops"]
        lat_weighted += d["lat_ns"]["mean"] * d["total_ios"]
    if total_ios == 0:
        raise FioError("fio completed no I/O")
    return Result(bytes=total_bytes, ios=total_ios, seconds=job["job_runtime"] / 1000.0,
                  bw=bw, iops=iops, lat_us=lat_weighted / total_ios / 1000.0, ended=ended)


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path) as f:
            return " | ".join(l.strip() for l in f.read().splitlines()[-lines:] if l.strip())
    except OSError:
        return ""


def version() -> str:
    try:
        return subprocess.run(["fio", "--version"], capture_output=True, text=True).stdout.strip()
    except OSError:
        return "missing"


def has_nbd_engine() -> bool:
    try:
        out = subprocess.run(["fio", "--enghelp"], capture_output=True, text=True).stdout
    except OSError:
        return False
    return any(line.strip() == "nbd" for line in out.splitlines())


def cleanup(json_path: str) -> None:
    """Drop an empty stderr file of a clean run; the JSON stays for whoever wants the detail."""
    try:
        if os.path.getsize(json_path + ".stderr") == 0:
            os.unlink(json_path + ".stderr")
    except OSError:
        pass
