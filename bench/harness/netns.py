"""Members behind slow links, for bench/pool: one network namespace per member, joined to
the host by a veth pair whose two ends are rate-limited with `tc tbf`, and one `sluice
serve` inside each namespace serving a file in /dev/shm.

Member i (1-based) is namespace sluice-pm<i>; the host end of its veth is spm<i>
(10.77.<i>.1/24) and the namespace end spm<i>-ns (10.77.<i>.2/24). A qdisc shapes what
leaves an interface, so the host end's tbf limits what the host sends to the member
(writes) and the namespace end's tbf what the member sends back (reads).

Everything here is undone by `teardown`, which is bounded in time and also clears what a
run that was killed outright left behind (namespaces named sluice-pm*, links named spm*).
"""

import ctypes
import os
import signal
import socket
import subprocess
import time

PREFIX = "sluice-pm"
PORT = 10809
EXPORT = "disk"
# tbf's bucket must hold a whole GSO packet (veth sends up to 64 KiB at once): with 32 KiB
# or 64 KiB, 1 Gbit/s came out at 80-100 MB/s and varied run to run; 256 KiB gives a steady
# 94-95% of the rate (the rest is Ethernet, IP and TCP headers, which tbf counts).
TBF_BURST = "256kb"
# Queue at most this long at the rate before dropping: deep enough for TCP to keep the link
# busy, short enough that a rate change settles within a run.
TBF_LATENCY = "50ms"
COMMAND_TIMEOUT_SECONDS = 10
START_TIMEOUT_SECONDS = 15
STOP_TIMEOUT_SECONDS = 6     # sluice drains for up to 5 s after SIGTERM; then SIGKILL


class NetError(Exception):
    pass


def namespace(i: int) -> str:
    return f"{PREFIX}{i}"


def host_addr(i: int) -> str:
    return f"10.77.{i}.1"


def member_addr(i: int) -> str:
    return f"10.77.{i}.2"


def member_uri(i: int) -> str:
    return f"nbd://{member_addr(i)}:{PORT}/{EXPORT}"


def _run(argv: list, ns: str = None) -> str:
    if ns:
        argv = ["ip", "netns", "exec", ns] + argv
    try:
        p = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=COMMAND_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise NetError(f"{' '.join(argv)}: no answer within {COMMAND_TIMEOUT_SECONDS} s")
    if p.returncode != 0:
        raise NetError(f"{' '.join(argv)}: {p.stderr.strip() or f'exit {p.returncode}'}")
    return p.stdout


def check() -> str:
    """Why namespaces cannot be used here, or '' when they can."""
    if os.geteuid() != 0:
        return "bench/pool needs root (network namespaces, veth, tc)"
    for tool in ("ip", "tc"):
        if subprocess.run(["sh", "-c", f"command -v {tool}"], capture_output=True).returncode:
            return f"{tool} is missing (apt-get install iproute2)"
    return ""


def setup(count: int, rate: str) -> None:
    """Namespaces and shaped links for members 1..count."""
    for i in range(1, count + 1):
        ns, host, peer = namespace(i), f"spm{i}", f"spm{i}-ns"
        _run(["ip", "netns", "add", ns])
        _run(["ip", "link", "add", host, "type", "veth", "peer", "name", peer])
        _run(["ip", "link", "set", peer, "netns", ns])
        _run(["ip", "addr", "add", f"{host_addr(i)}/24", "dev", host])
        _run(["ip", "link", "set", host, "up"])
        _run(["ip", "addr", "add", f"{member_addr(i)}/24", "dev", peer], ns)
        _run(["ip", "link", "set", peer, "up"], ns)
        _run(["ip", "link", "set", "lo", "up"], ns)
    set_rate(count, rate)


def set_rate(count: int, rate: str) -> None:
    for i in range(1, count + 1):
        set_link_rate(i, rate)


def set_link_rate(i: int, rate: str) -> None:
    """Member i's link, both directions."""
    tbf = ["root", "tbf", "rate", rate, "burst", TBF_BURST, "latency", TBF_LATENCY]
    _run(["tc", "qdisc", "replace", "dev", f"spm{i}"] + tbf)
    _run(["tc", "qdisc", "replace", "dev", f"spm{i}-ns"] + tbf, namespace(i))


def teardown() -> list:
    """Stop every member and remove every namespace and link of ours; returns what could not
    be removed. Safe to call more than once and after a crashed run."""
    for member in reversed(list(_members)):
        member.stop()
    problems = []
    try:
        names = [l.split()[0] for l in _run(["ip", "netns", "list"]).splitlines() if l.strip()]
    except NetError as e:
        return [str(e)]
    names = [n for n in names if n.startswith(PREFIX)]
    for ns in names:
        _kill_namespace_processes(ns)
    # Links first: deleting a namespace frees its veth end later, in the background.
    for argv in [["ip", "link", "del", link] for link in _host_links()] + \
                [["ip", "netns", "del", ns] for ns in names]:
        try:
            _run(argv)
        except NetError as e:
            if "Cannot find device" not in str(e):
                problems.append(str(e))
    return problems


def _kill_namespace_processes(ns: str) -> None:
    """Servers a killed earlier run left in the namespace (ours are gone by now)."""
    try:
        pids = [int(p) for p in _run(["ip", "netns", "pids", ns]).split()]
    except (NetError, ValueError):
        return
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_TIMEOUT_SECONDS
    while time.monotonic() < deadline and any(os.path.exists(f"/proc/{p}") for p in pids):
        time.sleep(0.05)


def _host_links() -> list:
    try:
        out = _run(["ip", "-o", "link", "show"])
    except NetError:
        return []
    names = [line.split(":")[1].strip().split("@")[0] for line in out.splitlines() if ":" in line]
    return [n for n in names if n.startswith("spm") and n[3:].isdigit()]


# --- members ------------------------------------------------------------------------------

_members = []  # started and not yet stopped, for teardown


class Member:
    """`sluice serve` in member i's namespace, serving `path` as export "disk", with `extra`
    options (bench/trapeze: a data path and a chunk)."""

    def __init__(self, binary: str, i: int, path: str, log_path: str, extra: list = (),
                 log_level: str = "warn", env: dict = None):
        self.i = i
        self.uri = member_uri(i)
        argv = ["ip", "netns", "exec", namespace(i), binary, "serve",
                "--listen", f"{member_addr(i)}:{PORT}", "--export", f"{EXPORT}={path}",
                "--log-level", log_level] + list(extra)
        self._log = open(log_path, "a")
        self._log.write(f"\n$ {' '.join(argv)}\n")
        self._log.flush()
        # `ip netns exec` execs the command, so this pid is the server's own.
        self._popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                       stderr=self._log, start_new_session=True,
                                       preexec_fn=die_with_parent,
                                       env=dict(os.environ, **env) if env else None)
        _members.append(self)
        try:
            self._wait_accepting()
        except BaseException:
            self.stop()
            raise

    def _wait_accepting(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while time.monotonic() < deadline:
            if self._popen.poll() is not None:
                raise NetError(f"member {self.i} exited with status {self._popen.returncode} "
                               f"(see {self._log.name})")
            try:
                with socket.create_connection((member_addr(self.i), PORT), timeout=0.5):
                    return
            except OSError:
                time.sleep(0.05)
        raise NetError(f"member {self.i} did not accept connections within {START_TIMEOUT_SECONDS} s")

    @property
    def pid(self) -> int:
        return self._popen.pid

    def kill(self) -> None:
        """SIGKILL, as a crashing node: no drain, no goodbye to its clients."""
        self._signal(signal.SIGKILL)
        self._wait(STOP_TIMEOUT_SECONDS)

    def stop(self) -> None:
        if self not in _members:
            return
        _members.remove(self)
        self._signal(signal.SIGTERM)
        if not self._wait(STOP_TIMEOUT_SECONDS):
            self._signal(signal.SIGKILL)
            self._wait(STOP_TIMEOUT_SECONDS)
        self._log.close()

    def _signal(self, sig: int) -> None:
        try:
            os.kill(self._popen.pid, sig)
        except ProcessLookupError:
            pass

    def _wait(self, seconds: float) -> bool:
        try:
            self._popen.wait(timeout=seconds)
            return True
        except subprocess.TimeoutExpired:
            return False


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child before exec: SIGKILL it when this process dies, however it dies."""
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass
