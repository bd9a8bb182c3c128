"""``clustergate list``: every test of a complete node and fabric run, each metric's criterion under the profile,
what the level leaves out; text and --json; described as the report's criteria table describes a criterion."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from fleet_data import later, real_run

from clustergate import cli
from clustergate.criteria.thresholds import load, shipped_thresholds
from clustergate.report.model import criteria_rows
from clustergate.run.durations import Key, Shape, reference
from clustergate.run.limits import TEST_LIMIT_S
from clustergate.run.testlimit import measured_limit
from clustergate.store import Store
from clustergate.trust.manifest import shipped

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


def test_each_test_s_limit_is_listed_with_where_it_comes_from(capsys: pytest.CaptureFixture[str],
                                                              tmp_path: Path) -> None:
    """The limit a run of that profile, level and shape gives each test (clustergate.run.testlimit), as the run's
    results.json records it: its own, else its measured time, else the level's."""
    listed = _listed(capsys, "--profile", "cpu", "--level", "quick")
    assert listed["shape"] == "1x2" and listed["store"] is None
    node = {t["nodeid"]: t for t in listed["runs"]["node"]}
    hbm = node["acceptance/test_gpu_compute.py::test_hbm_bandwidth"]
    known = reference(Key("cpu", "quick", Shape(1, 2)))["acceptance/test_gpu_compute.py::test_hbm_bandwidth"]
    assert hbm["limit"] == {"seconds": measured_limit(known.seconds), "source": "reference",
                            "healthy_s": known.seconds, "measured": known.where}
    gpu_only = node["acceptance/test_gpu_inventory.py::test_gpu_count"]["limit"]  # skips on CPU: never measured
    assert (gpu_only["seconds"], gpu_only["source"]) == (TEST_LIMIT_S["quick"], "level")
    dcgm = node["acceptance/test_dcgm.py::test_dcgm_diagnostic[memory]"]["limit"]
    assert dcgm["source"] == "marker" and dcgm["seconds"] == 3 * 3600
    # the sustained matmul's own limit holds at extended only, where it holds the profile's burn-in
    sustained = "acceptance/test_gpu_compute.py::test_sustained_matmul"
    assert node[sustained]["limit"]["source"] == "reference"
    extended = {t["nodeid"]: t for t in _listed(capsys, "--profile", "cpu", "--level", "extended")["runs"]["node"]}
    assert extended[sustained]["limit"] == {"seconds": 3600, "source": "marker", "healthy_s": None, "measured": ""}
    # another shape was not measured: the level's limit, said as such
    three = _listed(capsys, "--profile", "cpu", "--level", "quick", "--nproc-per-node", "3")["runs"]["node"]
    assert next(t for t in three if t["nodeid"] == hbm["nodeid"])["limit"]["measured"] == (
        "no measured time for profile cpu, level quick, 1 node x 3 ranks")
    h200 = _listed(capsys, "--profile", "h200", "--level", "standard")
    assert h200["shape"] == "1x8"
    # the text says it beside each test
    assert cli.main(["list", "--profile", "cpu", "--level", "quick"]) == 0
    out = capsys.readouterr().out
    assert "time limits on 1 node x 2 ranks\n" in out
    assert (f"  {hbm['nodeid']}\n      limit {measured_limit(known.seconds):g} s: 3 x its healthy {known.seconds:g} "
            f"s, at least 60 s ({known.where})\n") in out
    assert cli.main(["list", "--profile", "cpu", "--nodes", "0"]) == 2
    assert "--nodes and --nproc-per-node must be whole numbers >= 1" in capsys.readouterr().err


def test_the_store_refines_the_listed_limits(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    store = Store(tmp_path / "fleet.db", timeout_s=5)
    hbm = "acceptance/test_gpu_compute.py::test_hbm_bandwidth"
    for day in (1, 2, 3):
        run = later(real_run(), f"2027-01-0{day}T00:00:00+00:00")
        next(t for t in run["tests"] if t["nodeid"] == hbm)["duration_s"] = 30.0 + day
        store.record(run)
    listed = _listed(capsys, "--profile", "cpu", "--level", "quick", "--store", str(tmp_path / "fleet.db"))
    limit = next(t for t in listed["runs"]["node"] if t["nodeid"] == hbm)["limit"]
    assert limit == {"seconds": 99.0, "source": "store", "healthy_s": 33.0,
                     "measured": "store: 3 accepted runs to 2027-01-03"}
    assert listed["store"] == str(tmp_path / "fleet.db")
    assert cli.main(["list", "--profile", "cpu", "--store", str(tmp_path)]) == 2
    assert "a directory" in capsys.readouterr().err


def test_the_cpu_profile_is_called_a_dry_run_not_a_sign_off_profile(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["list", "--profile", "cpu"]) == 0
    first = capsys.readouterr().out.splitlines()[0]
    assert "a dry-run profile (no GPU): CPU ranks rehearse the flow, they sign off no GPU node" in first
    assert "a sign-off profile" not in first
    assert _listed(capsys, "--profile", "cpu")["dry_run"] is True
    assert _listed(capsys, "--profile", "h200")["dry_run"] is False
