"""launch/slurm/clustergate.sbatch submitted for real (sbatch --wait) on 1, 2 and 4 Slurm nodes, CPU ranks.

Each job must exit 0, its results.json must accept, its output must name the report, and every node
must be named by its Slurm node name: on the local cluster (launch/slurm/local-cluster.sh) all nodes
share one host name, so a report that used the host name would show one node four times.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, results, slurm  # noqa: F401  (slurm: the fixture)

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


@dataclass(frozen=True)
class Case:
    nodes: int
    args: tuple[str, ...]
    tests: int
    """How many tests must pass: a selection that silently shrank would go unseen otherwise."""
    limit_s: float
    """Seconds the job may take on a shared 2-core machine: about 3x what it took there alone."""
    verdict: str = "partial"
    """What the run is: a selection narrowed to keep the tier short is partial (exit 1), never an accept."""


CASES = [
    # One node: the job and node tests, no rendezvous partner.
    Case(1, ("acceptance", "--level", "quick", "-k", "test_world or test_nodes_built_alike or matmul_tflops"), 6, 120),
    # Two nodes: a collective across them, the software comparison and the node-pair matrix.
    Case(2, ("acceptance", "-m", "multinode", "--level", "quick", "-k", "net-all_reduce or software or gpu_pairs"),
         3, 150),
    # Four nodes: every multinode test (42 s of job time alone).
    Case(4, ("acceptance", "-m", "multinode", "--level", "quick"), 9, 180, "accept"),  # a complete fabric run
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c.nodes}-nodes")
def test_clustergate_sbatch(slurm: SlurmCluster, tmp_path: Path, case: Case) -> None:  # noqa: F811
    if case.nodes > len(slurm.nodes):
        pytest.skip(f"needs {case.nodes} Slurm nodes, the cluster has {len(slurm.nodes)}")
    job = slurm.submit("clustergate.sbatch", list(case.args), nodes=case.nodes, out_dir=tmp_path,
                       timeout=case.limit_s)
    output = job.output
    report = tmp_path / f"clustergate-{job.job_id}"
    status = 0 if case.verdict == "accept" else 1
    assert job.status == status, output[-6000:]
    res = results(report / "results.json")
    assert res["verdict"] == case.verdict and res["run_id"] == f"clustergate-{job.job_id}", res.get("reason")
    passed = [t for t in res["tests"] if t["outcome"] == "passed"]
    assert len(passed) == case.tests, [(t["nodeid"], t["outcome"], t["message"][:200]) for t in res["tests"]]
    # The output names the report (rank 0's summary and the batch script's last line).
    assert f"results: {report}/results.json" in output
    assert f"clustergate: job {job.job_id} finished with status {status}; collect {report}" in output
    assert (report / "report.html").exists() and (report / "junit.xml").exists()

    # Every node by its Slurm name, in results.json, in every per-rank figure, in the preflight lines.
    hosts = sorted(n["host"] for n in res["nodes"])
    assert len(hosts) == case.nodes and set(hosts) <= set(slurm.nodes), hosts
    assert socket.gethostname() not in hosts or socket.gethostname() in slurm.nodes
    for host in hosts:
        assert f"clustergate preflight ok on {host} (node index " in output
    per_rank_hosts = {p["host"] for t in res["tests"] for m in t["metrics"] for p in m.get("per_rank", [])}
    assert per_rank_hosts == set(hosts)
    html = (report / "report.html").read_text()
    assert all(host in html for host in hosts)
