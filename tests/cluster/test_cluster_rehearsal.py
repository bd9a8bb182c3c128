"""The whole sign-off of a 4-node "cluster" on one machine: node phase, merge, fabric phase, sign-off.

The node phase is four complete node runs of one cluster run: the one real run the contract's tests share
(README's command 1, tests/helpers/trust_runs.py), as four hosts, one of them with a slow HBM figure judged again by
the run's own judge under the shipped cpu profile (what the run records of a node whose memory is slow); a
complete node run per agent would cost CI minutes. The merge excludes the slow node with its reason, in both
list forms; the fabric phase runs for real, every multinode test, one torchrun agent per accepted host read
from accepted-hosts.txt, as a part of the same run; the sign-off names three accepted and one excluded, and
exits 0.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest
from cluster_rehearsal import fabric_phase, outputs, report
from trust_runs import as_node, node_run, recorded, write_node  # noqa: F401  (node_run: the fixture)

from clustergate.criteria.thresholds import load, shipped_thresholds
from clustergate.record.rejudge import rejudge

pytestmark = pytest.mark.slow

NAMES = ["cg-n01", "cg-n02", "cg-n03", "cg-n04"]
PLANTED = "cg-n02"
FABRIC_TESTS = ["acceptance", "--level", "quick"]
"""Every multinode test, as the README's fabric phase runs them: the sign-off signs only what was tested."""


def slow_memory(results: dict[str, Any]) -> dict[str, Any]:
    """The node's HBM figures far below the cpu profile's minimum, judged again as its run judges them."""
    for test in results["tests"]:
        for metric in test["metrics"]:
            if metric["name"] == "hbm_bandwidth_tbps":
                for part in metric["per_rank"]:
                    part["value"] = 1e-5
    judged = rejudge(results, load(shipped_thresholds()).profile(results["profile"]))
    del judged["rejudged"]
    return judged


def test_four_nodes_signed_off_in_phases(tmp_path: Path, node_run: Path) -> None:  # noqa: F811
    run = tmp_path / "reports" / "run-0001"
    for name in NAMES:
        node = as_node(recorded(node_run), name, run.name)
        directory = write_node(run, name, slow_memory(node) if name == PLANTED else node)
        shutil.copy(node_run / "report.html", directory)  # each node's own report, linked from the merged one

    merged = report("merge", *sorted(str(p) for p in (run / "nodes").iterdir()), "-o", str(run),
                    "--expect-hosts", "cg-n[01-04]", "--level", "quick")
    assert merged.returncode == 1, merged.stdout  # not every expected node was accepted
    cluster = json.loads((run / "results.json").read_text())
    assert cluster["kind"] == "cluster" and cluster["accepted"] == [n for n in NAMES if n != PLANTED]
    assert cluster["run_id"] == "run-0001" and cluster["level"] == "quick"
    [excluded] = cluster["excluded"]
    assert excluded["host"] == PLANTED and "hbm_bandwidth_tbps" in excluded["reasons"][0]
    assert (run / "accepted-hosts.txt").read_text().split() == cluster["accepted"]
    assert (run / "accepted-hostlist.txt").read_text().strip() == "cg-n[01,03-04]"
    assert (run / "excluded-hostlist.txt").read_text().strip() == PLANTED
    host, reason, action = (run / "excluded-hosts.txt").read_text().rstrip("\n").split("\t")
    assert host == PLANTED and "test_hbm_bandwidth: hbm_bandwidth_tbps=" in reason and ">= 0.0005" in reason
    assert action == "retest"  # HBM below its criterion: run again on the idle node first
    merged_page = (run / "report.html").read_text()
    assert 'id="cg-verdict"><div class="cg-verdict">REJECT' in merged_page
    assert f'href="./nodes/{PLANTED}/report.html"' in merged_page  # the excluded node's own report, one click away

    accepted = (run / "accepted-hosts.txt").read_text().split()
    fabric = fabric_phase(run, accepted, FABRIC_TESTS, run_id=run.name)
    assert all(a.code == 0 for a in fabric), outputs(fabric)
    fabric_results = json.loads((run / "fabric" / "results.json").read_text())
    assert sorted(n["host"] for n in fabric_results["nodes"]) == accepted and fabric_results["run_id"] == "run-0001"
    assert fabric_results["verdict"] == "accept"  # a complete fabric run
    outcomes = {t["nodeid"].split("::")[-1]: t["outcome"] for t in fabric_results["tests"]}
    assert outcomes["test_collective_bandwidth[net-all_reduce]"] == "passed", outcomes
    assert outcomes["test_gpu_pairs[internode]"] == "passed" and "failed" not in outcomes.values(), outcomes

    signed = report("signoff", str(run))
    assert signed.returncode == 0, signed.stdout
    out = json.loads((run / "signoff.json").read_text())
    assert out["verdict"] == "accept" and out["accepted"] == accepted and out["reasons"] == []
    assert [(e["host"], e["phase"]) for e in out["excluded"]] == [(PLANTED, "node")]
    assert out["phases"]["fabric"]["rounds"] == 3 and out["phases"]["fabric"]["hosts"] == accepted
    assert "SIGNED OFF: 3 hosts accepted, 1 excluded" in signed.stdout
    page = (run / "signoff.html").read_text()
    assert 'class="cg-verdict">ACCEPT<' in page and PLANTED in page and "cg-n[01,03-04]" in page
    assert f'href="./nodes/{PLANTED}/report.html"' in page
