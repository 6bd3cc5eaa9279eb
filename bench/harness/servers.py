"""The NBD servers under test: how each is started, when it is ready, and how it is stopped.

Every server listens on 127.0.0.1 on a free port of its own, is started fresh for each
measurement series, and is killed afterwards. Each runs in its own session (Ctrl-C at the
terminal reaches only the harness, which then stops them in order) and, where it stays our
child, dies with the harness even if the harness is killed outright (PR_SET_PDEATHSIG).
"""

import ctypes
import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

import proc

START_TIMEOUT_SECONDS = 15   # from exec to accepting connections; nbdkit and qemu-nbd need < 1 s
STOP_TIMEOUT_SECONDS = 8     # sluice drains for up to 5 s after SIGTERM; then SIGKILL

_running = []  # every server started and not yet stopped, for cleanup on any exit


class StartError(Exception):
    pass


@dataclass
class Launch:
    """What a server's command line is built from."""
    image: str
    port: int
    workdir: str
    metrics_port: Optional[int] = None
    pidfile: Optional[str] = None


@dataclass
class Server:
    name: str                       # label in tables and plots
    kind: str                       # sluice, nbdkit, qemu-nbd, nbd-server, null
    cache: str                      # how it reaches storage, shown beside the numbers
    argv: Callable[[Launch], list]
    export: str = ""                # export name in the URI
    daemon: bool = False            # forks into the background and writes a pid file
    metrics: bool = False           # serves Prometheus text on a second port
    extra_files: Callable[[Launch], None] = field(default=lambda launch: None)
    data_path: Optional[str] = None  # sluice's --data-path; None: its default (or not sluice)
    tls: bool = False               # TLS required: clients connect with nbds://localhost
    cpus: Optional[str] = None      # taskset -c list the server is pinned to; None: not pinned

    @property
    def is_sluice(self) -> bool:
        return self.kind == "sluice"


class Running:
    def __init__(self, server: Server, pid: int, popen, launch: Launch, log_path: str):
        self.server = server
        self.pid = pid
        self._popen = popen
        self.launch = launch
        self.log_path = log_path
        self.uri = (f"nbds://localhost:{launch.port}/{server.export}" if server.tls
                    else f"nbd://127.0.0.1:{launch.port}/{server.export}")
        self.metrics_url = (f"http://127.0.0.1:{launch.metrics_port}/metrics"
                            if launch.metrics_port else None)

    def stop(self) -> None:
        if self not in _running:
            return
        _running.remove(self)
        _signal_group(self.pid, signal.SIGTERM)
        if not self._wait_gone(STOP_TIMEOUT_SECONDS):
            _signal_group(self.pid, signal.SIGKILL)
            self._wait_gone(STOP_TIMEOUT_SECONDS)

    def _wait_gone(self, seconds: float) -> bool:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            # Our child is reaped by poll(); a daemon is reaped by init, so read /proc.
            gone = self._popen.poll() is not None if self._popen else not proc.alive(self.pid)
            if gone:
                return True
            time.sleep(0.02)
        return False


def stop_all() -> None:
    """Stop every server still running, newest first. Safe to call more than once."""
    for running in reversed(list(_running)):
        try:
            running.stop()
        except Exception:  # cleanup must reach the next server whatever happens
            pass


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start(server: Server, image: str, workdir: str, logdir: str) -> Running:
    launch = Launch(image=image, port=free_port(), workdir=workdir)
    if server.metrics:
        launch.metrics_port = free_port()
    if server.daemon:
        launch.pidfile = os.path.join(workdir, f"{_slug(server.name)}.pid")
        _unlink(launch.pidfile)
    server.extra_files(launch)
    argv = server.argv(launch)
    if server.cpus:
        # taskset execs the server in its own place, so the pid we watch stays the server's.
        argv = ["taskset", "-c", server.cpus] + argv
    log_path = os.path.join(logdir, log_name(server))
    with open(log_path, "a") as log:
        log.write(f"\n$ {' '.join(argv)}\n")
        log.flush()
        popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                 start_new_session=True, preexec_fn=_die_with_parent)
    running = Running(server, popen.pid, popen, launch, log_path)
    _running.append(running)
    try:
        if server.daemon:
            running.pid = _daemon_pid(popen, launch.pidfile, log_path)
            running._popen = None
        _wait_accepting(running, popen if not server.daemon else None, launch.port)
        if launch.metrics_port:
            _wait_accepting(running, popen, launch.metrics_port)
    except BaseException:
        running.stop()
        raise
    return running


def _wait_accepting(running: Running, popen, port: int) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if popen is not None and popen.poll() is not None:
            raise StartError(f"{running.server.name} exited with status {popen.returncode}: "
                             f"{_tail(running.log_path)}")
        if popen is None and not proc.alive(running.pid):
            raise StartError(f"{running.server.name} exited: {_tail(running.log_path)}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return
        except OSError:
            time.sleep(0.02)
    raise StartError(f"{running.server.name} did not accept connections on port {port} "
                     f"within {START_TIMEOUT_SECONDS} s")


def _daemon_pid(popen, pidfile: str, log_path: str) -> int:
    try:
        status = popen.wait(timeout=START_TIMEOUT_SECONDS)
    except subprocess.TimeoutExpired:
        raise StartError(f"did not daemonize within {START_TIMEOUT_SECONDS} s")
    if status != 0:
        raise StartError(f"exited with status {status}: {_tail(log_path)}")
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        try:
            with open(pidfile) as f:
                text = f.read().strip()
            if text:
                return int(text)
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise StartError(f"no pid file {pidfile}")


def _signal_group(pid: int, sig: int) -> None:
    # Each server leads its own session, so its pid is its process group: the group holds
    # its helpers too (nbd-server's per-connection children).
    try:
        os.killpg(pid, sig)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


_PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except Exception:
        pass


def _tail(path: str, lines: int = 2) -> str:
    """The last run's error line if it has one, else its last lines."""
    try:
        with open(path) as f:
            text = f.read().split("\n$ ")[-1].splitlines()[1:]
    except OSError:
        return "(no log)"
    text = [l.strip() for l in text if l.strip()]
    errors = [l for l in text if "error" in l.lower()]
    return " | ".join(errors[-1:] or text[-lines:]) or "(no output)"


def log_name(server: Server) -> str:
    """The server's log file in the run's logs/ directory."""
    return f"{_slug(server.name)}.log"


def _slug(name: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in name).strip("-")


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except OSError:
        pass


# --- the servers ------------------------------------------------------------------------

# Where nbdkit's plugins are, when not in the directory nbdkit was built with (a carried
# nbdkit, bench/pack): nbdkit then gets each plugin by its path. None: by name.
_nbdkit_plugin_dir: Optional[str] = None


def set_nbdkit_plugin_dir(path: Optional[str]) -> None:
    global _nbdkit_plugin_dir
    _nbdkit_plugin_dir = path


def nbdkit_plugin_dir() -> Optional[str]:
    return _nbdkit_plugin_dir


def nbdkit_plugin(name: str) -> str:
    """The PLUGIN argument of nbdkit's command line: 'file', or /DIR/nbdkit-file-plugin.so."""
    if _nbdkit_plugin_dir is None:
        return name
    return os.path.join(_nbdkit_plugin_dir, f"nbdkit-{name}-plugin.so")


def sluice(binary: str, data_path: Optional[str] = None, chunk: Optional[str] = None,
           metrics: bool = False, tls: Optional[str] = None,
           threads: Optional[int] = None, busy_poll: Optional[int] = None,
           config: Optional[str] = None) -> Server:
    """data_path None: the binary's default path (also when it has no --data-path yet).
    chunk None: the default (pipelined) chunking; '0' turns pipelining off. tls: a
    certificate directory; TLS is then required. threads None: one worker per CPU.
    busy_poll None: the binary's default spin before a worker sleeps. config: a
    configuration file (--config) for what has no flag, such as [limits]."""
    name = ("sluice" + (f" {data_path}" if data_path else "") + (f" chunk={chunk}" if chunk else "")
            + (" TLS" if tls else "") + (f" threads={threads}" if threads else "")
            + (f" busy-poll={busy_poll}" if busy_poll is not None else ""))
    cache = {"direct": "O_DIRECT", "splice-direct": "O_DIRECT", "copy": "page cache",
             "splice": "page cache", None: "default path"}.get(data_path, "?")

    def argv(launch: Launch) -> list:
        args = [binary, "serve", launch.image, "--listen", f"127.0.0.1:{launch.port}",
                "--log-level", "warn"]
        if data_path:
            args += ["--data-path", data_path]
        if chunk is not None:
            args += ["--chunk", chunk]
        if launch.metrics_port:
            args += ["--metrics", f"127.0.0.1:{launch.metrics_port}"]
        if tls:
            args += ["--tls=require", f"--tls-certificates={tls}"]
        if threads:
            args += ["--threads", str(threads)]
        if busy_poll is not None:
            args += ["--busy-poll", str(busy_poll)]
        if config:
            args += ["--config", config]
        return args

    return Server(name=name, kind="sluice", cache=cache, argv=argv, metrics=metrics,
                  data_path=data_path, tls=tls is not None)


def nbdkit_file(cold: bool, has_cache_none: bool, tls: Optional[str] = None,
                threads: Optional[int] = None) -> Server:
    """threads: nbdkit's -t, worker threads per connection (None: its default, 16)."""
    use_none = cold and has_cache_none

    def argv(launch: Launch) -> list:
        args = _nbdkit_common(launch, threads)
        if tls:
            args += ["--tls=require", f"--tls-certificates={tls}"]
        args += [nbdkit_plugin("file"), f"file={launch.image}"]
        return args + (["cache=none"] if use_none else [])

    # cache=none opens the file without O_DIRECT and evicts pages after each request.
    cache = "cache=none (evicts pages)" if use_none else "page cache"
    name = "nbdkit file" + (" TLS" if tls else "") + (f" -t {threads}" if threads else "")
    return Server(name=name, kind="nbdkit", cache=cache, argv=argv, tls=tls is not None)


def _nbdkit_common(launch: Launch, threads: Optional[int]) -> list:
    args = ["nbdkit", "-f", "--exit-with-parent", "-p", str(launch.port), "-i", "127.0.0.1"]
    return args + (["-t", str(threads)] if threads else [])


def qemu_nbd(cold: bool, aio: str) -> Server:
    mode = "none" if cold else "writeback"

    def argv(launch: Launch) -> list:
        return ["qemu-nbd", "-f", "raw", "-t", "--shared=300", "-p", str(launch.port),
                "-b", "127.0.0.1", f"--cache={mode}", f"--aio={aio}", launch.image]

    cache = "O_DIRECT (cache=none)" if cold else "page cache (writeback)"
    return Server(name="qemu-nbd", kind="qemu-nbd", cache=cache + f", aio={aio}", argv=argv)


def nbd_server() -> Server:
    """nbd-server 3.24 has no O_DIRECT option. Its -d (no fork) mode serves one connection
    and exits, so it runs as a daemon with a pid file. It has no default export: a client
    asking for the empty name is refused, so the export is named and the URI says so."""

    def write_config(launch: Launch) -> None:
        with open(os.path.join(launch.workdir, "nbd-server.conf"), "w") as f:
            f.write("[generic]\n"
                    f"port = {launch.port}\n"
                    "listenaddr = 127.0.0.1\n"
                    "[bench]\n"
                    f"exportname = {launch.image}\n")

    def argv(launch: Launch) -> list:
        return ["nbd-server", "-C", os.path.join(launch.workdir, "nbd-server.conf"),
                "-p", launch.pidfile]

    return Server(name="nbd-server", kind="nbd-server", cache="page cache (no O_DIRECT option)",
                  argv=argv, export="bench", daemon=True, extra_files=write_config)


def nbdkit_null(size: int, threads: Optional[int] = None) -> Server:
    def argv(launch: Launch) -> list:
        return _nbdkit_common(launch, threads) + [nbdkit_plugin("null"), f"size={size}"]

    name = "null (nbdkit)" + (f" -t {threads}" if threads else "")
    return Server(name=name, kind="null", cache="no storage", argv=argv)


def sluice_null(binary: str, size: int, threads: Optional[int] = None) -> Server:
    """sluice's own ceiling: `sluice serve null:SIZE` reads zeros, drops writes (sluice-null(7))."""

    def argv(launch: Launch) -> list:
        args = [binary, "serve", f"null:{size}", "--listen", f"127.0.0.1:{launch.port}",
                "--log-level", "warn"]
        return args + (["--threads", str(threads)] if threads else [])

    name = "null (sluice)" + (f" threads={threads}" if threads else "")
    return Server(name=name, kind="null", cache="no storage", argv=argv)


def sluice_gateway(binary: str, name: str, spec: str) -> Server:
    """sluice re-exporting SPEC (`nbd://...`, `pool:FILE`) as export `vol`: a gateway whose
    data path is always copy (docs/backends/remote.md), so no --data-path is given."""

    def argv(launch: Launch) -> list:
        return [binary, "serve", "--listen", f"127.0.0.1:{launch.port}", "--export",
                f"vol={spec}", "--log-level", "warn"]

    return Server(name=name, kind="sluice", cache="remote (copy)", argv=argv, export="vol")


def nbdkit_nbd(uri: str) -> Server:
    """nbdkit's nbd plugin re-exporting URI: one connection to it per client connection
    (the plugin's default, shared=false)."""

    def argv(launch: Launch) -> list:
        return _nbdkit_common(launch, None) + [nbdkit_plugin("nbd"), f"uri={uri}"]

    return Server(name="nbdkit nbd", kind="nbdkit", cache="remote", argv=argv)
