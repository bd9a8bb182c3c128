"""The fabric phase's node-pair rounds on 4 "nodes" under torchrun, one with a planted slow link.

The planted node's first partner becomes a suspect with it; the next round pairs each suspect with a
node already known good, the planted node is slow again and is excluded with that evidence, and its
first partner is cleared. The rounds are fixed (3 on CPU), each pairs the nodes disjointly. The
sign-off then keeps the other three.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from cluster_rehearsal import fabric_phase, outputs
from cluster_runs import node_results, write_node

from clustergate.cluster.merge import merge
from clustergate.cluster.signoff import signoff
from clustergate.criteria.thresholds import load
from clustergate.trust.manifest import shipped

from torchrun_job import ROOT

pytestmark = pytest.mark.slow

NAMES = ["cg-a01", "cg-a02", "cg-a03", "cg-a04"]
SLOW = "cg-a03"


def pair_thresholds(path: Path, fraction: float = 0.2) -> Path:
    """The shipped thresholds, with the cpu profile judging node pairs against the median node too, as a
    failure (the shipped cpu profile has no outlier_fraction, shared cores vary too much to judge by it,
    and its estimate only warns)."""
    data = yaml.safe_load((ROOT / "thresholds.yaml").read_text())
    data["profiles"]["cpu"]["metrics"]["internode_pair_bw_gbps"].update(outlier_fraction=fraction, severity="fail")
    path.write_text(yaml.safe_dump(data))
    return path


def test_slow_node_is_excluded_after_repairing_with_a_known_good_node(tmp_path: Path) -> None:
    thresholds = pair_thresholds(tmp_path / "thresholds.yaml")
    # A node phase that accepted all four (synthetic results under the same names and profile: one profile judges
    # a cluster run), merged first.
    for i, name in enumerate(NAMES):
        write_node(tmp_path / "nodes", name, node_results(name, i, profile=load(thresholds).profile("cpu")))
    merge(sorted((tmp_path / "nodes").iterdir()), tmp_path, thresholds=thresholds)
    agents = fabric_phase(tmp_path, NAMES, ["acceptance/test_interconnect.py", "-k", "internode",
                                            "--thresholds", str(thresholds)],
                          planted={SLOW: ["-p", "tests.faults.plugin_slow_link"]}, timeout=150, run_id=tmp_path.name)
    res = json.loads((tmp_path / "fabric" / "results.json").read_text())
    [test] = res["tests"]
    assert test["outcome"] == "failed", outputs(agents)
    rounds = test["details"]["node_rounds"]
    assert rounds["rounds"] == 3 == len(rounds["plans"])
    for plan in rounds["plans"]:
        nodes = [n for pair in plan for n in pair]
        assert len(nodes) == len(set(nodes))  # disjoint: every node in one pair at most
    assert [e["host"] for e in rounds["excluded"]] == [SLOW]
    evidence = rounds["excluded"][0]["evidence"]
    assert "suspect" in evidence[0] and "known good" in evidence[1] and evidence[1].endswith("excluded")
    status = {n["host"]: n["status"] for n in rounds["nodes"]}
    assert status == {name: "excluded" if name == SLOW else "good" for name in NAMES}
    first_partner = next(p["a"] if p["b"] == SLOW else p["b"] for p in rounds["pairs"]
                         if p["round"] == 1 and SLOW in (p["a"], p["b"]))
    assert any("cleared" in line for line in next(n for n in rounds["nodes"] if n["host"] == first_partner)["evidence"])
    # The judged figure names the slow node's GPU only: its partners' medians leave the excluded node out.
    [metric] = test["metrics"]
    failing = {p["host"] for p in metric["per_rank"] if not p["passed"]}
    assert failing == {SLOW}, test["message"]
    assert all(a.code != 0 for a in agents)  # a failed test fails the fabric job on every node

    # The pair rounds' exclusion lands on the slow node alone; the rest is not signed off, since this fabric run
    # was narrowed to one file and -k, and so did not test every multinode check (it signs only what was tested).
    out = signoff(tmp_path, thresholds=thresholds)  # the thresholds every phase ran under
    assert out["accepted"] == [n for n in NAMES if n != SLOW], out["reasons"]
    [reason] = out["reasons"]
    assert out["verdict"] == "reject" and reason.startswith(
        f"fabric phase: ran less than a complete run: {len(shipped().of_run('fabric')) - 1} of the "
        f"{len(shipped().of_run('fabric'))} tests of a complete fabric run did not run (-k "
        "'internode', -m 'multinode', paths acceptance/test_interconnect.py)"), reason
    [excluded] = out["excluded"]
    assert (excluded["host"], excluded["phase"]) == (SLOW, "fabric") and "known good" in excluded["reasons"][1]
    assert 'href="./fabric/report.html"' in (tmp_path / "signoff.html").read_text()
