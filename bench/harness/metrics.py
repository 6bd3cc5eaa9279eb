"""sluice's Prometheus text: scrape before and after a point, turn the phase histogram's
_sum/_count deltas into the mean time each request spent in each phase."""

import re
import urllib.request

PHASES = ("receive", "storage", "queue", "send", "total")
PHASE_METRIC = "sluice_request_phase_seconds"

_LINE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?\s+(\S+)")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


def scrape(url: str, timeout: float = 5.0) -> dict:
    """{(metric name, ((label, value), ...sorted)): float}"""
    with urllib.request.urlopen(url, timeout=timeout) as response:
        text = response.read().decode("utf-8", "replace")
    return parse(text)


def parse(text: str) -> dict:
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _LINE.match(line)
        if not m:
            continue
        labels = tuple(sorted(_LABEL.findall(m.group(2) or "")))
        try:
            samples[(m.group(1), labels)] = float(m.group(3))
        except ValueError:
            pass
    return samples


def phase_means_us(before: dict, after: dict, op: str = "read", export: str = "") -> dict:
    """{phase: mean microseconds per request between the two scrapes}; None for a phase
    with no requests in between or missing from the output."""
    means = {}
    for phase in PHASES:
        labels = tuple(sorted((("export", export), ("op", op), ("phase", phase))))
        s = _delta(before, after, (f"{PHASE_METRIC}_sum", labels))
        n = _delta(before, after, (f"{PHASE_METRIC}_count", labels))
        means[phase] = (s / n * 1e6) if s is not None and n else None
    return means


def _delta(before: dict, after: dict, key):
    if key not in after:
        return None
    return after[key] - before.get(key, 0.0)
