"""Firmware alike across the fleet (clustergate/cluster/firmware_fleet.py): a node on another version than the
fleet's is named with both and excluded, by the pure rule and by a real merge of node runs
(tests/helpers/cluster_runs.py) of which one carries another VBIOS."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cluster_runs import node_results, write_node

from clustergate.cluster.firmware_fleet import Versions, exclusions, node_versions
from clustergate.cluster.merge import merge
from workloads.gpu.firmware import DETAILS_KEY

GPU_TEST = "acceptance/test_gpu_firmware.py::test_gpu_firmware_alike"


def findings(fleet: dict[str, Versions]) -> dict[str, list[str]]:
    """Per host, the reasons ``exclusions`` gives it."""
    out: dict[str, list[str]] = {}
    for exclusion in exclusions(fleet):
        out.setdefault(exclusion.host, []).append(exclusion.reason)
    return out
FLEET_VBIOS, ODD_VBIOS = "96.00.A5.00.1A", "96.00.A5.00.1B"


def test_the_odd_node_is_named_with_the_fleets_version() -> None:
    fleet = {"n1": {"vbios": ("A",), "driver": ("570.1",)}, "n2": {"vbios": ("B",), "driver": ("570.1",)},
             "n3": {"vbios": ("A",), "driver": ("570.1",)}}
    assert findings(fleet) == {"n2": ["fleet firmware: vbios B on this node, the fleet's is A (2 of 3 nodes): flash "
                                      "the node to the fleet's version (or the fleet to one) and run it again"]}


def test_the_odd_nodes_step_is_to_align_its_firmware_naming_the_fleets_version() -> None:
    """Not a generic re-test: the node's firmware is what to change, to the version the fleet carries."""
    (found,) = exclusions({"n1": {"vbios": ("A",)}, "n2": {"vbios": ("B",)}, "n3": {"vbios": ("A",)}})
    assert found.step is not None and found.step.action.value == "config"
    assert found.step.category == "config_fleet_firmware" and found.step.where == "n2 vbios B; the fleet's A"
    assert "[n2 vbios B; the fleet's A]: bring the node to the fleet's version" in found.step.text()
    assert found.verdict is None  # excluded, its figures still the fleet's


def test_a_split_fleet_names_every_node_of_the_split() -> None:
    found = findings({"n1": {"hca_fw[MT_1]": ("28.39",)}, "n2": {"hca_fw[MT_1]": ("28.37",)}})
    assert sorted(found) == ["n1", "n2"]
    assert "no version is on most of the fleet's 2 nodes (28.39 on 1, 28.37 on 1)" in found["n1"][0]


def test_a_node_that_recorded_no_firmware_is_not_judged() -> None:
    assert node_versions({"tests": [{"nodeid": GPU_TEST, "details": {}}], "environment": {"driver": "570"}}) == {}
    assert findings({"n1": {}, "n2": {"vbios": ("A",)}}) == {}


def _with_firmware(results: dict[str, Any], host: str, vbios: str) -> dict[str, Any]:
    """The node run as a real one records it: test_gpu_firmware_alike passed, its details the node's versions."""
    test = next(t for t in results["tests"] if t["nodeid"] == GPU_TEST)
    test.update(outcome="passed", message="", skip_fact=None, phases=["setup", "call", "teardown"],
                details={DETAILS_KEY: {host: {"vbios": [vbios], "inforom": ["G520.0282.02.02"]}}})
    return results


def test_merge_names_the_node_on_another_vbios(tmp_path: Path) -> None:
    nodes = tmp_path / "run" / "nodes"
    for seed, host in enumerate(("m1", "m2", "m3"), start=1):
        write_node(nodes, host, _with_firmware(node_results(host, seed), host, ODD_VBIOS if host == "m2" else
                                               FLEET_VBIOS))
    cluster = merge(sorted(nodes.iterdir()), tmp_path / "run")
    assert cluster["accepted"] == ["m1", "m3"]
    (entry,) = cluster["excluded"]
    assert entry["host"] == "m2"
    assert entry["reasons"] == [f"fleet firmware: vbios {ODD_VBIOS} on this node, the fleet's is {FLEET_VBIOS} (2 of 3 "
                                "nodes): flash the node to the fleet's version (or the fleet to one) and run it again"]
    # Its own run passed: what to do is align its firmware (config), not run it again (retest).
    assert entry["action"] == "config"
    assert [(s["category"], s["where"]) for s in entry["steps"]] == [
        ("config_fleet_firmware", f"m2 vbios {ODD_VBIOS}; the fleet's {FLEET_VBIOS}")]
    assert (tmp_path / "run" / "excluded-hosts.txt").read_text().rstrip("\n").endswith("\tconfig")
