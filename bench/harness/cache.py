"""Page cache control: cold runs drop it before each point, warm runs read the image first."""

import os

DROP_CACHES = "/proc/sys/vm/drop_caches"


def can_drop() -> tuple:
    """(True, '') when this process may drop the page cache, else (False, why not)."""
    if os.geteuid() != 0:
        return False, "not running as root (drop_caches needs root): cold variants are skipped"
    if not os.access(DROP_CACHES, os.W_OK):
        return False, f"{DROP_CACHES} is not writable here (container?): cold variants are skipped"
    return True, ""


def drop() -> None:
    """Write dirty pages back, then drop clean page cache, dentries and inodes."""
    os.sync()
    with open(DROP_CACHES, "w") as f:
        f.write("3\n")


def warm(path: str) -> None:
    """Read the whole file once so that buffered servers find it in the page cache."""
    chunk = 16 << 20
    with open(path, "rb", buffering=0) as f:
        buf = bytearray(chunk)
        while f.readinto(buf):
            pass
