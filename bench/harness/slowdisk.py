"""A slow disk of known speed: the bench image behind a loop device (O_DIRECT to the file),
its reads limited by cgroup v1 blkio (`blkio.throttle.read_bps_device`). The limit is one
budget for every process in the cgroup, so the processes placed there share one disk of that
speed, as the programs of one node share its disk. Needs root, losetup and cgroup v1 blkio
(DESIGN.md: the machines have it). bench/trapeze and interference's restricted pass use it.
"""

import os
import subprocess

BLKIO = "/sys/fs/cgroup/blkio"


def sh(argv: list) -> str:
    p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise OSError(f"{' '.join(argv)}: {p.stderr.strip() or f'exit {p.returncode}'}")
    return p.stdout.strip()


class Disk:
    """`path` read-only behind a loop device, and the blkio cgroup `name` that throttles it."""

    def __init__(self, path: str, name: str, read_only: bool = True):
        self.device = None
        self.cgroup = None
        if not os.path.isdir(BLKIO):
            raise OSError(f"{BLKIO} is not mounted (cgroup v1 blkio is needed)")
        flags = ["--read-only"] if read_only else []
        self.device = sh(["losetup", "--find", "--show", "--direct-io=on"] + flags + [path])
        rdev = os.stat(self.device).st_rdev
        self.majmin = f"{os.major(rdev)}:{os.minor(rdev)}"
        self.cgroup = os.path.join(BLKIO, name)
        os.makedirs(self.cgroup, exist_ok=True)

    def throttle(self, mbps: float) -> None:
        """Reads of the whole cgroup at most `mbps` MB/s (10^6 bytes); 0: no limit."""
        self._write("blkio.throttle.read_bps_device", f"{self.majmin} {int(mbps * 1e6)}")

    def limit(self, mbps: float, iops: int) -> None:
        """Reads and writes each at most `mbps` MB/s and `iops` requests a second, like a
        disk (a real one shares one budget between them; blkio keeps one per direction)."""
        for direction in ("read", "write"):
            self._write(f"blkio.throttle.{direction}_bps_device", f"{self.majmin} {int(mbps * 1e6)}")
            self._write(f"blkio.throttle.{direction}_iops_device", f"{self.majmin} {iops}")

    def join(self, pid: int) -> None:
        """Moves a process (all its threads) into the throttled cgroup."""
        self._write("cgroup.procs", str(pid))

    def joined(self, argv: list) -> list:
        """argv, run from a shell that first joins the cgroup."""
        return ["sh", "-c", 'echo $$ > "$0/cgroup.procs" && exec "$@"', self.cgroup] + argv

    def _write(self, name: str, text: str) -> None:
        with open(os.path.join(self.cgroup, name), "w") as f:
            f.write(text + "\n")

    def remove(self) -> list:
        """Undo everything; the problems met, as text (cleanup goes on past each)."""
        problems = []
        if self.cgroup and os.path.isdir(self.cgroup):
            try:
                self.limit(0, 0)
            except OSError:
                pass
            try:
                # Processes left in it (none, once every server stopped) go back to the root.
                for pid in open(os.path.join(self.cgroup, "cgroup.procs")).read().split():
                    with open(os.path.join(BLKIO, "cgroup.procs"), "w") as f:
                        f.write(pid + "\n")
                os.rmdir(self.cgroup)
            except OSError as e:
                problems.append(f"cgroup {self.cgroup}: {e}")
        if self.device:
            try:
                sh(["losetup", "-d", self.device])
            except OSError as e:
                problems.append(str(e))
        return problems
