"""The fleet view: every node's figures side by side, and the parts that fall behind the fleet.

Each node judged its GPUs against its own median; here every part is set against the fleet's median for the
same metric, test and profile (a profile is one GPU model and one node shape, so a node of 2 GPUs is never
held to nodes of 8): every GPU of a per-GPU metric, every node of a per-node one (in the node phase a
whole-job figure is the node's too). A part outside the criterion's peer bounds at the fleet median
(``outlier_fraction``: below that fraction of it; ``outlier_multiple``: above that multiple) is a fleet
outlier: it fails whatever the severity of the criterion's absolute bounds, its node is excluded, and the
reason names the part (host, GPU index and serial, or the node). The fleet is the reference where no absolute
figure can be cited (``source: peers``) and the finer check where one can.

The fleet also holds each node to its model's shape: a node whose run saw fewer GPUs than most of the fleet's
nodes of the same GPU model is excluded (a node that lost GPUs would otherwise pass as a smaller shape).
"""

from __future__ import annotations

import math
import statistics
import sys
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy

from clustergate.cluster.node_runs import Exclusion, NodeRun
from clustergate.common.numbers import number
from clustergate.criteria.criterion import Criterion
from clustergate.record import actions
from clustergate.record.results import short_test_name


@dataclass(slots=True)
class Sample:
    host: str
    value: float
    gpu_index: int | None = None
    gpu_serial: str | None = None
    rank: int | None = None
    passed: bool = True
    """As the node's own run judged it."""

    def part(self) -> str:
        """The part the figure belongs to, as a reason names it: ``gpu 3 (serial 1652...)``, or ``the node``."""
        if self.gpu_index is not None:
            return f"gpu {self.gpu_index}" + (f" (serial {self.gpu_serial})" if self.gpu_serial else "")
        return "the node" if self.rank is None else f"rank {self.rank}"


@dataclass(slots=True)
class FleetMetric:
    """One metric of one test under one profile, across the fleet."""

    name: str
    nodeid: str
    profile: str
    unit: str
    scope: str
    criterion: dict[str, Any]
    samples: list[Sample] = field(default_factory=list)
    outliers: list[dict[str, Any]] = field(default_factory=list)
    median: float = 0.0
    """The fleet median (set by ``collect`` once every sample is in)."""
    by_host: dict[str, list[Sample]] = field(default_factory=dict)
    rule: Criterion = field(init=False)
    """The criterion read once: every part of the fleet is held to it (a thousand nodes: half a million times)."""
    low: float | None = None
    high: float | None = None
    """``floor`` and ``limit`` once the median is known: a part between them misses nothing (``misses``), and most
    parts are, so the criterion's words are made only for the few outside."""

    def __post_init__(self) -> None:
        self.rule = Criterion.from_json(self.criterion)

    @property
    def title(self) -> str:
        return f"{self.name} ({short_test_name(self.nodeid)})"

    @property
    def floor(self) -> float | None:
        """Below this a part is a fleet outlier: the criterion's peer floor at the fleet median."""
        return self.rule.peer_floor(self.median)

    @property
    def limit(self) -> float | None:
        """Above this a part is a fleet outlier: the criterion's peer limit at the fleet median."""
        return self.rule.peer_limit(self.median)

    @property
    def parts(self) -> str:
        return "GPUs" if self.scope == "gpu" else "nodes"

    def misses(self, sample: Sample) -> list[str]:
        """How a part falls behind the fleet (empty where it does not, and where there is no fleet to compare
        with: fewer than two parts)."""
        if len(self.samples) < 2 or ((self.low is None or sample.value >= self.low)
                                     and (self.high is None or sample.value <= self.high)):
            return []
        return self.rule.peer_misses(sample.value, self.median, "fleet")

    def stats(self) -> dict[str, Any]:
        values = sorted(s.value for s in self.samples)
        n = len(values)

        def q(p: float) -> float:
            return values[min(n - 1, max(0, round(p * (n - 1))))]

        return {"count": n, "min": values[0], "p05": q(0.05), "median": self.median, "p95": q(0.95),
                "max": values[-1], "floor": self.floor, "limit": self.limit}

    def failing(self) -> list[float]:
        """The figures of the parts that fail: by their node's own run, or against the fleet."""
        return [s.value for s in self.samples if not s.passed or self.misses(s)]

    def histogram(self) -> dict[str, list[float] | list[int]]:
        """The distribution of its parts' figures (``histogram``): what the merged page draws, of a size that does
        not grow with the fleet; each part's figure stays in its node's file."""
        return histogram([s.value for s in self.samples])

    def as_json(self) -> dict[str, Any]:
        return {"metric": self.name, "test": self.nodeid, "profile": self.profile, "unit": self.unit,
                "scope": self.scope, "criterion": self.criterion, **self.stats(), "outliers": self.outliers,
                "failing": self.failing(), "histogram": self.histogram()}


BINS = 40
"""The most bars of a fleet's histogram: readable at 8,000 GPUs, where a bar per GPU is not."""


def histogram(values: list[float]) -> dict[str, list[float] | list[int]]:
    """``values`` in at most ``BINS`` bins (the square root of their count, at least 5) spanning them with 2% to
    spare: ``{"edges": [bins + 1 floats], "counts": [bins ints]}``."""
    lo, hi = min(values), max(values)
    span = hi - lo if hi > lo else (abs(hi) or 1.0) * 0.01
    bins = min(BINS, max(5, int(math.sqrt(len(values)))))
    counts, edges = numpy.histogram(numpy.asarray(values, dtype=float), bins=bins,
                                    range=(lo - span * 0.02, hi + span * 0.02))
    return {"edges": [float(e) for e in edges], "counts": [int(c) for c in counts]}


class Collector:
    """The fleet's samples, gathered node by node as merge reads each file (``add``), so that no node's whole record
    need stay in memory for them; ``fleet`` sets them side by side once every node is read and bound."""

    def __init__(self) -> None:
        self.metrics: dict[tuple[str, str, str], FleetMetric] = {}

    def add(self, host: str, res: dict[str, Any]) -> None:
        """Every judged-or-recorded metric with per-rank values of ``host``'s results."""
        profile = str(res.get("profile", "?"))
        for test in res.get("tests", []):
            for m in test.get("metrics", []):
                per = m.get("per_rank") or []
                if not per:
                    continue
                key = (profile, test["nodeid"], m["name"])
                fm = self.metrics.get(key)
                if fm is None:
                    fm = self.metrics[key] = FleetMetric(m["name"], test["nodeid"], profile, m.get("unit", ""),
                                                         m.get("scope", "gpu"), dict(m.get("criterion") or {}))
                if fm.scope == "gpu":
                    fm.samples += [Sample(host, float(p["value"]), p.get("gpu_index"), _shared(p.get("gpu_serial")),
                                          p.get("rank"), bool(p.get("passed", True))) for p in per]
                else:  # one figure for the node (world scope is the node itself in the node phase)
                    fm.samples.append(Sample(host, float(m["value"]), passed=bool(m.get("passed", True))))

    def fleet(self, runs: list[NodeRun]) -> list[FleetMetric]:
        """The metrics over the nodes of ``runs`` that have results and are a part of this cluster run (an unbound
        node's figures are not the fleet's), each with its median."""
        parts = {r.host for r in runs if r.results is not None and r.verdict != "unbound"}
        out = []
        for fm in self.metrics.values():
            fm.samples = [s for s in fm.samples if s.host in parts]
            if not fm.samples:
                continue
            fm.median = statistics.median(s.value for s in fm.samples)
            fm.low, fm.high = fm.floor, fm.limit
            for sample in fm.samples:
                fm.by_host.setdefault(sample.host, []).append(sample)
            out.append(fm)
        return sorted(out, key=lambda f: (f.profile, f.scope != "gpu", f.name, f.nodeid))


def _shared(text: Any) -> Any:
    """A GPU serial, one string however many of a node's metrics name it."""
    return sys.intern(text) if type(text) is str else text


def collect(runs: list[NodeRun]) -> list[FleetMetric]:
    """Every judged-or-recorded metric with per-rank values, across every node that has results and is a part of
    this cluster run (``Collector`` over ``runs`` read whole)."""
    collector = Collector()
    for run in runs:
        if run.results is not None and run.verdict != "unbound":
            collector.add(run.host, run.results)
    return collector.fleet(runs)


def judge_outliers(fleet: list[FleetMetric]) -> list[Exclusion]:
    """Mark every part outside its criterion's peer bounds at the fleet median (its metric's ``outliers``) and exclude
    its node, one exclusion per metric naming the parts, with its step (what the metric's miss calls for, on those
    parts)."""
    found: list[Exclusion] = []
    for fm in fleet:
        low: dict[str, list[tuple[Sample, list[str]]]] = {}
        for s in fm.samples:
            if missed := fm.misses(s):
                low.setdefault(s.host, []).append((s, missed))
                fm.outliers.append({"host": s.host, "gpu_index": s.gpu_index, "gpu_serial": s.gpu_serial,
                                    "rank": s.rank, "part": s.part(), "value": s.value, "severity": "fail"})
        for host, behind in low.items():
            values = sorted(s.value for s, _ in behind)
            shown = number(values[0], fm.unit) if len(values) == 1 else \
                f"{number(values[0])}..{number(values[-1], fm.unit)}"
            parts = ", ".join(s.part() for s, _ in behind)
            gpus = ", ".join("the node" if s.gpu_index is None else f"gpu {s.gpu_index}"
                             + (f" serial {s.gpu_serial}" if s.gpu_serial else "") for s, _ in behind)
            found.append(Exclusion(host, f"fleet outlier: {fm.name}={shown} on {parts}, {behind[0][1][0]} "
                                         f"{fm.unit} ({len(fm.samples)} {fm.parts} of {fm.profile})",
                                   actions.step(actions.category_of_metric(fm.name), fm.nodeid,
                                                f"{host} {gpus}: fleet outlier")))
    return found


def outlying_parts(fleet: list[FleetMetric]) -> int:
    """How many parts (GPUs and nodes) ``judge_outliers`` found behind the fleet."""
    return sum(len(fm.outliers) for fm in fleet)


def node_shape(run: NodeRun) -> tuple[str, int] | None:
    """(GPU model, GPUs) of a node run's one node, as its record lists them; None without GPUs or results."""
    nodes = (run.results or {}).get("nodes") or []
    gpus = [g for n in nodes[:1] for g in n.get("gpus") or []]
    return (str(gpus[0].get("name")), len(gpus)) if gpus else None


def judge_shapes(runs: list[NodeRun]) -> list[Exclusion]:
    """Exclude a node that saw fewer GPUs than most of the fleet's nodes of its GPU model (more than half of
    them agree on a count): it lost GPUs, whatever profile its own count chose."""
    shapes = {r.host: shape for r in runs if r.verdict != "unbound" and (shape := node_shape(r)) is not None}
    by_model: dict[str, Counter[int]] = {}
    for model, gpus in shapes.values():
        by_model.setdefault(model, Counter())[gpus] += 1
    found = []
    for run in runs:
        if run.host not in shapes:
            continue
        model, gpus = shapes[run.host]
        usual, nodes = by_model[model].most_common(1)[0]
        if gpus < usual and nodes * 2 > sum(by_model[model].values()):
            found.append(Exclusion(run.host, f"fleet shape: {gpus} GPUs on this node (profile "
                                             f"{(run.results or {}).get('profile')}, where {nodes} of the fleet's "
                                             f"{sum(by_model[model].values())} nodes of {model} have {usual}): GPUs "
                                             "missing from the node (off the bus, not visible to the job)",
                                   # GPUs gone from a node that passed its own run: the GPU inventory's step (a
                                   # reset, then the vendor), not a retest of a run that was not at fault.
                                   actions.step("gpu_inventory", "acceptance/test_gpu_inventory.py::test_gpu_count",
                                                f"{run.host}: {gpus} of the fleet's {usual} GPUs")))
    return found


def worst_figures(run: NodeRun, fleet: list[FleetMetric]) -> dict[str, dict[str, Any]]:
    """Per fleet metric, this node's worst GPU (or its one figure): the nodes table's columns."""
    out: dict[str, dict[str, Any]] = {}
    for fm in fleet:
        mine = fm.by_host.get(run.host)
        if not mine:
            continue
        up = fm.rule.higher_is_better
        worst = min(mine, key=lambda s: s.value) if up in (True, None) else max(mine, key=lambda s: s.value)
        state = "fail" if any(not s.passed or fm.misses(s) for s in mine) else ""
        out[fm.title] = {"value": worst.value, "unit": fm.unit, "gpu_index": worst.gpu_index, "state": state}
    return out
