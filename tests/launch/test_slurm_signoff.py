"""The Slurm side of the cluster sign-off: launch/slurm/signoff.sbatch and the health-check prolog.

Bad nodes are planted through the cluster's TaskProlog hook (one node's tasks only):
- a node that measures below its criterion: a thresholds file that asks a PFLOP of bf16 matmul
  (a real measurement, judged for real, failing on that node alone);
- a node that hangs in a test: it is cut by its own time limit while the others finish.
The node phase runs a narrowed selection to keep the tier short: each node's run is partial, so the merge
excludes every node as having run less than a complete node run and nothing is signed off (the accepting
flow, a fabric phase on the accepted hosts, is rehearsed in tests/cluster/test_cluster_rehearsal.py). signoff.sbatch
refuses a narrowing argument before any step (tests/launch/test_slurm_scripts.py), so the narrowing comes through
PYTEST_ADDOPTS, where only the runs see it: the merge's exclusion of partial runs is what keeps such a sign-off from
signing anything.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from datetime import datetime
from pathlib import Path

import pytest
import yaml

from slurm_cluster import SlurmCluster, log, results, slurm  # noqa: F401  (slurm: the fixture)
from torchrun_job import ROOT

pytestmark = [pytest.mark.slurm, pytest.mark.slow]

SLOW, HUNG = "node3", "node4"
# Cheap single-node tests (node phase) plus every multinode one (fabric phase: -k matches marker names, and
# the sign-off signs only a fabric run that left out no multinode test); each phase adds its -m.
SELECTION = ["acceptance", "--level", "quick"]
NARROWED = '-k "test_world or matmul_tflops or test_nodes_built_alike or software or multinode"'
"""PYTEST_ADDOPTS of every node's runs (a planted node's own PYTEST_ADDOPTS, set by the TaskProlog, repeats it)."""
NODE_PHASE_TESTS = 6  # test_world x2, matmul bf16/fp16/tf32 (fp8 skips on CPU), test_nodes_built_alike
HANG = '''import os, time


def pytest_runtest_call(item):
    if os.environ["CG_PLANTED_HANG_IN"] in item.nodeid:
        time.sleep(3600)
'''


def _strict_thresholds(tmp_path: Path) -> Path:
    """thresholds.yaml with the cpu profile asking 1000 TFLOPS of bf16 matmul: no CPU reaches it."""
    data = yaml.safe_load((ROOT / "thresholds.yaml").read_text())
    data["profiles"]["cpu"]["metrics"]["matmul_bf16_tflops"]["min"] = 1000
    path = tmp_path / "strict-thresholds.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def _plant_slow_node(cluster: SlurmCluster, tmp_path: Path, node: str = SLOW) -> None:
    cluster.plant_env(node, PYTEST_ADDOPTS=f"--thresholds={_strict_thresholds(tmp_path)} {NARROWED}")


def _started(res: dict) -> float:
    return datetime.fromisoformat(res["started"]).timestamp()


def test_node_phase_every_node_alone_a_bad_one_ends_alone(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    _plant_slow_node(slurm, tmp_path)
    plant = tmp_path / "plant"
    plant.mkdir()
    (plant / "cg_planted_hang.py").write_text(HANG)
    slurm.plant_env(HUNG, PYTHONPATH=f"{plant}:{ROOT}", CG_PLANTED_HANG_IN="test_nodes_built_alike",
                    PYTEST_ADDOPTS=f"--test-timeout=10 -pcg_planted_hang {NARROWED}")
    job = slurm.submit("signoff.sbatch", SELECTION, nodes=4, out_dir=tmp_path, timeout=240,
                       env={"CLUSTERGATE_SIGNOFF_UNTIL": "node", "CLUSTERGATE_RUN_ID": "run",
                            "PYTEST_ADDOPTS": NARROWED})
    output = job.output
    run = tmp_path / "run"
    assert job.status == 1, output[-6000:]  # srun's status: the failed nodes' torchrun exited 1
    assert "clustergate sign-off: === 1/4 node phase: every node alone, at once" in output
    assert "stopping after the node phase (CLUSTERGATE_SIGNOFF_UNTIL=node)" in output
    assert "2/4 merge" not in output

    nodes = sorted(slurm.nodes[:4])
    assert sorted(p.name for p in (run / "nodes").iterdir()) == nodes
    by_node = {n: results(run / "nodes" / n / "results.json") for n in nodes}
    for node, res in by_node.items():
        assert [h["host"] for h in res["nodes"]] == [node] and res["world_size"] == 1  # alone, by its Slurm name
        assert f"clustergate preflight ok on {node} (node index " in output
    assert output.count("rendezvous none (this node alone)") == 4
    for node in sorted(set(nodes) - {SLOW, HUNG}):
        # Every selected test passed; a narrowed selection is a partial run, never an accept.
        assert by_node[node]["verdict"] == "partial", by_node[node]["error"]
        assert by_node[node]["run_id"] == "run"  # the job's CLUSTERGATE_RUN_ID, through node.sh
        assert sum(t["outcome"] == "passed" for t in by_node[node]["tests"]) == NODE_PHASE_TESTS
    slow = by_node[SLOW]
    assert slow["verdict"] == "reject"
    failed = [t for t in slow["tests"] if t["outcome"] == "failed"]
    assert [t["nodeid"].split("::")[-1] for t in failed] == ["test_matmul_tflops[bf16]"]
    assert "expected >= 1000 [cpu, rank 0 node3]" in failed[0]["message"]
    hung = by_node[HUNG]
    assert hung["verdict"] == "reject" and "test_nodes_built_alike did not finish within 10 s" in hung["error"]
    assert f"srun: error: {SLOW}: task " in output and f"srun: error: {HUNG}: task " in output
    # At once: every node started before any node finished.
    starts = {n: _started(r) for n, r in by_node.items()}
    ends = {n: starts[n] + r["duration_s"] for n, r in by_node.items()}
    assert max(starts.values()) < min(ends.values()), (starts, ends)


@pytest.mark.parametrize("nodes", [1, 4], ids=lambda n: f"{n}-nodes")
def test_signoff_end_to_end(slurm: SlurmCluster, tmp_path: Path, nodes: int) -> None:  # noqa: F811
    if nodes > 1:
        _plant_slow_node(slurm, tmp_path)
    job = slurm.submit("signoff.sbatch", SELECTION, nodes=nodes, out_dir=tmp_path, timeout=420,
                       env={"CLUSTERGATE_RUN_ID": "run", "PYTEST_ADDOPTS": NARROWED})
    output = job.output
    run = tmp_path / "run"
    allocated = sorted(slurm.nodes[:nodes])
    # Every phase ran; every node ran a narrowed selection: the merge excludes each as partial (the slow one
    # rejected), no host is accepted, the fabric phase is skipped, and the sign-off says why, exit 1.
    assert (run / "accepted-hosts.txt").read_text().split() == [], output[-6000:]
    cluster = results(run / "results.json")
    assert cluster["run_id"] == "run" and cluster["level"] == "quick"  # the pytest arguments' --level
    reasons = {e["host"]: "; ".join(e["reasons"]) for e in cluster["excluded"]}
    assert sorted(reasons) == allocated
    for node in (n for n in allocated if n != SLOW):
        assert "tests of a complete node run did not run (-k " in reasons[node], reasons[node]
    assert "fabric phase skipped: 0 node(s) accepted in the node phase" in output
    assert "4/4 sign-off" in output and job.status == 1, output[-6000:]
    signoff = results(run / "signoff.json")
    assert signoff["verdict"] == "reject" and "no node passed the node phase" in signoff["reasons"]
    assert not (run / "signoff-accepted-hosts.txt").exists()


def test_healthcheck_prolog_drains_the_bad_node(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    """launch/slurm/healthcheck.sh as the cluster's Prolog: the planted node is drained with the reason
    from its results.json; the healthy one is not; the job itself runs."""
    good = "node2"
    _plant_slow_node(slurm, tmp_path)
    health = tmp_path / "health"
    # What a site's prolog file does: set the environment, exec the check. The per-node plant
    # (env.NODE) reaches it through this wrapper, as the TaskProlog's does not reach a Prolog.
    slurm.plant_prolog(f"""#!/bin/bash
[ -f {slurm.hooks}/env.$SLURMD_NODENAME ] && . {slurm.hooks}/env.$SLURMD_NODENAME
export CLUSTERGATE_GPUS_PER_NODE=0 CLUSTERGATE_HEALTH_DIR={health} CLUSTERGATE_PYTHON={sys.executable}
export PYTHONPATH={ROOT} OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= CLUSTERGATE_HEALTH_TIER=quick
exec {ROOT}/launch/slurm/healthcheck.sh acceptance --level quick -k "test_world or matmul_tflops"
""")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\nsrun hostname >/dev/null && echo \"job ran on $SLURM_JOB_NODELIST\"\n")
    proc = subprocess.run(["sbatch", "--wait", "--parsable", f"--nodelist={good},{SLOW}", "--nodes=2",
                           f"--output={tmp_path}/job-%j.out", str(script)], capture_output=True, text=True,
                          timeout=240)
    log(f"slurm job {proc.stdout.strip()}: health-check Prolog on {good},{SLOW}: exit {proc.returncode}; "
        f"{SLOW}: {slurm.node_state(SLOW)[0]}, {good}: {slurm.node_state(good)[0]}")
    assert proc.returncode == 0, proc.stderr
    state, reason = slurm.node_state(SLOW)
    assert "DRAIN" in state, (state, reason)
    checks = sorted(p for p in (health / SLOW).iterdir() if p.name != "inductor-cache")  # the kept compile cache
    assert len(checks) == 1
    res = json.loads((checks[0] / "results.json").read_text())
    assert res["verdict"] == "reject" and [h["host"] for h in res["nodes"]] == [SLOW]
    assert reason.startswith("clustergate: reject: test_matmul_tflops[bf16]: matmul_bf16_tflops=")
    assert f"expected >= 1000 [cpu, rank 0 {SLOW}] (report: {checks[0]})" in reason
    good_state, _ = slurm.node_state(good)
    assert "DRAIN" not in good_state
    # The site's -k narrows the check: the good node's record says partial (never an accept), and it stays up.
    assert json.loads(next((health / good).glob("*/results.json")).read_text())["verdict"] == "partial"


def test_healthcheck_resumes_the_node_it_drained_and_no_other(slurm: SlurmCluster, tmp_path: Path) -> None:  # noqa: F811
    """The day-2 cycle: the Prolog's check drains the planted node ("clustergate: ..."); the fault gone, the
    HealthCheckProgram (CLUSTERGATE_HEALTH_RECHECK=1) checks it again while it is idle and drained, and resumes
    it. A node an admin drained for another reason is neither checked nor resumed."""
    admin, admin_reason = "node4", "admin: fan 3 replaced, burn-in pending"
    _plant_slow_node(slurm, tmp_path)
    health = tmp_path / "health"
    site = f"""#!/bin/bash
[ -f {slurm.hooks}/env.$SLURMD_NODENAME ] && . {slurm.hooks}/env.$SLURMD_NODENAME
export CLUSTERGATE_GPUS_PER_NODE=0 CLUSTERGATE_HEALTH_DIR={health} CLUSTERGATE_PYTHON={sys.executable}
export PYTHONPATH={ROOT} OMP_NUM_THREADS=1 CUDA_VISIBLE_DEVICES= CLUSTERGATE_HEALTH_TIER=quick
exec {ROOT}/launch/slurm/healthcheck.sh acceptance --level quick -k "test_world or matmul_tflops"
"""
    slurm.plant_prolog(site)
    subprocess.run(["scontrol", "update", f"nodename={admin}", "state=drain", f"reason={admin_reason}"], check=True,
                   timeout=60)
    try:
        script = tmp_path / "job.sh"
        script.write_text("#!/bin/bash\nsrun hostname >/dev/null\n")
        proc = subprocess.run(["sbatch", "--wait", "--parsable", f"--nodelist={SLOW}", "--nodes=1",
                               f"--output={tmp_path}/job-%j.out", str(script)], capture_output=True, text=True,
                              timeout=240)
        assert proc.returncode == 0, proc.stderr
        state, reason = slurm.node_state(SLOW)
        assert "DRAIN" in state and reason.startswith("clustergate: reject: test_matmul_tflops[bf16]"), (state, reason)
        # The fault is repaired; the HealthCheckProgram runs the same site file in recheck mode.
        (slurm.hooks / f"env.{SLOW}").unlink()
        slurm.plant_healthcheck(site.replace("exec ", "CLUSTERGATE_HEALTH_RECHECK=1 exec "))
        start = time.monotonic()
        while "DRAIN" in slurm.node_state(SLOW)[0] and time.monotonic() - start < 180:
            time.sleep(1)
        state, reason = slurm.node_state(SLOW)
        recheck_log = health / SLOW / "recheck.log"
        log(f"health check: {SLOW} drained by the Prolog's check, then {state} {time.monotonic() - start:.0f} s "
            f"after the fault was removed")
        assert "DRAIN" not in state, (state, reason, recheck_log.read_text() if recheck_log.exists() else "")
        assert f"resumed {SLOW} (it was drained: clustergate: reject: " in recheck_log.read_text()
        runs = sorted(p for p in (health / SLOW).iterdir() if p.is_dir() and p.name != "inductor-cache")
        assert [json.loads((r / "results.json").read_text())["verdict"] for r in runs] == ["reject", "partial"]
        # The admin's drain stands, and its node was never checked.
        state, reason = slurm.node_state(admin)
        assert "DRAIN" in state and reason == admin_reason, (state, reason)
        assert not list((health / admin).glob("*/results.json")) if (health / admin).exists() else True
    finally:
        slurm.clear()  # no more checks before the admin's node is put back
        subprocess.run(["scontrol", "update", f"nodename={admin}", "state=resume"], timeout=60)
