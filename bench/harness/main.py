"""bench/run: build sluice, install the peers, make the images, run the experiments.

See bench/README.md for what each experiment measures and how to read its tables.
"""

import argparse
import datetime
import os
import shutil
import signal
import socket
import sys
import tempfile
import time
import traceback

import build
import cache
import ceph
import clients
import clientside
import fio
import gateway
import image
import interference
import netmem
import machine
import peers
import qos
import scale
import servers
import sweep
import tools
from measure import Context
from report import Report
from units import parse_size, size_label

EXPERIMENTS = {"peers": peers.run, "sweep": sweep.run, "clients": clients.run,
               "client": clientside.run, "scale": scale.run, "interference": interference.run,
               "ceph": ceph.run, "qos": qos.run, "netmem": netmem.run, "gateway": gateway.run}
# What a plain bench/run runs: the full run is already about 44 minutes, so interference (a
# question of its own, with its own CPU placement), ceph (a Ceph cluster of its own, and
# sluice's rbd backend) and qos (checks of load restriction against its goals, not a
# comparison; about 3.5 minutes), netmem (three nodes in network namespaces) and gateway
# (re-exporting servers against their member, judged against the goals) run only
# when --only names them.
DEFAULT_EXPERIMENTS = ("peers", "sweep", "clients", "client", "scale")
# The full run: 574 points (126 peers, 330 sweep, 18 clients, 100 scale on 2 cores) x 3 runs
# of 1 s; a run takes about 1.4 s (1.5 s where the page cache is dropped first, up to 5 s
# with 256 fio threads), so about 44 minutes on a 2-core machine (bench/README.md, Time).
RUNTIME_SECONDS = 1
INTERFERENCE_PASSES = ("full", "equal", "restricted")
REPEAT = 3
QUICK_RUNTIME_SECONDS = 1
QUICK_REPEAT = 1
DEFAULT_IMAGE_BYTES = 2 << 30
# Set by bench/unpack-run: the plugin directory of a carried nbdkit.
NBDKIT_PLUGINS_ENV = "SLUICE_BENCH_NBDKIT_PLUGINS"

BENCH_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
REPO = os.path.dirname(BENCH_DIR)


def parse_args(argv):
    p = argparse.ArgumentParser(
        prog="bench/run",
        description="Benchmarks of sluice against other NBD servers (see bench/README.md).")
    p.add_argument("--quick", action="store_true",
                   help=f"fewer points, {QUICK_REPEAT} run of {QUICK_RUNTIME_SECONDS} s each; "
                        "the whole run takes a few minutes")
    p.add_argument("--runtime", type=int, metavar="SECONDS",
                   help=f"seconds per fio run (default {RUNTIME_SECONDS}, "
                        f"{QUICK_RUNTIME_SECONDS} with --quick)")
    p.add_argument("--repeat", type=int, metavar="N",
                   help=f"fio runs per measured point; tables show the median of each figure "
                        f"(default {REPEAT}, {QUICK_REPEAT} with --quick)")
    p.add_argument("--only", metavar="EXPERIMENT",
                   help="run only these, comma-separated: peers, sweep, clients, client, scale, "
                        "interference, ceph, qos, netmem, gateway (the last five only when "
                        "named)")
    p.add_argument("--image", metavar="PATH",
                   help="image to serve (default: /var/tmp/sluice-bench-SIZE.img, created once); "
                        "it is only read; writes go to a scratch copy in /var/tmp")
    p.add_argument("--size", default=size_label(DEFAULT_IMAGE_BYTES), metavar="SIZE",
                   help="size of a created image (default %(default)s)")
    p.add_argument("--out", metavar="DIR",
                   help="output directory (default bench/results/DATE-HOST)")
    p.add_argument("--no-build", action="store_true",
                   help="measure target/release/sluice as it is, without cargo build")
    p.add_argument("--sluice", metavar="BINARY",
                   help="measure this sluice binary instead of building target/release/sluice")
    p.add_argument("--no-install", action="store_true",
                   help="do not apt-get install missing tools; skip what needs them")
    p.add_argument("--interference-rate", type=int, metavar="MB/S",
                   help="interference's equal-load pass: fio's rate in MB/s for every server "
                        "(default: 60%% of the lowest full-speed rate, in steps of 50; 0: no "
                        "equal-load pass)")
    p.add_argument("--interference-passes", metavar="LIST", default=",".join(INTERFERENCE_PASSES),
                   help="interference's passes, comma-separated: full (every server at full "
                        "speed), equal (at one rate), restricted (sluice with and without a "
                        "storage cap beside a local disk reader); default %(default)s")
    p.add_argument("--tcp-congestion", metavar="NAME",
                   help="TCP congestion control for the run (net.ipv4.tcp_congestion_control; "
                        "network namespaces made during the run copy it when the harness runs "
                        "in the initial one), put back at the end; e.g. cubic where the system runs bbr without fq (see "
                        "machine.txt's tcp line). Needs root")
    p.add_argument("--nbdkit-plugins", metavar="DIR", default=os.environ.get(NBDKIT_PLUGINS_ENV),
                   help="give nbdkit its plugins by path from DIR (a carried nbdkit, bench/pack) "
                        f"instead of by name; default ${NBDKIT_PLUGINS_ENV} if set")
    args = p.parse_args(argv)
    args.only = [e.strip() for e in (args.only or ",".join(DEFAULT_EXPERIMENTS)).split(",")
                 if e.strip()]
    for e in args.only:
        if e not in EXPERIMENTS:
            p.error(f"unknown experiment {e!r}: choose from {', '.join(EXPERIMENTS)}")
    if args.runtime is not None and args.runtime < 1:
        p.error("--runtime must be at least 1 second")
    if args.repeat is not None and args.repeat < 1:
        p.error("--repeat must be at least 1")
    args.interference_passes = tuple(x.strip() for x in args.interference_passes.split(",")
                                     if x.strip())
    for x in args.interference_passes:
        if x not in INTERFERENCE_PASSES:
            p.error(f"unknown interference pass {x!r}: choose from {', '.join(INTERFERENCE_PASSES)}")
    if args.interference_rate is not None and args.interference_rate < 0:
        p.error("--interference-rate must be 0 (no equal-load pass) or more MB/s")
    try:
        args.size = parse_size(args.size)
    except ValueError as e:
        p.error(str(e))
    return args


def _put_congestion_back(before, report) -> None:
    """Puts the system's congestion control back first thing at the end, with stop signals
    held off: a second Ctrl-C while servers stop must not leave the machine changed
    (sockets still open keep theirs anyway)."""
    if before is None:
        return
    held = {sig: signal.signal(sig, signal.SIG_IGN) for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    try:
        machine.set_congestion(before)
    except (OSError, ValueError) as e:
        report.say(f"warning: could not put TCP congestion control back to {before}: {e}")
    finally:
        for sig, handler in held.items():
            signal.signal(sig, handler)


def _on_signal(signum, frame):
    # Every stop request goes the way of Ctrl-C: unwind, and every finally stops its server.
    raise KeyboardInterrupt


def _install_signal_handlers() -> None:
    # SIGINT explicitly: a shell starts background jobs with SIGINT ignored, and Python then
    # installs no KeyboardInterrupt handler. SIGHUP only if nobody (nohup) chose to ignore it.
    for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        if sig == signal.SIGHUP and signal.getsignal(sig) == signal.SIG_IGN:
            continue
        signal.signal(sig, _on_signal)


def main(argv) -> int:
    args = parse_args(argv)
    _install_signal_handlers()

    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M%S")
    out_dir = os.path.abspath(args.out or os.path.join(BENCH_DIR, "results",
                                                        f"{stamp}-{socket.gethostname()}"))
    os.makedirs(os.path.join(out_dir, "logs"), exist_ok=True)
    os.makedirs(os.path.join(out_dir, "fio"), exist_ok=True)
    report = Report(out_dir)
    workdir = tempfile.mkdtemp(prefix="sluice-bench-")
    started = time.monotonic()
    status = 0
    congestion_before = None
    try:
        if args.tcp_congestion:
            try:
                congestion_before = machine.read_congestion()
                machine.set_congestion(args.tcp_congestion)
            except (OSError, ValueError) as e:
                report.say(f"error: --tcp-congestion {args.tcp_congestion}: {e}")
                return 1
            report.say(f"TCP congestion control for this run: {args.tcp_congestion} "
                       f"(was {congestion_before}; put back at the end)")
        ctx = prepare(args, report, out_dir, workdir, argv)
        if ctx is None:
            return 1
        for name in args.only:
            began = time.monotonic()
            try:
                EXPERIMENTS[name](ctx)
                report.say()
                report.say(f"({name}: {(time.monotonic() - began) / 60:.1f} min)")
            except KeyboardInterrupt:
                raise
            except Exception:
                status = 1
                report.say(f"error: experiment {name} failed:\n{traceback.format_exc()}")
            finally:
                servers.stop_all()
    except KeyboardInterrupt:
        report.say("\ninterrupted: servers stopped")
        status = 130
    finally:
        _put_congestion_back(congestion_before, report)
        servers.stop_all()
        shutil.rmtree(workdir, ignore_errors=True)
        elapsed = time.monotonic() - started
        report.say()
        report.say(f"done in {elapsed / 60:.1f} min; results in {out_dir}")
        report.close()
        _give_back(out_dir)
    return status


def prepare(args, report, out_dir, workdir, argv):
    report.say(f"sluice benchmarks -> {out_dir}")
    if args.nbdkit_plugins:
        servers.set_nbdkit_plugin_dir(os.path.abspath(args.nbdkit_plugins))
    missing = tools.ensure(report, allow_install=not args.no_install)
    if "fio" in missing or not fio.has_nbd_engine():
        report.say("error: fio with the nbd engine is required (apt-get install fio)")
        return None

    binary = os.path.abspath(args.sluice or os.path.join(REPO, "target", "release", "sluice"))
    if args.no_build or args.sluice:
        if not os.access(binary, os.X_OK):
            report.say(f"error: no sluice binary at {binary}")
            return None
    else:
        try:
            binary = build.build(REPO, report)
        except build.BuildError as e:
            report.say(f"error: {e}")
            return None
    features = build.features(binary)
    absent = [f for f in build.OPTIONAL_FLAGS if f not in features]
    if absent:
        report.say(f"note: `sluice serve --help` has no {', '.join(absent)}: "
                   "the variants that need them are skipped")

    image_path = os.path.abspath(args.image or image.default_path(args.size))
    image_size = image.ensure(image_path, args.size, report)
    scratch = image.ensure_scratch(image_path, report)
    if image.on_memory(image_path):
        report.say(f"warning: {image_path} is on a memory filesystem: 'cold' numbers measure RAM")

    pacing = machine.loopback_pacing_warning()
    if pacing:
        report.say(f"warning: {pacing}")
    cold_ok, cold_reason = cache.can_drop()
    text = machine.describe(REPO, binary, features, image_path, scratch, argv)
    with open(os.path.join(out_dir, "machine.txt"), "w") as f:
        f.write(text)
    report.say()
    for line in text.splitlines():
        report.say("  " + line)

    runtime = args.runtime or (QUICK_RUNTIME_SECONDS if args.quick else RUNTIME_SECONDS)
    repeat = args.repeat or (QUICK_REPEAT if args.quick else REPEAT)
    return Context(report=report, out_dir=out_dir, workdir=workdir, binary=binary,
                   features=features, serve_defaults=build.defaults(binary),
                   data_paths=build.data_paths(binary), image=image_path,
                   scratch=scratch, image_size=image_size,
                   runtime=runtime, repeat=repeat, quick=args.quick,
                   cold_ok=cold_ok, cold_reason=cold_reason,
                   nbdkit_cache_none=tools.nbdkit_has_cache_none(), qemu_aio=tools.qemu_nbd_aio(),
                   missing=missing, allow_install=not args.no_install,
                   interference_rate=args.interference_rate,
                   interference_passes=args.interference_passes)


def _give_back(out_dir: str) -> None:
    """Under sudo, hand the results to the user who asked for them."""
    uid, gid = os.environ.get("SUDO_UID"), os.environ.get("SUDO_GID")
    if os.geteuid() != 0 or not uid or not gid:
        return
    for root, dirs, files in os.walk(out_dir):
        for name in [root] + [os.path.join(root, n) for n in dirs + files]:
            try:
                os.chown(name, int(uid), int(gid))
            except OSError:
                pass


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
