"""NVIDIA DCGM diagnostics, when asked for: ``--dcgm-diag 1|2|3|4`` runs ``dcgmi diag -r N -j`` once per
node on the node's GPUs of this job, and each DCGM test becomes one test here with DCGM's own messages.

Each node's local rank 0 runs dcgmi while every rank waits in short exchanges (a long blocking
collective would outlast the control group's timeout); rank 0 prints a heartbeat line at most every 30 s.
A result DCGM passed with an error of severity ISOLATE or RESET fails (workloads.gpu.dcgm). A GPU DCGM fails
fails on its own rank (host, index, serial) with DCGM's message, its error id and severity, and the next
step for its category.
Where DCGM is absent or its host engine unreachable, the tests skip saying so; a DCGM test the run
level does not include, or that DCGM did not report, skips too.
"""

from __future__ import annotations

import time
from typing import Any

import pytest

from acceptance.evidence import decide, gpu_label, is_node_reader, where_of
from acceptance.gpu_helpers import require_device
from clustergate.run.recorder import Recorder
from workloads import faults, heartbeat
from workloads.gpu import dcgm
from workloads.gpu._hw import release
from workloads.result import Result

DCGM_LIMIT_S = 3 * 3600
"""The tests' own time limit: level 3 on 8 GPUs takes tens of minutes, level 4 (memtest, pulse_test) hours."""
POLL_S = 10.0
"""How often the ranks agree on whether every node's dcgmi has finished."""
HEARTBEAT_S = heartbeat.INTERVAL_S
"""At most this often rank 0 says how many nodes' dcgmi have finished."""


@pytest.fixture(scope="module")
def dcgm_reports() -> dict[str, Any]:
    """Each node's DCGM report, filled by the first DCGM test that runs (one dcgmi per node)."""
    return {}


def _node_gpus(cg: Recorder) -> list[int]:
    node = cg.identities[cg.rank]["node_rank"]
    return sorted(i["gpu"]["index"] for i in cg.identities
                  if i["node_rank"] == node and (i.get("gpu") or {}).get("index") is not None)


def _run(cg: Recorder, level: int) -> dict[int, dict[str, Any]]:
    """Run dcgmi on every node at once; {node_rank: what its reader saw}."""
    release(cg.device)  # DCGM's memory and stress tests need the GPUs' memory
    limit_s = DCGM_LIMIT_S - 300
    run = dcgm.DiagRun(level, _node_gpus(cg) or None, limit_s).start() if is_node_reader(cg) else None
    beat = heartbeat.Heartbeat(f"dcgmi diag -r {level}", unit="nodes finished", interval_s=HEARTBEAT_S,
                               enabled=cg.rank == 0)
    while True:
        finished = [f for f in cg.all_ranks(None if run is None else run.done()) if f is not None]
        if all(finished):
            break
        beat.total = len(finished)
        beat(sum(finished), note=f"stopped if not finished within {heartbeat.duration(limit_s - beat.elapsed_s())}")
        time.sleep(POLL_S)
    mine = None
    if run is not None:
        report, absent, failure = run.report()
        mine = {"command": " ".join(run.command), "absent": absent, "failure": failure,
                "version": report.version if report else None,
                "runtime_error": report.runtime_error if report else None,
                "serials": report.serials if report else {},
                "results": [r.as_dict() for r in report.results] if report else []}
    return {cg.identities[r]["node_rank"]: {"reader": r, **seen} for r, seen in enumerate(cg.all_ranks(mine))
            if seen is not None}


def _rank_of(cg: Recorder, node_rank: int, gpu: int | None, reader: int) -> int:
    for r, ident in enumerate(cg.identities):
        if ident["node_rank"] == node_rank and (ident.get("gpu") or {}).get("index") == gpu:
            return r
    return reader


DCGM_TESTS = [pytest.param(name, id=name) for name in (*dcgm.TESTS, dcgm.OTHER)]


@pytest.mark.parametrize("name", DCGM_TESTS)
@pytest.mark.time_limit(DCGM_LIMIT_S)
def test_dcgm_diagnostic(cg: Recorder, request: pytest.FixtureRequest, dcgm_reports: dict[str, Any],
                         name: str) -> None:
    """One DCGM diagnostic test (plugin) on every GPU of every node, with DCGM's own verdict and message."""
    level = request.config.getoption("dcgm_diag")
    if not level:
        cg.skip("DCGM diagnostics not requested: pass --dcgm-diag 1|2|3|4 (or set CLUSTERGATE_DCGM_DIAG)",
                fact="dcgm_not_requested", requested=None, needs=dcgm.LEVEL_OF.get(name, 1))
    needed = dcgm.LEVEL_OF.get(name, 1)
    if needed > level:
        cg.skip(f"DCGM runs {name} at --dcgm-diag {needed} and above (this run: {level})",
                fact="dcgm_not_requested", requested=level, needs=needed)
    require_device(cg, gpu_only=True)
    if "nodes" not in dcgm_reports:
        dcgm_reports["nodes"] = _run(cg, level)
    failures: dict[int, list[str]] = {}
    unreadable: dict[str, str] = {}
    rows = []
    for node_rank, seen in sorted(dcgm_reports["nodes"].items()):
        reader = seen["reader"]
        node = where_of(cg, reader).label("node")
        if seen["absent"]:
            unreadable[node] = seen["absent"]
            continue
        problem = seen["failure"] or (f"DCGM could not run: {seen['runtime_error']}" if seen["runtime_error"] else None)
        if problem:
            failures.setdefault(reader, []).append(f"{node}: {problem}. Next step: {faults.next_step('dcgm')}")
            continue
        mine = [r for r in seen["results"] if dcgm.bucket(r["test"]) == name]
        if not mine:
            unreadable[node] = (f"DCGM {seen['version'] or ''} reported no {name!r} result at -r {level} "
                                f"({seen['command']})")
            continue
        for r in mine:
            result = dcgm.DcgmResult(**{**r, "warnings": tuple(r["warnings"]), "info": tuple(r["info"])})
            owner = _rank_of(cg, node_rank, result.gpu, reader)
            who = gpu_label(cg, owner) if owner != reader or result.gpu is not None else node
            said = "; ".join(result.messages()) or "(DCGM gave no message)"
            verdict = result.verdict()  # DCGM's status, failed where an error says isolate or reset the GPU
            if verdict != result.status:
                severities = "/".join(sorted({str(dcgm.severity_name(w["error_severity"])) for w in result.severe()}))
                said = f"DCGM said {result.status.upper()}, with an error of severity {severities}: {said}"
            # "status" is the verdict here (the report's support section lists fail and warn); DCGM's own beside it
            rows.append({"where": who, "test": result.test, "dcgm_gpu": result.gpu, "status": verdict,
                         "dcgm_status": result.status, "message": said})
            if verdict in ("fail", "warn"):
                failures.setdefault(owner, []).append(
                    f"{who}: DCGM {result.test} {verdict.upper()}: {said}. "
                    f"Next step: {faults.next_step(result.fault_category())}")
        if all(row["status"] == "skip" for row in rows[-len(mine):]):  # this node's, as judged
            why = "; ".join(m for r in mine for m in r["info"])
            unreadable[node] = f"DCGM skipped {name}: {why or 'no reason given'}"
    cg.record_result(Result(metrics=(), details={"dcgm": rows, "tables": {f"DCGM {name}": rows}}))
    decide(cg, f"DCGM {name}", failures, unreadable)
