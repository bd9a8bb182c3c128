"""Whether a run was judged by the site's thresholds: what ties a results.json to them.

A results.json carries, with every metric, the criterion that judged it, and under ``clustergate`` the
digest of the profile it ran under (``Profile.run_digest``). ``clustergate.record.verdict.of_record`` judges the
figures again, but against the criteria the file carries: a hand-edited file that lowers a minimum would
pass it. Merge and sign-off therefore hold every run to the thresholds they are given (``--thresholds``,
by default the shipped file): its profile must be one of them, its digest that profile's, and every
stored criterion that profile's criterion for the metric. Where not one run of a node phase was judged by them
(``fleet_problem``: a site profile's runs merged without its file), the command line is at fault, not each node.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping
from typing import Any

from clustergate.criteria.thresholds import Thresholds

ASK = "give the thresholds the run was started with (--thresholds FILE)"


def recorded_digest(results: Mapping[str, Any]) -> Any:
    """The digest of the profile a run recorded as the one that judged it (None: none recorded)."""
    return (results.get("clustergate") or {}).get("thresholds_digest")


def other_thresholds(results: Mapping[str, Any], thresholds: Thresholds) -> str | None:
    """Why ``results`` was judged under a profile or thresholds other than ``thresholds``' (the profile is not
    there, or its digest is not the one recorded); None when they are the ones it names."""
    name = str(results.get("profile"))
    profile = thresholds.profiles.get(name)
    if profile is None:
        return f"it ran under profile {name!r}, which {thresholds.path} does not have: {ASK}"
    recorded = recorded_digest(results)
    if recorded is not None and recorded != profile.run_digest:
        return (f"it was judged by other thresholds than profile {name!r} of {thresholds.path} "
                f"(digest {recorded}, that profile's is {profile.run_digest}): {ASK}")
    return None


def fleet_problem(runs: Iterable[Mapping[str, Any]], thresholds: Thresholds) -> str | None:
    """Why a whole node phase cannot be judged by ``thresholds``: every finished run was judged under a profile or
    thresholds it was not given (``other_thresholds``), a site profile merged without its file. That is the
    command line's mistake, not every node's: one line naming what the runs were judged by (exit 2), where
    excluding each node would drain a fleet that passed. None when any run was judged by them (a node judged by
    others among them is excluded, saying so: ``problem``)."""
    finished = [r for r in runs if r.get("verdict") != "running"]
    if not finished or any(other_thresholds(r, thresholds) is None for r in finished):
        return None
    seen = Counter((str(r.get("profile")), str(recorded_digest(r))) for r in finished)
    said = ", ".join(f"profile {name!r} (digest {digest}, {n} run{'s' if n > 1 else ''})"
                     for (name, digest), n in seen.most_common())
    return (f"the node runs were judged by {said}, which {thresholds.path} does not hold: pass the thresholds "
            "file they ran under (--thresholds FILE, the site profile's, as the node phase was given it)")


def problem(results: dict[str, Any], thresholds: Thresholds) -> str | None:
    """Why ``results`` (a schema-checked run) was not judged by ``thresholds``; None when it was, or when it
    still says "running" (no verdict yet to hold to anything: its readers exclude it as unfinished)."""
    if results.get("verdict") == "running":
        return None
    if (other := other_thresholds(results, thresholds)) is not None:
        return other
    name = str(results.get("profile"))
    profile = thresholds.profiles[name]
    if recorded_digest(results) is None:
        return ("its results.json does not say which thresholds judged it (no clustergate.thresholds_digest: "
                "written by an older clustergate, or edited): run it again")
    for test in results.get("tests") or []:
        for metric in test.get("metrics") or []:
            stored = metric.get("criterion") or {}
            criterion = profile.metrics.get(metric.get("name"))
            # the criterion that judged it: a by_nodes row is the one of the run's own node count
            expected = criterion.for_nodes(len(results.get("nodes") or [])).as_json() if criterion is not None else {}
            if stored != expected:
                return (f"the file was edited after the run: {test.get('nodeid')} stores a criterion for "
                        f"{metric.get('name')} that profile {name!r} of {thresholds.path} does not have "
                        f"({stored}; the profile's: {expected})")
    return None
