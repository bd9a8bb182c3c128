"""``clustergate merge`` on synthetic node results (tests/helpers/cluster_runs.py).

Each node's results.json has the shape a real 8-GPU node writes; faults are planted in the figures.
Checked: a node's own failure excludes it with the failing figure named; a node that accepted itself but whose GPUs fall
below the fleet's median is excluded (tests/cluster/test_fleet_outliers.py: every scope); expected hosts with no
directory, directories without results, and runs still "running" are excluded as missing;
the host lists in both forms; bad input exits 2 naming the path; and the cluster results.json matches
clustergate/cluster/cluster.schema.json.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from cluster_runs import node_results, schema_errors, write_node

from clustergate.cluster.merge import merge

from torchrun_job import ROOT, job_env


def merge_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clustergate", "merge", *args], cwd=ROOT, env=job_env(),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=300)


@pytest.fixture
def fleet(tmp_path: Path) -> Path:
    """gpu01-gpu08: 01 fails its own bf16 matmul test on gpu 3 (a fail criterion, from the spec); 02's tf32 matmul
    is 15% slow on every GPU (above the profile's min, and alike on the node, so it accepted itself): a fleet
    outlier; 03 still says running; 04 has no results.json; 05-08 healthy. (gpu09 is expected and has no
    directory.)"""
    nodes = tmp_path / "nodes"
    for i in range(1, 9):
        host = f"gpu{i:02d}"
        if i == 4:
            (nodes / host).mkdir(parents=True)
            continue
        faults = {1: {("matmul_bf16_tflops", 3): 0.5}, 2: {("matmul_tf32_tflops", None): 0.85}}.get(i, {})
        res = node_results(host, i, faults)
        if i == 3:
            res["verdict"] = "running"
        write_node(nodes, host, res)
    return nodes


def test_merge_excludes_failed_outlying_and_missing_nodes(fleet: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    proc = merge_cli(*sorted(str(p) for p in fleet.iterdir()), "-o", str(out), "--expect-hosts", "gpu[01-09]")
    assert proc.returncode == 1, proc.stdout
    cluster = json.loads((out / "results.json").read_text())
    assert schema_errors(cluster) == []
    assert cluster["verdict"] == "reject" and cluster["accepted"] == ["gpu05", "gpu06", "gpu07", "gpu08"]
    reasons = {e["host"]: e["reasons"] for e in cluster["excluded"]}
    assert sorted(reasons) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu09"]
    own = reasons["gpu01"][0]
    assert own.startswith("test_matmul_tflops[bf16]: matmul_bf16_tflops=") and own.endswith("on gpu 3")
    assert ">= 700" in own
    # gpu02 accepted itself: only the fleet view excludes it, naming every GPU with its serial.
    node02 = next(n for n in cluster["nodes"] if n["host"] == "gpu02")
    assert node02["verdict"] == "accept" and node02["status"] == "excluded"
    [outlier] = reasons["gpu02"]
    assert outlier.startswith("fleet outlier: matmul_tf32_tflops=") and "below 90% of the fleet median" in outlier
    assert "gpu 0 (serial 1654000020)" in outlier and "gpu 7" in outlier
    assert "still says running" in reasons["gpu03"][0]
    assert "no results.json" in reasons["gpu04"][0] and "expected, but no result" in reasons["gpu09"][0]
    assert cluster["counts"] == {"expected": 9, "results": 7, "accepted": 4, "excluded": 5, "missing": 3,
                                 "fleet_outliers": 9}  # 8 slow tf32 matmuls on gpu02, gpu 3's bf16 matmul on gpu01
    tf32 = next(f for f in cluster["fleet"] if f["metric"] == "matmul_tf32_tflops")
    assert tf32["count"] == 56 and sum(tf32["histogram"]["counts"]) == 56
    assert tf32["floor"] == pytest.approx(0.9 * tf32["median"])
    assert {o["host"] for o in tf32["outliers"]} == {"gpu02"}
    assert (out / "accepted-hostlist.txt").read_text() == "gpu[05-08]\n"
    assert (out / "excluded-hostlist.txt").read_text() == "gpu[01-04,09]\n"
    assert (out / "accepted-hosts.txt").read_text() == "gpu05\ngpu06\ngpu07\ngpu08\n"
    lines = {host: (why, action) for host, why, action in
             (line.split("\t") for line in (out / "excluded-hosts.txt").read_text().splitlines())}
    assert list(lines) == ["gpu01", "gpu02", "gpu03", "gpu04", "gpu09"] and lines["gpu02"] == (outlier, "retest")
    assert {e["host"]: e["action"] for e in cluster["excluded"]} == {h: a for h, (_, a) in lines.items()} == {
        h: "retest" for h in lines}  # slow matmuls: run again first; no result: run again
    steps = {e["host"]: [(s["category"], s["where"]) for s in e["steps"]] for e in cluster["excluded"]}
    # gpu01's own failure, and that GPU is behind the fleet too: one step
    assert steps["gpu01"] == [("gpu_compute", "gpu01 gpu 3 serial 1654000013")]
    assert steps["gpu02"][0][1].endswith("gpu 7 serial 1654000027: fleet outlier") and steps["gpu09"] == [
        ("no_result", "")]
    assert {e["host"]: e["evidence"] for e in cluster["excluded"]} == {
        **{h: f"evidence/evidence-{h}.tar.gz" for h in ("gpu01", "gpu02", "gpu03", "gpu04")}, "gpu09": None}
    page = (out / "report.html").read_text()
    assert 'class="cg-verdict">REJECT<' in page and "gpu[05-08]" in page
    assert page.count("data:image/svg+xml;base64,") >= 20
    assert "excluded: gpu02 (retest): fleet outlier: matmul_tf32_tflops" in proc.stdout


def test_an_outlier_of_a_criterion_judged_by_its_peers_alone_excludes_its_node(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    for i in range(1, 5):
        # n1's GPUs all train 23% slower alone (outlier_fraction only, source peers): alike on the node, so it
        # accepted itself, and below the fleet's floor.
        res = node_results(f"n{i}", i, {("train_local_tokens_per_s_per_gpu", None): 0.77} if i == 1 else {})
        write_node(nodes, f"n{i}", res)
    cluster = merge(sorted(nodes.iterdir()), tmp_path / "run")
    assert cluster["verdict"] == "reject" and cluster["accepted"] == ["n2", "n3", "n4"]
    [node] = [n for n in cluster["nodes"] if n["host"] == "n1"]
    assert node["verdict"] == "accept" and node["status"] == "excluded" and node["warnings"] == []
    assert node["reasons"][0].startswith("fleet outlier: train_local_tokens_per_s_per_gpu=")
    local = next(f for f in cluster["fleet"] if f["metric"] == "train_local_tokens_per_s_per_gpu")
    assert [(o["host"], o["gpu_index"], o["severity"]) for o in local["outliers"]] == [("n1", g, "fail")
                                                                                       for g in range(8)]


def test_all_accepted_exits_zero(tmp_path: Path) -> None:
    for i in range(3):
        write_node(tmp_path / "nodes", f"a{i}", node_results(f"a{i}", 100 + i))
    proc = merge_cli(*sorted(str(p) for p in (tmp_path / "nodes").iterdir()), "-o", str(tmp_path / "run"))
    assert proc.returncode == 0, proc.stdout
    assert proc.stdout.startswith("ACCEPT: 3 of 3 nodes accepted") and "accepted: a[0-2]" in proc.stdout
    assert (tmp_path / "run" / "excluded-hosts.txt").read_text() == ""


def test_help_says_the_exit_status() -> None:
    proc = merge_cli("--help")
    assert proc.returncode == 0 and "Exit status: 0 when every node" in proc.stdout and "--expect-hosts" in proc.stdout


@pytest.mark.parametrize(("args", "message"), [
    (["/no/such/dir"], "/no/such/dir: not a directory"),
    ([], "no node directories given"),
    (["--expect-hosts", "gpu[1-"], "'[' is never closed"),
    (["--expect-hosts", "/no/such/hosts.txt"], "/no/such/hosts.txt: no such file"),
])
def test_bad_input_exits_2_naming_it(args: list[str], message: str, tmp_path: Path) -> None:
    proc = merge_cli(*args, "-o", str(tmp_path / "run"))
    assert proc.returncode == 2 and message in proc.stdout and "Traceback" not in proc.stdout, proc.stdout


def test_a_multi_node_run_is_not_a_node_directory(tmp_path: Path) -> None:
    res = node_results("x1", 1)
    res["nodes"].append({**res["nodes"][0], "host": "x2", "node_rank": 1})
    write_node(tmp_path / "nodes", "x1", res)
    proc = merge_cli(str(tmp_path / "nodes" / "x1"), "-o", str(tmp_path / "run"))
    assert proc.returncode == 2 and "is a run of 2 nodes, not one node's" in proc.stdout


def test_unreadable_results_exclude_the_node(tmp_path: Path) -> None:
    (tmp_path / "nodes" / "bad").mkdir(parents=True)
    (tmp_path / "nodes" / "bad" / "results.json").write_text("{ not json")
    write_node(tmp_path / "nodes", "good", node_results("good", 7))
    cluster = merge(sorted((tmp_path / "nodes").iterdir()), tmp_path / "run")
    assert cluster["accepted"] == ["good"] and cluster["excluded"][0]["host"] == "bad"
    assert "unreadable" in cluster["excluded"][0]["reasons"][0]
