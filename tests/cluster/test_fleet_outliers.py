"""The fleet is the reference: parts that fall behind their peers are excluded and named, whatever their
criterion's severity, at every scope.

A merge of five synthetic nodes (tests/helpers/cluster_runs.py, judged by the shipped h100-sxm-80gb profile): one node's
intra-node all_reduce and one GPU's bf16 matmul read 0.6 of their peers (their own runs fail them too), one
node's all_gather 0.85 (above its min: only the fleet sees it). Then a fabric run of four healthy nodes where one
GPU's InfiniBand all_reduce (net_*, one figure a GPU) reads 0.6 of its peers and another GPU's all_gather 0.85
(above the NDR min): the run names both GPUs, and the sign-off excludes exactly their hosts.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from cluster_runs import fabric_results, node_results, write_fabric, write_node

from clustergate.cluster import fleet
from clustergate.cluster.excluded import join, steps
from clustergate.cluster.merge import merge
from clustergate.cluster.node_runs import NodeRun
from clustergate.cluster.signoff import signoff

HOSTS = ["n1", "n2", "n3", "n4", "n5"]
FAULTS: dict[str, dict[tuple[str, int | None], float]] = {
    "n2": {("intranode_allreduce_busbw_gbps", None): 0.6},
    "n3": {("matmul_bf16_tflops", 5): 0.6},
    "n4": {("intranode_allgather_busbw_gbps", None): 0.85},
}


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], Path]:
    base = tmp_path_factory.mktemp("fleet")
    for seed, host in enumerate(HOSTS, start=1):
        write_node(base / "nodes", host, node_results(host, seed, FAULTS.get(host)))
    return merge(sorted((base / "nodes").iterdir()), base / "run"), base / "run"


def test_merge_excludes_exactly_the_parts_behind_the_fleet_naming_each(cluster: tuple[dict[str, Any], Path]) -> None:
    out, run = cluster
    assert out["accepted"] == ["n1", "n5"] and out["verdict"] == "reject"
    reasons = {e["host"]: e["reasons"] for e in out["excluded"]}
    assert sorted(reasons) == ["n2", "n3", "n4"]
    outliers = {(fm["metric"], o["host"], o["gpu_index"]) for fm in out["fleet"] for o in fm["outliers"]}
    assert outliers == {("intranode_allreduce_busbw_gbps", "n2", None), ("matmul_bf16_tflops", "n3", 5),
                        ("intranode_allgather_busbw_gbps", "n4", None)}
    assert out["counts"]["fleet_outliers"] == 3

    # n4 accepted itself (its all_gather is above the min of 250): the fleet alone excludes it, naming the node.
    n4 = next(n for n in out["nodes"] if n["host"] == "n4")
    assert n4["verdict"] == "accept" and n4["status"] == "excluded"
    [why] = reasons["n4"]
    assert why.startswith("fleet outlier: intranode_allgather_busbw_gbps=280.5 GB/s on the node, below 90% of the "
                          "fleet median 330 GB/s (5 nodes of h100-sxm-80gb)"), why
    # n2 and n3 fail their own runs too; the fleet names the node, and the GPU by index and serial.
    assert any(r.startswith("fleet outlier: intranode_allreduce_busbw_gbps=222 GB/s on the node, below 90% of the "
                            "fleet median 370 GB/s") for r in reasons["n2"]), reasons["n2"]
    assert any(r.startswith("fleet outlier: matmul_bf16_tflops=") and "on gpu 5 (serial 1654000035)" in r
               for r in reasons["n3"]), reasons["n3"]
    allgather = next(fm for fm in out["fleet"] if fm["metric"] == "intranode_allgather_busbw_gbps")
    assert allgather["scope"] == "node" and allgather["count"] == 5
    assert allgather["floor"] == pytest.approx(0.9 * 330) and allgather["failing"] == [pytest.approx(280.5)]
    assert [o["part"] for o in allgather["outliers"]] == ["the node"]
    steps = {e["host"]: [s["where"] for s in e["steps"]] for e in out["excluded"]}
    assert steps["n4"] == ["n4 the node: fleet outlier"]
    page = (run / "report.html").read_text()
    assert "outlier below / above" in page and "the node" in page and "1654000035" in page


def test_a_fleet_outlier_fails_whatever_the_criterion_s_severity() -> None:
    """A part behind the fleet fails its node even where the criterion's own bounds only warn."""
    def run(host: str, value: float) -> NodeRun:
        metric = {"name": "intranode_pair_bw_gbps", "value": value, "unit": "GB/s", "scope": "gpu",
                  "criterion": {"min": 10, "outlier_fraction": 0.9, "severity": "warn"}, "passed": True,
                  "per_rank": [{"rank": 0, "host": host, "gpu_index": 0, "gpu_serial": f"s-{host}", "value": value}]}
        return NodeRun(host, f"/r/{host}", "accept", results={"profile": "p", "tests": [
            {"nodeid": "acceptance/test_interconnect.py::test_gpu_pairs[intranode]", "metrics": [metric]}]})
    runs = [run("a", 300.0), run("b", 298.0), run("c", 180.0)]
    found = fleet.collect(runs)
    join(runs, fleet.judge_outliers(found))
    assert fleet.outlying_parts(found) == 1
    assert [r.status for r in runs] == ["accepted", "accepted", "excluded"]
    assert runs[2].reasons == ["fleet outlier: intranode_pair_bw_gbps=180 GB/s on gpu 0 (serial s-c), below 90% of "
                               "the fleet median 298 GB/s (3 GPUs of p)"] and runs[2].warnings == []


def test_a_lower_is_better_figure_is_held_to_a_multiple_of_the_fleet_median() -> None:
    def run(host: str, value: float) -> NodeRun:
        metric = {"name": "intranode_allreduce_latency_us", "value": value, "unit": "us", "scope": "node",
                  "criterion": {"outlier_multiple": 1.5, "source": "peers"}, "passed": True,
                  "per_rank": [{"rank": 0, "host": host, "value": value}]}
        return NodeRun(host, f"/r/{host}", "accept", results={"profile": "p", "tests": [
            {"nodeid": "acceptance/test_interconnect.py::test_allreduce_latency[node]", "metrics": [metric]}]})
    runs = [run("a", 9.0), run("b", 9.4), run("c", 9.1), run("d", 20.0)]
    found = fleet.collect(runs)
    join(runs, fleet.judge_outliers(found))
    assert fleet.outlying_parts(found) == 1
    assert runs[3].reasons == ["fleet outlier: intranode_allreduce_latency_us=20 us on the node, above 1.5x the fleet "
                               "median 9.25 us (4 nodes of p)"]
    assert found[0].limit == pytest.approx(1.5 * 9.25) and found[0].floor is None


def test_a_node_that_lost_gpus_is_not_judged_as_a_smaller_shape() -> None:
    def run(host: str, gpus: int) -> NodeRun:
        return NodeRun(host, f"/r/{host}", "accept", results={
            "profile": "h200" if gpus == 8 else "h200-4gpu", "tests": [],
            "nodes": [{"host": host, "gpus": [{"index": g, "name": "NVIDIA H200"} for g in range(gpus)]}]})
    runs = [run("a", 8), run("b", 8), run("c", 4)]
    join(runs, fleet.judge_shapes(runs))
    assert [r.status for r in runs] == ["accepted", "accepted", "excluded"]
    assert runs[2].reasons[0].startswith("fleet shape: 4 GPUs on this node (profile h200-4gpu, where 2 of the "
                                         "fleet's 3 nodes of NVIDIA H200 have 8)")
    # Its own run passed: the step is the GPU inventory's (reset, then the vendor), not a retest.
    assert [(s.category, s.action.value, s.where) for s in steps(runs[2])] == [
        ("gpu_inventory", "reset", "c: 4 of the fleet's 8 GPUs")]
    even = [run("a", 8), run("c", 4)]  # no majority: a fleet of mixed shapes says nothing of either
    join(even, fleet.judge_shapes(even))
    assert [r.status for r in even] == ["accepted", "accepted"]


def test_sign_off_excludes_the_hosts_of_gpus_behind_the_fabric(tmp_path: Path) -> None:
    hosts = ["f1", "f2", "f3", "f4"]
    for seed, host in enumerate(hosts, start=20):
        write_node(tmp_path / "nodes", host, node_results(host, seed))
    merge(sorted((tmp_path / "nodes").iterdir()), tmp_path)
    faults = {("net_allreduce_busbw_gbps", "f3", 2): 0.6, ("net_allgather_busbw_gbps", "f4", 6): 0.85}
    fab = fabric_results(hosts, tmp_path.name, faults=faults)
    failed = {(m["name"], p["host"], p["gpu_index"]) for t in fab["tests"] for m in t["metrics"]
              for p in m["per_rank"] if not p["passed"]}
    assert failed == {("net_allreduce_busbw_gbps", "f3", 2), ("net_allgather_busbw_gbps", "f4", 6)}
    net = next(t for t in fab["tests"] if t["nodeid"].endswith("[net-all_gather]"))
    assert "below 90% of the cluster median" in net["message"] and "f4 gpu 6" in net["message"]
    write_fabric(tmp_path, fab)
    out = signoff(tmp_path)
    assert out["accepted"] == ["f1", "f2"], out["reasons"]
    assert {e["host"]: e["phase"] for e in out["excluded"]} == {"f3": "fabric", "f4": "fabric"}
    assert out["verdict"] == "accept", out["reasons"]
