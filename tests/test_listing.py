"""``clustergate list``: every test of a complete node and fabric run, each metric's criterion under the profile,
what the level leaves out; text and --json; described as the report's criteria table describes a criterion."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from clustergate import cli
from clustergate.manifest import shipped
from clustergate.report.model import criteria_rows
from clustergate.thresholds import load, shipped_thresholds

from torchrun_job import ROOT, job_env


def _listed(capsys: pytest.CaptureFixture[str], *args: str) -> dict:
    assert cli.main(["list", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("level", ["quick", "standard", "extended"])
def test_every_test_of_the_manifest_is_listed_once_run_or_left_out(capsys: pytest.CaptureFixture[str],
                                                                    level: str) -> None:
    listed = _listed(capsys, "--profile", "h200", "--level", level)
    manifest = shipped()
    for run in ("node", "fabric"):
        expected = [t.nodeid for t in manifest.of_run(run) if level not in t.skipped_by_design]
        assert [t["nodeid"] for t in listed["runs"][run]] == expected
    assert [t["nodeid"] for t in listed["left_out"]] == [t.nodeid for t in manifest.tests
                                                         if level in t.skipped_by_design]
    assert listed["profile"] == "h200" and listed["level"] == level and listed["manifest"] == manifest.digest


def test_each_metric_carries_the_profile_s_criterion(capsys: pytest.CaptureFixture[str]) -> None:
    profile = load(shipped_thresholds()).profile("h100-sxm-80gb")
    listed = _listed(capsys, "--profile", "h100-sxm-80gb")
    metrics = {m["name"]: m for run in listed["runs"].values() for t in run for m in t["metrics"]}
    declared = {m for t in shipped().tests for m in t.metrics}
    assert set(metrics) == declared - {m for t in shipped().tests if "standard" in t.skipped_by_design
                                       for m in t.metrics}
    bf16 = metrics["matmul_bf16_tflops"]
    criterion = profile.metrics["matmul_bf16_tflops"]
    assert bf16["bounds"] == {b.key: b.value for b in criterion.bounds} and bf16["bounds"]["min"] > 0
    assert (bf16["criterion"], bf16["unit"], bf16["severity"], bf16["scope"]) == (
        criterion.text(), "TFLOPS", criterion.severity, "gpu")
    assert bf16["source"] == criterion.source_text() and bf16["description"] == criterion.description


def test_the_text_names_each_run_its_tests_their_criteria_and_what_the_level_leaves_out(
        capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--profile", "h100-sxm-80gb", "--level", "quick"]) == 0
    out = capsys.readouterr().out
    criterion = load(shipped_thresholds()).profile("h100-sxm-80gb").metrics["matmul_bf16_tflops"]
    assert out.startswith("profile h100-sxm-80gb   level quick   a sign-off profile")
    assert "\nnode run (every node alone): " in out and "\nfabric run (two or more nodes" in out
    assert f"      matmul_bf16_tflops (gpu): {criterion.text()}   [TFLOPS, severity fail" in out
    left_out = out.split("\nleft out at level quick by design:\n", 1)[1]
    assert "  acceptance/test_finetune.py::test_lora_finetune_learns (node run): the day-2 node check" in left_out
    assert cli.main(["list", "--profile", "h100-sxm-80gb", "--level", "standard"]) == 0
    out = capsys.readouterr().out
    assert "test_lora_finetune_learns" in out and "test_lora_finetune_learns (node run)" not in out


def test_the_list_and_the_report_describe_a_criterion_alike(capsys: pytest.CaptureFixture[str]) -> None:
    profile = load(shipped_thresholds()).profile("h100-sxm-80gb")
    listed = _listed(capsys, "--profile", "h100-sxm-80gb")
    test = next(t for t in listed["runs"]["node"] if t["nodeid"].endswith("test_hbm_bandwidth"))
    metric = test["metrics"][0]
    criterion = profile.metrics[metric["name"]]
    results = {"tests": [{"nodeid": test["nodeid"], "metrics": [
        {"name": metric["name"], "scope": "gpu", "value": 3.0, "unit": metric["unit"], "passed": True,
         "criterion": criterion.as_json()}]}]}
    row, = criteria_rows(results)
    assert (row.criterion, row.source) == (metric["criterion"], metric["source"]) and row.criterion != "not judged"


def test_a_metric_the_profile_lacks_and_a_profile_that_judges_nothing_are_said(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    data = yaml.safe_load(shipped_thresholds().read_text())
    del data["profiles"]["cpu"]["metrics"]["matmul_bf16_tflops"]
    (tmp_path / "t.yaml").write_text(yaml.safe_dump(data))
    listed = _listed(capsys, "--thresholds", str(tmp_path / "t.yaml"), "--profile", "cpu")
    bf16 = next(m for t in listed["runs"]["node"] for m in t["metrics"] if m["name"] == "matmul_bf16_tflops")
    assert bf16["in_profile"] is False and "no criterion for this metric" in bf16["criterion"]
    assert cli.main(["list", "--profile", "nvidia-generic"]) == 0
    assert "not a sign-off profile: it judges nothing" in capsys.readouterr().out


@pytest.mark.parametrize("args, said", [
    (["--profile", "nope"], "no profile 'nope'; profiles are: "),
    (["--thresholds", "/nonexistent/t.yaml"], "/nonexistent/t.yaml"),
    (["--level", "long"], "argument --level: invalid choice: 'long'"),
])
def test_bad_input_is_one_line_and_status_2(capsys: pytest.CaptureFixture[str], args: list[str], said: str) -> None:
    try:
        status = cli.main(["list", *args])
    except SystemExit as exc:  # argparse's own usage error
        status = exc.code
    captured = capsys.readouterr()
    assert status == 2 and captured.out == ""
    assert captured.err.startswith("clustergate list: ") and said in captured.err
    assert len(captured.err.strip().splitlines()) == 1, captured.err


def test_the_command_lists_without_torch() -> None:
    """``clustergate list`` is for a machine without the suite's stack too: it never imports torch."""
    code = ("import sys; from clustergate.cli import main; status = main(['list', '--json']); "
            "print(status, 'torch' in sys.modules, file=sys.stderr)")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=job_env(), text=True, capture_output=True,
                          timeout=120)
    assert proc.stderr.strip() == "0 False", proc.stderr
    assert json.loads(proc.stdout)["profile"] in load(shipped_thresholds()).profiles  # this node's: test_profile_choice


def test_the_cpu_profile_is_called_a_dry_run_not_a_sign_off_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--profile", "cpu"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "a dry-run profile (no GPU): CPU ranks rehearse the flow, they sign off no GPU node" in first
    assert "a sign-off profile" not in first
    assert _listed(capsys, "--profile", "cpu")["dry_run"] is True
    assert _listed(capsys, "--profile", "h200")["dry_run"] is False


def test_a_reader_that_closes_the_pipe_early_is_told_list_writes_no_file() -> None:
    """`clustergate list | head`: one line, exit 2 (the contract's rule for a closed pipe), and no claim of files
    written, for list writes none."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the command prints anything (as `| head -0`)
    proc = subprocess.run([sys.executable, "-m", "clustergate", "list"], cwd=ROOT, env=job_env(), stdout=write,
                          stderr=subprocess.PIPE, text=True, timeout=120)
    os.close(write)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines() == [
        "clustergate list: the output was closed before the listing was printed whole (broken pipe); list writes no "
        "file: run it without the pipe, or keep it with --json > FILE"]
