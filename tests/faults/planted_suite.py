"""A pytest plugin for the suite's own tests of the run: the test files planted in the run's directory are the
whole suite.

The run holds its verdict to the acceptance suite's manifest (``clustergate.trust.manifest``): a run of a planted
test file ran none of the suite's tests, so it is partial, never accept. The tests of the run's endings
(signals, lost ranks, timeouts, the final barrier an accept waits for) need a run that can accept in seconds:
loaded with ``-p tests.faults.planted_suite``, this makes what the run collected its manifest, and itself, the
harness's plugins and the conftest files planted beside the tests the suite's plugins, so a clean run of the planted
file is complete and its verdict is the run's own. It exists only here, loaded by a test as it
would load a fault; ``merge``, ``signoff``, ``calibrate`` and the re-render read the shipped manifest, so a
planted run never counts there.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from clustergate.trust import attestation, manifest
from clustergate.trust.completeness import manifest_id, suite_prefix

PLANTED: list[manifest.Manifest] = []


def _planted() -> manifest.Manifest:
    """The planted suite: the test files under the directory the run is started in (its rootdir)."""
    if PLANTED:
        return PLANTED[0]
    return manifest.Manifest("planted", (), Path("planted"), "planted", directory=Path.cwd())


manifest.shipped = _planted  # before the plugin reads it (this module is imported when -p names it)
_suite_places = attestation.suite_places
# The planted suite's plugins are the suite's: this module, the harness's own (the suite's tests/: a planted fault,
# gpu_replay), and the conftest files planted beside the test files (under the planted suite's directory, which
# suite_places takes from the manifest).
HARNESS = Path(attestation.__file__).resolve().parents[2] / "tests"  # clustergate/trust/attestation.py
attestation.suite_places = lambda: (*_suite_places(), Path(__file__).resolve(), HARNESS)


@pytest.hookimpl(tryfirst=True)  # what was collected, before -k, -m or --deselect leave any of it out
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    planted = _planted()
    where = {"suite": suite_prefix((item.nodeid, item.path) for item in items)}  # as the run records it
    # A multinode test may skip on one node, as the suite's own do (the run records that fact for it).
    tests = tuple(manifest.SuiteTest(str(manifest_id(item.nodeid, where, planted)),
                                     "fabric" if item.get_closest_marker("multinode") else "node",
                                     {n: "gpu" for m in item.iter_markers("metrics") for n in m.args}, {},
                                     (manifest.SkipRule("one_node"),) if item.get_closest_marker("multinode") else ())
                  for item in items if manifest_id(item.nodeid, where, planted))
    PLANTED[:] = [manifest.Manifest("planted", tests, Path("planted"), "planted", directory=Path.cwd())]
