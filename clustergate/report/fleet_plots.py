"""The fleet's distributions as base64 PNG: one histogram per metric, every GPU (or node) of the fleet, drawn
from the cluster results' ``fleet`` section as merge decided it (its histogram, median, floor and failing parts:
``clustergate.cluster.fleet.histogram`` binned the parts' figures; the page never holds them one by one).

A histogram stays readable at 8,000 GPUs where bars per GPU do not. Lines mark the fleet median, the
outlier bounds (outlier_fraction x median below, outlier_multiple x median above) and the profile's min/max;
the fleet outliers are drawn as red triangles under the axis and every other failing part as a red tick, so a
single bad GPU among thousands is still seen. Drawn on matplotlib's Agg canvas as
``clustergate.report.plots`` draws (no pyplot, no global backend).
"""

from __future__ import annotations

from typing import Any

import numpy
from matplotlib.figure import Figure

from clustergate.common.numbers import number, percent
from clustergate.record.results import short_test_name
from clustergate.report.plots import DPI, STATE_COLOURS, _png


def histogram_png(fm: dict[str, Any]) -> str:
    """One entry of the cluster results' ``fleet`` section as a histogram."""
    counts, edges = fm["histogram"]["counts"], fm["histogram"]["edges"]
    # Fixed margins, not a layout engine: at dozens of figures the constrained layout was a third of the time.
    fig = Figure(figsize=(5.6, 2.9), dpi=DPI)
    ax = fig.add_axes((0.1, 0.17, 0.87, 0.73))
    # One filled outline, not a patch per bar (``ax.hist``): the same picture, drawn in a fraction of the time.
    ax.stairs(numpy.asarray(counts, dtype=float), numpy.asarray(edges, dtype=float), fill=True,
              color=STATE_COLOURS["ok"])
    median, criterion = fm["median"], fm["criterion"]
    ax.axvline(median, color="#222222", linestyle="-", linewidth=1, label=f"median {number(median)}")
    if fm.get("floor") is not None:
        ax.axvline(fm["floor"], color=STATE_COLOURS["fail"], linestyle="--", linewidth=1,
                   label=f"{percent(criterion['outlier_fraction'])} of median {number(fm['floor'])}")
    if fm.get("limit") is not None:
        ax.axvline(fm["limit"], color=STATE_COLOURS["fail"], linestyle="--", linewidth=1,
                   label=f"{number(criterion['outlier_multiple'])}x median {number(fm['limit'])}")
    for key, style in (("min", ":"), ("max", "-.")):
        if key in criterion:
            ax.axvline(float(criterion[key]), color="#555555", linestyle=style, linewidth=1,
                       label=f"{key} {number(float(criterion[key]))}")
    outliers = [o["value"] for o in fm.get("outliers") or []]
    if outliers:
        ax.plot(outliers, [0] * len(outliers), marker="^", markersize=8, linestyle="none",
                color=STATE_COLOURS["fail"], label=f"{len(outliers)} fleet outliers", clip_on=False)
    bad = list(fm.get("failing") or [])
    for value in outliers:  # the rest of the failing parts: their own run failed them
        if value in bad:
            bad.remove(value)
    if bad:
        ax.plot(bad, [0] * len(bad), marker="|", markersize=14, linestyle="none", color=STATE_COLOURS["fail"],
                label=f"{len(bad)} failing their own run", clip_on=False)
    part = "GPUs" if fm["scope"] == "gpu" else "nodes"
    ax.set_xlabel(f"{fm['metric']} ({fm['unit']})" if fm["unit"] else fm["metric"], fontsize=8)
    ax.set_ylabel(part, fontsize=8)
    ax.set_title(f"{fm['metric']} ({short_test_name(fm['test'])}): {fm['count']} {part}", fontsize=9)
    ax.tick_params(labelsize=7)
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(fontsize=6, loc="best")
    return _png(fig)
