"""CPU time and memory of a server's whole process tree, read from /proc.

Servers differ in shape: sluice and nbdkit are one process with threads, qemu-nbd too,
nbd-server forks a child per connection. Summing over the tree treats them alike.
"""

import glob
import os

CLOCK_TICKS_PER_SECOND = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list:
    """pid and every descendant alive now (children of any thread count)."""
    seen, todo = [], [pid]
    while todo:
        p = todo.pop()
        if p in seen:
            continue
        seen.append(p)
        for path in glob.glob(f"/proc/{p}/task/*/children"):
            try:
                with open(path) as f:
                    todo.extend(int(c) for c in f.read().split())
            except OSError:
                pass  # the thread or process went away while we looked
    return seen


def _stat_fields(pid: int):
    with open(f"/proc/{pid}/stat") as f:
        text = f.read()
    # comm (field 2) may hold spaces and parentheses: split after the last ')'.
    return text[text.rindex(")") + 2:].split()


def cpu_seconds(pid: int) -> float:
    """utime+stime of the tree, plus cutime+cstime: children that exited and were reaped
    between two samples (nbd-server's per-connection processes) are counted by their parent."""
    ticks = 0
    for p in tree(pid):
        try:
            fields = _stat_fields(p)
        except OSError:
            continue
        # After comm: state is index 0, so utime/stime/cutime/cstime (fields 14-17) are 11-14.
        ticks += sum(int(x) for x in fields[11:15])
    return ticks / CLOCK_TICKS_PER_SECOND


def _status_kib(pid: int, key: str) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return 0


def peak_rss_bytes(pid: int) -> int:
    """Sum over the tree of VmHWM, the high-water mark of resident memory since each process started."""
    return 1024 * sum(_status_kib(p, "VmHWM") for p in tree(pid))


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
        return state not in ("Z", "X")
    except (OSError, IndexError):
        return False


def cpu_ticks(cpus: list) -> tuple:
    """(busy, total) clock ticks of these CPUs since boot, from /proc/stat: busy is every
    state but idle and iowait. Two readings give how busy the CPUs were in between."""
    busy = total = 0
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if not name.startswith("cpu") or name == "cpu" or int(name[3:]) not in cpus:
                continue
            # user nice system idle iowait irq softirq steal (guest time is inside user)
            ticks = [int(x) for x in fields[:8]]
            total += sum(ticks)
            busy += sum(ticks) - ticks[3] - ticks[4]
    return busy, total
