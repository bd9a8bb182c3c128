"""Crafted results.json files made complete by the suite's manifest, as a real run records them.

A test that crafts a node run (or a fabric run) names the tests it is about; ``complete`` adds every other
test of a complete run of that kind as skipped with a reason (a skip is what a run records of a test that
does not apply, as GPU tests skip on CPU), records the phases each test ran, and attests the run (``attested``:
this checkout's suite, with the suite's plugins alone). Without it, a crafted file is a partial run, which no
command accepts.
"""

from __future__ import annotations

from typing import Any

from clustergate import attestation
from clustergate.completeness import manifest_id
from clustergate.manifest import shipped

RAN = ["setup", "call", "teardown"]
SKIPPED = ["setup", "teardown"]


def complete(results: dict[str, Any], run: str = "node") -> dict[str, Any]:
    """``results`` with every test of a complete ``run`` (node | fabric) and each test's phases (in place). The
    tests added are named as the run names the suite's (``selection.suite``: ``acceptance`` from the checkout)."""
    manifest = shipped()
    selection = results.get("selection") or {}
    present = {manifest_id(t["nodeid"], selection, manifest) for t in results["tests"]}
    suite = str(selection.get("suite", manifest.suite)).rstrip("/")
    prefix = "" if suite in ("", ".") else suite + "/"
    for test in results["tests"]:
        test.setdefault("phases", SKIPPED if test["outcome"] == "skipped" else RAN)
        test.setdefault("problems", [])
    added = [{"nodeid": prefix + t.nodeid.split("/", 1)[1], "outcome": "skipped", "duration_s": 0.0,
              "failed_ranks": [], "message": "not measured in this crafted run", "problems": [], "metrics": [],
              "details": {}, "phases": SKIPPED}
             for t in manifest.of_run(run) if t.nodeid not in present]
    results["tests"] += added
    if isinstance(selection.get("selected"), int):
        selection["selected"] += len(added)
    results["attestation"] = attested()  # a run of a harness (gpu_replay's GPUs) is taken as the suite's run too
    return results


def attested(dry_run: bool = False) -> dict[str, Any]:
    """The attestation of a clean run of this checkout: its suite digest, checked against git, and the suite's
    plugins alone (one stands for them: pytest's own are many)."""
    plugin = attestation.plugin_entry("clustergate", "clustergate", attestation.__file__.replace(
        "attestation.py", "__init__.py"), attestation.suite_places())
    return attestation.section(attestation.suitefiles.Checked(attestation.suite_digest(), "git"), [plugin], dry_run)
