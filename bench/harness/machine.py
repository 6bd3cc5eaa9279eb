"""machine.txt: what the numbers of a run were measured on, so a reader can judge them."""

import datetime
import os
import platform
import shutil
import socket

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
        f"sluice: {binary} at commit {_commit(repo)}",
        f"sluice serve options present: "
        f"{', '.join(sorted(features)) or 'none of ' + ', '.join(build.OPTIONAL_FLAGS)}",
        f"sluice data paths measured: {', '.join(build.data_paths(binary)) or 'default only'}",
        f"sluice serve defaults: "
        f"{', '.join(f'{k} {v}' for k, v in build.defaults(binary).items()) or 'not stated'}",
        f"image: {image} ({size_label(image_mod.size_of(image))}) on {fstype} {device}",
        f"scratch image (write jobs): {scratch}",
        f"io scheduler of {device}: {_scheduler(device)}",
        f"command: {' '.join(argv)}",
    ]
    return "\n".join(lines) + "\n"


def one_line() -> str:
    """The machine in one line, for a table's caption: CPU, cores, memory, kernel."""
    return (f"{_cpu_model()}, {os.cpu_count()} cores ({len(os.sched_getaffinity(0))} usable), "
            f"{_mem_total()}, kernel {platform.release()}, host {socket.gethostname()}")


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


def _scheduler(device: str) -> str:
    name = os.path.basename(device)
    for candidate in (name, name.rstrip("0123456789")):
        try:
            with open(f"/sys/block/{candidate}/queue/scheduler") as f:
                return f.read().strip()
        except OSError:
            continue
    return "unknown"
