"""The acceptance suite's manifest: what a complete node run and a complete fabric run contain.

``clustergate/manifest.json`` lists every test of the ``acceptance`` suite that ships with this
clustergate: its node id, whether it belongs to the fabric run (marked ``multinode``) or the node run,
the metrics it declares with the scope each is recorded in (``gpu``: one figure per rank, ``node``: one
per node, ``world``: one for the job), the levels that skip it by design on every profile (the LoRA
and ZeRO-3 fine-tunes at quick), and the facts on which it may skip (``skips``: each a fact of
``clustergate.trust.skip_facts``, for the profile kinds and levels it earns a skip at). It is data, read without
torch, so that ``merge``, ``signoff``, ``calibrate`` and the re-render hold every results.json to the same list
the run itself was held to (``clustergate.trust.completeness``). ``tests/trust/test_manifest.py`` fails when the suite's
collection and this file disagree; ``python -m clustergate.trust.manifest --write`` writes it again from the
collection, keeping the scopes, by-design skips and skip facts it already states (a new metric's scope and a
new test's skip facts are written by hand).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from typing import Any

from clustergate.trust.skip_facts import FACTS, PROFILE_KINDS

MANIFEST = Path(__file__).resolve().parent.parent / "manifest.json"
SCHEMA = 1
SCOPES = ("gpu", "node", "world")
LEVELS = ("quick", "standard", "extended")
"""The levels in the order of how much they run (``workloads.common.LEVELS``; the manifest's test checks
they agree)."""
RUNS = ("node", "fabric")


class ManifestError(ValueError):
    """The manifest file cannot be used; the message names the file, the entry and the fix."""


@dataclass(frozen=True, slots=True)
class SkipRule:
    """A fact on which a test may skip, for the profile kinds and run levels where it earns the skip."""

    fact: str
    """A fact of ``clustergate.trust.skip_facts.FACTS``."""
    profiles: tuple[str, ...] = PROFILE_KINDS
    """``cpu`` (the cpu profile), ``gpu`` (any GPU profile) or both."""
    levels: tuple[str, ...] = LEVELS
    """The run levels at which the fact earns the skip (a level that needs the test leaves it out)."""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"fact": self.fact}
        if self.profiles != PROFILE_KINDS:
            out["profiles"] = list(self.profiles)
        if self.levels != LEVELS:
            out["levels"] = list(self.levels)
        return out


@dataclass(frozen=True, slots=True)
class SuiteTest:
    """One test of the suite as the manifest states it."""

    nodeid: str
    """As pytest names it with the suite's parent directory as rootdir: ``acceptance/FILE::NAME[PARAM]``."""
    run: str
    """``node`` (every node alone, ``-m "not multinode"``) or ``fabric`` (``-m multinode``, two or more nodes)."""
    metrics: dict[str, str] = field(default_factory=dict)
    """Every metric the test declares (``@pytest.mark.metrics``) and the scope it is recorded in."""
    skipped_by_design: dict[str, str] = field(default_factory=dict)
    """Level -> why that level leaves the test out on every profile (the test skips itself, saying so)."""
    skips: tuple[SkipRule, ...] = ()
    """The facts on which the test may skip besides its by-design levels; a skip on any other is not earned."""
    time_limit: dict[str, float] = field(default_factory=dict)
    """Level -> the test's own limit there (``@pytest.mark.time_limit``), over its measured one
    (``clustergate.run.testlimit``); written from the collection."""

    def as_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"nodeid": self.nodeid, "run": self.run, "metrics": self.metrics}
        if self.skipped_by_design:
            out["skipped_by_design"] = self.skipped_by_design
        if self.skips:
            out["skips"] = [r.as_json() for r in self.skips]
        if self.time_limit:
            out["time_limit"] = self.time_limit
        return out

    def earns(self, fact: str, kind: str, level: str) -> bool:
        """Whether a skip on ``fact`` is earned by this test under a profile of ``kind`` (cpu | gpu) at ``level``:
        a rule says so, or the level leaves the test out by design on every profile."""
        if fact == "below_level" and level in self.skipped_by_design:
            return True
        return any(r.fact == fact and kind in r.profiles and level in r.levels for r in self.skips)


@dataclass(frozen=True, slots=True)
class Manifest:
    """The suite's tests, in run order."""

    suite: str
    tests: tuple[SuiteTest, ...]
    path: Path
    digest: str
    """sha256 (16 hex digits) of the file's bytes: which manifest a cluster record was checked against."""
    directory: Path | None = None
    """Where the suite's test files are (None: where the package named ``suite`` is installed)."""
    by_id: dict[str, SuiteTest] = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        self.by_id.update((t.nodeid, t) for t in self.tests)

    def of_run(self, run: str) -> tuple[SuiteTest, ...]:
        """The tests a complete ``run`` (node | fabric) contains."""
        return tuple(t for t in self.tests if t.run == run)

    def get(self, nodeid: str) -> SuiteTest | None:
        return self.by_id.get(nodeid)

    def suite_dir(self) -> Path | None:
        """The directory of the suite's test files: a run's node ids are matched to the manifest's through it
        (found without importing the suite: its conftest imports torch)."""
        if self.directory is not None:
            return self.directory
        spec = importlib.util.find_spec(self.suite)
        return Path(spec.origin).resolve().parent if spec is not None and spec.origin else None

    def left_out_at(self, level: str, required: str) -> list[str]:
        """The node-run tests a run at ``level`` skips by design that a run at ``required`` runs."""
        return [t.nodeid for t in self.of_run("node")
                if level in t.skipped_by_design and required not in t.skipped_by_design]


def _fail(path: Path, where: str, problem: str) -> ManifestError:
    return ManifestError(f"{path}: {where}: {problem}")


def _rule(path: Path, where: str, raw: Any) -> SkipRule:
    if not isinstance(raw, dict) or "fact" not in raw or set(raw) - {"fact", "profiles", "levels"}:
        raise _fail(path, where, "must be a mapping of fact and (optional) profiles and levels")
    if raw["fact"] not in FACTS:
        raise _fail(path, f"{where}.fact", f"must be one of {', '.join(FACTS)}, got {raw['fact']!r}")
    profiles, levels = tuple(raw.get("profiles", PROFILE_KINDS)), tuple(raw.get("levels", LEVELS))
    if not profiles or set(profiles) - set(PROFILE_KINDS):
        raise _fail(path, f"{where}.profiles", f"must list some of {', '.join(PROFILE_KINDS)}, got {list(profiles)}")
    if not levels or set(levels) - set(LEVELS):
        raise _fail(path, f"{where}.levels", f"must list some of {', '.join(LEVELS)}, got {list(levels)}")
    return SkipRule(raw["fact"], profiles, levels)


def _test(path: Path, i: int, raw: Any) -> SuiteTest:
    where = f"tests[{i}]"
    if not isinstance(raw, dict) or set(raw) - {"nodeid", "run", "metrics", "skipped_by_design", "skips",
                                                 "time_limit"}:
        raise _fail(path, where, "must be a mapping of nodeid, run, metrics and (optional) skipped_by_design, "
                                 "skips and time_limit")
    nodeid, run, metrics = raw.get("nodeid"), raw.get("run"), raw.get("metrics")
    if not isinstance(nodeid, str) or "::" not in nodeid:
        raise _fail(path, f"{where}.nodeid", f"must be a pytest node id FILE::NAME, got {nodeid!r}")
    if run not in RUNS:
        raise _fail(path, f"{nodeid}: run", f"must be one of {', '.join(RUNS)}, got {run!r}")
    if not isinstance(metrics, dict) or not all(isinstance(k, str) and v in SCOPES for k, v in metrics.items()):
        raise _fail(path, f"{nodeid}: metrics", f"must map each declared metric to its scope ({', '.join(SCOPES)})")
    skips = raw.get("skipped_by_design") or {}
    if not isinstance(skips, dict) or not all(k in LEVELS and isinstance(v, str) and v for k, v in skips.items()):
        raise _fail(path, f"{nodeid}: skipped_by_design", f"must map a level ({', '.join(LEVELS)}) to why it skips")
    rules = raw.get("skips") or []
    if not isinstance(rules, list):
        raise _fail(path, f"{nodeid}: skips", "must be a list of {\"fact\", \"profiles\"?, \"levels\"?}")
    limits = raw.get("time_limit") or {}
    if not isinstance(limits, dict) or not all(k in LEVELS and isinstance(v, (int, float)) and not isinstance(v, bool)
                                               and v > 0 for k, v in limits.items()):
        raise _fail(path, f"{nodeid}: time_limit", f"must map a level ({', '.join(LEVELS)}) to seconds > 0")
    return SuiteTest(nodeid, run, dict(metrics), dict(skips),
                     tuple(_rule(path, f"{nodeid}: skips[{j}]", r) for j, r in enumerate(rules)),
                     {k: float(v) for k, v in limits.items()})


def parse(text: bytes, path: Path) -> Manifest:
    """A manifest from its file's bytes (ManifestError naming the file and entry)."""
    try:
        data = json.loads(text.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise ManifestError(f"{path}: not a JSON manifest ({exc})") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("tests"), list):
        raise _fail(path, "top level", f"must be {{\"schema\": {SCHEMA}, \"suite\", \"tests\": [...]}}")
    if tuple(data.get("levels") or ()) != LEVELS:
        raise _fail(path, "levels", f"must be {list(LEVELS)}")
    tests = tuple(_test(path, i, raw) for i, raw in enumerate(data["tests"]))
    seen: set[str] = set()
    for t in tests:
        if t.nodeid in seen:
            raise _fail(path, t.nodeid, "listed twice")
        seen.add(t.nodeid)
    return Manifest(str(data.get("suite") or "acceptance"), tests, path, hashlib.sha256(text).hexdigest()[:16])


@cache
def _load(path: Path) -> Manifest:
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise ManifestError(f"{path}: cannot read the suite's manifest ({exc.strerror or exc}); reinstall "
                            "clustergate") from None
    return parse(text, path)


def shipped() -> Manifest:
    """The manifest of the acceptance suite installed with this clustergate (read once)."""
    return _load(MANIFEST)


# ---- writing it from the suite's collection -------------------------------------------------------------

def dumps(manifest_tests: list[SuiteTest], suite: str = "acceptance") -> str:
    """The manifest file's text: one line per test, so that a change to one test is one line of a diff."""
    lines = ",\n".join("  " + json.dumps(t.as_json(), sort_keys=False) for t in manifest_tests)
    return (f'{{"schema": {SCHEMA}, "suite": {json.dumps(suite)}, "levels": {json.dumps(list(LEVELS))},\n'
            f' "tests": [\n{lines}\n]}}\n')


def from_collection(collected: list[dict[str, Any]], known: Manifest | None) -> tuple[list[SuiteTest], list[str]]:
    """The manifest's tests from the suite's collection (``collect``), with the scopes, by-design skips and skip
    facts ``known`` states; and what must be written by hand (a metric whose scope no manifest states yet)."""
    scopes: dict[str, str] = {}
    for t in known.tests if known else ():
        scopes.update(t.metrics)
    missing: list[str] = []
    out: list[SuiteTest] = []
    for item in collected:
        old = known.get(item["nodeid"]) if known else None
        metrics = {}
        for name in item["metrics"]:
            scope = (old.metrics.get(name) if old else None) or scopes.get(name)
            if scope is None:
                missing.append(f"{item['nodeid']}: the scope of {name} (gpu, node or world)")
            metrics[name] = scope or "?"
        out.append(SuiteTest(item["nodeid"], "fabric" if item["multinode"] else "node", metrics,
                             dict(old.skipped_by_design) if old else {}, old.skips if old else (),
                             {k: float(v) for k, v in (item.get("time_limit") or {}).items()}))
    return out, missing


def time_limit(item: Any, level: str) -> float | None:
    """A test's own limit at ``level`` (a pytest item's ``@pytest.mark.time_limit(seconds)``, or ``(seconds,
    levels=[...])`` at those levels only); None where the test says none. The manifest records it and the run holds
    a test to it (``clustergate.run.testlimit``): one reading of the marker."""
    marker = item.get_closest_marker("time_limit")
    if marker is None or level not in marker.kwargs.get("levels", LEVELS):
        return None
    return float(marker.args[0])


class _Collector:
    """A pytest plugin that writes what the suite collected: node ids, declared metrics, the multinode mark, the
    test's own time limit at each level."""

    def __init__(self, out: Path) -> None:
        self.out = out

    def pytest_collection_finish(self, session: Any) -> None:
        items = [{"nodeid": item.nodeid,
                  "metrics": [n for m in item.iter_markers("metrics") for n in m.args],
                  "multinode": item.get_closest_marker("multinode") is not None,
                  "time_limit": {level: s for level in LEVELS if (s := time_limit(item, level)) is not None}}
                 for item in session.items]
        self.out.write_text(json.dumps(items))


def collect(suite: Path | None = None) -> list[dict[str, Any]]:
    """What pytest collects of the installed suite (a subprocess: the plugin sets up a one-rank world)."""
    import acceptance

    suite = suite or Path(acceptance.__file__).resolve().parent
    with tempfile.TemporaryDirectory(prefix="clustergate-manifest-") as tmp:
        out = Path(tmp) / "collected.json"
        code = ("import sys, pytest; from pathlib import Path; from clustergate.trust.manifest import _Collector; "
                "out = Path(sys.argv.pop(1)); sys.exit(pytest.main(sys.argv[1:], plugins=[_Collector(out)]))")
        env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
        for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "PYTEST_ADDOPTS"):
            env.pop(name, None)
        proc = subprocess.run([sys.executable, "-c", code, str(out), str(suite), "--collect-only", "-q",
                               "--rootdir", str(suite.parent), "-p", "no:cacheprovider", "--profile", "cpu",
                               "--report-dir", str(Path(tmp) / "report")],
                              cwd=suite.parent, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                              timeout=300)
        if not out.exists():
            raise ManifestError(f"collecting {suite} failed (exit {proc.returncode}):\n{proc.stdout[-3000:]}")
        return json.loads(out.read_text())


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clustergate.trust.manifest", description=__doc__.split("\n\n")[0])
    p.add_argument("--write", action="store_true", help=f"write {MANIFEST.name} from the suite's collection")
    args = p.parse_args(argv)
    known = shipped() if MANIFEST.exists() else None
    tests, missing = from_collection(collect(), known)
    text = dumps(tests)
    if missing:
        print("state these by hand in the manifest, then run again:\n  " + "\n  ".join(missing), file=sys.stderr)
    if args.write:
        MANIFEST.write_text(text)
        print(f"wrote {MANIFEST}: {len(tests)} tests")
    else:
        same = MANIFEST.exists() and MANIFEST.read_text() == text
        print(f"{MANIFEST} {'agrees with' if same else 'differs from'} the suite's collection ({len(tests)} tests)")
        return 0 if same and not missing else 1
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())
