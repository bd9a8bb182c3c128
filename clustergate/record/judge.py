"""Judge gathered metric records against a profile's criteria.

Pure functions over plain data: rank 0 calls ``judge`` on what every rank recorded and
broadcasts the outcome. One failure format for every metric (after ReFrame):

    matmul_bf16_tflops=512.3 TFLOPS, expected >= 700 [h100-sxm-80gb, rank 13 node-3 gpu 5 serial 1650...]
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from clustergate.common.numbers import number
from clustergate.common.parts import gpu_label
from clustergate.criteria.criterion import Criterion, Figure
from clustergate.criteria.thresholds import Profile


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
        return gpu_label(asdict(self))


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
    """No part missed a ``fail`` criterion (a missed ``warn`` criterion leaves it passed)."""
    failures: list[str] = field(default_factory=list)
    per_rank: list[dict[str, Any]] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    """Misses of a ``warn`` criterion, in the failure format: listed, never failing."""

    def as_json(self) -> dict[str, Any]:
        out = asdict(self)
        out.pop("failures")
        out.pop("warnings")
        out["warned"] = bool(self.warnings)
        return out


def record_problems(records: list[Record], ran: dict[int, str]) -> tuple[list[str], list[int]]:
    """What is wrong with the records themselves, and the ranks concerned: a rank that recorded a
    metric twice (an error in the test), and a per-GPU metric missing on a rank that ran the test
    (``ran``: rank -> host of every rank whose test body passed)."""
    lines: list[str] = []
    ranks: set[int] = set()
    for (name, rank), n in sorted(Counter((r.name, r.where.rank) for r in records).items()):
        if n > 1:
            lines.append(f"{name} recorded {n} times on rank {rank}: an error in the test, which must record "
                         "each figure once")
            ranks.add(rank)
    for name in sorted({r.name for r in records if r.scope == "gpu"}):
        have = {r.where.rank for r in records if r.name == name}
        missing = [rank for rank in sorted(ran) if rank not in have]
        if missing:
            lines.append(f"per-GPU metric {name} not recorded on {len(missing)} of the {len(ran)} ranks that ran "
                         f"the test: {', '.join(f'rank {r} ({ran[r]})' for r in missing[:16])}"
                         f"{' ...' if len(missing) > 16 else ''}; every rank records its own GPU's figure")
            ranks.update(missing)
    return lines, sorted(ranks)


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


def judge(records: list[Record], profile: Profile, nodes: int | None = None) -> list[Judged]:
    """Judge every metric in ``records``; metrics missing from the profile fail, naming the key. ``nodes``: the job's
    node count, which picks a ``by_nodes`` row (default: the nodes ``records`` come from, every rank's records of a
    test as the run gathers them; a re-judge passes the record's own count, its world figures kept once)."""
    by_name: dict[str, list[Record]] = {}
    for r in keep_one_per_scope(records):
        by_name.setdefault(r.name, []).append(r)
    nodes = nodes or len({r.where.node_rank for r in records})
    judged: list[Judged] = []
    for name, recs in by_name.items():
        first = recs[0]
        if name not in profile.metrics:
            judged.append(Judged(
                name=name, value=Criterion().stand_in([r.value for r in recs]), unit=first.unit,
                scope=first.scope, description=first.description, criterion={}, passed=False,
                failures=[f"{name}: profile {profile.name!r} in {profile.source} has no metrics.{name}; add it"],
                per_rank=[{**asdict(r.where), "value": r.value, "passed": False} for r in recs],
            ))
            continue
        c = profile.metrics[name].for_nodes(nodes)
        failures: list[str] = []
        warnings: list[str] = []
        per_rank: list[dict[str, Any]] = []
        weighed = c.weigh([Figure(r.value, r.unit, r.where.node_rank) for r in recs], first.scope)
        for r, (failed, warned) in zip(recs, weighed, strict=True):
            per_rank.append({**asdict(r.where), "value": r.value, "passed": not failed, "warned": bool(warned)})
            for problems, into in ((failed, failures), (warned, warnings)):
                if problems:
                    into.append(f"{name}={number(r.value, r.unit)}, {'; '.join(problems)} "
                                f"[{profile.name}, {r.where.label(r.scope)}]")
        judged.append(Judged(
            name=name, value=c.stand_in([r.value for r in recs]), unit=first.unit, scope=first.scope,
            description=c.description or first.description, criterion=c.as_json(), passed=not failures,
            failures=failures, per_rank=per_rank, warnings=warnings,
        ))
    return judged


def warnings(tests: list[dict[str, Any]], drift: dict[str, Any] | None = None) -> list[dict[str, Any]]:
    """results.json's top-level ``warnings``: every part that missed a ``warn`` criterion, from the tests'
    metrics (so a re-judged file lists its own), then every drift of weight ``warn`` (``drift``: the results'
    ``drift`` section, ``clustergate.store.drift``): test, metric, value, the criterion missed, where."""
    out = []
    for test in tests:
        for m in test.get("metrics", []):
            text = Criterion.from_json(m.get("criterion")).text()
            for p in m.get("per_rank") or []:
                if p.get("warned"):
                    where = Where(rank=p["rank"], host=p.get("host", "?"), node_rank=p.get("node_rank", 0),
                                  gpu_index=p.get("gpu_index"), gpu_serial=p.get("gpu_serial"))
                    out.append({"test": test["nodeid"], "metric": m["name"], "value": p["value"], "criterion": text,
                                "where": where.label(m.get("scope", "gpu"))})
    out += [{"test": d["test"], "metric": d["metric"], "value": d["now"], "criterion": f"drift: {d['criterion']}",
             "where": d["where"]} for d in (drift or {}).get("findings") or [] if d.get("severity") == "warn"]
    return out
