"""A run that ran less than a complete node or fabric run is partial, by any means: the rule on copies of one
real complete run, and real runs hollowed by pytest's own options."""

from __future__ import annotations

from pathlib import Path

import pytest
from trust_runs import node_run, recorded  # noqa: F401  (node_run: the fixture)

from clustergate.record.verdict import of_record
from clustergate.trust import manifest
from clustergate.trust.completeness import partial

from torchrun_job import ROOT, run_job

pytestmark = pytest.mark.slow  # the shared torchrun run, and runs of their own


def _without(results: dict, *names: str) -> dict:
    results["tests"] = [t for t in results["tests"] if not any(n in t["nodeid"] for n in names)]
    results["selection"]["selected"] = len(results["tests"])
    return results


def test_the_complete_run_is_complete_and_every_narrowing_is_partial(node_run: Path) -> None:  # noqa: F811
    """-k, --deselect: the tests a complete node run contains and the record does not are named."""
    shipped = manifest.shipped()
    assert partial(recorded(node_run), shipped) == []
    narrowed = _without(recorded(node_run), "test_gpu_compute.py")
    narrowed["selection"]["k"] = "not gpu_compute"
    reasons = partial(narrowed, shipped)
    [reason] = reasons
    assert reason.startswith(f"11 of the {len(shipped.of_run('node'))} tests of a complete node run did not run "
                             "(-k 'not gpu_compute'): "
                             "test_sustained_matmul, test_power_under_load, test_matmul_tflops[bf16]")
    assert of_record(narrowed).verdict == "partial"
    deselected = _without(recorded(node_run), "test_checkpoint_round_trip")
    deselected["selection"]["deselect"] = ["acceptance/test_training.py::test_checkpoint_round_trip"]
    assert partial(deselected, shipped) == [f"1 of the {len(shipped.of_run('node'))} tests of a complete node run "
                                            "did not run (--deselect (1)): "
                                            "test_checkpoint_round_trip"]


def test_a_call_phase_that_never_ran_is_partial(node_run: Path) -> None:  # noqa: F811
    hollow = recorded(node_run)
    world = next(t for t in hollow["tests"] if t["nodeid"].endswith("test_world_matches_profile"))
    world["phases"] = ["setup", "teardown"]  # passed, but its body never ran
    assert partial(hollow, manifest.shipped()) == [
        "1 tests never ran their body, only their fixtures (test_world_matches_profile): nothing was measured "
        "there (--setup-only or --setup-plan?)"]


def test_a_node_run_is_not_a_fabric_run_nor_one_node_a_fabric(node_run: Path) -> None:  # noqa: F811
    results = recorded(node_run)
    assert partial(results, manifest.shipped(), need="fabric") == [
        "a fabric run needs two or more nodes; this one ran on 1"]
    fabric_only = _without(recorded(node_run), *[t.nodeid.split("::")[1] for t in manifest.shipped().of_run("node")])
    assert [t["nodeid"] for t in fabric_only["tests"]] == [t.nodeid for t in manifest.shipped().of_run("fabric")]
    assert partial(fabric_only, manifest.shipped(), need="node")[0].startswith(
        f"{len(manifest.shipped().of_run('node'))} of the {len(manifest.shipped().of_run('node'))} tests of a "
        "complete node run did not run")


def test_a_run_below_the_required_level_ran_less(node_run: Path) -> None:  # noqa: F811
    results = recorded(node_run)
    assert partial(results, manifest.shipped(), need="node", level="standard") == []
    assert partial(results, manifest.shipped(), need="node", level="extended") == [
        "it ran at level standard, the site requires extended or more (level standard leaves out "
        "test_gpu_memory_patterns)"]


@pytest.mark.parametrize("mode", ["--setup-only", "--setup-plan"])
def test_a_run_that_runs_no_test_body_is_partial(tmp_path: Path, mode: str) -> None:
    """pytest records every test of a --setup-only or --setup-plan run as passed: nothing was measured."""
    r = run_job(tmp_path, [str(ROOT / "acceptance"), "--rootdir", str(ROOT), "-k", "test_world", mode], nproc=1,
                report_dir=tmp_path / "report", timeout=180)
    res = r.results
    assert r.codes == [1], r.output[-3000:]
    assert res["verdict"] == "partial" and {t["outcome"] for t in res["tests"]} == {"passed"}
    assert mode.lstrip("-") in res["selection"]["modes"]
    assert "2 tests never ran their body, only their fixtures (test_world_matches_profile, " \
           "test_allreduce_is_exact)" in res["reason"]
    n = len(manifest.shipped().of_run("node"))
    assert f"{n - 2} of the {n} tests of a complete node run did not run (-k 'test_world'" in res["reason"]
