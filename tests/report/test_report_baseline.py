"""--baseline: the comparison logic, and a run compared with an earlier one."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from report_results import RESULTS
from report_runs import demo_baseline, demo_reject, results, schema_errors  # noqa: F401

from clustergate.criteria import baseline
from clustergate.report.summary import summary_lines


def scaled(factor_by_rank: dict[int, float]) -> dict[str, Any]:
    out = copy.deepcopy(RESULTS)
    for test in out["tests"]:
        for m in test["metrics"]:
            for p in m["per_rank"]:
                p["value"] *= factor_by_rank.get(p["rank"], 1.0)
            if m["per_rank"]:
                m["value"] = min(p["value"] for p in m["per_rank"])
    return out


def test_changes_beyond_tolerance_are_flagged_with_direction() -> None:
    now = scaled({3: 1.25, 1: 0.9})
    cmp = baseline.compare(now, RESULTS, tolerance=0.05, source="old/results.json")
    by = {(c["name"], c["rank"]): c for c in cmp["per_gpu"]}
    assert by[("matmul_bf16_tflops", 3)]["flagged"] and by[("matmul_bf16_tflops", 3)]["direction"] == "better"
    assert by[("matmul_bf16_tflops", 1)]["change"] == pytest.approx(-0.1)
    assert by[("matmul_bf16_tflops", 1)]["direction"] == "worse"
    assert not by[("matmul_bf16_tflops", 0)]["flagged"] and by[("matmul_bf16_tflops", 0)]["direction"] == "same"
    assert "serial SN3" in by[("matmul_bf16_tflops", 3)]["gpu"]
    metrics = {c["name"]: c for c in cmp["metrics"]}
    assert metrics["allreduce_busbw_gbps"]["flagged"] is False
    assert cmp["flagged"] == sum(c["flagged"] for c in cmp["metrics"] + cmp["per_gpu"])
    assert cmp["source"] == "old/results.json" and cmp["missing"] == [] and cmp["notes"] == []
    assert cmp["tolerance"] == 0.05


def test_gpus_are_matched_by_serial_when_ranks_are_renumbered() -> None:
    now = copy.deepcopy(RESULTS)
    hbm = now["tests"][2]["metrics"][0]
    for p in hbm["per_rank"]:  # the same GPUs, the job started in another order
        p["rank"] = 3 - p["rank"]
    for node in now["nodes"]:
        for g in node["gpus"]:
            g["rank"] = 3 - g["rank"]
    cmp = baseline.compare(now, RESULTS, 0.05)
    hbm_changes = [c for c in cmp["per_gpu"] if c["name"] == "hbm_bandwidth_tbps"]
    assert len(hbm_changes) == 4 and all(c["change"] == 0 for c in hbm_changes)


def test_lower_is_better_zero_baseline_missing_and_notes() -> None:
    then = copy.deepcopy(RESULTS)
    then["world_size"] = 8
    then["tests"].append({"nodeid": "acceptance/test_gone.py::test_gone", "outcome": "passed", "duration_s": 1,
                          "failed_ranks": [], "message": "", "metrics": [
                              {"name": "gone", "value": 1.0, "unit": "x", "scope": "world", "criterion": {},
                               "passed": True, "per_rank": []}]})
    assert baseline.direction(0.2, {"max": 10}) == "worse"
    assert baseline.direction(0.2, {}) == "changed"
    assert baseline.relative_change(1.0, 0.0) is None and baseline.relative_change(0.0, 0.0) == 0.0
    cmp = baseline.compare(RESULTS, then, 0.05)
    assert cmp["missing"] == ["acceptance/test_gone.py::test_gone::gone"]
    assert cmp["notes"] == ["world_size differs: 8 then, 4 now"]


def test_load_refuses_what_is_not_a_results_file(tmp_path: Path) -> None:
    with pytest.raises(baseline.BaselineError, match="file not found"):
        baseline.load(tmp_path / "nope.json")
    (tmp_path / "results.json").write_text(json.dumps({"schema": 2}))
    with pytest.raises(baseline.BaselineError, match="not a clustergate results.json"):
        baseline.load(tmp_path)  # a report directory is accepted too


def test_comparison_appears_in_terminal_summary() -> None:
    data = {**RESULTS, "baseline": baseline.compare(scaled({1: 0.8}), RESULTS, 0.05, source="old.json")}
    lines = summary_lines(data)
    assert any(line.startswith("baseline old.json:") and "beyond 5%" in line for line in lines)
    assert any("-20%, worse" in line for line in lines)


@pytest.mark.slow  # a torchrun job (shared by the report tests)
def test_run_with_baseline_records_and_shows_the_comparison(demo_baseline: Path) -> None:  # noqa: F811
    data = results(demo_baseline)
    assert schema_errors(data) == []
    base = data["baseline"]
    tflops = [c for c in base["per_gpu"] if c["name"] == "demo_tflops"]
    assert len(tflops) == 2 and all(c["flagged"] and c["direction"] == "better" for c in tflops)
    # rank 1's planted slow HBM in the baseline: now 2.4x faster
    hbm = next(c for c in base["per_gpu"] if c["name"] == "demo_hbm_tbps" and c["rank"] == 1)
    assert hbm["change"] > 1.0
    page = (demo_baseline / "report" / "report.html").read_text()
    assert "Against the baseline" in page and "+20%" in page
    assert "baseline " in (demo_baseline / "output.txt").read_text()


@pytest.mark.slow  # a torchrun job (shared by the report tests)
def test_unreadable_baseline_is_a_usage_error_on_every_rank(tmp_path: Path) -> None:
    from torchrun_job import run_job

    (tmp_path / "test_x.py").write_text("def test_x():\n    pass\n")
    job = run_job(tmp_path, ["test_x.py", "--baseline", str(tmp_path / "nope")], nproc=2, timeout=120)
    assert "file not found; pass the results.json of an earlier run" in job.output
    # A usage error ends every rank before any test: the bound is start-up under load (10-40 s on CI's 2 cores),
    # well under the 300 s a rank left waiting for its peers would take.
    assert job.seconds < 100
