"""The per-GPU and per-node tables of the report, derived from the results.json dict (pure, no HTML).

Each cell says its state (failed, warned, outlier) so the HTML report highlights it; judging itself
happened when the run did (``clustergate.record.judge``): these tables only show it.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from typing import Any

from clustergate.common.numbers import number
from clustergate.common.parts import gpu_label, rank_index
from clustergate.criteria.criterion import Criterion
from clustergate.record.results import short_test_name

OUTLIER_DEVIATION = 0.10
"""A GPU more than this fraction worse than the median of its peers is highlighted as an outlier
(highlighting only: judging uses the profile's ``outlier_fraction``)."""



@dataclass(frozen=True, slots=True)
class Cell:
    text: str
    state: str = ""
    """``fail`` | ``warn`` | ``outlier`` | ``""``: drives the highlight."""
    title: str = ""


@dataclass(slots=True)
class Table:
    columns: list[str]
    rows: list[list[Cell]] = field(default_factory=list)


def _gpu_metrics(results: dict[str, Any], scope: str) -> list[tuple[str, dict[str, Any]]]:
    """(column name, metric) for every metric of ``scope`` with per-rank values, in test order."""
    seen: dict[str, int] = {}
    out = []
    for test in results.get("tests", []):
        for m in test.get("metrics", []):
            if m.get("scope") == scope and m.get("per_rank"):
                n = seen[m["name"]] = seen.get(m["name"], 0) + 1
                name = m["name"] if n == 1 else f"{m['name']} ({short_test_name(test['nodeid'])})"
                out.append((name, m))
    return out


def cell_state(value: float, passed: bool, peers: list[float], criterion: dict[str, Any],
               warned: bool = False) -> str:
    """``fail`` if judged failed; ``warn`` if it missed a warn criterion; ``outlier`` if more than
    OUTLIER_DEVIATION worse than the peers' median (either way when the criterion gives no direction,
    and then only among 3 or more)."""
    if not passed:
        return "fail"
    if warned:
        return "warn"
    up = Criterion.from_json(criterion).higher_is_better
    if len(peers) < (2 if up is not None else 3):
        return ""
    med = statistics.median(peers)
    if not med:
        return ""
    change = (value - med) / abs(med)
    worse = abs(change) > OUTLIER_DEVIATION if up is None else \
        (change < -OUTLIER_DEVIATION if up else change > OUTLIER_DEVIATION)
    return "outlier" if worse else ""


def _metric_cell(p: dict[str, Any], m: dict[str, Any]) -> Cell:
    peers = [q["value"] for q in m["per_rank"]]
    state = cell_state(p["value"], p.get("passed", True), peers, m.get("criterion") or {}, bool(p.get("warned")))
    return Cell(number(p["value"], m.get("unit", "")), state)


def _failed_tests_by_rank(results: dict[str, Any]) -> dict[int, list[str]]:
    out: dict[int, list[str]] = {}
    for test in results.get("tests", []):
        for r in test.get("failed_ranks", []):
            out.setdefault(r, []).append(short_test_name(test["nodeid"]))
    return out


def gpu_table(results: dict[str, Any]) -> Table:
    """One row per rank (host, GPU index, serial), one column per gpu-scope metric."""
    ranks = rank_index(results)
    metrics = _gpu_metrics(results, "gpu")
    failed = _failed_tests_by_rank(results)
    table = Table(["rank", "host", "gpu", "serial", *(n for n, _ in metrics), "failed tests"])
    for rank in sorted(ranks):
        ident = ranks[rank]
        index = "" if ident["gpu_index"] is None else str(ident["gpu_index"])
        row = [Cell(str(rank)), Cell(ident["host"]), Cell(index),
               Cell(ident["gpu_serial"] or "", title=ident["gpu_uuid"] or "")]
        for _, m in metrics:
            per = {p["rank"]: p for p in m["per_rank"]}
            p = per.get(rank)
            if p is None:
                row.append(Cell(""))
                continue
            row.append(_metric_cell(p, m))
        tests = failed.get(rank, [])
        row.append(Cell(", ".join(tests), "fail" if tests else ""))
        table.rows.append(row)
    return table


def node_table(results: dict[str, Any]) -> Table:
    """One column per node; rows: host facts, node-scope metrics, the worst GPU of each gpu-scope
    metric, failed ranks (transposed: a cluster has fewer nodes than a run has metrics)."""
    ranks = rank_index(results)
    nodes = results.get("nodes", [])
    failed = _failed_tests_by_rank(results)
    table = Table(["", *(f"node {n.get('node_rank', 0)}" for n in nodes)])
    table.rows.append([Cell("host"), *(Cell(n.get("host", "?")) for n in nodes)])
    table.rows.append([Cell("ranks"), *(Cell(str(len(n.get("ranks", [])))) for n in nodes)])
    models = [sorted({g.get("name") or "?" for g in n.get("gpus", [])}) for n in nodes]
    table.rows.append([Cell("GPUs"), *(Cell(f"{len(n.get('gpus', []))}" + (f" x {', '.join(m)}" if m else ""))
                                       for n, m in zip(nodes, models, strict=True))])

    def node_of(p: dict[str, Any]) -> Any:
        return ranks.get(p["rank"], {}).get("node_rank", p.get("node_rank"))

    for name, m in _gpu_metrics(results, "node"):
        row = [Cell(name)]
        for n in nodes:
            mine = [p for p in m["per_rank"] if node_of(p) == n.get("node_rank", 0)]
            row.append(_metric_cell(mine[0], m) if mine else Cell(""))
        table.rows.append(row)
    for name, m in _gpu_metrics(results, "gpu"):
        row = [Cell(f"{name} (worst GPU)")]
        up = Criterion.from_json(m.get("criterion")).higher_is_better
        for n in nodes:
            mine = [p for p in m["per_rank"] if node_of(p) == n.get("node_rank", 0)]
            if not mine:
                row.append(Cell(""))
                continue
            worst = min(mine, key=lambda p: p["value"]) if up in (True, None) else max(mine, key=lambda p: p["value"])
            bad = [p for p in mine if not p.get("passed", True)]
            state = "fail" if bad else _metric_cell(worst, m).state
            label = gpu_label({**ranks.get(worst["rank"], {}), **worst}, short=True)
            row.append(Cell(f"{number(worst['value'], m.get('unit', ''))} ({label})", state,
                            title=f"{len(bad)} of {len(mine)} GPUs fail" if bad else ""))
        table.rows.append(row)
    bad_ranks = [sorted(r for r in n.get("ranks", []) if r in failed) for n in nodes]
    table.rows.append([Cell("failed ranks"), *(Cell(", ".join(map(str, b)), "fail" if b else "") for b in bad_ranks)])
    return table
