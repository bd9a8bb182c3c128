"""Issue 23: one verdict rule for every command that reads a stored verdict, black-box.

Each forged or broken node file below still says "accept". The merge, the sign-off and the re-render
command must each refuse it or judge it again from its records by the run's own rule
(``clustergate.verdict.of_record``): never an accept, always one clear line, never a traceback. Host
names are identities: a file whose host is not its directory's, a directory whose name is not a node
name, or a host outside --expect-hosts never reaches an accepted list. Outputs never overwrite inputs.
"""

from __future__ import annotations

import copy
import json
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cluster_runs import node_results, write_node

from torchrun_job import ROOT, job_env

Forgery = Callable[[dict[str, Any]], Any]


def cli(*args: str) -> subprocess.CompletedProcess[str]:
    # Hang guard only: each command reads a few files and draws one page (seconds on CI's 2 busy cores).
    return subprocess.run([sys.executable, "-m", "clustergate.report", *args], cwd=ROOT, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)


def _metric(res: dict[str, Any], name: str) -> dict[str, Any]:
    return next(m for t in res["tests"] for m in t["metrics"] if m["name"] == name)


def _slow_gpu_marked_passed(res: dict[str, Any]) -> None:
    """GPU 3's bf16 figure far below 700 TFLOPS, every flag still saying passed."""
    m = _metric(res, "matmul_bf16_tflops")
    m["per_rank"][3]["value"] = 100.0


def _too_few_tests(res: dict[str, Any]) -> None:
    res["selection"] = {"k": None, "m": None, "level": "standard", "selected": len(res["tests"]) + 3,
                        "deselected": 0}


def _failed_metric_in_passed_test(res: dict[str, Any]) -> None:
    _metric(res, "hbm_bandwidth_tbps")["passed"] = False


def _error_kept_with_accept(res: dict[str, Any]) -> None:
    res["error"] = "SIGTERM on rank 3 (gpu7)"


def _no_tests(res: dict[str, Any]) -> None:
    res["tests"] = []


def _all_skipped(res: dict[str, Any]) -> None:
    for t in res["tests"]:
        t.update(outcome="skipped", metrics=[])


def _no_outcome(res: dict[str, Any]) -> None:
    del res["tests"][0]["outcome"]


def _unknown_schema(res: dict[str, Any]) -> None:
    res["schema"] = 2


def _value_not_a_number(res: dict[str, Any]) -> None:
    _metric(res, "matmul_bf16_tflops")["per_rank"][0]["value"] = "fast"


def _criterion_lowered(res: dict[str, Any]) -> None:
    """GPU 3 at 100 TFLOPS, and the stored minimum lowered to 50 so that the records pass it."""
    m = _metric(res, "matmul_bf16_tflops")
    m["per_rank"][3]["value"] = 100.0
    m["value"] = 100.0
    m["criterion"]["min"] = 50.0


def _other_thresholds(res: dict[str, Any]) -> None:
    res["clustergate"]["thresholds_digest"] = "0123456789abcdef"


def _no_thresholds_digest(res: dict[str, Any]) -> None:
    del res["clustergate"]


def _profile_not_in_thresholds(res: dict[str, Any]) -> None:
    res["profile"] = "h100-site-calibrated"


FORGERIES: dict[str, tuple[Forgery, str]] = {
    # name: (forgery, what the merge's reason says)
    "metric-passed-below-min": (_slow_gpu_marked_passed, "records contradict the stored verdict accept: "),
    "failed-metric-passed-test": (_failed_metric_in_passed_test, "stored as failed, but its test is stored as passed"),
    "fewer-tests-than-selected": (_too_few_tests, "selected tests"),
    "error-with-accept": (_error_kept_with_accept, "SIGTERM on rank 3"),
    "zero-tests": (_no_tests, "no test ran"),
    "all-skipped": (_all_skipped, "skipped: nothing was measured"),
    "test-without-outcome": (_no_outcome, "not a valid results.json"),
    "unknown-schema-version": (_unknown_schema, "not a valid results.json"),
    "value-not-a-number": (_value_not_a_number, "not a valid results.json"),
    "criterion-lowered": (_criterion_lowered, "the file was edited after the run: "),
    "other-thresholds": (_other_thresholds, "it was judged by other thresholds than profile 'h100-sxm-80gb'"),
    "no-thresholds-digest": (_no_thresholds_digest, "does not say which thresholds judged it"),
    "profile-not-in-thresholds": (_profile_not_in_thresholds, "which "),
}
RAW_FILES: dict[str, tuple[bytes, str]] = {
    "nan": (b'{"schema": 1, "verdict": "accept", "duration_s": NaN}', "NaN is not a number JSON allows"),
    "binary": (b"\x89PNG\r\n\x1a\n\x00\x00\xff\xfe", "not text"),
    "deep-nesting": (b'{"schema": 1, "verdict": "accept", "details": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
                     "nested deeper"),
    "not-an-object": (b"[1, 2, 3]", "not a valid results.json"),
}


@pytest.fixture(scope="module")
def good() -> dict[str, Any]:
    return node_results("gpu2", 2)


def _forged_run(tmp_path: Path, good: dict[str, Any], forge: Forgery | None = None,
                raw: bytes | None = None) -> Path:
    """nodes/gpu1 healthy; nodes/gpu2 forged (or raw bytes); returns the nodes directory."""
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    forged = copy.deepcopy(good)
    if forge is not None:
        forge(forged)
    directory = write_node(nodes, "gpu2", forged)
    if raw is not None:
        (directory / "results.json").write_bytes(raw)
    return nodes


def _assert_gpu2_excluded(tmp_path: Path, proc: subprocess.CompletedProcess[str], says: str) -> None:
    assert proc.returncode == 1, proc.stdout
    assert "Traceback" not in proc.stdout
    assert (tmp_path / "run" / "accepted-hosts.txt").read_text() == "gpu1\n"
    [line] = (tmp_path / "run" / "excluded-hosts.txt").read_text().splitlines()
    assert line.startswith("gpu2\t") and says in line, line
    cluster = json.loads((tmp_path / "run" / "results.json").read_text())
    assert cluster["verdict"] == "reject" and cluster["accepted"] == ["gpu1"]


@pytest.mark.parametrize("name", list(FORGERIES))
def test_merge_recomputes_every_node_verdict_from_its_records(tmp_path: Path, good: dict[str, Any], name: str) -> None:
    forge, says = FORGERIES[name]
    nodes = _forged_run(tmp_path, good, forge)
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run"))
    _assert_gpu2_excluded(tmp_path, proc, says)


@pytest.mark.parametrize("name", list(RAW_FILES))
def test_merge_excludes_a_file_that_is_not_strict_results_json(tmp_path: Path, good: dict[str, Any],
                                                                name: str) -> None:
    raw, says = RAW_FILES[name]
    nodes = _forged_run(tmp_path, good, raw=raw)
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run"))
    _assert_gpu2_excluded(tmp_path, proc, says)


@pytest.mark.parametrize("name", [*FORGERIES, *RAW_FILES])
def test_the_rerender_command_never_accepts_a_forged_file(tmp_path: Path, good: dict[str, Any], name: str) -> None:
    nodes = _forged_run(tmp_path, good, *((FORGERIES[name][0],) if name in FORGERIES else (None, RAW_FILES[name][0])))
    proc = cli(str(nodes / "gpu2" / "results.json"), "-o", str(tmp_path / "r.html"))
    assert proc.returncode in (1, 2), proc.stdout  # 1: judged again, not accepted; 2: refused as unusable
    assert "Traceback" not in proc.stdout
    if proc.returncode == 2:
        assert len(proc.stdout.strip().splitlines()) == 1, proc.stdout


def test_a_host_that_is_not_its_directory_is_excluded(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    write_node(nodes, "gpu2", node_results("gpu7", 2))  # gpu7's accepting file copied into gpu2's directory
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run"))
    _assert_gpu2_excluded(tmp_path, proc, "names host 'gpu7', not 'gpu2' (its directory)")


def test_a_host_name_with_a_newline_never_forges_a_line(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    write_node(nodes, "gpu2\ngpu9", node_results("gpu2\ngpu9", 2))
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2\ngpu9"), "-o", str(tmp_path / "run"))
    assert proc.returncode == 1 and "Traceback" not in proc.stdout, proc.stdout
    assert (tmp_path / "run" / "accepted-hosts.txt").read_text() == "gpu1\n"
    [line] = (tmp_path / "run" / "excluded-hosts.txt").read_text().splitlines()
    assert line.startswith("gpu2\\ngpu9\t") and "is not a node name" in line


def test_a_host_outside_the_expected_list_is_excluded(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    for i, host in enumerate(["gpu1", "gpu2"]):
        write_node(nodes, host, node_results(host, i))
    proc = cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run"), "--expect-hosts", "gpu1")
    _assert_gpu2_excluded(tmp_path, proc, "not an expected host")


def test_signoff_does_not_take_the_merged_lists_on_trust(tmp_path: Path) -> None:
    """The merged results.json edited to accept a node its own directory rejects: not signed off."""
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    write_node(nodes, "gpu2", node_results("gpu2", 2, {("hbm_bandwidth_tbps", 1): 0.5}))
    assert cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run")).returncode == 1
    path = tmp_path / "run" / "results.json"
    cluster = json.loads(path.read_text())
    cluster.update(verdict="accept", accepted=["gpu1", "gpu2"], excluded=[], excluded_hostlist="")
    for node in cluster["nodes"]:
        node.update(status="accepted", verdict="accept", reasons=[])
    path.write_text(json.dumps(cluster))
    proc = cli("signoff", str(tmp_path / "run"))
    assert proc.returncode == 1 and "Traceback" not in proc.stdout, proc.stdout
    out = json.loads((tmp_path / "run" / "signoff.json").read_text())
    assert "gpu2" not in out["accepted"] and out["verdict"] == "reject"
    assert any("its node directories do not support" in r for r in out["reasons"])
    assert "gpu2" not in (tmp_path / "run" / "signoff-accepted-hosts.txt").read_text()


@pytest.mark.parametrize("name", ["metric-passed-below-min", "fewer-tests-than-selected", "error-with-accept",
                                  "criterion-lowered", "other-thresholds"])
def test_signoff_recomputes_the_fabric_verdict(tmp_path: Path, good: dict[str, Any], name: str) -> None:
    nodes = tmp_path / "nodes"
    for i, host in enumerate(["gpu1", "gpu2"]):
        write_node(nodes, host, node_results(host, i))
    assert cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run")).returncode == 0
    fabric = node_results("gpu1", 5)  # per-GPU figures on two hosts, as a fabric run has
    fabric["nodes"].append({**fabric["nodes"][0], "host": "gpu2", "node_rank": 1})
    fabric["selection"] = {"k": None, "m": "multinode", "level": "standard", "selected": len(fabric["tests"]),
                           "deselected": 30}
    FORGERIES[name][0](fabric)
    (tmp_path / "run" / "fabric").mkdir()
    (tmp_path / "run" / "fabric" / "results.json").write_text(json.dumps(fabric))
    proc = cli("signoff", str(tmp_path / "run"))
    assert proc.returncode == 1 and "Traceback" not in proc.stdout, proc.stdout
    assert json.loads((tmp_path / "run" / "signoff.json").read_text())["verdict"] == "reject"


@pytest.mark.parametrize(("selection", "says"), [
    ({"k": "allreduce", "m": "multinode", "multinode": 2, "multinode_deselected": 19}, "left out 19 multinode tests"),
    ({"k": None, "m": "multinode and not pairs", "multinode": 20, "multinode_deselected": 1},
     "left out 1 multinode tests"),
    ({"k": None, "m": "not multinode", "multinode": 0, "multinode_deselected": 21}, "left out 21"),
    ({"k": "gpu", "m": None, "multinode": 0, "multinode_deselected": 0}, "selected no multinode test"),
    # A record from before the counts: any -k, or a -m other than multinode, is refused.
    ({"k": "allreduce", "m": "multinode"}, "narrowed with -k 'allreduce'"),
    ({"k": None, "m": "multinode and not pairs"}, "not -m multinode"),
])
def test_signoff_signs_only_a_fabric_run_that_selected_every_multinode_test(
        tmp_path: Path, selection: dict[str, Any], says: str) -> None:
    nodes = tmp_path / "nodes"
    for i, host in enumerate(["gpu1", "gpu2"]):
        write_node(nodes, host, node_results(host, i))
    assert cli("merge", str(nodes / "gpu1"), str(nodes / "gpu2"), "-o", str(tmp_path / "run")).returncode == 0
    fabric = node_results("gpu1", 5)
    fabric["nodes"].append({**fabric["nodes"][0], "host": "gpu2", "node_rank": 1})
    fabric["selection"] = {**selection, "level": "standard", "selected": len(fabric["tests"]), "deselected": 30}
    (tmp_path / "run" / "fabric").mkdir()
    (tmp_path / "run" / "fabric" / "results.json").write_text(json.dumps(fabric))
    proc = cli("signoff", str(tmp_path / "run"))
    assert proc.returncode == 1, proc.stdout
    out = json.loads((tmp_path / "run" / "signoff.json").read_text())
    assert out["verdict"] == "reject" and any(says in r for r in out["reasons"]), out["reasons"]


def test_merge_never_writes_over_its_inputs(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    before = (nodes / "gpu1" / "results.json").read_bytes()
    proc = cli("merge", str(nodes / "gpu1"), "-o", str(nodes / "gpu1"))
    assert proc.returncode == 2 and "is one of the node directories given" in proc.stdout
    shutil.copytree(nodes / "gpu1", tmp_path / "other")
    proc = cli("merge", str(nodes / "gpu1"), "-o", str(tmp_path / "other"))
    assert proc.returncode == 2 and "holds a results.json that is not a merge's" in proc.stdout
    assert (nodes / "gpu1" / "results.json").read_bytes() == before
    assert (tmp_path / "other" / "results.json").read_bytes() == before


def test_calibrate_never_writes_over_its_thresholds_or_an_existing_file(tmp_path: Path) -> None:
    thresholds = tmp_path / "thresholds.yaml"
    shutil.copy(ROOT / "thresholds.yaml", thresholds)
    before = thresholds.read_bytes()
    write_node(tmp_path / "nodes", "gpu1", node_results("gpu1", 1))
    run = str(tmp_path / "nodes" / "gpu1" / "results.json")

    def calibrate(*extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "clustergate.calibrate", run, "--extends", "h100-sxm-80gb",
                               "--min-samples", "1", "--thresholds", str(thresholds), *extra], cwd=ROOT,
                              env=job_env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=180)

    proc = calibrate("-o", str(thresholds))
    assert proc.returncode == 2 and "is the --thresholds file it extends" in proc.stdout
    assert thresholds.read_bytes() == before
    (tmp_path / "site.yaml").write_text("# mine\n")
    proc = calibrate("-o", str(tmp_path / "site.yaml"))
    assert proc.returncode == 2 and "exists: pass --force" in proc.stdout
    assert (tmp_path / "site.yaml").read_text() == "# mine\n"
    proc = calibrate("-o", str(tmp_path / "site.yaml"), "--force")
    assert proc.returncode == 0, proc.stdout
    assert "h100-sxm-80gb-site" in (tmp_path / "site.yaml").read_text()


def test_merge_and_signoff_hold_every_run_to_the_thresholds_they_are_given(tmp_path: Path) -> None:
    """A thresholds file that cannot be read is one usage error; a sign-off given other thresholds than its
    merge was given is not signed off; runs under a site file are accepted only when merged with it."""
    nodes = tmp_path / "nodes"
    write_node(nodes, "gpu1", node_results("gpu1", 1))
    missing = cli("merge", str(nodes / "gpu1"), "-o", str(tmp_path / "run"), "--thresholds", str(tmp_path / "no.yaml"))
    assert missing.returncode == 2 and "Traceback" not in missing.stdout, missing.stdout
    assert len(missing.stdout.strip().splitlines()) == 1 and "--thresholds" in missing.stdout
    site = tmp_path / "site.yaml"  # the shipped file under another name: the same h100 profile and digest
    shutil.copy(ROOT / "thresholds.yaml", site)
    assert cli("merge", str(nodes / "gpu1"), "-o", str(tmp_path / "run"), "--thresholds", str(site)).returncode == 0
    merged = json.loads((tmp_path / "run" / "results.json").read_text())
    assert merged["thresholds"] == str(site) and merged["accepted"] == ["gpu1"]
    proc = cli("signoff", str(tmp_path / "run"))  # the shipped thresholds, not the merge's
    assert proc.returncode == 1 and f"the merge held the nodes to {site}" in proc.stdout, proc.stdout
    assert cli("signoff", str(tmp_path / "run"), "--thresholds", str(site)).returncode == 0
