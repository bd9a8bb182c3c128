"""Judge gathered metric records against a profile's criteria.

Pure functions over plain data: rank 0 calls ``judge`` on what every rank recorded and
broadcasts the outcome. One failure format for every metric (after ReFrame):

    matmul_bf16_tflops=512.3 TFLOPS, expected >= 700 [h100-sxm-80gb, rank 13 node-3 gpu 5 serial 1650...]
"""

from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any

from clustergate.thresholds import Criterion, Profile


@dataclass(frozen=True, slots=True)
class Where:
    """The part a figure belongs to: enough to walk to the rack and pull it."""

    rank: int
    host: str
    node_rank: int
    gpu_index: int | None = None
    gpu_serial: str | None = None
    gpu_uuid: str | None = None

    def label(self, scope: str = "gpu") -> str:
        if scope == "world":
            return "whole job"
        if scope == "node":
            return f"node {self.node_rank} ({self.host})"
        gpu = "" if self.gpu_index is None else f" gpu {self.gpu_index}"
        serial = f" serial {self.gpu_serial}" if self.gpu_serial else ""
        return f"rank {self.rank} {self.host}{gpu}{serial}"


@dataclass(frozen=True, slots=True)
class Record:
    """One metric as one rank recorded it."""

    name: str
    value: float
    unit: str
    scope: str
    description: str
    where: Where


@dataclass(slots=True)
class Judged:
    """One metric judged over every part it was measured on (the results.json ``metrics`` entry)."""

    name: str
    value: float
    unit: str
    scope: str
    description: str
    criterion: dict[str, Any]
    passed: bool
    failures: list[str] = field(default_factory=list)
    per_rank: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("failures")
        return out


def keep_one_per_scope(records: list[Record]) -> list[Record]:
    """Every gpu-scope record; one per node for node scope; one for world scope (lowest rank)."""
    kept: dict[tuple[Any, ...], Record] = {}
    for r in sorted(records, key=lambda r: r.where.rank):
        key: tuple[Any, ...]
        if r.scope == "gpu":
            key = (r.name, r.where.rank)
        elif r.scope == "node":
            key = (r.name, r.where.node_rank)
        else:
            key = (r.name,)
        kept.setdefault(key, r)
    return list(kept.values())


def _fmt(x: float) -> str:
    return f"{x:.4g}" if abs(x) < 1e4 else f"{x:.0f}"


def _problems(r: Record, c: Criterion, medians: dict[str, float]) -> list[str]:
    """Why one record fails its criterion (empty when it passes)."""
    out: list[str] = []
    if c.unit is not None and r.unit != c.unit:
        out.append(f"recorded in {r.unit!r}, the profile expects {c.unit!r}")
        return out
    if c.ceiling is not None and r.value > c.ceiling:
        out.append(f"above the physical ceiling {_fmt(c.ceiling)}: a measurement error, not a result")
    if c.min is not None and r.value < c.min:
        out.append(f"expected >= {_fmt(c.min)}")
    if c.max is not None and r.value > c.max:
        out.append(f"expected <= {_fmt(c.max)}")
    if c.outlier_fraction is not None and r.scope == "gpu":
        for peers, median in medians.items():
            if r.value < c.outlier_fraction * median:
                out.append(f"below {c.outlier_fraction:.0%} of the {peers} median {_fmt(median)}")
    return out


def _medians(records: list[Record], r: Record) -> dict[str, float]:
    node = [x.value for x in records if x.where.node_rank == r.where.node_rank]
    medians = {"node": statistics.median(node)} if len(node) > 1 else {}
    nodes = {x.where.node_rank for x in records}
    if len(nodes) > 1:
        medians["cluster"] = statistics.median(x.value for x in records)
    return medians


def _aggregate(values: list[float], c: Criterion) -> float:
    """The figure that stands for the metric: the worst against the criterion, else the median."""
    if c.min is not None or c.outlier_fraction is not None:
        return min(values)
    if c.max is not None or c.ceiling is not None:
        return max(values)
    return statistics.median(values)


def judge(records: list[Record], profile: Profile) -> list[Judged]:
    """Judge every metric in ``records``; metrics missing from the profile fail, naming the key."""
    by_name: dict[str, list[Record]] = {}
    for r in keep_one_per_scope(records):
        by_name.setdefault(r.name, []).append(r)
    judged: list[Judged] = []
    for name, recs in by_name.items():
        first = recs[0]
        if name not in profile.metrics:
            judged.append(Judged(
                name=name, value=_aggregate([r.value for r in recs], Criterion()), unit=first.unit,
                scope=first.scope, description=first.description, criterion={}, passed=False,
                failures=[f"{name}: profile {profile.name!r} in {profile.source} has no metrics.{name}; add it"],
                per_rank=[{**asdict(r.where), "value": r.value, "passed": False} for r in recs],
            ))
            continue
        c = profile.metrics[name]
        failures: list[str] = []
        per_rank: list[dict[str, Any]] = []
        for r in recs:
            problems = _problems(r, c, _medians(recs, r))
            per_rank.append({**asdict(r.where), "value": r.value, "passed": not problems})
            if problems:
                failures.append(
                    f"{name}={_fmt(r.value)} {r.unit}, {'; '.join(problems)} "
                    f"[{profile.name}, {r.where.label(r.scope)}]"
                )
        judged.append(Judged(
            name=name, value=_aggregate([r.value for r in recs], c), unit=first.unit, scope=first.scope,
            description=c.description or first.description, criterion=c.as_dict(), passed=not failures,
            failures=failures, per_rank=per_rank,
        ))
    return judged
