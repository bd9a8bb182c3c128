"""Figures as base64 PNG for the self-contained report (matplotlib's Agg canvas, no pyplot).

Using ``Figure`` and ``FigureCanvasAgg`` directly leaves matplotlib's global backend and pyplot's
figure registry alone: a test process that also plots is not affected, and nothing needs a display.
"""

from __future__ import annotations

import base64
import io
import math

from matplotlib import colormaps
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from clustergate.common.numbers import number
from clustergate.report.figures import STATE_COLOURS, BarFigure, CurveFigure, MatrixFigure
from clustergate.report.figures import Figure as Spec

DPI = 100


def _png(fig: Figure) -> str:
    buf = io.BytesIO()
    FigureCanvasAgg(fig).print_png(buf)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _bytes_label(value: float, _pos: object = None) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= scale:
            return f"{value / scale:g} {unit}"
    return f"{value:g} B"


def _axis_label(field: str, unit: str) -> str:
    return f"{field} ({unit})" if unit else field


def curve_png(spec: CurveFigure) -> str:
    fig = Figure(figsize=(6.4, 3.6), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    colours: dict[str, str] = {}
    for s in spec.series:
        # One colour and one legend entry per label; groups of a label (nodes, rails) are its lines.
        first = s.label not in colours
        colours.setdefault(s.label, f"C{len(colours) % 10}")
        ax.plot(s.x, s.y, marker="o", markersize=3, linewidth=1.4 if first else 0.9, color=colours[s.label],
                label=s.label if first else None)
    if spec.log_x and all(x > 0 for s in spec.series for x in s.x):
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(FuncFormatter(_bytes_label))
        ax.set_xlabel(spec.x_field if spec.x_unit in ("", "B") else _axis_label(spec.x_field, spec.x_unit))
    else:
        ax.set_xlabel(_axis_label(spec.x_field, spec.x_unit))
    ax.set_ylabel(_axis_label(spec.y_field, spec.y_unit))
    ax.set_title(spec.title, fontsize=10)
    ax.grid(True, alpha=0.3)
    ax.tick_params(labelsize=8)
    if len({s.label for s in spec.series}) > 1:
        ax.legend(fontsize=7, loc="best")
    return _png(fig)


def matrix_png(spec: MatrixFigure) -> str:
    rows, cols = len(spec.values), len(spec.values[0])
    size = min(9.0, 2.5 + 0.45 * max(rows, cols))
    fig = Figure(figsize=(size + 1.2, size), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    data = [[math.nan if v is None else v for v in row] for row in spec.values]
    image = ax.imshow(data, cmap=colormaps["viridis"].with_extremes(bad="#dddddd"), aspect="auto")
    fig.colorbar(image, ax=ax, label=spec.unit or None, shrink=0.8)
    ax.set_xticks(range(cols), spec.col_labels, rotation=90 if cols > 8 else 0, fontsize=7)
    ax.set_yticks(range(rows), spec.row_labels, fontsize=7)
    if rows * cols <= 256:
        finite = [v for row in data for v in row if not math.isnan(v)]
        mid = (max(finite) + min(finite)) / 2 if finite else 0
        for i, row in enumerate(data):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, number(v), ha="center", va="center", fontsize=6,
                            color="white" if v < mid else "black")
    ax.set_title(spec.title, fontsize=10)
    return _png(fig)


def bars_png(spec: BarFigure) -> str:
    n = len(spec.values)
    fig = Figure(figsize=(min(14.0, max(4.5, 1.5 + 0.22 * n)), 3.4), dpi=DPI, layout="constrained")
    ax = fig.add_subplot()
    ax.bar(range(n), spec.values, width=0.6 if n > 3 else 0.4,
           color=[STATE_COLOURS.get(s, STATE_COLOURS["ok"]) for s in spec.states])
    ax.set_xlim(-0.5 if n > 3 else -1.0, n - 0.5 if n > 3 else n)
    for (label, y), style in zip(spec.lines, ("--", ":", "-."), strict=False):
        ax.axhline(y, color="#555555", linestyle=style, linewidth=1, label=label)
    ax.set_xticks(range(n), spec.labels, rotation=90 if n > 6 else 0, fontsize=7)
    ax.set_ylabel(spec.unit)
    ax.set_title(spec.title, fontsize=10)
    ax.grid(True, axis="y", alpha=0.3)
    if spec.lines:
        ax.legend(fontsize=7, loc="lower right")
    return _png(fig)


def png(spec: Spec) -> str:
    """Any figure spec as base64 PNG."""
    if isinstance(spec, CurveFigure):
        return curve_png(spec)
    if isinstance(spec, MatrixFigure):
        return matrix_png(spec)
    return bars_png(spec)
