"""What merge keeps of a node file past its read (clustergate.cluster.node_facts): the facts its later steps read,
none of the detail that made a merge of 10,000 nodes need 8 GB."""

from __future__ import annotations

import json

from cluster_runs import node_results

from clustergate.cluster.node_facts import keep, slim
from clustergate.cluster.node_runs import NodeRun, failed_tests
from clustergate.record import actions
from clustergate.trust import completeness
from clustergate.trust.manifest import shipped


def test_a_slim_record_says_what_the_whole_one_says_to_merges_later_steps_in_a_fraction_of_it() -> None:
    whole = node_results("gpu01", 1, {("hbm_bandwidth_tbps", 2): 0.5})
    healthy = node_results("gpu02", 2)
    kept = slim(whole)
    assert len(json.dumps(kept)) * 5 < len(json.dumps(whole))
    # The node's identity and inventory stay whole (the host's GPUs, serials, software): the fleet's checks read them.
    assert {k: v for k, v in kept.items() if k != "tests"} == {k: v for k, v in whole.items() if k != "tests"}
    passed = [t for t in kept["tests"] if t["outcome"] == "passed"]
    assert passed and all(set(t) <= {"nodeid", "outcome", "phases", "skip_fact", "duration_s"} for t in passed)
    [failed] = [t for t in kept["tests"] if t["outcome"] == "failed"]
    assert failed["metrics"] and any(p["passed"] is False for m in failed["metrics"] for p in m["per_rank"])
    # The host's steps and the fleet's skips are the same from what is kept as from the whole file.
    assert actions.steps(kept) == actions.steps(whole) and actions.steps(kept)
    assert completeness.fleet_problems({"gpu01": kept, "gpu02": slim(healthy)}, shipped()) == \
        completeness.fleet_problems({"gpu01": whole, "gpu02": healthy}, shipped())


def test_a_nodes_failure_lines_are_said_while_its_messages_are_there() -> None:
    whole = node_results("gpu01", 1, {("hbm_bandwidth_tbps", 2): 0.5})
    run = NodeRun("gpu01", "/r/nodes/gpu01", "reject", results=whole, unjudged=node_results("gpu01", 1))
    lines = failed_tests(whole)
    keep(run)
    assert run.failed == lines and lines[0]["summary"].startswith("hbm_bandwidth_tbps=")
    assert run.drift == [] and run.results is not None and run.unjudged is not None
    assert not any("details" in t for t in run.results["tests"] + run.unjudged["tests"] if t["outcome"] == "passed")
