"""Experiment `netmem` (issue 29): does the idle RAM of two other nodes, as a cached volume
(`cache:FILE`, docs/cache.md), hide a slow disk behind a slow link?

Three nodes, each a network namespace joined to the host by a shaped veth pair (netns.py):
- node 1 serves the backing, a file of random data behind a loop device limited by cgroup v1
  blkio to BACKING_MBPS and BACKING_IOPS in each direction (slowdisk.py), a disk, over a link
  of BACKING_LINK;
- nodes 2 and 3 serve RAM (`memory:SIZE,elastic`) over faster links (MEMBER_LINK); node 2
  also serves a plain RAM export, the reference for what RAM over such a link gives.
On the host, `sluice serve --export vol=cache:FILE` with those two as members; fio's nbd
engine reads and writes through it, and directly against the backing and the RAM export.
Every figure is a ratio within this run, judged against the issue's goals:
- warm 4K random reads, QD1 and QD32: >= 10x the backing's IOPS, >= 0.8x the RAM export's;
- cold 1M sequential reads, prefetch auto: >= 0.9x the backing's own sequential rate; the
  second pass >= 0.8x the RAM export's;
- 4K random writes (write-through): >= 0.9x the backing's;
- a member killed mid-run: no error, and the rate after it (reported);
- both members squeezed to half their memory while fio verifies what it wrote: no error, no
  stale read, the hit rate reported.
Run only with `--only netmem`; it needs root, ip, tc, losetup and cgroup v1 blkio.
"""

import os
import time
from dataclasses import dataclass
from typing import Optional

import fio
import image
import metrics
import netns
import servers
import slowdisk
from measure import Context
from qos_report import Row
from report import format_markdown
from units import fmt

SECONDS, QUICK_SECONDS = 10, 3
BACKING_MBPS, BACKING_IOPS = 60, 500
BACKING_LINK, MEMBER_LINK = "1gbit", "4gbit"
BACKING_BYTES = 1 << 30
# What the readers range over: more than a gateway would keep, less than the members lend.
WORKING_SET = 256 << 20
MEMBER_SIZE = "512M"
# Each member's floor: half of what it holds once the working set is cached (half the working
# set each), so the squeeze takes about half of it back.
MEMBER_FLOOR = f"{WORKING_SET >> 22}M"
MEMBER_METRICS_PORT = 9101
# The squeeze: the members give back 1/8 of what they hold every 2 s (docs/backends/memory.md),
# so reaching the floor takes some 12 s; the verified reads go round the working set this
# long meanwhile. A member squeezed under a cache in use does not stay at its floor: the
# cache refills the slots it gave back (the notes say so).
SQUEEZE_SECONDS, QUICK_SQUEEZE_SECONDS = 20, 10
RAM_EXPORT_SIZE = "512M"
BLOCK = "64K"
CGROUP = "sluice-netmem"
BACKING_PATH = "/var/tmp/sluice-netmem-1G.img"
# Goals (issue 29, Benchmark).
WARM_VS_BACKING, WARM_VS_RAM, COLD_VS_BACKING, SECOND_VS_RAM, WRITE_VS_BACKING = 10, 0.8, 0.9, 0.8, 0.9
HEADERS = ["row", "what", "measured", "ratio", "goal", "met"]


@dataclass
class Nodes:
    backing: str            # URIs
    ram: str
    members: list
    procs: dict             # node number -> netns.Member
    meminfo: str            # the fake /proc/meminfo the members' watchers read


def run(ctx: Context) -> None:
    r = ctx.report
    r.heading("netmem: a cached volume in two nodes' RAM over a slow disk behind a slow link")
    why = netns.check()
    if why:
        raise RuntimeError(why)
    seconds = QUICK_SECONDS if ctx.quick else SECONDS
    image.ensure(BACKING_PATH, BACKING_BYTES, r)
    problems = netns.teardown()
    disk = slowdisk.Disk(BACKING_PATH, CGROUP, read_only=False)
    try:
        disk.limit(BACKING_MBPS, BACKING_IOPS)
        rows = _measure(ctx, disk, seconds)
    finally:
        problems += netns.teardown() + disk.remove()
    _publish(ctx, rows, seconds, problems)


def _measure(ctx: Context, disk: slowdisk.Disk, seconds: int) -> list:
    nodes = _start_nodes(ctx, disk)
    base = _baselines(ctx, nodes, seconds)
    rows = []
    gateway = _gateway(ctx, nodes)
    try:
        rows += _read_rows(ctx, gateway, base, seconds)
        rows += _write_rows(ctx, gateway, base, seconds)
        rows += _kill_rows(ctx, gateway, nodes, seconds)
        rows += _squeeze_rows(ctx, gateway, nodes, seconds)
    finally:
        gateway.stop()
    return rows


# --- the nodes ----------------------------------------------------------------------------

def _start_nodes(ctx: Context, disk: slowdisk.Disk) -> Nodes:
    netns.setup(3, MEMBER_LINK)
    netns.set_link_rate(1, BACKING_LINK)
    meminfo = os.path.join(ctx.workdir, "netmem-meminfo")
    _write_meminfo(meminfo, squeezed=False)
    log = os.path.join(ctx.logdir, "netmem-nodes.log")
    # O_DIRECT: every read reaches the throttled disk (buffered, re-reads came from the
    # page cache at 1,500 IOPS against a 500 IOPS disk).
    procs = {1: netns.Member(ctx.binary, 1, disk.device, log, ["--data-path", "direct"])}
    disk.join(procs[1].pid)
    env = {"SLUICE_ELASTIC_MEMINFO": meminfo}
    procs[2] = _member(ctx, 2, meminfo, ["--export", f"ram=memory:{RAM_EXPORT_SIZE}"])
    procs[3] = _member(ctx, 3, meminfo)
    ram = f"nbd://{netns.member_addr(2)}:{netns.PORT}/ram"
    return Nodes(netns.member_uri(1), ram, [netns.member_uri(2), netns.member_uri(3)], procs,
                 meminfo)


def _member(ctx: Context, i: int, meminfo: str, extra: list = ()) -> netns.Member:
    """A RAM node: the elastic export the cache uses, its watcher reading `meminfo`."""
    log = os.path.join(ctx.logdir, "netmem-nodes.log")
    metrics_at = f"{netns.member_addr(i)}:{MEMBER_METRICS_PORT}"
    return netns.Member(ctx.binary, i, f"memory:{MEMBER_SIZE},elastic,floor={MEMBER_FLOOR}", log,
                        ["--metrics", metrics_at] + list(extra),
                        env={"SLUICE_ELASTIC_MEMINFO": meminfo})


def _member_memory(i: int) -> tuple:
    """(bytes held, bytes given back) of node i's elastic export, from its /metrics."""
    samples = metrics.scrape(f"http://{netns.member_addr(i)}:{MEMBER_METRICS_PORT}/metrics")
    held = sum(v for k, v in samples.items() if k[0] == "sluice_elastic_held_bytes")
    given = sum(v for k, v in samples.items() if k[0] == "sluice_elastic_given_back_bytes_total")
    return held, given


def _write_meminfo(path: str, squeezed: bool) -> None:
    """Plenty of memory, or next to none (the members' watchers give back to their floor)."""
    available = 64 << 10 if squeezed else 16 << 20     # kB, as /proc/meminfo counts
    with open(path + ".new", "w") as f:
        f.write(f"MemTotal:       {32 << 20} kB\nMemAvailable:   {available} kB\n")
    os.rename(path + ".new", path)


def _gateway(ctx: Context, nodes: Nodes) -> servers.Running:
    path = os.path.join(ctx.workdir, "netmem-cache.toml")
    members = ", ".join(f'"{m}"' for m in nodes.members)
    with open(path, "w") as f:
        f.write(f'backing = "{nodes.backing}"\nmembers = [{members}]\nblock = "{BLOCK}"\n'
                'policy = "write-through"\nprefetch = "auto"\n')

    def argv(launch: servers.Launch) -> list:
        return [ctx.binary, "serve", "--listen", f"127.0.0.1:{launch.port}", "--export",
                f"vol=cache:{path}", "--metrics", f"127.0.0.1:{launch.metrics_port}",
                "--log-level", "info"]

    server = servers.Server(name="sluice cache", kind="sluice", cache="network memory",
                            argv=argv, export="vol", metrics=True)
    running = ctx.start(server, path)
    if running is None:
        raise RuntimeError("the cached volume did not start (see the logs)")
    return running


# --- fio ----------------------------------------------------------------------------------

def _fio(ctx: Context, name: str, uri: str, rw: str, bs: str, qd: int, seconds: int,
         extra: list = (), time_based: bool = True) -> fio.Result:
    """One fio job over the working set; untimed (time_based False): one pass, or --loops."""
    argv = ["fio", "--ioengine=nbd", f"--uri={uri}", f"--name={name}", f"--rw={rw}",
            f"--bs={bs}", f"--iodepth={qd}", f"--size={WORKING_SET}", f"--runtime={seconds}",
            "--output-format=json"] + (["--time_based"] if time_based else []) + list(extra)
    path = os.path.join(ctx.fiodir, f"netmem-{name}.json")
    return fio.run_jobs(argv, seconds, path, grace=120)[0]


def _baselines(ctx: Context, nodes: Nodes, seconds: int) -> dict:
    """The backing and the RAM export on their own: the references of every ratio."""
    out = {}
    for key, uri in (("backing", nodes.backing), ("ram", nodes.ram)):
        out[key, "seq"] = _fio(ctx, f"{key}-seq", uri, "read", "1M", 1, seconds)
        out[key, "qd1"] = _fio(ctx, f"{key}-4k-qd1", uri, "randread", "4k", 1, seconds)
        out[key, "qd32"] = _fio(ctx, f"{key}-4k-qd32", uri, "randread", "4k", 32, seconds)
    out["backing", "write"] = _fio(ctx, "backing-write", nodes.backing, "randwrite", "4k", 32, seconds)
    return out


def _ratio_row(part: str, what: str, got: fio.Result, ref: fio.Result, key: str,
               low: Optional[float]) -> Row:
    value = getattr(got, key) / getattr(ref, key) if getattr(ref, key) else None
    unit = (lambda x: f"{x / 1e6:,.1f} MB/s") if key == "bw" else (lambda x: f"{x:,.0f} IOPS")
    return Row(part, what, f"{unit(getattr(got, key))} vs {unit(getattr(ref, key))}", value, low)


def _read_rows(ctx, gateway, base: dict, seconds: int) -> list:
    uri = gateway.uri
    cold = _fio(ctx, "cache-seq-cold", uri, "read", "1M", 1, 600, time_based=False)
    second = _fio(ctx, "cache-seq-second", uri, "read", "1M", 1, seconds)
    qd1 = _fio(ctx, "cache-4k-qd1", uri, "randread", "4k", 1, seconds)
    qd32 = _fio(ctx, "cache-4k-qd32", uri, "randread", "4k", 32, seconds)
    return [
        _ratio_row("cold", "1M seq read QD1, first pass (prefetch auto) ÷ the backing's",
                   cold, base["backing", "seq"], "bw", COLD_VS_BACKING),
        _ratio_row("warm", "1M seq read QD1, second pass ÷ the RAM export's",
                   second, base["ram", "seq"], "bw", SECOND_VS_RAM),
        _ratio_row("warm", "4K randread QD1 ÷ the backing's", qd1, base["backing", "qd1"],
                   "iops", WARM_VS_BACKING),
        _ratio_row("warm", "4K randread QD1 ÷ the RAM export's", qd1, base["ram", "qd1"],
                   "iops", WARM_VS_RAM),
        _ratio_row("warm", "4K randread QD32 ÷ the backing's", qd32, base["backing", "qd32"],
                   "iops", WARM_VS_BACKING),
        _ratio_row("warm", "4K randread QD32 ÷ the RAM export's", qd32, base["ram", "qd32"],
                   "iops", WARM_VS_RAM),
    ]


def _write_rows(ctx, gateway, base: dict, seconds: int) -> list:
    got = _fio(ctx, "cache-write", gateway.uri, "randwrite", "4k", 32, seconds)
    return [_ratio_row("write", "4K randwrite QD32 (write-through) ÷ the backing's", got,
                       base["backing", "write"], "iops", WRITE_VS_BACKING)]


def _kill_rows(ctx, gateway, nodes: Nodes, seconds: int) -> list:
    """Warm 4K reads while node 3 is killed half-way: fio must see no error; its rate per
    second before the kill and after it, from fio's log. The write row left blocks
    invalidated: a sequential pass fills them first."""
    import threading
    _fio(ctx, "cache-rewarm", gateway.uri, "read", "1M", 4, 600, time_based=False)
    log = os.path.join(ctx.fiodir, "netmem-kill")
    what = f"4K randread QD32, node 3 killed at {seconds / 2:g} s: IOPS before, after, errors"
    timer = threading.Timer(seconds / 2, nodes.procs[3].kill)
    timer.start()
    try:
        _fio(ctx, "cache-kill", gateway.uri, "randread", "4k", 32, seconds,
             [f"--write_iops_log={log}", "--log_avg_msec=500"])
        before, after = _halves(f"{log}_iops.1.log", seconds / 2)
        row = Row("member lost", what, f"{fmt(before)} then {fmt(after)} IOPS, 0 errors",
                  after / before if before else None)
    except (fio.FioError, OSError) as e:
        row = Row("member lost", what, error=str(e))
    finally:
        timer.cancel()
    # Back, empty, for the next row: the gateway reconnects with its backoff.
    nodes.procs[3] = _member(ctx, 3, nodes.meminfo)
    return [row]


def _halves(path: str, split: float) -> tuple:
    """Mean IOPS of fio's log entries wholly before `split` seconds and wholly after it."""
    before, after = [], []
    with open(path) as f:
        for line in f:
            ms, value = (float(x) for x in line.split(",")[:2])
            (before if ms / 1000 <= split else after if ms / 1000 > split + 0.5 else []).append(value)
    mean = lambda xs: sum(xs) / len(xs) if xs else None  # noqa: E731
    return mean(before), mean(after)


def _squeeze_rows(ctx, gateway, nodes: Nodes, seconds: int) -> list:
    """Write a verifiable pattern, read it warm, then squeeze both members while fio reads
    it back round and round and checks every block."""
    verify = ["--verify=crc32c", "--verify_fatal=1", "--verify_state_save=0"]
    squeeze = QUICK_SQUEEZE_SECONDS if ctx.quick else SQUEEZE_SECONDS
    what = (f"64K writes with crc32c, read back and verified for {squeeze} s while both "
            f"members give back memory (floor {MEMBER_FLOOR} each)")
    try:
        _fio(ctx, "cache-verify-write", gateway.uri, "write", "64k", 8, 600, verify,
             time_based=False)
        _fio(ctx, "cache-verify-warm", gateway.uri, "read", "64k", 8, 600, time_based=False)
        held = sum(_member_memory(i)[0] for i in (2, 3))
        before = _counts(gateway)
        _write_meminfo(nodes.meminfo, squeezed=True)
        passes = _verify_while_squeezed(ctx, gateway, verify, squeeze)
        after = _counts(gateway)
        left, given = (sum(x) for x in zip(*(_member_memory(i) for i in (2, 3))))
    except (fio.FioError, OSError) as e:
        return [Row("squeeze", what, error=str(e))]
    finally:
        _write_meminfo(nodes.meminfo, squeezed=False)
    hits, misses = (after[0] - before[0]), (after[1] - before[1])
    rate = hits / (hits + misses) if hits + misses else None
    figures = (f"0 verify errors in {passes} passes; members held {held / 2**20:,.0f} MiB, "
               f"gave back {given / 2**20:,.0f}, hold {left / 2**20:,.0f}; hit rate "
               + (f"{rate:.1%}" if rate is not None else "-"))
    return [Row("squeeze", what, figures, rate)]


def _verify_while_squeezed(ctx, gateway, verify: list, seconds: int) -> int:
    """Verified passes over the working set for `seconds` (a pass at least); how many ran."""
    deadline = time.monotonic() + seconds
    passes = 0
    while passes == 0 or time.monotonic() < deadline:
        passes += 1
        _fio(ctx, f"cache-verify-read-{passes}", gateway.uri, "write", "64k", 8, 600,
             verify + ["--verify_only"], time_based=False)
    return passes


def _counts(gateway) -> tuple:
    """The cached volume's hits and misses so far, from its /metrics."""
    samples = metrics.scrape(gateway.metrics_url)
    hits = sum(v for k, v in samples.items() if k[0].startswith("sluice_cache_hits"))
    misses = sum(v for k, v in samples.items() if k[0].startswith("sluice_cache_misses"))
    return hits, misses


# --- the report ---------------------------------------------------------------------------

def _publish(ctx: Context, rows: list, seconds: int, problems: list) -> None:
    r = ctx.report
    table = format_markdown(HEADERS, [row.cells() for row in rows], left=3)
    notes = [f"backing: {BACKING_PATH} ({BACKING_BYTES >> 30} GiB of random data) behind a loop "
             f"device limited to {BACKING_MBPS} MB/s and {BACKING_IOPS} IOPS each way (cgroup v1 "
             f"blkio) and served with --data-path direct by node 1 over a {BACKING_LINK} link; "
             f"members: nodes 2 and 3, memory:{MEMBER_SIZE},elastic,floor={MEMBER_FLOOR} over "
             f"{MEMBER_LINK} links (their watchers read a made-up /proc/meminfo: plenty, or "
             "next to nothing for the squeeze); the RAM export: "
             f"memory:{RAM_EXPORT_SIZE} on node 2. Cache block {BLOCK}, prefetch auto.",
             f"fio's nbd engine over the first {WORKING_SET >> 20} MiB, {seconds} s per timed "
             "run; the cold and verify passes read the working set once, untimed. Rows run "
             "in order on one gateway: cold, then warm, writes, a member lost, the squeeze.",
             "The squeeze: the members' watchers read a /proc/meminfo that says memory is "
             "short, so each gives back an eighth of what it holds every 2 s, down to its "
             "floor; the cache refills what they give back as the verified reads miss, so "
             "they settle above the floor: 'hold' is where they stood at the end."]
    notes += [f"cleanup: {p}" for p in problems]
    r.say(table)
    for line in notes:
        r.say(line)
    with open(os.path.join(ctx.out_dir, "netmem.md"), "w", encoding="utf-8") as f:
        f.write("# netmem: a cached volume in network memory\n\n" + table + "\n\n"
                + "\n\n".join(notes) + "\n")
