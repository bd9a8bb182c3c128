"""Failure paths of launch/slurm/clustergate.sbatch on a real Slurm cluster, each planted on one node.

Plants go through the cluster's TaskProlog hook (tests/helpers/slurm_cluster.py: `export K=V` lines reach
every task on that node only), so the job is submitted exactly as a user submits it:
- a node whose preflight fails (its shared directory is missing) ends the job quickly, named;
- a node whose rank is killed mid-run ends the others (srun --kill-on-bad-exit), and the job's
  output, results.json and report.html say which node failed first;
- a job cancelled with scancel leaves a results.json that is not accept.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

import pytest

from slurm_cluster import SlurmCluster, log, results, slurm, wait_gone  # noqa: F401  (slurm: the fixture)
from torchrun_job import ROOT

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

BAD = "node3"
"""The planted node: not the allocation's first, so it never hosts the rendezvous."""

# A pytest plugin planted on one node: SIGKILL this rank as it enters the named test's call, the way
# the kernel's OOM killer or a GPU fault ends a rank, with no chance to say anything.
KILLER = '''import os, signal


def pytest_runtest_call(item):
    if os.environ["CG_PLANTED_KILL_IN"] in item.nodeid:
        os.kill(os.getpid(), signal.SIGKILL)
'''


def test_preflight_failure_ends_the_job_quickly_naming_the_node(slurm: SlurmCluster,  # noqa: F811
                                                                  tmp_path: Path) -> None:
    missing = tmp_path / "not-mounted-here"
    slurm.plant_env(BAD, CLUSTERGATE_SHARED_DIR=str(missing))
    # Without --kill-on-bad-exit the other three would wait out the 600-s rendezvous join timeout;
    # 90 s allows a busy 2-core machine three times what the job took alone (10 s).
    job = slurm.submit("clustergate.sbatch", ["acceptance", "-m", "multinode", "--level", "quick"], nodes=4,
                       out_dir=tmp_path, timeout=90)
    output = job.output
    assert job.status != 0, output[-4000:]
    assert (f"clustergate preflight FAILED on {BAD} (node index 2): shared directory {missing} does not exist on "
            "this node: mount the shared filesystem here, or choose another path") in output
    assert f"srun: error: {BAD}: task 2: Exited with exit code 2" in output
    assert f"node {BAD} (node index 2) failed first: its preflight exited 2" in output
    assert "test session starts" not in output  # no node got as far as pytest
    assert job.seconds < 60, f"took {job.seconds:.0f} s; the daemons' lines of it:\n{slurm.daemon_lines(job.job_id)}"


def test_a_node_killed_mid_run_ends_the_job_and_is_named(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "cg_planted_killer.py").write_text(KILLER)
    # Not the first multinode test: results.json has been written by then, whichever node holds rank 0.
    slurm.plant_env(BAD, PYTHONPATH=f"{plant}{os.pathsep}{ROOT}", PYTEST_ADDOPTS="-pcg_planted_killer",
                    CG_PLANTED_KILL_IN="net-broadcast")
    job = slurm.submit("clustergate.sbatch", ["acceptance", "-m", "multinode", "--level", "quick"], nodes=4,
                       out_dir=tmp_path, timeout=180)
    output = job.output
    report = tmp_path / f"clustergate-{job.job_id}"
    assert job.status != 0, output[-4000:]
    # Slurm and the launcher name the node in the job's output ...
    assert f"srun: error: {BAD}: task 2: Exited with exit code 1" in output
    assert f"clustergate on {BAD} (node index 2): torchrun exited 1" in output
    named = f"node {BAD} (node index 2) failed first: its torchrun exited 1"
    assert f"clustergate: {named}" in output
    # ... and results.json and the report carry it, with a verdict that is not accept.
    res = results(report / "results.json")
    assert res["verdict"] == "reject" and named in res["error"], res["error"]
    assert "test_collective_bandwidth[net-broadcast]" in (report / "progress.jsonl").read_text()
    assert named in (report / "report.html").read_text()
    # Slurm ended every other node of the step (Terminated, or exit 1 where a rank saw the lost peer first).
    for node in sorted(set(slurm.nodes[:4]) - {BAD}):
        assert f"srun: error: {node}: task " in output, node


def test_scancel_leaves_a_results_json_that_is_not_accept(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    job_id, output = slurm.submit_nowait("clustergate.sbatch", ["acceptance", "-m", "not multinode", "--level",
                                                                "quick"], nodes=2, out_dir=tmp_path)
    progress = tmp_path / f"clustergate-{job_id}" / "progress.jsonl"
    deadline = time.monotonic() + 120  # 2 nodes start in about 20 s alone
    while time.monotonic() < deadline and '"test_end"' not in (progress.read_text() if progress.exists() else ""):
        time.sleep(0.5)
    assert progress.exists() and '"test_end"' in progress.read_text(), "the job never got through a test"
    # Cancelled mid-run, after results.json has recorded a passing test.
    subprocess.run(["scancel", job_id], check=True, timeout=60)
    gone = wait_gone(job_id, 90)  # Slurm sends SIGTERM, then SIGKILL after KillWait (30 s)
    res = results(progress.parent / "results.json")
    log(f"slurm job {job_id}: clustergate.sbatch on 2 nodes, scancel after its first test: gone {gone:.1f} s "
        f"later; results.json: {res['verdict']}")
    assert res["verdict"] != "accept", (res["verdict"], res["error"], output.read_text()[-3000:])
