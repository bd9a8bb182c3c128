"""The fleet's distributions as SVG: one histogram per metric, every GPU (or node) of the fleet, drawn from the
cluster results' ``fleet`` section as merge decided it (its histogram, median, floor and failing parts:
``clustergate.cluster.fleet.histogram`` binned the parts' figures; the page never holds them one by one).

A histogram stays readable at 8,000 GPUs where bars per GPU do not. Lines mark the fleet median, the
outlier bounds (outlier_fraction x median below, outlier_multiple x median above) and the profile's min/max;
the fleet outliers are drawn as red triangles under the axis and every other failing part as a red tick, so a
single bad GPU among thousands is still seen.

Drawn as SVG text rather than on matplotlib's canvas (``clustergate.report.plots`` draws the node page's figures
there): a merge page holds one histogram per metric, about 40, and matplotlib took about 0.1 CPU s to lay out and
rasterize each, 4 s of every merge; these are a few shapes and labels, drawn in about a millisecond, sharp at any
zoom and a third of the PNG's bytes. The page embeds each as an ``<img>`` (``data:image/svg+xml``), where no
script of it could run; every label is XML-escaped.
"""

from __future__ import annotations

import math
from typing import Any
from xml.sax.saxutils import escape, quoteattr

from clustergate.common.numbers import number, percent
from clustergate.record.results import short_test_name
from clustergate.report.figures import STATE_COLOURS

WIDTH, HEIGHT = 700, 290
"""The canvas in pixels: the plot, and a legend column at its right."""
LEFT, RIGHT, TOP, BOTTOM = 52, 510, 28, 246
"""The plot area's edges."""
TICKS = 5
"""About this many labelled ticks on the x axis."""
MIN_BAR_PX = 3.0
"""The narrowest bar drawn, in pixels."""
GREY, DARK = "#555555", "#222222"
DASHES = {"solid": "", "dashed": "5,3", "dotted": "1.5,2.5", "dashdot": "6,2.5,1.5,2.5"}


def nice_ticks(low: float, high: float, count: int = TICKS) -> list[float]:
    """Round tick values covering [low, high]: steps of 1, 2, 2.5 or 5 times a power of ten."""
    if not high > low:
        return [low]
    raw = (high - low) / count
    power = 10.0 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1.0, 2.0, 2.5, 5.0, 10.0) if m * power >= raw)
    first = math.ceil(low / step - 1e-9)
    ticks = [(first + i) * step for i in range(count + 2)]
    # Rounded to the step's own digits, so 0.30000000000000004 prints as 0.3.
    digits = max(0, -math.floor(math.log10(step)) + 1)
    return [round(t, digits) for t in ticks if t <= high + step * 1e-9]


class _Canvas:
    """Data to pixels on one plot area, and the SVG elements drawn so far."""

    def __init__(self, x_range: tuple[float, float], y_max: float) -> None:
        self.x0, self.x1 = x_range
        self.y_max = y_max
        self.parts: list[str] = []

    def x(self, value: float) -> float:
        return LEFT + (value - self.x0) / (self.x1 - self.x0) * (RIGHT - LEFT)

    def y(self, count: float) -> float:
        return BOTTOM - count / self.y_max * (BOTTOM - TOP)

    def add(self, element: str) -> None:
        self.parts.append(element)

    def text(self, x: float, y: float, words: str, size: int, anchor: str = "middle", extra: str = "") -> None:
        self.add(f'<text x="{x:.1f}" y="{y:.1f}" font-size="{size}" text-anchor="{anchor}"{extra}>'
                 f"{escape(words)}</text>")

    def line(self, x1: float, y1: float, x2: float, y2: float, colour: str, style: str = "solid",
             width: float = 1.0) -> None:
        dash = f' stroke-dasharray="{DASHES[style]}"' if DASHES[style] else ""
        self.add(f'<line x1="{x1:.1f}" y1="{y1:.1f}" x2="{x2:.1f}" y2="{y2:.1f}" stroke="{colour}" '
                 f'stroke-width="{width}"{dash}/>')


def _x_range(fm: dict[str, Any], marks: list[float]) -> tuple[float, float]:
    edges = [float(e) for e in fm["histogram"]["edges"]]
    low, high = min(edges + marks), max(edges + marks)
    if not high > low:  # every part the same figure: a window around it
        pad = abs(low) * 0.05 or 1.0
        return low - pad, high + pad
    pad = (high - low) * 0.04
    return low - pad, high + pad


def histogram_svg(fm: dict[str, Any]) -> str:
    """One entry of the cluster results' ``fleet`` section as a histogram (an SVG document)."""
    counts = [float(c) for c in fm["histogram"]["counts"]]
    edges = [float(e) for e in fm["histogram"]["edges"]]
    criterion = fm["criterion"]
    # (value, colour, style, legend words) of each vertical line.
    lines: list[tuple[float, str, str, str]] = [(float(fm["median"]), DARK, "solid", f"median {number(fm['median'])}")]
    if fm.get("floor") is not None:
        lines.append((float(fm["floor"]), STATE_COLOURS["fail"], "dashed",
                      f"{percent(criterion['outlier_fraction'])} of median {number(fm['floor'])}"))
    if fm.get("limit") is not None:
        lines.append((float(fm["limit"]), STATE_COLOURS["fail"], "dashed",
                      f"{number(criterion['outlier_multiple'])}x median {number(fm['limit'])}"))
    for key, style in (("min", "dotted"), ("max", "dashdot")):
        if key in criterion:
            lines.append((float(criterion[key]), GREY, style, f"{key} {number(float(criterion[key]))}"))
    outliers = [float(o["value"]) for o in fm.get("outliers") or []]
    bad = [float(v) for v in fm.get("failing") or []]
    for value in outliers:  # the rest of the failing parts: their own run failed them
        if value in bad:
            bad.remove(value)

    # A tenth above the tallest bar, so that it does not touch the frame.
    canvas = _Canvas(_x_range(fm, [v for v, *_ in lines] + outliers + bad), max(max(counts, default=0.0), 1.0) * 1.1)
    _axes(canvas, fm)
    _bars(canvas, counts, edges)
    legend: list[tuple[str, str, str]] = []  # (kind, colour or style, words)
    for value, colour, style, words in lines:
        canvas.line(canvas.x(value), TOP, canvas.x(value), BOTTOM, colour, style)
        legend.append(("line:" + style, colour, words))
    fail = STATE_COLOURS["fail"]
    for value in outliers:
        x = canvas.x(value)
        canvas.add(f'<polygon points="{x:.1f},{BOTTOM - 1} {x - 5:.1f},{BOTTOM + 8} {x + 5:.1f},{BOTTOM + 8}" '
                   f'fill="{fail}"/>')
    if outliers:
        legend.append(("triangle", fail, f"{len(outliers)} fleet outliers"))
    for value in bad:
        canvas.line(canvas.x(value), BOTTOM - 7, canvas.x(value), BOTTOM + 7, fail, width=1.5)
    if bad:
        legend.append(("tick", fail, f"{len(bad)} failing their own run"))
    _legend(canvas, legend)
    part = "GPUs" if fm["scope"] == "gpu" else "nodes"
    canvas.text((LEFT + RIGHT) / 2, 16, f"{fm['metric']} ({short_test_name(fm['test'])}): {fm['count']} {part}", 12)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" '
            f'viewBox="0 0 {WIDTH} {HEIGHT}" font-family="DejaVu Sans, Arial, sans-serif">'
            f'<rect width="{WIDTH}" height="{HEIGHT}" fill="#ffffff"/>' + "".join(canvas.parts) + "</svg>")


def _bars(canvas: _Canvas, counts: list[float], edges: list[float]) -> None:
    """The bins as bars. Where a criterion's line stretches the axis far past the parts (every GPU within 0.01% of
    the median, a floor at 80% of it), a bin is narrower than a pixel: each is drawn at least MIN_BAR_PX wide, centred
    where it is, so that the parts are seen at all."""
    for i, count in enumerate(counts):
        if count <= 0:
            continue
        left, right = canvas.x(edges[i]), canvas.x(edges[i + 1])
        if right - left < MIN_BAR_PX:
            middle = (left + right) / 2
            left, right = middle - MIN_BAR_PX / 2, middle + MIN_BAR_PX / 2
        top = canvas.y(count)
        canvas.add(f'<rect x="{left:.1f}" y="{top:.1f}" width="{right - left:.1f}" height="{BOTTOM - top:.1f}" '
                   f'fill="{STATE_COLOURS["ok"]}"/>')


def _axes(canvas: _Canvas, fm: dict[str, Any]) -> None:
    """The frame, the y axis's whole counts with their grid lines, the x axis's round ticks, and the axis names."""
    for count in nice_ticks(0.0, canvas.y_max, 4):
        if count != int(count):
            continue
        y = canvas.y(count)
        canvas.line(LEFT, y, RIGHT, y, "#dddddd")
        canvas.text(LEFT - 5, y + 3.5, number(count), 10, "end")
    for value in nice_ticks(canvas.x0, canvas.x1):
        x = canvas.x(value)
        canvas.line(x, BOTTOM, x, BOTTOM + 4, GREY)
        canvas.text(x, BOTTOM + 21, number(value), 10)  # below the outliers' triangles
    canvas.add(f'<rect x="{LEFT}" y="{TOP}" width="{RIGHT - LEFT}" height="{BOTTOM - TOP}" fill="none" '
               f'stroke="{GREY}"/>')
    unit = fm["unit"]
    canvas.text((LEFT + RIGHT) / 2, BOTTOM + 38, f"{fm['metric']} ({unit})" if unit else fm["metric"], 11)
    mid = (TOP + BOTTOM) / 2
    canvas.text(14, mid, "GPUs" if fm["scope"] == "gpu" else "nodes", 11,
                extra=f" transform={quoteattr(f'rotate(-90 14 {mid:.1f})')}")


def _legend(canvas: _Canvas, entries: list[tuple[str, str, str]]) -> None:
    """The legend in its own column right of the plot, where it never hides a bar."""
    x = RIGHT + 12
    for i, (kind, colour, words) in enumerate(entries):
        y = TOP + 8 + i * 17
        if kind.startswith("line:"):
            canvas.line(x, y, x + 22, y, colour, kind.removeprefix("line:"))
        elif kind == "triangle":
            canvas.add(f'<polygon points="{x + 11},{y - 5} {x + 6},{y + 4} {x + 16},{y + 4}" fill="{colour}"/>')
        else:
            canvas.line(x + 11, y - 6, x + 11, y + 6, colour, width=1.5)
        canvas.text(x + 28, y + 3.5, words, 10, "start")
