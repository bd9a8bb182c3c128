"""How long each test of the suite takes when healthy: the readings a test's limit follows
(``clustergate.run.testlimit``), and the reference file that ships them.

A reading is a test's ``duration_s`` in a finished run's results.json (rank 0's setup, call and teardown) where the
test passed, its body run. Readings are kept per profile, level and job shape (nodes x ranks a node): a test whose
time grows with the node's GPUs or the job's nodes is measured on that shape, or has no measured time there.

``clustergate/durations.json`` holds the reference readings: real runs, each with where it was measured (when,
which hosts and GPUs, the verdict, the versions, the machine in words). It is written from finished results.json
files, never by hand::

    python -m clustergate.run.durations RUN1/results.json RUN2/results.json --machine "one H200 SXM, 16 cores, a VM"

Each file's profile, level and shape come from the file itself; the readings of every (profile, level, shape) the
files measure replace that group's earlier ones (``--keep`` adds to them). The site's own readings come from its
results store (``clustergate.store.db.Store.accepted_runs``), by the same rule (``readings``).
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from clustergate.record import resultsfile
from clustergate.trust.manifest import LEVELS

if TYPE_CHECKING:
    from clustergate.store import Store

DURATIONS = Path(__file__).resolve().parent.parent / "durations.json"
SCHEMA = 1


class DurationsError(ValueError):
    """The reference file cannot be used; the message names the file, the entry and the fix."""


@dataclass(frozen=True, slots=True)
class Shape:
    """A job's shape: how many nodes, how many ranks on each."""

    nodes: int
    ranks_per_node: int

    @property
    def key(self) -> str:
        """As the reference file keys it: ``1x8``."""
        return f"{self.nodes}x{self.ranks_per_node}"

    def describe(self) -> str:
        return (f"{self.nodes} node{'s' if self.nodes != 1 else ''} x {self.ranks_per_node} "
                f"rank{'s' if self.ranks_per_node != 1 else ''}")

    @classmethod
    def of(cls, world_size: int, nodes: int) -> Shape:
        """The shape of a job of ``world_size`` ranks on ``nodes`` nodes (torchrun starts as many on each)."""
        nodes = max(1, nodes)
        return cls(nodes, max(1, world_size // nodes))

    @classmethod
    def of_results(cls, results: Mapping[str, Any]) -> Shape:
        return cls.of(int(results.get("world_size") or 1), len(results.get("nodes") or []))

    @classmethod
    def parse(cls, key: str) -> Shape:
        nodes, _, ranks = key.partition("x")
        if not (nodes.isdigit() and ranks.isdigit() and int(nodes) >= 1 and int(ranks) >= 1):
            raise ValueError(f"a shape is NODESxRANKS (e.g. 1x8), got {key!r}")
        return cls(int(nodes), int(ranks))


@dataclass(frozen=True, slots=True)
class Key:
    """What readings are kept and looked up by."""

    profile: str
    level: str
    shape: Shape

    def describe(self) -> str:
        return f"profile {self.profile}, level {self.level}, {self.shape.describe()}"


@dataclass(frozen=True, slots=True)
class Healthy:
    """A test's healthy time: the slowest of its readings, and where they come from."""

    seconds: float
    readings: int
    where: str
    """In words: 'reference: 2 runs on vm (2026-11-29)', 'store: 4 accepted runs (newest 2026-12-01)'."""

    def as_message(self) -> list[Any]:
        return [self.seconds, self.readings, self.where]

    @classmethod
    def from_message(cls, message: Any) -> Healthy:
        """A reading as rank 0 shares it; ValueError for any other shape (clustergate.run.ranks.control checks it)."""
        if not (isinstance(message, list) and len(message) == 3 and isinstance(message[0], (int, float))
                and not isinstance(message[0], bool) and message[0] >= 0 and isinstance(message[1], int)
                and message[1] >= 1 and isinstance(message[2], str)):
            raise ValueError(f"a healthy time is [seconds, readings, where], got {message!r}")
        return cls(float(message[0]), message[1], message[2])


def readings(results: Mapping[str, Any]) -> dict[str, float]:
    """Every healthy reading of a finished run: ``{nodeid: duration_s}`` of each test that passed with its body run
    (a skipped test measured nothing; a failed one may have been cut short or held up). None of a run that still says
    'running' (under way, or killed)."""
    if results.get("verdict") in (None, "running"):
        return {}
    found = {}
    for test in results.get("tests") or []:
        seconds = test.get("duration_s")
        if test.get("outcome") == "passed" and "call" in (test.get("phases") or ["call"]) \
                and isinstance(seconds, (int, float)) and not isinstance(seconds, bool) and seconds >= 0:
            found[str(test.get("nodeid"))] = float(seconds)
    return found


def slowest(readings_of_runs: Iterable[dict[str, float]], where: str) -> dict[str, Healthy]:
    """Each test's healthy time over several runs' readings: the slowest, with how many there were."""
    seen: dict[str, list[float]] = {}
    for each in readings_of_runs:
        for nodeid, seconds in each.items():
            seen.setdefault(nodeid, []).append(seconds)
    return {nodeid: Healthy(max(values), len(values), where) for nodeid, values in seen.items()}


def site(store: Store, key: Key, newest: int) -> dict[str, Healthy]:
    """Each test's healthy time in the site's ``newest`` accepted runs of ``key`` in ``store`` (StoreError where it
    cannot be read)."""
    shape = key.shape
    runs = store.accepted_runs(key.profile, key.level, nodes=shape.nodes, world_size=shape.nodes * shape.ranks_per_node,
                               newest=newest)
    last = max((str(r.get("started") or "") for r in runs), default="")[:10]
    return slowest((readings(r) for r in runs),
                   f"store: {len(runs)} accepted run{'s' if len(runs) != 1 else ''}" + (f" to {last}" if last else ""))


# ---- the reference file ---------------------------------------------------------------------------------------

def _fail(path: Path, where: str, problem: str) -> DurationsError:
    return DurationsError(f"{path}: {where}: {problem}; write it again with python -m clustergate.run.durations")


def check(data: Any, path: Path) -> dict[str, Any]:
    """The reference file's content, checked: ``{schema, profiles: {PROFILE: {LEVEL: {SHAPE: {runs, tests}}}}}``."""
    if not isinstance(data, dict) or data.get("schema") != SCHEMA or not isinstance(data.get("profiles"), dict):
        raise _fail(path, "top level", f'must be {{"schema": {SCHEMA}, "profiles": {{...}}}}')
    for profile, levels in data["profiles"].items():
        if not isinstance(levels, dict) or set(levels) - set(LEVELS) or \
                not all(isinstance(shapes, dict) for shapes in levels.values()):
            raise _fail(path, f"profiles.{profile}", f"must map levels ({', '.join(LEVELS)}) to shapes")
        for level, shapes in levels.items():
            for shape, group in shapes.items():
                where = f"profiles.{profile}.{level}.{shape}"
                try:
                    Shape.parse(shape)
                except ValueError as exc:
                    raise _fail(path, where, str(exc)) from None
                if not (isinstance(group, dict) and isinstance(group.get("runs"), dict)
                        and isinstance(group.get("tests"), dict)):
                    raise _fail(path, where, "must hold runs and tests")
                for nodeid, seen in group["tests"].items():
                    if not isinstance(seen, dict) or not seen or any(
                            run not in group["runs"] or isinstance(s, bool) or not isinstance(s, (int, float))
                            or s < 0 for run, s in seen.items()):
                        raise _fail(path, f"{where}.tests.{nodeid}", "must map runs of the group to seconds >= 0")
    return data


@cache
def _load(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise DurationsError(f"{path}: cannot read the reference durations ({exc.strerror or exc}); reinstall "
                             "clustergate") from None
    except ValueError as exc:
        raise DurationsError(f"{path}: not JSON ({exc}); write it again with python -m clustergate.run.durations") \
            from None
    return check(data, path)


def reference(key: Key, path: Path = DURATIONS) -> dict[str, Healthy]:
    """The reference healthy time of every test measured for ``key`` (none where that profile, level and shape
    were never measured)."""
    group = _load(path)["profiles"].get(key.profile, {}).get(key.level, {}).get(key.shape.key)
    if not group:
        return {}
    runs = group["runs"]
    found = {}
    for nodeid, seen in group["tests"].items():
        used = [runs[r] for r in seen]
        hosts = sorted({h for run in used for h in run.get("hosts") or []})
        dates = sorted({str(run.get("started") or "")[:10] for run in used} - {""})
        machine = "; ".join(sorted({str(run["machine"]) for run in used if run.get("machine")}))
        where = (f"reference: {len(used)} run{'s' if len(used) != 1 else ''} on {', '.join(hosts) or 'an unnamed host'}"
                 + (f" ({machine})" if machine else "") + (f", {dates[0]}" if dates else "")
                 + (f" to {dates[-1]}" if len(dates) > 1 else ""))
        found[nodeid] = Healthy(float(max(seen.values())), len(seen), where)
    return found


# ---- writing it from finished runs ------------------------------------------------------------------------------

def run_entry(results: Mapping[str, Any], machine: str | None) -> dict[str, Any]:
    """Where a run was measured, as the reference file keeps it."""
    gpus = sorted({str(g.get("name")) for n in results.get("nodes") or [] for g in n.get("gpus") or []
                   if g.get("name")})
    env = results.get("environment") or {}
    entry = {"started": results.get("started"), "verdict": results.get("verdict"),
             "hosts": sorted({str(n.get("host")) for n in results.get("nodes") or [] if n.get("host")}),
             "gpus": gpus, "torch": env.get("torch"), "python": env.get("python"),
             "clustergate": (results.get("clustergate") or {}).get("version"),
             "suite_digest": (results.get("attestation") or {}).get("suite_digest")}
    if machine:
        entry["machine"] = machine
    return entry


def add(data: dict[str, Any], runs: list[tuple[Path, Mapping[str, Any]]], machine: str | None = None,
        keep: bool = False) -> list[str]:
    """Add the readings of finished ``runs`` (path, results) to ``data`` (the reference file's content), each under
    its own profile, level and shape; what it did, one line each. Without ``keep`` every group the runs measure
    loses its earlier readings first: a group's readings are one measurement."""
    said: list[str] = []
    cleared: set[tuple[str, str, str]] = set()
    for path, results in runs:
        seen = readings(results)
        if not seen:
            raise DurationsError(f"{path}: no test passed in this run (verdict {results.get('verdict')!r}): it has "
                                 "no healthy durations")
        profile, level = str(results.get("profile")), str(results.get("level"))
        if level not in LEVELS:
            raise DurationsError(f"{path}: level {level!r} is not one of {', '.join(LEVELS)}")
        shape = Shape.of_results(results)
        group_key = (profile, level, shape.key)
        levels = data["profiles"].setdefault(profile, {}).setdefault(level, {})
        if not keep and group_key not in cleared:
            levels.pop(shape.key, None)
            cleared.add(group_key)
        group = levels.setdefault(shape.key, {"runs": {}, "tests": {}})
        run = f"r{1 + max((int(r[1:]) for r in group['runs'] if r[1:].isdigit()), default=0)}"
        group["runs"][run] = run_entry(results, machine)
        for nodeid, seconds in seen.items():
            group["tests"].setdefault(nodeid, {})[run] = round(seconds, 3)
        verdict = results.get("verdict")
        note = "" if verdict == "accept" else f" (verdict {verdict}: its passed tests only)"
        said.append(f"{path}: {len(seen)} readings -> {profile} {level} {shape.key} as {run}{note}")
    return said


def dumps(data: Mapping[str, Any]) -> str:
    """The reference file's text, keys sorted: one line per run and per test, so that a new measurement of one group
    is a diff of that group's lines."""
    def block(value: Any, depth: int) -> str:
        if depth == 6 or not isinstance(value, dict):  # a run's entry, a test's readings
            return json.dumps(value, sort_keys=True)
        pad = " " * (depth + 1)
        lines = [f"{pad}{json.dumps(k)}: {block(v, depth + 1)}" for k, v in sorted(value.items())]
        return "{\n" + ",\n".join(lines) + "\n" + " " * depth + "}" if lines else "{}"
    return block(dict(data), 0) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m clustergate.run.durations", description=__doc__.split("\n\n")[0],
                                epilog="\n\n".join(__doc__.split("\n\n")[1:]),
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="+", type=Path, help="finished runs' results.json (or their report directories)")
    p.add_argument("--machine", default=None, help="the machine in words, kept beside each run (GPU, cores, a VM)")
    p.add_argument("--keep", action="store_true", help="add to the groups' earlier readings instead of replacing "
                                                       "them")
    p.add_argument("--file", type=Path, default=DURATIONS, help=f"the reference file (default: {DURATIONS})")
    args = p.parse_args(argv)
    try:
        data = check(json.loads(args.file.read_text()), args.file) if args.file.exists() \
            else {"schema": SCHEMA, "profiles": {}}
        runs = [(path / "results.json" if path.is_dir() else path, resultsfile.read(path)) for path in args.results]
        said = add(data, runs, args.machine, args.keep)
    except (DurationsError, ValueError, OSError) as exc:  # ResultsFileError is a ValueError
        print(f"python -m clustergate.run.durations: {exc}", file=sys.stderr)
        return 2
    args.file.write_text(dumps(data))
    print("\n".join([*said, f"wrote {args.file}"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
