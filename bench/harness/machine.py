"""machine.txt: what the numbers of a run were measured on, so a reader can judge them."""

import datetime
import os
import platform
import shutil
import socket
import subprocess

import build
import fio
import image as image_mod
import servers
import tools
from units import size_label


def describe(repo: str, binary: str, features: set, image: str, scratch: str, argv: list) -> str:
    fstype, device = image_mod.filesystem(image)
    lines = [
        f"date: {datetime.datetime.now().astimezone().isoformat(timespec='seconds')}",
        f"host: {socket.gethostname()}",
        f"kernel: {platform.release()} ({platform.version()})",
        f"cpu: {_cpu_model()}",
        f"cores: {os.cpu_count()} online, {len(os.sched_getaffinity(0))} usable by this run",
        f"memory: {_mem_total()}",
        f"fio: {fio.version()}{_where('fio')}",
        f"nbdkit: {tools.version('nbdkit')}{_where('nbdkit')}, plugins from "
        f"{servers.nbdkit_plugin_dir() or 'its own plugin directory'}",
        f"qemu-nbd: {tools.version('qemu-nbd')}{_where('qemu-nbd')}",
        f"nbd-server: {tools.version('nbd-server')}{_where('nbd-server')}",
        f"libnbd: {tools.version('nbdinfo')}{_where('nbdinfo')}",
        f"sluice: {_which_sluice(repo, binary)}",
        f"sluice serve options present: "
        f"{', '.join(sorted(features)) or 'none of ' + ', '.join(build.OPTIONAL_FLAGS)}",
        f"sluice data paths measured: {', '.join(build.data_paths(binary)) or 'default only'}",
        f"sluice serve defaults: "
        f"{', '.join(f'{k} {v}' for k, v in build.defaults(binary).items()) or 'not stated'}",
        f"image: {image} ({size_label(image_mod.size_of(image))}) on {fstype} {device}",
        f"scratch image (write jobs): {scratch}",
        f"io scheduler of {device}: {_scheduler(device)}",
        f"tcp: {_tcp()}",
        f"command: {' '.join(argv)}",
    ]
    return "\n".join(lines) + "\n"


def one_line() -> str:
    """The machine in one line, for a table's caption: CPU, cores, memory, kernel."""
    return (f"{_cpu_model()}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
            f"{_mem_total()}, kernel {platform.release()}, host {socket.gethostname()}")


def _which_sluice(repo: str, binary: str) -> str:
    """The binary and the commit it was built from, as far as this run knows: one from
    outside the checkout (`--sluice`) need not be its commit's."""
    inside = os.path.realpath(binary).startswith(os.path.realpath(repo) + os.sep)
    if inside:
        return f"{binary} at commit {_commit(repo)}"
    return f"{binary} (given; its build is not known here, the checkout is at commit {_commit(repo)})"


def _where(program: str) -> str:
    """' (/path/of/program)', so a run with carried tools (bench/pack) says which it used."""
    path = shutil.which(program)
    return f" ({path})" if path else ""


def _commit(repo: str) -> str:
    """In a tree unpacked from bench/pack, the commit it was packed at; else the work tree's."""
    try:
        with open(os.path.join(repo, "carry", "MANIFEST.txt")) as f:
            for line in f:
                if line.startswith("commit:"):
                    return line.split(":", 1)[1].strip() + " (packed by bench/pack)"
    except OSError:
        pass
    return build.git_description(repo)


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _mem_total() -> str:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    kib = int(line.split()[1])
                    return f"{kib / (1 << 20):.1f} GiB"
    except OSError:
        pass
    return "unknown"


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return "unknown"


CONGESTION = "/proc/sys/net/ipv4/tcp_congestion_control"


def read_congestion() -> str:
    """The congestion control new TCP connections get now."""
    now = _read(CONGESTION)
    if now == "unknown":
        raise ValueError(f"cannot read {CONGESTION}, so it could not be put back")
    return now


def set_congestion(name: str) -> str:
    """Makes `name` the congestion control of new TCP connections (the kernel loads its module
    when root asks); returns the one before."""
    before = read_congestion()
    try:
        with open(CONGESTION, "w") as f:
            f.write(name)
    except OSError as e:
        available = _read("/proc/sys/net/ipv4/tcp_available_congestion_control")
        raise ValueError(f"the kernel refused it ({e.strerror}); available now: {available}") from None
    return before


def _tcp() -> str:
    """The congestion control new connections get and the loopback's queueing: with bbr and
    no fq qdisc, TCP paces each socket with its own timer, which changed the 1M read rows
    on loopback by more than any server change (bench/results/2026-11-28-tcp-pacing-vm)."""
    lo = _lo_qdisc() or "unknown (no tc)"
    return (f"congestion control {_read('/proc/sys/net/ipv4/tcp_congestion_control')}, "
            f"default qdisc {_read('/proc/sys/net/core/default_qdisc')}, lo: {lo}, "
            f"lo rps_cpus {_read('/sys/class/net/lo/queues/rx-0/rps_cpus')}")


def loopback_pacing_warning() -> str:
    """A warning when new TCP connections pace themselves by timer over loopback (bbr and no
    fq qdisc): the rows at several reads in flight then measure how bbr takes the loopback's
    reordering as much as they measure the servers."""
    cc = _read("/proc/sys/net/ipv4/tcp_congestion_control")
    if not cc.startswith("bbr"):
        return ""
    if " fq " in f" {_lo_qdisc()} ":
        return ""
    return (f"TCP congestion control is {cc} and lo has no fq qdisc: every loopback socket is paced "
            "by its own timer, which on a 2-core VM cut sluice's spliced 1M reads at 8 in flight "
            "to 0.56-0.57x nbdkit where cubic gave 0.98-1.19x (bench/results/2026-11-28-tcp-pacing-vm); "
            "`--tcp-congestion cubic` compares the servers the way Debian's default does")


def _lo_qdisc() -> str:
    """`tc qdisc show dev lo`'s first line; empty without tc."""
    try:
        out = subprocess.run(["tc", "qdisc", "show", "dev", "lo"], capture_output=True, text=True)
    except OSError:
        return ""
    return out.stdout.split("\n")[0].strip() if out.returncode == 0 else ""


def _scheduler(device: str) -> str:
    name = os.path.basename(device)
    for candidate in (name, name.rstrip("0123456789")):
        try:
            with open(f"/sys/block/{candidate}/queue/scheduler") as f:
                return f.read().strip()
        except OSError:
            continue
    return "unknown"
