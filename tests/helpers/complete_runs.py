"""Crafted results.json files made complete by the suite's manifest, as a real run records them.

A test that crafts a node run (or a fabric run) names the tests it is about; ``complete`` adds every other
test of a complete run of that kind: skipped on a fact the manifest lets it skip on and the record bears out (as
GPU tests skip on CPU: ``clustergate.trust.skip_facts``), else passed, with a figure that meets the profile's criterion
for every metric it declares, judged by the run's own judge; records the phases each test ran; and attests the
run (``attested``: this checkout's suite, with the suite's plugins alone). Without it, a crafted file is a partial
run, which no command accepts.
"""

from __future__ import annotations

from typing import Any

from clustergate.criteria.thresholds import Profile, load, shipped_thresholds
from clustergate.record.judge import Record, Where, judge
from clustergate.trust import attestation, skip_facts
from clustergate.trust.completeness import manifest_id
from clustergate.trust.manifest import SuiteTest, shipped

RAN = ["setup", "call", "teardown"]
SKIPPED = ["setup", "teardown"]
PARAMS = {"below_level": lambda results: {"level": results.get("level")},
          "package_missing": lambda results: {"package": "deepspeed"},
          "dcgm_not_requested": lambda results: {"requested": None, "needs": 1}}


def earned_fact(test: SuiteTest, results: dict[str, Any]) -> dict[str, Any] | None:
    """A fact ``test`` may skip on in ``results`` (the manifest earns it, the record bears it out), or None. Never
    ``not_required`` (which setting is the test's own, a crafted run does not know), and ``no_shared_dir`` (which
    merge checks against the profile) last."""
    kind, level = skip_facts.profile_kind(results), str(results.get("level"))
    names = (["below_level"] if level in test.skipped_by_design else []) + sorted(
        (r.fact for r in test.skips if r.fact != "not_required"), key=lambda name: name == "no_shared_dir")
    for name in names:
        fact = skip_facts.fact(name, **PARAMS.get(name, lambda results: {})(results))
        if test.earns(name, kind, level) and skip_facts.problem(fact, results) is None:
            return fact
    return None


def _wheres(results: dict[str, Any]) -> list[Where]:
    """Every rank of the record, with its node and GPU."""
    out = []
    for node in results.get("nodes") or []:
        gpus = {g.get("rank"): g for g in node.get("gpus") or []}
        for rank in node.get("ranks") or []:
            gpu = gpus.get(rank) or {}
            out.append(Where(rank, node["host"], node.get("node_rank", 0), gpu.get("index"), gpu.get("serial"),
                             gpu.get("uuid")))
    return out


def _passing_value(criterion: dict[str, Any]) -> float:
    if "min" in criterion:
        return min(criterion["min"] * 1.05, criterion.get("ceiling", float("inf")))
    return criterion["max"] * 0.5 if "max" in criterion else 1.0


def measured(test: SuiteTest, results: dict[str, Any], profile: Profile) -> dict[str, Any]:
    """``test`` passed, every metric it declares with a figure on every rank that meets ``profile``'s criterion."""
    records = [Record(name, _passing_value(profile.metrics[name].as_json()), profile.metrics[name].unit or "",
                      scope, "", where)  # type: ignore[arg-type]
               for name, scope in test.metrics.items() for where in _wheres(results)]
    judged = judge(records, profile)
    assert all(j.passed for j in judged), [f for j in judged for f in j.failures]
    return {"outcome": "passed", "metrics": [j.as_json() for j in judged]}


def attest(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with the attestation of a clean run of this checkout where it has none (a real run's own is kept;
    in place)."""
    results.setdefault("attestation", attested(dry_run=skip_facts.profile_kind(results) == "cpu"))
    return results


def complete(results: dict[str, Any], run: str = "node", profile: Profile | None = None) -> dict[str, Any]:
    """``results`` with every test of a complete ``run`` (node | fabric), each test's phases and skip fact, and its
    attestation (in place). The tests added are named as the run names the suite's (``selection.suite``:
    ``acceptance`` from the checkout); one that may not skip here is measured under ``profile`` (default: the
    shipped profile the record names)."""
    manifest = shipped()
    selection = results.get("selection") or {}
    present = {manifest_id(t["nodeid"], selection, manifest) for t in results["tests"]}
    suite = str(selection.get("suite", manifest.suite)).rstrip("/")
    prefix = "" if suite in ("", ".") else suite + "/"
    for test in results["tests"]:
        test.setdefault("phases", SKIPPED if test["outcome"] == "skipped" else RAN)
        test.setdefault("problems", [])
        known = manifest.get(manifest_id(test["nodeid"], selection, manifest) or "")
        if test["outcome"] == "skipped" and "skip_fact" not in test and known is not None:
            test["skip_fact"] = earned_fact(known, results)
    added = []
    for t in manifest.of_run(run):
        if t.nodeid in present:
            continue
        fact = earned_fact(t, results)
        added.append({"nodeid": prefix + t.nodeid.split("/", 1)[1], "outcome": "skipped", "duration_s": 0.0,
                      "failed_ranks": [], "message": "not measured in this crafted run", "problems": [],
                      "metrics": [], "details": {}, "phases": SKIPPED, "skip_fact": fact})
        if fact is None:
            profile = profile or load(shipped_thresholds()).profile(str(results["profile"]))
            added[-1].update(message="", phases=RAN, **measured(t, results, profile))
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
    return attestation.section(attestation.suitefiles.Checked(attestation.suite_digest(), "git"), [plugin], dry_run,
                               foreign_code=[], environment_code={"checked": 1, "unattested": []})


def without_gpus(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` as a CPU run records itself: no node lists a GPU, no part names a GPU index, serial or UUID (its
    parts are ranks). Changed in place, and returned."""
    for node in results.get("nodes") or []:
        node["gpus"] = []
    for test in results.get("tests") or []:
        for metric in test.get("metrics") or []:
            for part in metric.get("per_rank") or []:
                for key in ("gpu_index", "gpu_serial", "gpu_uuid"):
                    part.pop(key, None)
    return results


# How many tests a complete node run has, from the shipped manifest: the own tests that quote a partial run's
# reason ("90 of the 92 tests ...") count from it, so a new acceptance test changes no assertion's text.
NODE_TESTS = len(shipped().of_run("node"))
