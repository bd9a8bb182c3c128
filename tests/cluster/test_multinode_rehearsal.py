"""The multi-node rehearsal: a 2-node x 2-rank job on this machine, started the way a cluster starts it.

Two copies of launch/node.sh (what srun runs on each Slurm node and each Kubernetes pod runs) form one
job through torchrun's c10d rendezvous on 127.0.0.1, node index 0 hosting it, and run the multinode
tests plus the node tests under the cpu profile. Everything a real 2-node job exercises is here except
the wire between machines: preflight, rendezvous, GROUP_RANK 0 and 1, the control group across
agents, the shared directory seen from both "nodes".

CLUSTERGATE_REHEARSAL_THRESHOLDS points it at another thresholds file (default: the checkout's).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from torchrun_job import ROOT, free_port, job_env

pytestmark = pytest.mark.slow

LIMIT_S = 110
"""Two agents, two ranks each, a full c10d rendezvous and the multinode tests at quick: 30-50 s on CI's
2 cores. A hang-guard, not a performance check: past it both agents are ended and the test fails."""


def test_two_nodes_run_multinode_and_node_tests(tmp_path: Path) -> None:
    shared = tmp_path / "shared"
    shared.mkdir()
    report = tmp_path / "report"
    thresholds = os.environ.get("CLUSTERGATE_REHEARSAL_THRESHOLDS", str(ROOT / "thresholds.yaml"))
    common = {
        "CLUSTERGATE_NNODES": "2", "CLUSTERGATE_GPUS_PER_NODE": "0", "CLUSTERGATE_NPROC_PER_NODE": "2",
        "CLUSTERGATE_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "CLUSTERGATE_RDZV_ID": uuid.uuid4().hex[:8],
        "CLUSTERGATE_RDZV_TIMEOUT": "60", "CLUSTERGATE_REPORT_DIR": str(report), "CLUSTERGATE_SHARED_DIR": str(shared),
        "CLUSTERGATE_PYTHON": sys.executable,
    }
    pytest_args = ["acceptance", "-k", "multinode or test_node.py", "--level", "quick", "--thresholds", thresholds]
    start = time.monotonic()
    agents = [subprocess.Popen(["bash", str(ROOT / "launch" / "node.sh"), *pytest_args], cwd=tmp_path,
                               env=job_env({**common, "CLUSTERGATE_NODE_INDEX": str(i)}),
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
              for i in range(2)]
    outputs, codes = [], []
    for agent in agents:
        try:
            out, _ = agent.communicate(timeout=max(1.0, LIMIT_S - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            for a in agents:
                a.kill()
            out = (agent.communicate()[0] or "") + f"\n[rehearsal killed after {LIMIT_S} s]"
        outputs.append(out)
        codes.append(agent.returncode)
    output = "\n".join(outputs)
    (tmp_path / "output.txt").write_text(output)
    assert codes == [0, 0], output[-6000:]
    assert output.count("clustergate preflight ok on") == 2

    import json
    res = json.loads((report / "results.json").read_text())
    assert res["verdict"] == "accept" and res["world_size"] == 4, res
    assert [n["node_rank"] for n in res["nodes"]] == [0, 1]
    tests = {t["nodeid"].split("::")[-1]: t for t in res["tests"]}
    assert not [n for n, t in tests.items() if "needs 2+ nodes" in t["message"]], "multinode tests were skipped"
    assert tests["test_same_software_on_every_node"]["outcome"] == "passed"
    for name in ("test_nodes_built_alike", "test_shared_directory_is_shared",
                 "test_hosts_resolve_and_rendezvous_store_reachable"):
        assert tests[name]["outcome"] == "passed", tests[name]["message"]
    assert [d["node_rank"] for d in tests["test_nodes_built_alike"]["details"]["discovery"]] == [0, 1]
    shared_test = tests["test_shared_directory_is_shared"]
    assert [n["read_from_node"] for n in shared_test["details"]["per_node"]] == [1, 0]  # each read the other's file
    metrics = {m["name"]: m for m in shared_test["metrics"]}
    assert sorted(p["node_rank"] for p in metrics["shared_fs_write_gbps"]["per_rank"]) == [0, 1]
    assert list(shared.iterdir()) == []
