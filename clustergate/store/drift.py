"""Drift: figures that fell further below their own first accepted figure than the profile allows.

A GPU is followed by its serial, so its history goes with it to another host; a node's own figures
(per-node metrics, and a one-node run's whole-job metrics) are followed by its host name. The first
accepted figure is the earliest one the store holds from a run accepted when it was recorded, at the same
``--level`` (a quick run measures smaller shapes than a standard one) and started before the run judged.

Only figures where higher is better drift here: metrics whose criterion has a floor (``min`` or
``outlier_fraction``). A metric judged only by a ``max`` (error counts, latencies) is not judged for
drift: an error count's first figure is usually 0, of which no fraction can be taken, and every such
figure is already held to its absolute limit on every run. A figure without an identity that lasts (a
per-GPU figure without a serial, as on CPU ranks; a whole-job figure of a run over several nodes) has no
history of its own and is not judged either.

Two profile settings decide it (``settings:`` in thresholds.yaml):

- ``drift_fraction`` (default 0.05): a figure more than this fraction below its first accepted figure
  has drifted;
- ``drift_severity`` (default ``warn``): ``warn`` lists a drift among the run's warnings; ``fail`` fails
  the figure, unless the metric's own criterion is ``severity: warn`` (a drift never weighs more than
  missing the criterion itself would).

Without a store nothing is judged and nothing changes.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any, NamedTuple

from clustergate.common.numbers import number, percent
from clustergate.criteria.criterion import SEVERITIES, Criterion
from clustergate.criteria.settings import DRIFT_FRACTION as DEFAULT_FRACTION
from clustergate.criteria.settings import DRIFT_SEVERITY as DEFAULT_SEVERITY
from clustergate.store.db import Store, StoredFigure

Baselines = Mapping[tuple[str, str, str], StoredFigure]
"""``Store.baselines``' answer: ``{("gpu", serial, metric) | ("node", host, metric): first accepted figure}``."""


@dataclass(frozen=True, slots=True)
class Drift:
    """One part's figure that fell more than the allowed fraction below its first accepted figure."""

    test: str
    metric: str
    scope: str
    """gpu | node"""
    host: str
    gpu_index: int | None
    serial: str | None
    unit: str
    first: float
    first_run: int
    first_time: str | None
    first_host: str | None
    """Where the part was when its first accepted figure was measured (a GPU may have moved since)."""
    now: float
    fraction: float
    """How far below its first accepted figure: (first - now) / first."""
    limit: float
    severity: str
    """fail | warn"""
    rank: int | None = None
    """The rank that measured the figure (the ranks a drift that fails its test names)."""

    def where(self) -> str:
        if self.scope != "gpu":
            return f"node {self.host}"
        gpu = "" if self.gpu_index is None else f" gpu {self.gpu_index}"
        return f"{self.host}{gpu} serial {self.serial}"

    def text(self) -> str:
        """``matmul_bf16_tflops=684 TFLOPS, 10.0% below its first accepted 760 (run #3, 2026-01-01T00:00:00+00:00,
        on gpu01), drift limit 5% [gpu02 gpu 3 serial 1654...]``: the suite's one failure format."""
        moved = f", on {self.first_host}" if self.first_host and self.first_host != self.host else ""
        return (f"{self.metric}={number(self.now, self.unit)}, {percent(self.fraction)} below its first accepted "
                f"{number(self.first)} (run #{self.first_run}, {self.first_time or 'time unknown'}{moved}), "
                f"drift limit {percent(self.limit)} [{self.where()}]")

    def criterion(self) -> str:
        """What the figure was held to, as the report shows a criterion: ``at most 5% below its first accepted
        760 TFLOPS (run #3, 2026-01-01T00:00:00+00:00)``."""
        return (f"at most {percent(self.limit)} below its first accepted {number(self.first, self.unit)} (run "
                f"#{self.first_run}, {self.first_time or 'time unknown'})").replace("  ", " ")

    def as_json(self) -> dict[str, Any]:
        """The results.json ``drift.findings`` entry: the fields, and the part and criterion as the report says them."""
        return {**asdict(self), "where": self.where(), "criterion": self.criterion()}


def check_settings(fraction: float, severity: str) -> None:
    """ValueError naming the setting when ``drift_fraction`` or ``drift_severity`` cannot be used."""
    if isinstance(fraction, bool) or not isinstance(fraction, (int, float)) or not math.isfinite(fraction) \
            or not 0 < fraction < 1:
        raise ValueError(f"drift_fraction must lie in (0, 1), got {fraction!r}")
    if severity not in SEVERITIES:
        raise ValueError(f"drift_severity must be {' or '.join(SEVERITIES)}, got {severity!r}")


class Followed(NamedTuple):
    """A figure that can drift: a floor criterion, and an identity that lasts."""

    test: str
    metric: Mapping[str, Any]
    part: Mapping[str, Any]
    criterion: Criterion
    scope: str
    """gpu (followed by its serial) | node (by its host)"""
    key: str


def followed(results: Mapping[str, Any]) -> list[Followed]:
    """Every figure of a run that drift judges."""
    nodes = results.get("nodes") or []
    only_host = nodes[0].get("host") if len(nodes) == 1 else None
    out = []
    for test in results.get("tests") or []:
        if test.get("outcome") == "skipped":
            continue
        for m in test.get("metrics") or []:
            criterion = Criterion.from_json(m.get("criterion"))
            if criterion.higher_is_better is not True:
                continue
            scope = m.get("scope", "gpu")
            for p in m.get("per_rank") or []:
                if scope == "gpu":
                    key, followed_as = p.get("gpu_serial"), "gpu"
                else:  # a node's figure; a whole-job figure only where the job ran on one node
                    key, followed_as = (p.get("host") if scope == "node" else only_host), "node"
                if key:
                    out.append(Followed(str(test.get("nodeid")), m, p, criterion, followed_as, str(key)))
    return out


def wanted(parts: list[Followed]) -> tuple[set[str], set[str], set[str]]:
    """The metrics, GPU serials and hosts whose first accepted figures ``parts`` need."""
    return ({str(f.metric["name"]) for f in parts}, {f.key for f in parts if f.scope == "gpu"},
            {f.key for f in parts if f.scope == "node"})


def judge(parts: list[Followed], first: Baselines, *, fraction: float = DEFAULT_FRACTION,
          severity: str = DEFAULT_SEVERITY) -> list[Drift]:
    """Every part of ``parts`` more than ``fraction`` below its own first accepted figure in ``first`` (pure),
    failures first, then the furthest below. ``severity`` is the profile's ``drift_severity``."""
    check_settings(fraction, severity)
    found = []
    for f in parts:
        name, unit = str(f.metric["name"]), str(f.metric.get("unit", ""))
        base = first.get((f.scope, f.key, name))
        if base is None or base.value <= 0 or base.unit != unit:
            continue  # no past of its own, none a fraction can be taken of, or measured in another unit
        now = float(f.part["value"])
        below = (base.value - now) / base.value
        if below <= fraction:
            continue
        weight = "fail" if severity == "fail" and f.criterion.severity == "fail" else "warn"
        found.append(Drift(
            test=f.test, metric=name, scope=f.scope, host=str(f.part.get("host") or f.key),
            gpu_index=f.part.get("gpu_index") if f.scope == "gpu" else None,
            serial=f.key if f.scope == "gpu" else None, unit=unit, first=base.value, first_run=base.run,
            first_time=base.time, first_host=base.host, now=now, fraction=below, limit=fraction, severity=weight,
            rank=f.part.get("rank")))
    return sorted(found, key=lambda d: (d.severity != "fail", -d.fraction, d.metric, d.host, d.gpu_index or 0))


def drift(results: Mapping[str, Any], store: Store, *, fraction: float = DEFAULT_FRACTION,
          severity: str = DEFAULT_SEVERITY) -> list[Drift]:
    """Every figure of ``results`` (a run's results.json) more than ``fraction`` below its own first accepted
    figure in ``store``, failures first, then the furthest below. ``severity`` is the profile's
    ``drift_severity``."""
    check_settings(fraction, severity)
    parts = followed(results)
    if not parts:
        return []
    metrics, serials, hosts = wanted(parts)
    first = store.baselines(metrics, serials=serials, hosts=hosts, level=results.get("level"),
                            before=results.get("started"))
    return judge(parts, first, fraction=fraction, severity=severity)


def section(findings: list[Drift], fraction: float, severity: str, store: str,
            problem: str | None = None) -> dict[str, Any]:
    """The results.json ``drift`` section: the settings it was judged by, the store, every finding, and why drift
    was not judged (``problem``; None when it was)."""
    return {"store": store, "fraction": fraction, "severity": severity, "problem": problem,
            "findings": [d.as_json() for d in findings]}
