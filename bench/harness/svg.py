"""Charts as plain SVG files: line charts (log2 x axis for request sizes, linear y axis,
legend) and grouped bar charts (one group per category, one bar per series).

No plotting library: a fresh Debian box has none, and the chart is simple enough to draw.
"""

import math
from dataclasses import dataclass
from xml.sax.saxutils import escape

WIDTH, HEIGHT = 1000, 560
LEFT, RIGHT, TOP, BOTTOM = 80, 300, 60, 60   # margins; the legend sits in the right one


@dataclass
class Series:
    label: str
    points: list            # [(x, y)], x > 0
    color: str = "#1f77b4"
    dash: str = ""          # SVG stroke-dasharray, "" for a solid line


def line_chart(path: str, title: str, series: list, x_label: str, y_label: str,
               x_tick_label=str, subtitle: str = "") -> None:
    drawn = [s for s in series if s.points]
    xs = [x for s in drawn for x, _ in s.points]
    ys = [y for s in drawn for _, y in s.points]
    if not xs:
        xs, ys = [1, 2], [0, 1]
    lo, hi = math.floor(math.log2(min(xs))), math.ceil(math.log2(max(xs)))
    if hi == lo:
        hi += 1
    y_max, y_step = _nice_axis(max(ys) if ys else 1.0)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def px(x):
        return LEFT + (math.log2(x) - lo) / (hi - lo) * plot_w

    def py(y):
        return TOP + plot_h - y / y_max * plot_h

    out = _frame(title, subtitle, plot_w)

    # Grid and ticks: every power of two on x, round steps on y.
    for e in range(lo, hi + 1):
        x = px(2 ** e)
        out.append(f'<line x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{TOP + plot_h}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{x:.1f}" y="{TOP + plot_h + 18}" text-anchor="middle">'
                   f'{escape(x_tick_label(2 ** e))}</text>')
    steps = int(round(y_max / y_step))
    for i in range(steps + 1):
        v = i * y_step
        y = py(v)
        out.append(f'<line x1="{LEFT}" y1="{y:.1f}" x2="{LEFT + plot_w}" y2="{y:.1f}" stroke="#e5e5e5"/>')
        out.append(f'<text x="{LEFT - 8}" y="{y + 4:.1f}" text-anchor="end">{_tick(v, y_step)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>')
    out.append(f'<text x="{LEFT + plot_w / 2:.1f}" y="{HEIGHT - 15}" text-anchor="middle">'
               f'{escape(x_label)}</text>')
    out.append(f'<text transform="translate(20,{TOP + plot_h / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')

    for s in drawn:
        pts = sorted(s.points)
        coords = " ".join(f"{px(x):.1f},{py(y):.1f}" for x, y in pts)
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(f'<polyline points="{coords}" fill="none" stroke="{s.color}" stroke-width="2"{dash}/>')
        for x, y in pts:
            out.append(f'<circle cx="{px(x):.1f}" cy="{py(y):.1f}" r="3" fill="{s.color}"/>')

    # Legend, one row per series, in the right margin.
    lx, ly = LEFT + plot_w + 20, TOP + 10
    for i, s in enumerate(series):
        y = ly + i * 22
        dash = f' stroke-dasharray="{s.dash}"' if s.dash else ""
        out.append(f'<line x1="{lx}" y1="{y}" x2="{lx + 30}" y2="{y}" stroke="{s.color}" '
                   f'stroke-width="2"{dash}/>')
        note = "" if s.points else " (not run)"
        out.append(f'<text x="{lx + 38}" y="{y + 4}">{escape(s.label + note)}</text>')

    out.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def bar_chart(path: str, title: str, categories: list, series: list, y_label: str,
              subtitle: str = "", value_label=lambda v: f"{v:.2f}") -> None:
    """series: [Series(label, [value or None per category], color)]. Bars start at 0, so a
    negative value (a slowdown below the noise) hangs below the axis."""
    values = [0.0] + [v for s in series for v in s.points if v is not None]
    _, step = _nice_axis(max(values) - min(values))
    # A little headroom above the tallest bar, for its value label.
    lo_steps = math.floor(min(values) / step)
    hi_steps = max(1, math.ceil(max(values) * 1.06 / step))
    top, bottom = hi_steps * step, lo_steps * step
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def py(y):
        return TOP + (top - y) / (top - bottom) * plot_h

    out = _frame(title, subtitle, plot_w)
    for i in range(lo_steps, hi_steps + 1):
        v = i * step
        out.append(f'<line x1="{LEFT}" y1="{py(v):.1f}" x2="{LEFT + plot_w}" y2="{py(v):.1f}" '
                   f'stroke="{"#999" if i == 0 else "#e5e5e5"}"/>')
        out.append(f'<text x="{LEFT - 8}" y="{py(v) + 4:.1f}" text-anchor="end">{_tick(v, step)}</text>')
    group_w = plot_w / max(1, len(categories))
    bar_w = group_w * 0.8 / max(1, len(series))
    for ci, name in enumerate(categories):
        x0 = LEFT + ci * group_w + group_w * 0.1
        for si, s in enumerate(series):
            value = s.points[ci] if ci < len(s.points) else None
            if value is None:
                continue
            x, y_hi, y_lo = x0 + si * bar_w, py(max(value, 0.0)), py(min(value, 0.0))
            out.append(f'<rect x="{x:.1f}" y="{y_hi:.1f}" width="{bar_w * 0.9:.1f}" '
                       f'height="{max(y_lo - y_hi, 0.5):.1f}" fill="{s.color}"/>')
            out.append(f'<text x="{x + bar_w * 0.45:.1f}" y="{y_hi - 4:.1f}" text-anchor="middle" '
                       f'font-size="10">{escape(value_label(value))}</text>')
        out.append(f'<text x="{LEFT + (ci + 0.5) * group_w:.1f}" y="{TOP + plot_h + 18}" '
                   f'text-anchor="middle">{escape(name)}</text>')
    out.append(f'<rect x="{LEFT}" y="{TOP}" width="{plot_w}" height="{plot_h}" fill="none" stroke="#333"/>')
    out.append(f'<text transform="translate(20,{TOP + plot_h / 2:.1f}) rotate(-90)" '
               f'text-anchor="middle">{escape(y_label)}</text>')
    lx, ly = LEFT + plot_w + 20, TOP + 10
    for i, s in enumerate(series):
        y = ly + i * 22
        out.append(f'<rect x="{lx}" y="{y - 6}" width="30" height="12" fill="{s.color}"/>')
        out.append(f'<text x="{lx + 38}" y="{y + 4}">{escape(s.label)}</text>')
    out.append("</svg>")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(out) + "\n")


def _frame(title: str, subtitle: str, plot_w: float) -> list:
    """The opening of a chart: canvas, title and subtitle."""
    return [f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="sans-serif" font-size="12">',
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="white"/>',
            f'<text x="{LEFT + plot_w / 2:.1f}" y="{TOP - 28}" text-anchor="middle" '
            f'font-size="15" font-weight="bold">{escape(title)}</text>',
            f'<text x="{LEFT + plot_w / 2:.1f}" y="{TOP - 5}" text-anchor="middle" '
            f'fill="#555">{escape(subtitle)}</text>']


def _nice_axis(top: float):
    """(axis maximum, tick step): 1, 2 or 5 times a power of ten, about five ticks."""
    if top <= 0:
        return 1.0, 0.2
    raw = top / 5
    power = 10 ** math.floor(math.log10(raw))
    for m in (1, 2, 5, 10):
        step = m * power
        if step >= raw:
            break
    return math.ceil(top / step) * step, step


def _tick(v: float, step: float) -> str:
    if step >= 1:
        return f"{v:,.0f}"
    decimals = max(0, -math.floor(math.log10(step)))
    return f"{v:.{decimals}f}"
