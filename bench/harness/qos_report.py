"""The table, notes and files of the `qos` experiment (qos.py measures): one row per figure
judged against issue 27's goal, each a ratio measured within this run."""

import os
from dataclasses import dataclass
from typing import Optional

import machine
from report import format_markdown
from units import fmt

# The goals (issue 27, Benchmarks): a limit within 5%, shares within 10% of the weights'
# ratio, a reservation kept at 95%, CPU per I/O up by at most 5%.
LIMIT_TOLERANCE, SHARE_TOLERANCE, RESERVATION_KEPT, CPU_RISE_MAX = 0.05, 0.10, 0.95, 0.05

HEADERS = ["row", "what", "measured", "ratio", "goal", "met"]
CSV_HEADERS = ["row", "what", "measured", "ratio", "goal_low", "goal_high", "met", "error"]
RUN_CSV_HEADERS = ["job", "server", "round", "iops", "mb_per_s", "cpu_seconds", "cpu_us_per_io",
                   "error"]


@dataclass
class Row:
    part: str                       # limit, burst, shares, reservation, overhead
    what: str
    figures: str = ""               # the measured figures the ratio comes from
    value: Optional[float] = None   # the ratio judged
    low: Optional[float] = None     # goal: low <= value <= high; both None: reported only
    high: Optional[float] = None
    error: str = ""

    @property
    def goal(self) -> str:
        if self.low is not None and self.high is not None:
            return f"{self.low:.2f}..{self.high:.2f}"
        if self.low is not None:
            return f">= {self.low:.2f}"
        return f"<= {self.high:.2f}" if self.high is not None else "(reported)"

    @property
    def met(self) -> Optional[bool]:
        if self.error or self.value is None or (self.low is None and self.high is None):
            return None
        return ((self.low is None or self.value >= self.low)
                and (self.high is None or self.value <= self.high))

    @property
    def verdict(self) -> str:
        if self.error:
            return "FAILED"
        return {True: "met", False: "MISSED", None: "-"}[self.met]

    def cells(self) -> list:
        ratio = "-" if self.value is None else f"{self.value:.3f}"
        return [self.part, self.what, self.figures or self.error, ratio, self.goal, self.verdict]


def _rate(value: float, unit: str) -> str:
    return f"{value / 1e6:,.1f} MB/s" if unit == "MB/s" else f"{value:,.0f} IOPS"


def limit_rows(label, job, seconds, first, result, steady, limit, unit) -> list:
    """The rate after the first second (the burst spent) against the limit; the whole run
    against what the limit allows over it, rate x (runtime + burst), burst 1 s here."""
    total = result.bytes if unit == "MB/s" else result.ios
    allowed = limit * (result.seconds + 1) / result.seconds
    whole = total / result.seconds
    return [
        Row("limit", f"{label}, {job}: seconds 2..{seconds}",
            f"{_rate(steady, unit)} of {_rate(limit, unit)}", steady / limit,
            1 - LIMIT_TOLERANCE, 1 + LIMIT_TOLERANCE),
        Row("limit", f"{label}, {job}: whole run, first second's burst included",
            f"{_rate(whole, unit)} of {_rate(allowed, unit)} allowed", whole / allowed,
            None, 1 + LIMIT_TOLERANCE),
    ]


def burst_row(label, job, first, limit, burst, unit) -> Row:
    expected = limit * (1 + burst)
    return Row("burst", f"{label}, {job}: first second vs rate x (1 + burst)",
               f"{_rate(first, unit)} of {_rate(expected, unit)}", first / expected,
               1 - LIMIT_TOLERANCE, 1 + LIMIT_TOLERANCE)


def _pair(rates) -> str:
    """'a + b IOPS from the second second on (whole run a' + b')'."""
    (s0, w0), (s1, w1) = rates
    return f"{fmt(s0)} + {fmt(s1)} IOPS (whole run {fmt(w0)} + {fmt(w1)})"


def share_row(cap_label: str, weights: tuple, rates) -> Row:
    what = f"w{weights[0]} + w{weights[1]}, 4K randread QD32 each, {cap_label}: seconds 2..N"
    if isinstance(rates, str):
        return Row("shares", what, error=rates)
    target = weights[1] / weights[0]
    (low, _), (high, _) = rates
    return Row("shares", what, _pair(rates), high / low if low else None,
               target * (1 - SHARE_TOLERANCE), target * (1 + SHARE_TOLERANCE))


def reservation_row(reserved: bool, reservation: int, cap: int, flood_weight: int, rates) -> Row:
    what = (f"{'reservation-iops = ' + str(reservation) if reserved else 'control, no reservation'}"
            f" (w100) + flood (w{flood_weight}), storage-iops = {cap}: seconds 2..N")
    if isinstance(rates, str):
        return Row("reservation", what, error=rates)
    return Row("reservation", what, _pair(rates), rates[0][0] / reservation,
               RESERVATION_KEPT if reserved else None, None)


def overhead_rows(label: str, points: list) -> list:
    """points: without QoS, with the roomy class."""
    plain, roomy = points
    what = f"{label}, 1 conn, roomy class ÷ no QoS"
    if not plain.ok or not roomy.ok:
        return [Row("overhead", what, error=plain.error or roomy.error)]
    cpu = (f"{_cpu_spread(roomy)} vs {_cpu_spread(plain)} CPU µs/IO")
    iops = f"{fmt(roomy.iops)} vs {fmt(plain.iops)} IOPS"
    return [Row("overhead", f"{what}: CPU per I/O", cpu,
                roomy.cpu_us_per_io / plain.cpu_us_per_io, None, 1 + CPU_RISE_MAX),
            Row("overhead", f"{what}: IOPS", iops, roomy.iops / plain.iops)]


def _cpu_spread(point) -> str:
    values = [r.cpu_us_per_io for r in point.good if r.cpu_us_per_io is not None]
    text = f"{point.cpu_us_per_io:.2f}"
    return text + (f" ({min(values):.2f}..{max(values):.2f})" if len(values) > 1 else "")


def intro(ctx, seconds: int, loads: tuple) -> list:
    return [
        f"machine: {machine.one_line()}",
        f"load average (1, 5, 15 min): {loads[0]} before, {loads[1]} after",
        f"each row: fio's nbd engine against sluice started with a configuration file of its "
        f"own (--log-level warn, default threads and data path; --metrics but for the "
        f"overhead rows), every export serving "
        f"{ctx.image} read-only, warm (read once before the experiment); {seconds} s per fio run.",
        "limit and burst rows: fio logs its rate averaged over whole seconds "
        "(--write_bw_log/--write_iops_log, --log_avg_msec=1000); the first line is the first "
        "second. 'seconds 2..N' is (the run's total - the first second) / (runtime - 1 s): "
        "the rate once the burst (1 s of the limit by default) is spent. A bucket starts "
        "full, so the first second may carry rate x (1 + burst).",
        "shares and reservation rows: two fio jobs in one fio (two connections, started "
        "together), each on its own export of the same image, the export naming the class "
        "(both connect from 127.0.0.1, so [[qos-match]] by address cannot tell them apart); "
        "the storage cap makes them contend (without one the page cache answers both at once "
        "and there is nothing to divide). Figures: each connection's IOPS from the second "
        "second on (fio's per-second log, as above), so the cap's 1 s burst, spent before "
        "anyone waits, does not blur the split; the whole run's in parentheses. The ratio: "
        "w300's over w100's (shares), the reserved class's over its reservation.",
        "a row whose fio has not ended 15 s after its runtime has requests stuck in sluice: "
        "fio is killed and the row shows what sluice's metrics said it held 2 s before.",
        "overhead rows: sluice with no QoS configured and sluice with one class whose limits "
        "are never reached (iops = 100000000, bps = 1T), both running; the fio runs alternate "
        "between them, the first server changing each round; medians over the rounds, "
        "min..max in parentheses; server CPU from /proc (user + system, whole process).",
    ]


def show(ctx, rows: list, runs: list, seconds: int, loads: tuple) -> None:
    r = ctx.report
    lines = intro(ctx, seconds, loads)
    for line in lines:
        r.say(line)
    table = [row.cells() for row in rows]
    r.table("", HEADERS, table, left=3)
    verdict = _verdict(rows)
    r.say(verdict)
    _write(ctx, lines, table, verdict, rows, runs)


def _verdict(rows: list) -> str:
    judged = [row for row in rows if row.met is not None]
    missed = [f"{row.part}: {row.what}" for row in judged if not row.met]
    failed = [f"{row.part}: {row.what}" for row in rows if row.error]
    text = f"goals met on {len(judged) - len(missed)} of {len(judged)} rows"
    if missed:
        text += "; missed: " + "; ".join(missed)
    if failed:
        text += "; failed: " + "; ".join(failed)
    return text


def _write(ctx, lines, table, verdict, rows, runs) -> None:
    with open(os.path.join(ctx.out_dir, "qos.md"), "w", encoding="utf-8") as f:
        f.write("# qos\n\n" + "\n\n".join(lines) + "\n\n")
        f.write(format_markdown(HEADERS, table, left=3) + "\n\n" + verdict + "\n")
    ctx.report.csv("qos.csv", CSV_HEADERS, [
        [row.part, row.what, row.figures, row.value, row.low, row.high, row.met, row.error]
        for row in rows])
    ctx.report.csv("qos_overhead_runs.csv", RUN_CSV_HEADERS, [
        [job, side, i, run.iops, run.mb_per_s, run.cpu_seconds, run.cpu_us_per_io, run.error]
        for job, side, i, run in runs])
