"""The memory-bound job of the `interference` experiment: triad.c, compiled here with cc,
run pinned to the job's cores, read as it prints its bandwidth samples.

One triad process serves a whole row: it is paused (SIGSTOP) while the server's I/O is
measured alone and runs otherwise; the harness asks for the median of its samples inside
time windows (wall-clock, the clock fio's report uses), so the job's figures come from the
very seconds the I/O ran or did not run.
"""

import os
import shutil
import signal
import statistics
import subprocess
import threading
import time
from typing import Optional

import tools
from netns import die_with_parent

SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "triad.c")
CFLAGS = ["-O2", "-pthread"]
# The three arrays together span at least this many times the last-level cache, so a pass
# cannot be served from it; never less than 64 MiB each.
LLC_MULTIPLE = 4
MIN_ARRAY_MIB = 64
# A sample every 100 ms: a 1 s window (--runtime 1) still holds about nine whole samples.
SAMPLE_MS = 100
# Allocating and touching the arrays (1 GiB on a 260 MiB LLC) takes about a second.
READY_TIMEOUT_SECONDS = 120
STOP_TIMEOUT_SECONDS = 5


class TriadError(Exception):
    pass


def compile_triad(report, workdir: str, allow_install: bool) -> Optional[str]:
    """The triad binary in workdir (temporary, like the servers' configs), or None. Without
    a compiler, the one bench/pack carried (carry/bin/triad, first in PATH) if there is one."""
    carried = shutil.which("triad")
    if shutil.which("cc") is None and carried:
        report.say(f"no cc: using the triad that bench/pack compiled ({carried})")
        return carried
    if not tools.ensure_one(report, "cc", "build-essential", allow_install):
        return None
    binary = os.path.join(workdir, "triad")
    command = ["cc"] + CFLAGS + ["-o", binary, SOURCE]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        report.say(f"error: {' '.join(command)} failed: {(proc.stdout + proc.stderr).strip()[-500:]}")
        return None
    return binary


def llc_bytes() -> Optional[int]:
    """Size of the largest cache /sys lists for CPU 0 (the last level), or None."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    best = None
    try:
        entries = [e for e in os.listdir(base) if e.startswith("index")]
    except OSError:
        return None
    for entry in entries:
        try:
            with open(os.path.join(base, entry, "size")) as f:
                text = f.read().strip()
        except OSError:
            continue
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:].upper(), 1)
        digits = text.rstrip("KMGkmg")
        if digits.isdigit():
            size = int(digits) * scale
            best = size if best is None or size > best else best
    return best


def array_mib(llc: Optional[int]) -> int:
    if llc is None:
        return MIN_ARRAY_MIB
    return max(MIN_ARRAY_MIB, -(-LLC_MULTIPLE * llc // (3 << 20)))


class Triad:
    """A running triad pinned to `cpus` (a taskset list), one thread per CPU. mib None: the
    control load instead (`triad --spin`: registers only, no memory traffic, no samples)."""

    def __init__(self, binary: str, cpus: Optional[str], mib: Optional[int],
                 guard_seconds: float, log_path: str):
        argv = ([binary, str(int(guard_seconds)), str(mib), str(SAMPLE_MS)] if mib is not None
                else [binary, "--spin", str(int(guard_seconds))])
        if cpus:
            argv = ["taskset", "-c", cpus] + argv
        self._log = open(log_path, "a")
        self._log.write(f"\n$ {' '.join(argv)}\n")
        self._log.flush()
        self._samples = []          # (t0, t1, MB/s)
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self.ready_line = ""
        # taskset execs triad, so this pid is the job's own (SIGSTOP reaches it).
        self._popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                       stderr=self._log, text=True, bufsize=1,
                                       start_new_session=True, preexec_fn=die_with_parent)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        if not self._ready.wait(READY_TIMEOUT_SECONDS) or self._popen.poll() is not None:
            self.stop()
            raise TriadError(f"triad did not start (see {log_path})")

    def _read(self) -> None:
        for line in self._popen.stdout:
            words = line.split()
            if words[:1] == ["sample"] and len(words) == 4:
                with self._lock:
                    self._samples.append(tuple(float(w) for w in words[1:]))
            elif words[:1] == ["ready"]:
                self.ready_line = line.strip()
                self._ready.set()
            if words[:1] != ["sample"]:  # samples stay in memory; the log keeps the rest
                self._log.write(line)
                self._log.flush()  # the spin control appends to the same log meanwhile
        self._ready.set()  # ended before it was ready: the waiter sees it exit

    def pause(self) -> None:
        os.kill(self._popen.pid, signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self._popen.pid, signal.SIGCONT)

    def alone(self, seconds: float) -> tuple:
        """Let the job run alone for `seconds`; (t0, t1) of that window."""
        t0 = time.time()
        time.sleep(seconds)
        return t0, time.time()

    def median(self, t0: float, t1: float):
        """Median MB/s of the samples that lie wholly inside [t0, t1], and how many there
        were; (None, 0) when none did (a window shorter than a sample)."""
        # A sample ending at t1 is printed a moment later: wait for it.
        time.sleep(max(0.0, t1 + SAMPLE_MS / 1000.0 * 1.5 - time.time()))
        with self._lock:
            inside = [mb for s0, s1, mb in self._samples if s0 >= t0 and s1 <= t1]
        return (statistics.median(inside) if inside else None), len(inside)

    def stop(self) -> None:
        if self._popen.poll() is None:
            try:
                os.kill(self._popen.pid, signal.SIGCONT)  # a paused process cannot act on TERM
                os.kill(self._popen.pid, signal.SIGTERM)
                self._popen.wait(timeout=STOP_TIMEOUT_SECONDS)
            except subprocess.TimeoutExpired:
                self._popen.kill()
                self._popen.wait()
            except ProcessLookupError:
                pass
        self._reader.join(timeout=STOP_TIMEOUT_SECONDS)
        self._log.close()
