"""Compare a run with an earlier one (``--baseline PATH/results.json``): pure functions on results dicts.

Per metric (by test and name) and per GPU (by serial, else UUID, else host and GPU index, else
host and rank), the relative change is flagged when it exceeds the tolerance (the profile's
``baseline_tolerance``). A flag informs; it does not change the verdict. The comparison is stored
in results.json under ``"baseline"`` and shown in the report.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from clustergate.common import inputfile
from clustergate.common.parts import gpu_label, rank_index
from clustergate.common.terminal import error_text
from clustergate.criteria.criterion import Criterion

DEFAULT_TOLERANCE = 0.05


class BaselineError(ValueError):
    """The baseline file cannot be read as a results.json."""


def load(path: str | Path) -> dict[str, Any]:
    """Read a results.json to compare with; BaselineError naming the file and the fix."""
    path = Path(path)
    if path.is_dir():
        path = path / "results.json"
    try:
        data = json.loads(inputfile.read_text(path, "results"))
    except FileNotFoundError:
        raise BaselineError(f"--baseline {path}: file not found; pass the results.json of an earlier run") from None
    except inputfile.InputFileError as exc:
        raise BaselineError(f"--baseline {exc}") from None
    except (OSError, ValueError) as exc:  # not UTF-8, not JSON
        raise BaselineError(f"--baseline {path}: not readable JSON ({error_text(exc)})") from None
    if not isinstance(data, dict) or data.get("schema") != 1 or not isinstance(data.get("tests"), list):
        raise BaselineError(f"--baseline {path}: not a clustergate results.json (schema 1 with a 'tests' list)")
    problem = _shape_problem(data["tests"])
    if problem:
        raise BaselineError(f"--baseline {path}: {problem}; pass the results.json of an earlier run, unedited")
    data.setdefault("_source", str(path))
    return data


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _shape_problem(tests: list[Any]) -> str | None:
    """What makes the tests unusable for a comparison (checked when the run starts, not after it)."""
    for i, test in enumerate(tests):
        if not isinstance(test, dict) or not isinstance(test.get("nodeid"), str) \
                or not isinstance(test.get("metrics", []), list):
            return f"tests[{i}] is not a test entry (nodeid, metrics)"
        for m in test.get("metrics", []):
            name = m.get("name") if isinstance(m, dict) else repr(m)
            where = f"tests[{i}] ({test['nodeid']}) metric {name}"
            if not isinstance(m, dict) or not isinstance(m.get("name"), str):
                return f"{where} has no name"
            if not _number(m.get("value")):
                return f"{where} has value {m.get('value')!r}, not a finite number"
            for p in m.get("per_rank") or []:
                if not isinstance(p, dict) or not isinstance(p.get("rank"), int) or not _number(p.get("value")):
                    return f"{where} has a per-rank entry {p!r}, not a rank with a finite number"
    return None


def relative_change(current: float, baseline: float) -> float | None:
    """(current - baseline) / |baseline|; None when the baseline is 0 and the current is not."""
    if baseline == 0:
        return 0.0 if current == 0 else None
    return (current - baseline) / abs(baseline)


def direction(change: float | None, criterion: dict[str, Any]) -> str:
    """``better`` / ``worse`` by the criterion's sense, ``changed`` when it has none, ``same``."""
    if change == 0:
        return "same"
    up = Criterion.from_json(criterion).higher_is_better
    if up is None or change is None:
        return "changed"
    return "better" if (change > 0) == up else "worse"


def gpu_key(where: dict[str, Any]) -> str:
    """The physical part a per-rank value belongs to, stable across runs that renumber ranks."""
    if where.get("gpu_serial"):
        return f"serial:{where['gpu_serial']}"
    if where.get("gpu_uuid"):
        return f"uuid:{where['gpu_uuid']}"
    if where.get("gpu_index") is not None:
        return f"gpu:{where.get('host')}:{where['gpu_index']}"
    return f"rank:{where.get('host')}:{where.get('rank')}"


def _metrics(results: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    return {(t["nodeid"], m["name"]): m for t in results.get("tests", []) for m in t.get("metrics", [])}


def _entry(name: str, nodeid: str, unit: str, cur: float, base: float, crit: dict[str, Any],
           tolerance: float, **where: Any) -> dict[str, Any]:
    change = relative_change(cur, base)
    return {"nodeid": nodeid, "name": name, **where, "unit": unit, "current": cur, "baseline": base,
            "change": None if change is None else round(change, 6), "direction": direction(change, crit),
            "flagged": change is None or abs(change) > tolerance}


def compare(current: dict[str, Any], baseline: dict[str, Any], tolerance: float = DEFAULT_TOLERANCE,
            source: str | None = None) -> dict[str, Any]:
    """The ``"baseline"`` section of results.json: every shared metric and GPU figure, flagged or not."""
    now, then = _metrics(current), _metrics(baseline)
    ranks_now, ranks_then = rank_index(current), rank_index(baseline)
    metrics, per_gpu = [], []
    for key, m in now.items():
        old = then.get(key)
        if old is None:
            continue
        crit = m.get("criterion") or old.get("criterion") or {}
        metrics.append(_entry(m["name"], key[0], m.get("unit", ""), float(m["value"]), float(old["value"]), crit,
                              tolerance, scope=m.get("scope", "gpu")))
        if m.get("scope") != "gpu":
            continue
        old_parts = {gpu_key({**ranks_then.get(p["rank"], {}), **p}): p for p in old.get("per_rank") or []}
        for p in m.get("per_rank") or []:
            where = {**ranks_now.get(p["rank"], {}), **p}
            q = old_parts.get(gpu_key(where))
            if q is not None:
                per_gpu.append(_entry(m["name"], key[0], m.get("unit", ""), float(p["value"]), float(q["value"]),
                                      crit, tolerance, gpu=gpu_label(where), rank=p["rank"]))
    notes = []
    for field in ("profile", "world_size", "level"):
        if current.get(field) != baseline.get(field):
            notes.append(f"{field} differs: {baseline.get(field)} then, {current.get(field)} now")
    return {
        "source": source or baseline.get("_source", ""),
        "started": baseline.get("started"),
        "profile": baseline.get("profile"),
        "world_size": baseline.get("world_size"),
        "tolerance": tolerance,
        "flagged": sum(e["flagged"] for e in metrics) + sum(e["flagged"] for e in per_gpu),
        "metrics": metrics,
        "per_gpu": per_gpu,
        "missing": [f"{n}::{name}" for n, name in then if (n, name) not in now],
        "new": [f"{n}::{name}" for n, name in now if (n, name) not in then],
        "notes": notes,
    }
