"""The programs the benchmarks drive: find them, install the missing ones (Debian), ask versions."""

import os
import shutil
import subprocess

import servers

# program -> Debian package that ships it
PACKAGES = {
    "fio": "fio",
    "nbdkit": "nbdkit",
    "qemu-nbd": "qemu-utils",
    "nbd-server": "nbd-server",
    "nbdinfo": "libnbd-bin",
}


def missing() -> list:
    return [p for p in PACKAGES if shutil.which(p) is None]


def ensure(report, allow_install: bool) -> list:
    """Install what is missing when we can; return the programs still missing."""
    absent = missing()
    if not absent:
        return []
    packages = sorted({PACKAGES[p] for p in absent})
    if not allow_install:
        report.say(f"note: missing {', '.join(absent)}; not installing (--no-install)")
        return absent
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        report.say(f"note: missing {', '.join(absent)}; install as root with: "
                   f"apt-get install {' '.join(packages)}")
        return absent
    _apt_install(report, packages)
    return missing()


def ensure_one(report, program: str, package: str, allow_install: bool) -> bool:
    """One program only one experiment needs (cc for interference's job): installed on demand,
    so the other experiments never wait for it. True when it is there afterwards."""
    if shutil.which(program):
        return True
    if not allow_install or os.geteuid() != 0 or shutil.which("apt-get") is None:
        report.say(f"note: {program} is missing; install it with: apt-get install {package}")
        return False
    _apt_install(report, [package])
    return shutil.which(program) is not None


def _apt_install(report, packages: list) -> None:
    report.say(f"installing {' '.join(packages)} (apt-get) ...")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for command in (["apt-get", "update", "-q"],
                    ["apt-get", "install", "-y", "-q", "--no-install-recommends"] + packages):
        proc = subprocess.run(command, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True, timeout=900)
        if proc.returncode != 0:
            report.say(f"warning: {' '.join(command[:2])} failed: {proc.stderr.strip()[-300:]}")
            break


def version(program: str) -> str:
    """First line that names a version, or 'missing'."""
    if shutil.which(program) is None:
        return "missing"
    flag = {"nbd-server": "-V"}.get(program, "--version")
    try:
        proc = subprocess.run([program, flag], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    for line in (proc.stdout + proc.stderr).splitlines():
        if line.strip():
            return line.strip()
    return "unknown"


def help_text(argv: list) -> str:
    try:
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=10)
        return proc.stdout + proc.stderr
    except (OSError, subprocess.TimeoutExpired):
        return ""


def nbdkit_has_cache_none() -> bool:
    return "cache=" in help_text(["nbdkit", servers.nbdkit_plugin("file"), "--help"])


def qemu_nbd_aio() -> str:
    """io_uring when this qemu-nbd knows it, else native (needs O_DIRECT) or threads."""
    text = help_text(["qemu-nbd", "--help"])
    if "io_uring" in text:
        return "io_uring"
    return "threads"
