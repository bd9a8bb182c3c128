"""What the store keeps of a results document, as plain rows: pure functions of the document alone.

Three kinds of document are stored: a run's results.json (``run``: a node run of the node phase, a fabric
run, any run), a merge's cluster results.json (``cluster``) and a signoff.json (``signoff``). A run gives
one figure row per part and metric (``per_rank``: a GPU's figure, a node's, or the whole job's); a merge
and a sign-off give one decision row per host. A merge's fleet samples are copies of its node runs'
figures and are not stored as figures again: record the node runs themselves.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from clustergate.criteria.criterion import Criterion

KINDS = ("run", "cluster", "signoff")
FILE_KINDS = {"run": "results", "cluster": "cluster", "signoff": "signoff"}
"""The store's kind -> clustergate.record.resultsfile's name for its schema."""
VERDICTS = ("pass", "warn", "fail", "unjudged")
"""A figure's verdict: met its criterion, missed a ``warn`` one, missed a ``fail`` one, or had none to meet."""


@dataclass(frozen=True, slots=True)
class FigureRow:
    """One part's figure of one metric in one run."""

    test: str
    metric: str
    scope: str
    host: str | None
    """The node; None for a whole-job figure of a run over several nodes."""
    node_rank: int | None
    rank: int | None
    gpu_index: int | None
    gpu_serial: str | None
    gpu_uuid: str | None
    value: float
    unit: str
    criterion: str
    """The criterion the figure was judged by, as results.json gives it (JSON text)."""
    verdict: str


@dataclass(frozen=True, slots=True)
class DecisionRow:
    """What a merge or sign-off decided of one host."""

    host: str
    status: str
    """accepted | excluded"""
    phase: str | None
    """node | fabric: the phase that excluded it (None when accepted)."""
    reasons: str
    """JSON list of the reasons given."""


def kind_of(document: Mapping[str, Any]) -> str:
    """run, cluster or signoff, as the document itself says (a run's results.json has no ``kind``)."""
    kind = document.get("kind", "run")
    if kind not in KINDS:
        raise ValueError(f"kind {kind!r} is not one the store keeps ({', '.join(KINDS)})")
    return str(kind)


def canonical(document: Mapping[str, Any]) -> str:
    """The document as one canonical JSON text: the same content always gives the same text (and digest),
    however the file was indented. Strict JSON: ValueError on NaN or Infinity."""
    return json.dumps(document, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False,
                      default=str)


def digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def started(document: Mapping[str, Any]) -> str | None:
    """When the run started (a merge or sign-off: when it was made), as the document says."""
    value = document.get("created" if "kind" in document else "started")
    return str(value) if value else None


def seconds(iso: str | None) -> float | None:
    """An ISO-8601 time as seconds since the epoch (None when it is not one)."""
    if not iso:
        return None
    try:
        when = datetime.fromisoformat(iso.replace("Z", "+00:00"))
    except ValueError:
        return None
    return when.timestamp() if when.tzinfo else None


def hosts(document: Mapping[str, Any]) -> list[str]:
    """Every host the document names, in its order."""
    if kind_of(document) == "signoff":
        names = [*(document.get("accepted") or []), *(e.get("host") for e in document.get("excluded") or [])]
    else:
        names = [n.get("host") for n in document.get("nodes") or []]
    return list(dict.fromkeys(str(h) for h in names if h))


def identity(document: Mapping[str, Any]) -> str:
    """What makes two documents the same run, merge or sign-off whatever their content: a run's start, hosts
    and rendezvous id; a merge's or sign-off's time and directory. A second document of the same run with
    other content (re-judged, edited) is refused rather than counted twice."""
    kind = kind_of(document)
    if kind == "run":
        rdzv = (document.get("environment") or {}).get("TORCHELASTIC_RUN_ID") or ""
        return json.dumps([kind, started(document), sorted(hosts(document)), rdzv])
    return json.dumps([kind, started(document), document.get("output") or document.get("run_dir") or ""])


def part_verdict(criterion: Criterion, part: Mapping[str, Any]) -> str:
    if not criterion.judged:
        return "unjudged"
    if not part.get("passed", True):
        return "fail"
    return "warn" if part.get("warned") else "pass"


def figure_rows(document: Mapping[str, Any]) -> list[FigureRow]:
    """Every part's figure of every metric of a run's results.json (none for a merge or sign-off)."""
    if kind_of(document) != "run":
        return []
    nodes = document.get("nodes") or []
    only_host = nodes[0].get("host") if len(nodes) == 1 else None
    rows = []
    for test in document.get("tests") or []:
        for m in test.get("metrics") or []:
            criterion = Criterion.from_json(m.get("criterion"))
            scope = str(m.get("scope", "gpu"))
            parts = m.get("per_rank") or [{"value": m["value"], "passed": m.get("passed", True),
                                           "warned": m.get("warned", False)}]
            for p in parts:
                # A whole-job figure belongs to a node only when the job ran on one node.
                host = p.get("host", only_host) if scope != "world" else only_host
                rows.append(FigureRow(
                    test=str(test.get("nodeid")), metric=str(m["name"]), scope=scope, host=host,
                    node_rank=p.get("node_rank"), rank=p.get("rank"),
                    gpu_index=p.get("gpu_index") if scope == "gpu" else None,
                    gpu_serial=p.get("gpu_serial") if scope == "gpu" else None,
                    gpu_uuid=p.get("gpu_uuid") if scope == "gpu" else None,
                    value=float(p["value"]), unit=str(m.get("unit", "")),
                    criterion=json.dumps(m.get("criterion") or {}, sort_keys=True),
                    verdict=part_verdict(criterion, p)))
    return rows


def decision_rows(document: Mapping[str, Any]) -> list[DecisionRow]:
    """What a merge or sign-off decided of each host (none for a run)."""
    kind = kind_of(document)
    if kind == "run":
        return []
    excluded = {e["host"]: e for e in document.get("excluded") or [] if e.get("host")}
    if kind == "signoff":
        statuses = {**{h: "accepted" for h in document.get("accepted") or []}, **{h: "excluded" for h in excluded}}
    else:
        statuses = {n["host"]: n.get("status", "excluded") for n in document.get("nodes") or [] if n.get("host")}
        statuses.update({h: "excluded" for h in excluded if h not in statuses})  # expected hosts with no run
    nodes = {n.get("host"): n for n in document.get("nodes") or []} if kind == "cluster" else {}
    rows = []
    for host, status in statuses.items():
        entry = excluded.get(host) or {}
        reasons = entry.get("reasons") or (nodes.get(host) or {}).get("reasons") or []
        rows.append(DecisionRow(host=str(host), status=status, phase=entry.get("phase") if status == "excluded"
                                else None, reasons=json.dumps(list(reasons))))
    return rows
