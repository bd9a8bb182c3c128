"""A site profile against the shipped one: ``clustergate list`` names per criterion where it is looser, drops or
demotes a criterion; a criterion for a metric no test records is refused in one line; a shipped profile weakens
nothing. (The sign-off's side: tests/cluster/test_cluster_signoff.py; calibrate's floor:
tests/criteria/test_calibrate.py.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import looser_site
import pytest

from clustergate.criteria.against_shipped import shipped_profile, weakenings
from clustergate.criteria.thresholds import load, shipped_thresholds
from clustergate.trust.known_metrics import unknown_metric

from torchrun_job import ROOT, job_env


def clustergate(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clustergate", *args], cwd=ROOT, env=job_env(), text=True,
                          capture_output=True, timeout=120)


def test_shipped_profiles_weaken_nothing_and_name_only_recorded_metrics() -> None:
    shipped = load(shipped_thresholds())
    assert all(shipped_profile(p) is p and weakenings(p) == [] for p in shipped.profiles.values())
    assert unknown_metric(shipped) is None


def test_a_looser_profile_holds_to_the_shipped_profile_it_extends(tmp_path: Path) -> None:
    site = load(looser_site.write(tmp_path / "site.yaml"))
    profile = site.profile(looser_site.NAME)
    assert shipped_profile(profile).name == looser_site.SHIPPED  # type: ignore[union-attr]
    order = list(load(shipped_thresholds()).profile(looser_site.SHIPPED).metrics)  # the shipped profile's order
    assert [w.text() for w in weakenings(profile)] == sorted(looser_site.SAID,
                                                             key=lambda said: order.index(said.split(":")[0]))
    # The copies of the shipped profiles in the site file, unedited, weaken nothing.
    assert weakenings(site.profile(looser_site.SHIPPED)) == []


def test_list_names_each_looser_criterion(tmp_path: Path) -> None:
    site = looser_site.write(tmp_path / "site.yaml")
    proc = clustergate("list", "--thresholds", str(site), "--profile", looser_site.NAME)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.splitlines()
    assert f"LOOSER THAN SHIPPED: 3 criteria of profile {looser_site.NAME} ask less than the shipped profile:" in lines
    for said in looser_site.SAID:
        assert f"  {said}" in lines, said
    hbm = next(line for line in lines if line.strip().startswith("hbm_bandwidth_tbps (gpu):"))
    assert hbm.endswith(f"LOOSER THAN SHIPPED: {looser_site.SAID[0]}")
    listed = json.loads(clustergate("list", "--thresholds", str(site), "--profile", looser_site.NAME,
                                    "--json").stdout)
    assert {(w["metric"], w["kind"]) for w in listed["looser_than_shipped"]} == {
        ("hbm_bandwidth_tbps", "looser"), ("matmul_bf16_tflops", "demoted"), ("d2h_bandwidth_gbps", "dropped")}
    shipped = clustergate("list", "--profile", looser_site.SHIPPED)
    assert shipped.returncode == 0 and "LOOSER" not in shipped.stdout


def test_a_criterion_for_a_metric_no_test_records_is_refused_in_one_line(tmp_path: Path) -> None:
    site = looser_site.write(tmp_path / "site.yaml", {"matmul_bf16_tflop": {"min": 800}})
    proc = clustergate("list", "--thresholds", str(site), "--profile", looser_site.NAME)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr == (f"clustergate list: {site}: profiles.{looser_site.NAME}.metrics.matmul_bf16_tflop: no test "
                           "of the suite records 'matmul_bf16_tflop': did you mean matmul_bf16_tflops or "
                           "matmul_fp16_tflops or matmul_fp8_tflops? name a metric the suite records (clustergate "
                           "list shows them), or remove it\n")


@pytest.mark.parametrize("command", ["merge", "signoff", "calibrate"])
def test_merge_signoff_and_calibrate_refuse_it_too(tmp_path: Path, command: str) -> None:
    site = looser_site.write(tmp_path / "site.yaml", {"warp_speed": {"min": 1}})
    args = {"merge": ["merge", str(tmp_path), "-o", str(tmp_path / "out")], "signoff": ["signoff", str(tmp_path)],
            "calibrate": ["calibrate", str(tmp_path / "r.json"), "--extends", looser_site.NAME]}[command]
    if command == "calibrate":
        (tmp_path / "r.json").write_text("{}")
    proc = clustergate(*args, "--thresholds", str(site))
    assert proc.returncode == 2, proc.stderr
    assert "metrics.warp_speed: no test of the suite records 'warp_speed'" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_an_edited_bound_cites_the_file_that_set_it(tmp_path: Path) -> None:
    """A criterion the site file edits without a source of its own cites the file (source ``site``), not the
    shipped source it inherited or copied; one it gives its own source keeps it; an unedited one keeps the
    shipped citation."""
    from clustergate.criteria.sources import Source

    site = looser_site.write(tmp_path / "site.yaml", {"h2d_bandwidth_gbps": {"min": 60, "source": "spec"}})
    profile = load(site).profile(looser_site.NAME)
    shipped = load(shipped_thresholds()).profile(looser_site.SHIPPED)
    assert shipped.metrics["hbm_bandwidth_tbps"].source is not None  # it had a citation to lose
    for edited in ("hbm_bandwidth_tbps", looser_site.DEMOTED):
        assert profile.metrics[edited].source == Source("site", (("note", f"set by {site}"),)), edited
        assert profile.metrics[edited].source_text() == f"site (set by {site})"
    assert profile.metrics["h2d_bandwidth_gbps"].source == Source("spec")
    assert profile.metrics["gpu_count"].source == shipped.metrics["gpu_count"].source


def test_the_runs_summary_says_each_looser_criterion(tmp_path: Path) -> None:
    """What a run under the looser profile records (results.json ``looser_than_shipped``, as the run sets it from
    ``weakenings``) the terminal summary says, after the verdict line, per criterion."""
    from cluster_runs import node_results

    from clustergate.report.summary import summary_lines

    profile = load(looser_site.write(tmp_path / "site.yaml")).profile(looser_site.NAME)
    results = {**node_results("solo", 1, profile=profile),
               "looser_than_shipped": [w.as_json() for w in weakenings(profile)]}
    lines = summary_lines(results)
    assert lines[1] == (f"LOOSER THAN SHIPPED: profile {looser_site.NAME} asks less than shipped {looser_site.SHIPPED} "
                        "in 3 criteria (results.json looser_than_shipped):")
    assert "  hbm_bandwidth_tbps: looser (min -5 where shipped has >= 2.7)" in lines
    assert "  matmul_bf16_tflops: demoted (severity warn where shipped fails the test)" in lines
