"""The files every server serves: a read image of random data and a scratch copy for writes.

Both are made once and reused across runs. They live on a real disk (/var/tmp, not a tmpfs)
so that cold-cache numbers measure the disk. Writes go to the scratch copy only, so the read
image never changes.
"""

import os
import shutil

from units import size_label

DEFAULT_DIR = "/var/tmp"
MEMORY_FILESYSTEMS = {"tmpfs", "ramfs", "devtmpfs"}


def default_path(size: int) -> str:
    return os.path.join(DEFAULT_DIR, f"sluice-bench-{size_label(size)}.img")


def scratch_path(image: str, role: str = "scratch") -> str:
    base = os.path.basename(image)
    stem = base[:-4] if base.endswith(".img") else base
    return os.path.join(DEFAULT_DIR, f"{stem}-{role}.img")


def size_of(path: str) -> int:
    with open(path, "rb") as f:
        return f.seek(0, os.SEEK_END)  # also right for block devices


def ensure(path: str, size: int, report) -> int:
    """Make `path` a file of `size` random bytes unless it exists; return its size."""
    if os.path.exists(path):
        actual = size_of(path)
        if actual != size:
            report.say(f"note: {path} exists with {size_label(actual)}; using it as it is")
        return actual
    report.say(f"creating {path}: {size_label(size)} of random data (once; later runs reuse it) ...")
    partial = path + ".partial"
    chunk = 16 << 20
    with open(partial, "wb") as f:
        left = size
        while left > 0:
            n = min(chunk, left)
            f.write(os.urandom(n))
            left -= n
        f.flush()
        os.fsync(f.fileno())
    os.rename(partial, path)  # a run killed half-way leaves no short image behind
    return size


def ensure_scratch(image: str, report, role: str = "scratch",
                   purpose: str = "for write jobs") -> str:
    """A copy of the image, made once; fully allocated, like the image. role names the file
    (IMAGE-ROLE.img): the write jobs' copy, or one an experiment writes metadata to."""
    path = scratch_path(image, role)
    size = size_of(image)
    if os.path.exists(path) and size_of(path) == size:
        return path
    report.say(f"creating {path}: a copy of the image {purpose} ...")
    partial = path + ".partial"
    shutil.copyfile(image, partial)
    with open(partial, "rb+") as f:
        os.fsync(f.fileno())
    os.rename(partial, path)
    return path


def filesystem(path: str) -> tuple:
    """(fstype, device) of the mount that holds path."""
    real = os.path.realpath(path)
    best = ("", "unknown", "unknown")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                device, mountpoint, fstype = line.split()[:3]
                mountpoint = mountpoint.replace("\\040", " ")
                inside = real == mountpoint or real.startswith(mountpoint.rstrip("/") + "/")
                if inside and len(mountpoint) >= len(best[0]):
                    best = (mountpoint, fstype, device)
    except OSError:
        pass
    return best[1], best[2]


def on_memory(path: str) -> bool:
    return filesystem(path)[0] in MEMORY_FILESYSTEMS
