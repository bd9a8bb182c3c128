"""The merge page's fleet histograms (clustergate/report/fleet_plots.py): well-formed SVG that shows every bin with
parts in it, each criterion line, the outliers and the failing parts, with every label escaped."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from typing import Any

import pytest

from clustergate.cluster.fleet import histogram
from clustergate.report.fleet_plots import MIN_BAR_PX, histogram_svg, nice_ticks

SVG = "{http://www.w3.org/2000/svg}"


def _fleet_metric(values: list[float], **extra: Any) -> dict[str, Any]:
    return {"metric": "hbm_bandwidth_tbps", "test": "acceptance/test_gpu_compute.py::test_hbm_bandwidth",
            "unit": "TB/s", "scope": "gpu", "count": len(values), "median": sorted(values)[len(values) // 2],
            "criterion": {"min": 2.5, "outlier_fraction": 0.9}, "floor": 2.7, "limit": None,
            "outliers": [], "failing": [], "histogram": histogram(values), **extra}


def _texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{SVG}text")]


def test_bins_lines_outliers_and_failing_parts_are_drawn() -> None:
    values = [3.0 + i * 0.001 for i in range(60)] + [1.5]
    fm = _fleet_metric(values, outliers=[{"value": 1.5}], failing=[1.5, 2.0])
    root = ET.fromstring(histogram_svg(fm))
    bars = [r for r in root.iter(f"{SVG}rect") if r.get("fill") not in ("none", "#ffffff")]
    assert len(bars) == sum(1 for c in fm["histogram"]["counts"] if c), "one bar per bin with parts in it"
    assert all(float(b.get("width", 0)) >= MIN_BAR_PX - 0.05 for b in bars)
    words = _texts(root)
    assert "hbm_bandwidth_tbps (test_hbm_bandwidth): 61 GPUs" in words
    assert any(w.startswith("median ") for w in words) and "90% of median 2.7" in words and "min 2.5" in words
    assert "1 fleet outliers" in words and "1 failing their own run" in words  # 1.5 is the outlier, 2.0 the other


def test_every_part_alike_is_still_a_visible_bar() -> None:
    """Three nodes at one figure, the criterion's limit far off: the one bin is narrower than a pixel there."""
    fm = _fleet_metric([40.0, 40.0, 40.0], unit="us", scope="node", median=40.0, floor=None, limit=60.0,
                       criterion={"outlier_multiple": 1.5})
    root = ET.fromstring(histogram_svg(fm))
    [bar] = [r for r in root.iter(f"{SVG}rect") if r.get("fill") not in ("none", "#ffffff")]
    assert float(bar.get("width", 0)) >= MIN_BAR_PX - 0.05 and float(bar.get("height", 0)) > 100


def test_a_label_carrying_markup_is_escaped() -> None:
    fm = _fleet_metric([1.0, 2.0, 3.0], metric="<script>alert(1)</script>&", unit='"x"')
    svg = histogram_svg(fm)
    assert "<script>" not in svg
    words = _texts(ET.fromstring(svg))  # parsed back: the words as written, not markup
    assert "<script>alert(1)</script>& (test_hbm_bandwidth): 3 GPUs" in words
    assert '<script>alert(1)</script>& ("x")' in words


@pytest.mark.parametrize(("low", "high", "expect"), [
    (0.0, 10.0, [0.0, 2.0, 4.0, 6.0, 8.0, 10.0]),
    (39.2, 60.8, [40.0, 45.0, 50.0, 55.0, 60.0]),
    (0.1, 0.35, [0.1, 0.15, 0.2, 0.25, 0.3, 0.35]),
    (5.0, 5.0, [5.0]),
])
def test_ticks_are_round_and_inside_the_range(low: float, high: float, expect: list[float]) -> None:
    assert nice_ticks(low, high) == expect
