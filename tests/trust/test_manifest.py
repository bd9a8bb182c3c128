"""The suite's manifest (clustergate/manifest.json) states what the acceptance suite is: it must agree with
what pytest collects of acceptance/, and with what a real run records (each metric's scope, the by-design
skips of the run's level). README's command 1 is a complete node run and still accepts."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from trust_runs import COMMAND, node_run, recorded  # noqa: F401  (node_run: the fixture)

from clustergate.record.verdict import of_record
from clustergate.trust import manifest
from clustergate.trust.completeness import partial
from workloads.common import LEVELS

from torchrun_job import ROOT

pytestmark = pytest.mark.slow  # a collection subprocess, and the shared torchrun run


def test_the_manifest_is_what_the_suite_collects() -> None:
    """`python -m clustergate.trust.manifest --write` would write the file as it is: the same tests in the same order,
    each with its declared metrics and its run (node, or fabric for a test marked multinode)."""
    shipped = manifest.shipped()
    collected = manifest.collect()
    tests, missing = manifest.from_collection(collected, shipped)
    assert not missing, f"state these scopes in {manifest.MANIFEST}: {missing}"
    assert [c["nodeid"] for c in collected] == [t.nodeid for t in shipped.tests], (
        "acceptance/ and clustergate/manifest.json list other tests: run "
        "`python -m clustergate.trust.manifest --write` and review the change")
    assert manifest.dumps(tests) == manifest.MANIFEST.read_text()
    assert manifest.LEVELS == LEVELS


def test_a_manifest_that_disagrees_with_the_collection_is_found() -> None:
    shipped = manifest.shipped()
    collected = [{"nodeid": t.nodeid, "metrics": list(t.metrics), "multinode": t.run == "fabric"}
                 for t in shipped.tests]
    collected[3]["metrics"].append("new_metric_gbps")
    collected.append({"nodeid": "acceptance/test_new.py::test_new", "metrics": [], "multinode": False})
    tests, missing = manifest.from_collection(collected, shipped)
    assert missing == [f"{collected[3]['nodeid']}: the scope of new_metric_gbps (gpu, node or world)"]
    assert manifest.dumps(tests) != manifest.MANIFEST.read_text()


def test_readme_command_1_accepts_as_a_complete_node_run(node_run: Path) -> None:  # noqa: F811
    status = int((node_run.parents[3] / "status").read_text())
    results = recorded(node_run)
    assert COMMAND == ["clustergate", "run"]
    assert status == 0 and results["verdict"] == "accept" and results["reason"] is None, results.get("reason")
    assert results["profile"] == "cpu" and results["level"] == "standard" and results["run_id"] == "run-trust"
    ids = [t["nodeid"] for t in results["tests"]]
    assert ids == [t.nodeid for t in manifest.shipped().tests]  # every test once, the fabric ones skipped on one node
    assert all(t["outcome"] == "skipped" for t in results["tests"]
               if manifest.shipped().get(t["nodeid"]).run == "fabric")
    assert partial(results, manifest.shipped(), need="node") == []
    assert of_record(results).verdict == "accept"
    assert results["selection"]["suite"] == "acceptance" and results["world_size"] == 2
    assert results["selection"]["args"] == [str(ROOT / "acceptance")]  # clustergate run names the suite it came with


def test_every_metric_is_recorded_in_the_scope_the_manifest_states(node_run: Path) -> None:  # noqa: F811
    results = recorded(node_run)
    seen = {(t["nodeid"], m["name"]): m["scope"] for t in results["tests"] for m in t["metrics"]}
    assert len(seen) > 20, "the run measured too little to check the manifest's scopes against"
    for (nodeid, name), scope in seen.items():
        assert manifest.shipped().get(nodeid).metrics[name] == scope, (nodeid, name)


def test_a_by_design_skip_of_the_level_is_what_the_run_skipped(node_run: Path) -> None:  # noqa: F811
    results = recorded(node_run)
    by_id = {t["nodeid"]: t for t in results["tests"]}
    designed = [t for t in manifest.shipped().tests if results["level"] in t.skipped_by_design]
    assert designed, "level standard skips the memory pattern test by design"
    for test in designed:
        assert by_id[test.nodeid]["outcome"] == "skipped", test.nodeid
    assert manifest.shipped().left_out_at("quick", "standard") == [
        "acceptance/test_storage.py::test_local_scratch_fio", "acceptance/test_storage.py::test_shared_dir_fio",
        "acceptance/test_finetune.py::test_lora_finetune_learns",
        "acceptance/test_finetune.py::test_fsdp_full_finetune",
        "acceptance/test_finetune.py::test_zero3_finetune"]


def test_the_manifest_ships_in_the_package() -> None:
    pyproject = (ROOT / "pyproject.toml").read_text()
    assert '"manifest.json"' in pyproject.split("[tool.setuptools.package-data]")[1].split("\n[")[0]
    data = json.loads(manifest.MANIFEST.read_text())
    assert data["suite"] == "acceptance" and len(data["tests"]) == len(manifest.shipped().tests)
