"""Sizes and numbers as people write them: 4K, 1M, 2G; MB/s in decimal, GiB in binary."""

import math
import re

_SUFFIX = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(text: str) -> int:
    """'4K', '1M', '2G', '2GiB', '4096' -> bytes (binary multiples, as fio and sluice read them)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*", text, re.IGNORECASE)
    if not m:
        raise ValueError(f"not a size: {text!r} (use e.g. 4K, 512M, 2G)")
    return int(float(m.group(1)) * _SUFFIX[m.group(2).upper()])


def size_label(n: int) -> str:
    """4096 -> '4K', 1048576 -> '1M'; exact multiples only, else plain bytes."""
    for suffix in ("T", "G", "M", "K"):
        unit = _SUFFIX[suffix]
        if n >= unit and n % unit == 0:
            return f"{n // unit}{suffix}"
    return str(n)


def fmt(value, digits: int = 0) -> str:
    """A table cell: '-' for a missing value, thousands separators for big numbers."""
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if digits == 0:
        return f"{value:,.0f}"
    return f"{value:,.{digits}f}"


def fmt_sig(value, significant: int = 3) -> str:
    """About `significant` significant digits, never in exponent notation: 0.0123, 4.56, 789."""
    if value is None:
        return "-"
    if value == 0:
        return "0"
    digits = significant - 1 - math.floor(math.log10(abs(value)))
    return fmt(value, max(0, digits))


def ratio(a, b) -> str:
    """'1.23x', or '-' when either side is missing or b is zero."""
    if a is None or b is None or b == 0:
        return "-"
    return f"{a / b:.2f}x"


def percent(a, b) -> str:
    if a is None or b is None or b == 0:
        return "-"
    return f"{100.0 * a / b:.0f}%"
