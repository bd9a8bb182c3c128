"""The fleet view: every node's figures side by side, and the GPUs that fall behind the fleet.

Each node judged its GPUs against its own median; here every GPU of every node is set against the
fleet's median for the same metric and profile. A GPU below the criterion's ``outlier_fraction`` of
the fleet median fails even where its own node accepted it, and its node is excluded, unless the
criterion's ``severity`` is ``warn``, where it is a warning. Per-node figures (``node``/``world``
scope, one value a node in the node phase) are gathered too, for the distributions; ``outlier_fraction``
is only for per-GPU metrics, as in the run itself.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from clustergate.cluster.node_runs import NodeRun
from clustergate.criteria import Criterion
from clustergate.numbers import number, percent
from clustergate.results import short_test_name


@dataclass(slots=True)
class Sample:
    host: str
    value: float
    gpu_index: int | None = None
    gpu_serial: str | None = None
    rank: int | None = None
    passed: bool = True
    """As the node's own run judged it."""


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

    @property
    def title(self) -> str:
        return f"{self.name} ({short_test_name(self.nodeid)})"

    @property
    def floor(self) -> float | None:
        """Below this a GPU is a fleet outlier: the criterion's peer floor at the fleet median (gpu scope only)."""
        return None if self.scope != "gpu" else Criterion.from_json(self.criterion).peer_floor(self.median)

    @property
    def severity(self) -> str:
        return str(self.criterion.get("severity", "fail"))

    def stats(self) -> dict[str, Any]:
        values = sorted(s.value for s in self.samples)
        n = len(values)

        def q(p: float) -> float:
            return values[min(n - 1, max(0, round(p * (n - 1))))]

        return {"count": n, "min": values[0], "p05": q(0.05), "median": self.median, "p95": q(0.95),
                "max": values[-1], "floor": self.floor}

    def failing(self) -> list[float]:
        """The figures of the parts that fail: by their node's own run, or below the fleet floor."""
        floor = self.floor
        return [s.value for s in self.samples if not s.passed or (floor is not None and s.value < floor)]

    def as_json(self) -> dict[str, Any]:
        return {"metric": self.name, "test": self.nodeid, "profile": self.profile, "unit": self.unit,
                "scope": self.scope, "criterion": self.criterion, **self.stats(), "outliers": self.outliers,
                "failing": self.failing(),
                # Compact: [host, GPU index, value] per GPU (per node for node-scope metrics).
                "samples": [[s.host, s.gpu_index, s.value] for s in self.samples]}


def collect(runs: list[NodeRun]) -> list[FleetMetric]:
    """Every judged-or-recorded metric with per-rank values, across every node that has results and is a part of
    this cluster run (an unbound node's figures are not the fleet's)."""
    metrics: dict[tuple[str, str, str], FleetMetric] = {}
    for run in runs:
        res = run.results
        if not res or run.verdict == "unbound":
            continue
        profile = str(res.get("profile", "?"))
        for test in res.get("tests", []):
            for m in test.get("metrics", []):
                per = m.get("per_rank") or []
                if not per:
                    continue
                key = (profile, test["nodeid"], m["name"])
                fm = metrics.get(key)
                if fm is None:
                    fm = metrics[key] = FleetMetric(m["name"], test["nodeid"], profile, m.get("unit", ""),
                                                    m.get("scope", "gpu"), dict(m.get("criterion") or {}))
                if fm.scope == "gpu":
                    fm.samples += [Sample(run.host, float(p["value"]), p.get("gpu_index"), p.get("gpu_serial"),
                                          p.get("rank"), bool(p.get("passed", True))) for p in per]
                else:  # one figure for the node (world scope is the node itself in the node phase)
                    fm.samples.append(Sample(run.host, float(m["value"]), passed=bool(m.get("passed", True))))
    for fm in metrics.values():
        fm.median = statistics.median(s.value for s in fm.samples)
        for sample in fm.samples:
            fm.by_host.setdefault(sample.host, []).append(sample)
    return sorted(metrics.values(), key=lambda f: (f.profile, f.scope != "gpu", f.name, f.nodeid))


def judge_outliers(fleet: list[FleetMetric], runs: list[NodeRun]) -> int:
    """Mark GPUs below the fleet floor and give their node one line per metric: a reason (severity
    fail, the node is excluded) or a warning (warn). Returns the number of outlying GPUs."""
    by_host = {r.host: r for r in runs}
    count = 0
    for fm in fleet:
        floor = fm.floor
        if floor is None or len(fm.samples) < 2:
            continue
        low: dict[str, list[Sample]] = {}
        for s in fm.samples:
            if s.value < floor:
                low.setdefault(s.host, []).append(s)
                fm.outliers.append({"host": s.host, "gpu_index": s.gpu_index, "gpu_serial": s.gpu_serial,
                                    "rank": s.rank, "value": s.value, "severity": fm.severity})
        for host, samples in low.items():
            count += len(samples)
            gpus = ", ".join(f"gpu {s.gpu_index}" + (f" (serial {s.gpu_serial})" if s.gpu_serial else "")
                             if s.gpu_index is not None else f"rank {s.rank}" for s in samples)
            values = sorted(s.value for s in samples)
            shown = number(values[0], fm.unit) if len(values) == 1 else \
                f"{number(values[0])}..{number(values[-1], fm.unit)}"
            text = (f"fleet outlier: {fm.name}={shown} on {gpus}, below {percent(fm.criterion['outlier_fraction'])} of "
                    f"the fleet median {number(fm.median, fm.unit)} ({len(fm.samples)} GPUs)")
            run = by_host[host]
            (run.warnings if fm.severity == "warn" else run.reasons).append(text)
    return count


def worst_figures(run: NodeRun, fleet: list[FleetMetric]) -> dict[str, dict[str, Any]]:
    """Per fleet metric, this node's worst GPU (or its one figure): the nodes table's columns."""
    out: dict[str, dict[str, Any]] = {}
    for fm in fleet:
        mine = fm.by_host.get(run.host)
        if not mine:
            continue
        up = Criterion.from_json(fm.criterion).higher_is_better
        worst = min(mine, key=lambda s: s.value) if up in (True, None) else max(mine, key=lambda s: s.value)
        floor = fm.floor
        state = "fail" if not all(s.passed for s in mine) or (floor is not None and worst.value < floor) else ""
        out[fm.title] = {"value": worst.value, "unit": fm.unit, "gpu_index": worst.gpu_index, "state": state}
    return out
