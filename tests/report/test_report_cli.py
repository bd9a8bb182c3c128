"""clustergate render: re-render a recorded run, re-judge it, compare it."""

from __future__ import annotations

import copy
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from complete_runs import NODE_TESTS, complete
from report_results import RESULTS
from report_runs import DATA, demo_reject, results, schema_errors  # noqa: F401

from clustergate.criteria.thresholds import load
from clustergate.record.rejudge import rejudge

from torchrun_job import ROOT, clustergate_args, job_env


def report_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(clustergate_args(*args), cwd=ROOT, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)


def test_rejudge_replaces_metric_failures_and_keeps_other_failures(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_text(
        "schema: 1\nfallback_profile: loose\ncpu_profile: loose\nprofiles:\n  loose:\n    metrics:\n"
        "      matmul_bf16_tflops: {min: 500}\n      allreduce_busbw_gbps: {min: 400}\n"
        "      hbm_bandwidth_tbps: {min: 2}\n")
    recorded = copy.deepcopy(RESULTS)
    recorded["tests"][1]["outcome"] = "failed"
    recorded["tests"][1]["message"] = "[call] failed on 1/4 ranks: 2\n--- rank 2 (node-1) ---\nTraceback: boom"
    recorded["tests"][1]["problems"] = [recorded["tests"][1]["message"]]
    out = rejudge(recorded, load(tmp_path / "t.yaml").profile("loose"))
    bf16, allreduce, hbm = out["tests"]
    assert bf16["outcome"] == "passed" and bf16["message"] == "" and bf16["failed_ranks"] == []
    assert allreduce["outcome"] == "failed" and "Traceback: boom" in allreduce["message"]
    assert "allreduce_busbw_gbps=371 GB/s, expected >= 400" in allreduce["message"]
    assert hbm["outcome"] == "passed"
    assert out["verdict"] == "reject" and out["rejudged"]["original_profile"] == "h100-sxm-80gb"
    assert out["profile"] == "loose" and schema_errors(out) == []
    assert RESULTS["tests"][0]["outcome"] == "failed"  # the input is not modified


def test_a_failure_recorded_without_problems_is_kept_whole(tmp_path: Path) -> None:
    """A results.json written before tests kept their problems: its failures never turn into passes."""
    (tmp_path / "t.yaml").write_text(
        "schema: 1\nfallback_profile: loose\ncpu_profile: loose\nprofiles:\n  loose:\n    metrics:\n"
        "      matmul_bf16_tflops: {min: 500}\n      allreduce_busbw_gbps: {}\n      hbm_bandwidth_tbps: {}\n")
    older = copy.deepcopy(RESULTS)
    for test in older["tests"]:
        del test["problems"]
    bf16 = rejudge(older, load(tmp_path / "t.yaml").profile("loose"))["tests"][0]
    assert bf16["outcome"] == "failed" and bf16["message"] == RESULTS["tests"][0]["message"]
    assert bf16["metrics"][0]["passed"]  # the figures are judged anew all the same


@pytest.mark.slow  # a torchrun job (shared by the report tests)
def test_rerender_reproduces_the_recorded_report(demo_reject: Path, tmp_path: Path) -> None:  # noqa: F811
    out = tmp_path / "again.html"
    proc = report_cli(str(demo_reject / "report" / "results.json"), "-o", str(out))
    assert proc.returncode == 1, proc.stdout  # the recorded verdict is reject
    # The verdict line and where the report is: none of the drawing session's own output (its progress, pytest's
    # warnings, the page's path in the private directory it was drawn in and that is gone by now).
    verdict, where = proc.stdout.splitlines()
    assert verdict.startswith("REJECT   profile cpu") and where == f"report: {out}", proc.stdout
    page = out.read_text()
    assert 'class="cg-verdict">REJECT<' in page and "demo_hbm_tbps" in page
    for test in results(demo_reject)["tests"]:
        assert test["nodeid"] in page
    assert page.count("data:image/png;base64,") >= 6  # summary figures and per-test extras


@pytest.mark.slow  # a torchrun job (shared by the report tests)
def test_rejudge_and_compare_from_the_command_line(demo_reject: Path, tmp_path: Path) -> None:  # noqa: F811
    loose = tmp_path / "loose.yaml"
    text = (DATA / "thresholds.yaml").read_text()
    loose.write_text(text.replace("demo_hbm_tbps: {min: 2.0", "demo_hbm_tbps: {min: 1.0"))
    recorded = demo_reject / "report" / "results.json"
    proc = report_cli(str(recorded), "--thresholds", str(loose), "--baseline", str(recorded),
                      "--json-out", str(tmp_path / "rejudged.json"), "-o", str(tmp_path / "r.html"))
    # Every test passes under the looser profile; the demo is not the acceptance suite, so it stays partial.
    assert proc.returncode == 1, proc.stdout
    data = json.loads((tmp_path / "rejudged.json").read_text())
    assert {t["outcome"] for t in data["tests"]} == {"passed"} and data["rejudged"]["original_verdict"] == "reject"
    assert data["verdict"] == "partial"
    assert f"{NODE_TESTS} of the {NODE_TESTS} tests of a complete node run did not run" in data["reason"]
    assert data["baseline"]["flagged"] == 0 and schema_errors(data) == []
    page = (tmp_path / "r.html").read_text()
    assert 'class="cg-verdict">PARTIAL<' in page and "re-judged" in page


def test_bad_input_is_exit_2(tmp_path: Path) -> None:
    proc = report_cli(str(tmp_path / "missing.json"))
    assert proc.returncode == 2 and "file not found" in proc.stdout


def test_a_file_that_is_not_a_results_json_is_refused_with_one_error(tmp_path: Path) -> None:
    broken = copy.deepcopy(RESULTS)
    broken["tests"][0]["outcome"] = "sort of"
    path = tmp_path / "results.json"
    path.write_text(json.dumps(broken))
    proc = report_cli(str(path))
    assert proc.returncode == 2
    assert proc.stdout.strip().splitlines() == [
        f"clustergate render: {path}: not a valid results.json (results.schema.json): at tests/0/outcome: "
        '"sort of" is not one of "passed", "failed", "skipped", "error", "interrupted"']
    (tmp_path / "nothing.json").write_text("{not json")
    assert "not readable JSON" in report_cli(str(tmp_path / "nothing.json")).stdout


@pytest.mark.parametrize(("change", "expected"), [
    ({"verdict": "accept"}, "reject"),  # a test failed: the recorded accept is not taken on trust
    ({"verdict": "running", "tests": "passing"}, "reject"),  # never finished
    ({"verdict": "reject", "tests": "passing"}, "accept"),  # the rule, not the record, decides
])
def test_the_verdict_is_computed_again_and_sets_the_exit_status(tmp_path: Path, change: dict[str, Any],
                                                                 expected: str) -> None:
    recorded = copy.deepcopy(RESULTS)
    if change.pop("tests", None) == "passing":
        for test in recorded["tests"]:
            test.update(outcome="passed", message="", failed_ranks=[], problems=[], metrics=[])
    complete(recorded)  # every other test of a node run, skipped: a complete run
    # What a run records of its thresholds: an accept stands only for a run judged by the shipped ones.
    shipped = load(ROOT / "thresholds.yaml").profile(recorded["profile"]).run_digest
    recorded["clustergate"] = {"version": "0.1.0", "code_digest": "0" * 16, "thresholds_digest": shipped}
    recorded.update(change)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(recorded))
    proc = report_cli(str(path), "--json-out", str(tmp_path / "out.json"), "-o", str(tmp_path / "r.html"))
    assert json.loads((tmp_path / "out.json").read_text())["verdict"] == expected, proc.stdout
    assert proc.returncode == (0 if expected == "accept" else 1)
    if recorded["verdict"] != expected:
        assert f"the recorded verdict {recorded['verdict']!r} is not what its records say: {expected!r}" in proc.stdout
