"""Which figures a run holds: pure functions from results.json data to plot specifications.

The shapes recognised in a test's ``details`` are the conventions below. Nothing here draws:
``clustergate.report.plots`` turns these specs into PNG.

Details conventions
===================
A workload's ``Result.details`` is free-form JSON (only rank 0's copy reaches the report: gather
per-rank data in the workload if the report should show it). The report draws these shapes, found at
the top level of ``details`` or one mapping below it (``details["lora"]["loss_curve"]``), and links the
whole dict as JSON from the test's row; anything else is kept, not drawn.

Curves (busbw against size, bandwidth against buffer size, ...): a list of two or more point dicts
sharing a numeric x field, the first present of ``X_FIELDS`` (``size``, ``bytes``, ``size_bytes``,
``message_bytes``, ``step``, ``n``, ``x``)::

    "sizes": [{"bytes": 1048576, "time_us": 210.0, "algbw_gbps": 4.9, "busbw_gbps": 9.8}, ...]

- y is the first quantity of ``Y_PREFERRED`` present (``busbw``, ``bandwidth``, ``tflops``,
  ``throughput``, ``value``, ``y``), bare or with a unit word (``busbw_gbps``); otherwise every other
  numeric field, one figure per unit, skipping times (``time*``, ``*_us``/``_ms``/``_s``), sizes
  (``*bytes``, ``*_size``) and counts (``copies``, ``repeats``, ``rank``...).
- Units come from words in field names (``UNIT_TOKENS``: ``_gbps`` GB/s, ``_tbps`` TB/s, ``_tflops``,
  ``_us``...) or from ``"units": {"size": "B", "busbw": "GB/s"}``. Byte-valued x get a log-2 axis.
- Name several curves under ``"curves"``: ``{"node 0 (8 ranks)": [points], "whole job": [points]}``
  (or a list of ``{"name": str, "points": [points]}``); any other key holding a point list is one
  curve named after the key.
- busbw curves of every test are also drawn together, one figure per ``details["scope"]``, one colour
  per ``details["collective"]`` (else the test's parameters) and one line per curve name (node, group).

Matrices (GPU pairs, node pairs): ``{"values": 2-D list, "labels" | "row_labels"/"col_labels",
"unit", "title"}`` under any key, ``null`` for a missing cell (the diagonal)::

    "matrix": {"labels": ["gpu0", "gpu1"], "values": [[null, 48.1], [47.9, null]], "unit": "GB/s"}

Under a key naming a matrix (``matrix``, ``matrices``, ``*matrix*``) a bare 2-D list, or a mapping of
name to matrix (``{"node 0": [[...]], "node 1": [[...]]}``), is drawn too, one heatmap each.

Loss curves: a key containing ``loss`` whose value is a list of numbers (one per step), a list of
``{"step": int, "loss": float}``, or ``{"steps": [...], "values": [...]}``; several under
``"losses": {"rank 0": [...], "eval": [...]}``. All of a test's losses share one figure.

Tables: ``"tables": {"clocks": [{"gpu": 0, "sm_mhz": 1980, "throttle": "none"}, ...]}`` is shown as
HTML tables in the test's row.

Per-GPU bars need no details: they are drawn from every gpu-scope metric's ``per_rank`` values.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from clustergate.common.numbers import number
from clustergate.common.parts import gpu_label, rank_index
from clustergate.record.results import short_test_name
from clustergate.report import BYTE_FIELDS, COUNT_FIELDS, TIME_FIELDS, UNIT_TOKENS, X_FIELDS, Y_PREFERRED
from clustergate.report.tables import cell_state

STATE_COLOURS = {"ok": "#4c72b0", "outlier": "#e69f00", "warn": "#ff8c00", "fail": "#d62728"}
"""A part's colour by its state, in every figure of the node page and the merge page."""

MAX_SERIES = 12
"""Series drawn in one curve figure; more would be unreadable (the JSON still has them all)."""


@dataclass(frozen=True, slots=True)
class Series:
    label: str
    x: tuple[float, ...]
    y: tuple[float, ...]
    group: str = ""
    """Series with the same label share a colour and one legend entry; ``group`` tells them apart
    (e.g. one all_reduce line per node, all in the all_reduce colour)."""


@dataclass(frozen=True, slots=True)
class CurveFigure:
    """Lines sharing an x and a y field: busbw against size, loss against step, ..."""

    title: str
    x_field: str
    y_field: str
    series: tuple[Series, ...]
    x_unit: str = ""
    y_unit: str = ""

    @property
    def log_x(self) -> bool:
        return self.x_field in BYTE_FIELDS


@dataclass(frozen=True, slots=True)
class MatrixFigure:
    """A heatmap: GPU-pair or node-pair bandwidth, ``None`` for a missing cell."""

    title: str
    values: tuple[tuple[float | None, ...], ...]
    row_labels: tuple[str, ...]
    col_labels: tuple[str, ...]
    unit: str = ""


@dataclass(frozen=True, slots=True)
class BarFigure:
    """One gpu-scope metric across every GPU, failures and outliers marked."""

    title: str
    labels: tuple[str, ...]
    values: tuple[float, ...]
    states: tuple[str, ...]
    """``ok`` | ``fail`` | ``outlier`` per bar."""
    unit: str
    lines: tuple[tuple[str, float], ...] = field(default_factory=tuple)
    """Horizontal reference lines: ("min 700", 700.0), ("median", 712.3)."""


Figure = CurveFigure | MatrixFigure | BarFigure


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def unit_of(field: str) -> str:
    """The unit a field name ends with or contains: busbw_gbps -> GB/s, gbps_min -> GB/s, tflops -> TFLOPS."""
    for token in reversed(field.lower().split("_")):
        if token in UNIT_TOKENS:
            return UNIT_TOKENS[token]
    return ""


def base_of(field: str) -> str:
    """The quantity a field measures, without a trailing unit: busbw_gbps -> busbw, copy_tbps -> copy."""
    head, _, tail = field.rpartition("_")
    return head if head and tail.lower() in UNIT_TOKENS else field


def _is_x_like(field: str) -> bool:
    low = field.lower()
    return low in X_FIELDS or low.endswith(("bytes", "_size")) or low in COUNT_FIELDS


def _is_time(field: str) -> bool:
    low = field.lower()
    return low in TIME_FIELDS or low.startswith("time") or unit_of(low) in ("s", "ms", "us")


def _points_x(points: Any) -> str | None:
    """The x field a list of point dicts shares, or None if it is not a curve."""
    if not isinstance(points, list) or len(points) < 2 or not all(isinstance(p, dict) for p in points):
        return None
    for name in X_FIELDS:
        if all(_num(p.get(name)) for p in points):
            return name
    return None


def _y_groups(points: list[dict[str, Any]], x: str) -> list[tuple[str, str, list[str]]]:
    """(y label, unit, fields) per figure: the preferred quantity alone, else every other figure by unit."""
    numeric = [k for k in points[0] if k != x and all(_num(p.get(k)) for p in points)]
    for name in Y_PREFERRED:
        for k in numeric:
            if k == name or base_of(k) == name:
                return [(name, unit_of(k), [k])]
    by_unit: dict[str, list[str]] = {}
    for k in numeric:
        if not _is_x_like(k) and not _is_time(k):
            by_unit.setdefault(unit_of(k), []).append(k)
    return [(", ".join(fields) if len(fields) <= 3 else unit or "value", unit, fields)
            for unit, fields in by_unit.items()]


def _walk(details: dict[str, Any]) -> list[tuple[str, Any]]:
    """Top-level entries, and those one dict below (named ``outer.inner``): where workloads put data."""
    out: list[tuple[str, Any]] = []
    for key, value in details.items():
        out.append((str(key), value))
        if isinstance(value, dict) and key not in ("curves", "losses", "matrices", "tables", "units"):
            out += [(f"{key}.{k}", v) for k, v in value.items() if not isinstance(v, dict)]
    return out


def _named_curves(details: dict[str, Any]) -> list[tuple[str, list[dict[str, Any]]]]:
    found: list[tuple[str, Any]] = []
    curves = details.get("curves")
    if isinstance(curves, dict):
        found += [(str(k), v) for k, v in curves.items()]
    elif isinstance(curves, list):
        found += [(str(c.get("name", f"curve {i}")), c.get("points")) for i, c in enumerate(curves)
                  if isinstance(c, dict)]
    found += [(k, v) for k, v in _walk(details) if k != "curves" and "loss" not in k.lower()]
    return [(name, pts) for name, pts in found if _points_x(pts) is not None]


def curve_figures(details: dict[str, Any]) -> list[CurveFigure]:
    """Curves in ``details``: one figure per x and y quantity, one series per curve (and field)."""
    units = details.get("units") if isinstance(details.get("units"), dict) else {}
    groups: dict[tuple[str, str], list[Series]] = {}
    y_units: dict[tuple[str, str], str] = {}
    for name, points in _named_curves(details):
        x = _points_x(points)
        assert x is not None
        pts = sorted(points, key=lambda p: p[x])
        for label, unit, fields in _y_groups(pts, x):
            y_units.setdefault((x, label), str(units.get(fields[0], unit)))
            for f in fields:
                series_label = name if len(fields) == 1 else f"{name}: {f}"
                groups.setdefault((x, label), []).append(
                    Series(series_label, tuple(float(p[x]) for p in pts), tuple(float(p[f]) for p in pts)))
    figures = []
    for (x, y), series in groups.items():
        if len(series) > 1 and len({s.label.split(": ")[-1] for s in series}) == len(series) and \
                len({s.label.split(": ")[0] for s in series}) == 1:
            series = [Series(s.label.split(": ")[-1], s.x, s.y) for s in series]  # one curve: name by field
        title = f"{y} against {x}" + (f": {series[0].label}" if len(series) == 1 else "")
        figures.append(CurveFigure(title, x, y, tuple(series[:MAX_SERIES]), str(units.get(x, "B" if x in BYTE_FIELDS
                                                                                           else "")),
                                   y_units[(x, y)]))
    return figures


def _loss_series(name: str, value: Any) -> Series | None:
    if isinstance(value, list) and len(value) >= 2:
        if all(_num(v) for v in value):
            return Series(name, tuple(float(i) for i in range(len(value))), tuple(float(v) for v in value))
        if all(isinstance(v, dict) and _num(v.get("loss")) for v in value):
            steps = [v.get("step", i) for i, v in enumerate(value)]
            if all(_num(s) for s in steps):
                return Series(name, tuple(float(s) for s in steps), tuple(float(v["loss"]) for v in value))
    if isinstance(value, dict):
        steps, values = value.get("steps"), value.get("values", value.get("loss"))
        if isinstance(values, list) and len(values) >= 2 and all(_num(v) for v in values):
            if not (isinstance(steps, list) and len(steps) == len(values) and all(_num(s) for s in steps)):
                steps = list(range(len(values)))
            return Series(name, tuple(float(s) for s in steps), tuple(float(v) for v in values))
    return None


def loss_figures(details: dict[str, Any]) -> list[CurveFigure]:
    """Loss histories in ``details`` drawn in one figure."""
    candidates: list[tuple[str, Any]] = []
    losses = details.get("losses")
    if isinstance(losses, dict):
        candidates += [(str(k), v) for k, v in losses.items()]
    candidates += [(k, v) for k, v in _walk(details) if "loss" in k.rsplit(".", 1)[-1].lower() and k != "losses"]
    series = [s for s in (_loss_series(k, v) for k, v in candidates) if s is not None]
    if not series:
        return []
    return [CurveFigure("loss against step", "step", "loss", tuple(series[:MAX_SERIES]))]


def _grid(rows: Any) -> bool:
    """A 2-D list of numbers (``None`` for a missing cell) with at least two cells."""
    return isinstance(rows, list) and bool(rows) and all(isinstance(r, list) and r for r in rows) and \
        all(v is None or _num(v) for r in rows for v in r) and sum(len(r) for r in rows) >= 2 and \
        any(_num(v) for r in rows for v in r)


def _matrix(name: str, value: Any) -> MatrixFigure | None:
    if _grid(value):
        value = {"values": value}
    if not isinstance(value, dict) or not _grid(value.get("values")):
        return None
    rows = value["values"]
    width = max(len(r) for r in rows)
    cells = tuple(tuple((float(v) if v is not None else None) for v in r) + (None,) * (width - len(r))
                  for r in rows)
    labels = value.get("labels")
    row_labels = value.get("row_labels", labels) or [str(i) for i in range(len(rows))]
    col_labels = value.get("col_labels", labels) or [str(i) for i in range(width)]
    if len(row_labels) != len(rows) or len(col_labels) != width:
        row_labels, col_labels = [str(i) for i in range(len(rows))], [str(i) for i in range(width)]
    return MatrixFigure(str(value.get("title", name)), cells, tuple(map(str, row_labels)),
                        tuple(map(str, col_labels)), str(value.get("unit", "")))


def matrix_figures(details: dict[str, Any]) -> list[MatrixFigure]:
    """Matrices in ``details``: ``{"values": 2-D}`` under any key; under a key naming a matrix
    (``matrix``, ``matrices``, ``*matrix*``) also a bare 2-D list or a mapping of name -> matrix."""
    found: list[MatrixFigure | None] = []
    for key, value in _walk(details):
        named = "matri" in key.rsplit(".", 1)[-1].lower()
        if isinstance(value, dict) and "values" in value:
            found.append(_matrix(key, value))
        elif named and isinstance(value, dict):
            found += [_matrix(str(k), v) for k, v in value.items()]
        elif named:
            found.append(_matrix(key, value))
    return [m for m in found if m is not None]


def test_figures(details: dict[str, Any]) -> list[Figure]:
    """Every figure one test's details hold: curves, matrices, losses."""
    if not isinstance(details, dict):
        return []
    return [*curve_figures(details), *matrix_figures(details), *loss_figures(details)]


OVERVIEW_SERIES = 64
"""Lines in one busbw overview figure (one per collective and group; they share a colour per collective)."""


def _test_label(test: dict[str, Any]) -> str:
    """What tells a test's curves apart in an overview: its collective, else its parameters, else its name."""
    details = test.get("details") or {}
    if isinstance(details.get("collective"), str):
        return details["collective"]
    name = short_test_name(test["nodeid"])
    return name[name.index("[") + 1:-1] if name.endswith("]") and "[" in name else name


def busbw_overview(results: dict[str, Any]) -> list[CurveFigure]:
    """busbw against size of every collective, one figure per scope (``details["scope"]``), one colour
    per collective and one line per group (node, rail, whole job)."""
    by_scope: dict[str, list[Series]] = {}
    units: dict[str, tuple[str, str, str]] = {}
    for test in results.get("tests", []):
        details = test.get("details") or {}
        if not isinstance(details, dict):
            continue
        scope = str(details.get("scope", ""))
        for fig in curve_figures(details):
            if fig.y_field == "busbw":  # nccl-tests' bus bandwidth: comparable across collectives
                units.setdefault(scope, (fig.x_field, fig.x_unit, fig.y_unit))
                if isinstance(details.get("collective"), str) or len(fig.series) == 1:
                    lines = [Series(_test_label(test), s.x, s.y, group=s.label) for s in fig.series]
                else:  # several curves and no collective named: the curves' own names tell them apart
                    lines = list(fig.series)
                by_scope.setdefault(scope, []).extend(lines)
    figures = []
    for scope, series in by_scope.items():
        x_field, x_unit, y_unit = units[scope]
        title = "busbw against size" + (f", {scope} scope" if scope else "")
        figures.append(CurveFigure(title, x_field, "busbw", tuple(series[:OVERVIEW_SERIES]), x_unit, y_unit or "GB/s"))
    return figures


def gpu_bars(results: dict[str, Any]) -> list[BarFigure]:
    """One bar chart per gpu-scope metric with per-rank values from two GPUs or more: a bar chart puts a GPU
    beside its peers, and one GPU alone has none (the per-GPU table shows its figure). A one-rank quick run drew
    23 charts of one bar each: 1.3 s of its end on CPU, matplotlib's import included. Nor is a chart drawn where
    every GPU reads the same and passes (error counters at 0, the memory size): there is no GPU to tell from its
    peers, and the criterion table says it. On 4 H200s that left out 13 of quick's 28 charts, drawn by rank 0
    after the tests while every other rank waits (about 40 ms each on that host's CPU)."""
    ranks = rank_index(results)
    figures = []
    for test in results.get("tests", []):
        for m in test.get("metrics", []):
            per = sorted(m.get("per_rank") or [], key=lambda p: p["rank"])
            if m.get("scope") != "gpu" or len(per) < 2:
                continue
            values = [float(p["value"]) for p in per]
            crit = m.get("criterion") or {}
            states = tuple(cell_state(v, p.get("passed", True), values, crit, bool(p.get("warned"))) or "ok"
                           for p, v in zip(per, values, strict=True))
            if len(set(values)) == 1 and set(states) == {"ok"}:
                continue
            lines = [(f"{k} {number(crit[k])}", float(crit[k])) for k in ("min", "max") if k in crit]
            lines.append(("median", statistics.median(values)))
            labels = tuple(gpu_label(ranks.get(p["rank"], p), short=True) for p in per)
            figures.append(BarFigure(f"{m['name']} per GPU ({short_test_name(test['nodeid'])})", labels,
                                     tuple(values), states, m.get("unit", ""), tuple(lines)))
    return figures
