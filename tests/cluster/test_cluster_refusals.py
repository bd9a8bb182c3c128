"""A refused command changes nothing: merge and signoff check their whole command line and inputs before they
touch an output, and move an earlier result aside only when a new one is about to be written (saying where).
A merge of node runs judged by a site profile, without that profile's thresholds, is such a refusal (exit 2, one
line naming what judged them), not a fleet drained node by node; an excluded node's evidence bundle says why.

Real commands as subprocesses, on node files as a run writes them (tests/helpers/cluster_runs.py).
"""

from __future__ import annotations

import json
import shutil
import tarfile
from pathlib import Path

import pytest
import yaml
from cluster_runs import fabric_results, node_results, write_fabric, write_node
from dir_bytes import tree
from test_cluster_outputs import _merge, _run, cli

from clustergate.criteria.thresholds import load

from torchrun_job import ROOT


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run directory merged and signed off (every output of both there), copied by each test."""
    run = _run(tmp_path_factory.mktemp("signed"))
    assert _merge(run).returncode == 0
    write_fabric(run, fabric_results(["gpu1", "gpu2"], run.name))
    assert cli("signoff", str(run)).returncode == 0
    return run


@pytest.fixture
def run(signed: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(signed, tmp_path / "run-1"))


def _typo(run: Path) -> str:
    return str(run.parent / "typo.yaml")


REFUSED = {
    "merge, a thresholds file that is not there": (lambda run: ("merge", "--thresholds", _typo(run)), "typo.yaml"),
    "merge, a broken host list": (lambda run: ("merge", "--expect-hosts", "gpu[1-2"), "gpu[1-2"),
    "merge, an unknown profile": (lambda run: ("merge", "--profile", "h900"), "--profile h900"),
    "merge, a bad option value": (lambda run: ("merge", "--window", "-1"), "--window"),
    "signoff, a thresholds file that is not there": (lambda run: ("signoff", "--thresholds", _typo(run)),
                                                     "typo.yaml"),
    "signoff, a fabric results.json that is not JSON": (lambda run: ("signoff", "--fabric", _broken(run)),
                                                        "fabric phase's results.json"),
    "signoff, a site key that is not there": (lambda run: ("signoff", "--key-file", str(run.parent / "no.key")),
                                              "no.key"),
}


def _broken(run: Path) -> str:
    """A fabric directory (outside the run's) whose results.json was cut short."""
    fabric = run.parent / "fabric-cut"
    fabric.mkdir(exist_ok=True)
    (fabric / "results.json").write_text('{"schema": 1, "verdict": "acc')
    return str(fabric)


@pytest.mark.parametrize("case", list(REFUSED))
def test_a_refused_command_line_leaves_every_output_byte_for_byte(run: Path, case: str) -> None:
    args, said = REFUSED[case]
    command, *rest = args(run)
    before = tree(run)
    proc = _merge(run, *rest) if command == "merge" else cli("signoff", str(run), *rest)
    assert proc.returncode == 2, proc.stdout
    assert said in proc.stdout and "Traceback" not in proc.stdout, proc.stdout
    assert len(proc.stdout.strip().splitlines()) == 1, proc.stdout
    assert tree(run) == before  # not one byte written, moved or removed: no earlier/ either
    assert not (run / "earlier").exists()


def test_a_merge_refused_into_a_new_directory_makes_none(run: Path) -> None:
    out = run.parent / "elsewhere"
    proc = cli("merge", *sorted(str(p) for p in (run / "nodes").iterdir()), "-o", str(out), "--expect-hosts",
               "gpu[1-2")
    assert proc.returncode == 2, proc.stdout
    assert not out.exists()


def test_a_rerun_moves_the_earlier_outputs_aside_and_says_where(run: Path) -> None:
    before = tree(run)
    signed = cli("signoff", str(run))
    assert signed.returncode == 0, signed.stdout
    [kept] = (run / "earlier").iterdir()
    assert f"clustergate signoff: the earlier outputs in {run} were moved to {kept}" in signed.stdout.splitlines()
    assert {p.name for p in kept.iterdir()} >= {"signoff.json", "signoff.html", "signoff-accepted-hostlist.txt"}
    assert tree(kept)["signoff.json"] == before["signoff.json"]  # kept whole
    merged = _merge(run)
    assert merged.returncode == 0, merged.stdout
    second = next(p for p in (run / "earlier").iterdir() if p != kept)
    assert f"clustergate merge: the earlier outputs in {run} were moved to {second}" in merged.stdout.splitlines()
    for name in ("results.json", "report.html", "metrics.prom", "accepted-hosts.txt", "accepted-hostlist.txt"):
        assert tree(second)[name] == before[name], name


# ---- a merge without the site's thresholds -------------------------------------------------------------------

@pytest.fixture
def site_run(tmp_path: Path) -> tuple[Path, Path]:
    """Two node runs judged by a site profile (a stricter HBM bound under the shipped profile's name, as a site's
    own thresholds file holds it) that pass it, and that file."""
    data = yaml.safe_load((ROOT / "thresholds.yaml").read_text())
    shipped = data["profiles"]["h100-sxm-80gb"]
    shipped.setdefault("metrics", {})["hbm_bandwidth_tbps"] = {"min": 2.0, "outlier_fraction": 0.8}
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(data))
    profile = load(site).profile("h100-sxm-80gb")
    run = tmp_path / "run-1"
    for i, host in enumerate(("gpu1", "gpu2")):
        write_node(run / "nodes", host, node_results(host, i + 1, profile=profile))
    return run, site


def test_a_merge_without_the_site_thresholds_exits_2_and_writes_nothing(site_run: tuple[Path, Path]) -> None:
    run, site = site_run
    before = tree(run)
    proc = _merge(run)
    assert proc.returncode == 2, proc.stdout
    [line] = proc.stdout.strip().splitlines()
    digest = load(site).profile("h100-sxm-80gb").run_digest
    assert f"profile 'h100-sxm-80gb' (digest {digest}, 2 runs)" in line and "--thresholds FILE" in line, line
    assert tree(run) == before
    signoff = cli("signoff", str(run))  # no merge there: refused as before, writing nothing either
    assert signoff.returncode == 2 and tree(run) == before
    proc = _merge(run, "--thresholds", str(site))
    assert proc.returncode == 0, proc.stdout  # given the file they ran under, the fleet is accepted
    merged = json.loads((run / "results.json").read_text())
    assert merged["accepted"] == ["gpu1", "gpu2"] and merged["thresholds"] == str(site)


def test_a_signoff_without_the_site_thresholds_exits_2_naming_them(site_run: tuple[Path, Path]) -> None:
    """The same rule, the merge's, when the sign-off alone is not given the file."""
    run, site = site_run
    assert _merge(run, "--thresholds", str(site)).returncode == 0
    write_fabric(run, fabric_results(["gpu1", "gpu2"], run.name))
    before = tree(run)
    proc = cli("signoff", str(run))
    assert proc.returncode == 2, proc.stdout
    assert "the node runs were judged by profile 'h100-sxm-80gb' (digest" in proc.stdout, proc.stdout
    assert tree(run) == before


# ---- an exclusion's evidence bundle --------------------------------------------------------------------------

def test_an_excluded_nodes_evidence_bundle_names_its_reason(tmp_path: Path) -> None:
    """gpu3's own run accepts it, but it is not an expected host: its bundle must say so, not "No failure"."""
    run = _run(tmp_path, ("gpu1", "gpu2", "gpu3"))
    proc = _merge(run, "--expect-hosts", "gpu[1-2]")
    assert proc.returncode == 1, proc.stdout
    merged = json.loads((run / "results.json").read_text())
    [entry] = merged["excluded"]
    assert entry["host"] == "gpu3" and entry["evidence"], entry
    with tarfile.open(run / entry["evidence"]) as tar:
        summary = tar.extractfile("gpu3/summary.txt").read().decode()  # type: ignore[union-attr]
        manifest = json.loads(tar.extractfile("gpu3/MANIFEST.json").read())  # type: ignore[union-attr]
    assert "Excluded because:\n  not an expected host (--expect-hosts)" in summary, summary
    assert "No failure recorded by its own run." in summary, summary
    assert manifest["excluded_because"] == entry["reasons"]
