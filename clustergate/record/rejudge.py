"""Judge a recorded run again under other thresholds: the per-rank values are kept, the verdict is new.

A test's recorded failure is kept when something other than its metrics failed: its ``problems``
(a rank raised, a declared metric was never recorded, the run ended in it); a failure that was
only metric checks is replaced by the new judgement, so a test can pass or fail anew. The message
is rebuilt from the recorded problems and the new metric failures: nothing is parsed out of text.
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from clustergate.criteria.thresholds import Profile
from clustergate.record import actions
from clustergate.record.judge import Record, Where, judge, warnings
from clustergate.record.outcomes import metric_block
from clustergate.record.verdict import of_record


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


def problems_of(test: dict[str, Any]) -> list[str]:
    """What failed in a test besides its metrics' criteria. A results.json written before tests kept
    their ``problems``: a failure is kept whole (it may be more than metric checks, and its text is
    not parsed), so it never turns into a pass."""
    if "problems" in test:
        return list(test["problems"])
    failed = test.get("outcome") in ("failed", "error") and test.get("message")
    return [test["message"]] if failed else []


def rejudge(results: dict[str, Any], profile: Profile) -> dict[str, Any]:
    """A copy of ``results`` judged under ``profile``; ``"rejudged"`` records what was done."""
    out = copy.deepcopy(results)
    for test in out.get("tests", []):
        if not test.get("metrics") or test.get("outcome") == "skipped":
            continue
        records = [r for m in test["metrics"] for r in _records(m, out.get("nodes", []))]
        judged = judge(records, profile, nodes=len(out.get("nodes") or []) or None)
        test["metrics"] = [j.as_json() for j in judged]
        missed = [f for j in judged for f in j.failures]
        problems = problems_of(test)
        if test.get("outcome") == "passed" or (test.get("outcome") == "failed" and not problems):
            test["outcome"] = "failed" if missed else "passed"
            test["failed_ranks"] = sorted({p["rank"] for j in judged for p in j.per_rank if not p["passed"]})
        test["message"] = "\n".join([*problems, *([f"[call] {metric_block(missed)}"] if missed else [])])
    out["rejudged"] = {"thresholds": str(Path(profile.source)), "profile": profile.name,
                       "original_profile": results.get("profile"), "original_verdict": results.get("verdict")}
    out["profile"] = profile.name
    out["sign_off"] = profile.sign_off
    out["warnings"] = warnings(out["tests"], out.get("drift"))
    decision = of_record(out)  # the rule the run itself used
    out["verdict"], out["reason"] = decision.verdict, decision.reason
    out["actions"] = actions.section(out)
    return out
