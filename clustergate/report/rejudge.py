"""Judge a recorded run again under other thresholds: the per-rank values are kept, the verdict is new.

A test's recorded failure is kept when something other than its metrics failed (a rank raised, a
declared metric was never recorded); a failure that was only metric checks is replaced by the new
judgement, so a test can pass or fail anew.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

from clustergate.judge import Record, Where, judge
from clustergate.thresholds import Profile
from clustergate.verdict import decide

METRIC_HEADER = re.compile(r"^(\[call\] )?\d+ metric checks? failed:$")
"""The line ``clustergate.outcomes.merge`` puts above its metric failures (indented below it)."""


def strip_metric_failures(message: str) -> str:
    """The message without its metric-failure block(s)."""
    out: list[str] = []
    skipping = False
    for line in message.splitlines():
        if METRIC_HEADER.match(line.strip()):
            skipping = True
            continue
        if skipping and line.startswith("  "):
            continue
        skipping = False
        out.append(line)
    return "\n".join(out).strip()


def _records(metric: dict[str, Any], nodes: list[dict[str, Any]]) -> list[Record]:
    per = metric.get("per_rank") or []
    if not per:
        # A metric the recording profile lacked keeps no per-rank values: judge its one figure.
        host = nodes[0]["host"] if nodes else "?"
        per = [{"rank": 0, "host": host, "node_rank": 0, "value": metric["value"]}]
    return [Record(metric["name"], float(p["value"]), metric.get("unit", ""), metric.get("scope", "gpu"),
                   metric.get("description", ""),
                   Where(rank=p["rank"], host=p.get("host", "?"), node_rank=p.get("node_rank", 0),
                         gpu_index=p.get("gpu_index"), gpu_serial=p.get("gpu_serial"), gpu_uuid=p.get("gpu_uuid")))
            for p in per]


def verdict(results: dict[str, Any]) -> str:
    """The verdict of a finished run's record, by the rule the run itself used."""
    outcomes = [str(t.get("outcome")) for t in results.get("tests", [])]
    return decide(outcomes, error=results.get("error"), finished=True).verdict


def rejudge(results: dict[str, Any], profile: Profile) -> dict[str, Any]:
    """A copy of ``results`` judged under ``profile``; ``"rejudged"`` records what was done."""
    out = copy.deepcopy(results)
    for test in out.get("tests", []):
        if not test.get("metrics"):
            continue
        records = [r for m in test["metrics"] for r in _records(m, out.get("nodes", []))]
        judged = judge(records, profile)
        test["metrics"] = [j.as_json() for j in judged]
        problems = [f for j in judged for f in j.failures]
        rest = strip_metric_failures(test.get("message", ""))
        metric_only = test.get("outcome") == "passed" or (test.get("outcome") == "failed" and not rest)
        if metric_only:
            test["outcome"] = "failed" if problems else "passed"
            test["failed_ranks"] = sorted({p["rank"] for j in judged for p in j.per_rank if not p["passed"]})
        if problems:
            block = f"[call] {len(problems)} metric check{'s' if len(problems) > 1 else ''} failed:\n" + \
                "\n".join(f"  {p}" for p in problems)
            test["message"] = f"{rest}\n{block}".strip()
        else:
            test["message"] = rest
    out["rejudged"] = {"thresholds": str(Path(profile.source)), "profile": profile.name,
                       "original_profile": results.get("profile"), "original_verdict": results.get("verdict")}
    out["profile"] = profile.name
    out["sign_off"] = profile.sign_off
    out["verdict"] = verdict(out)
    return out
