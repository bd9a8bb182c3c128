"""Whether a run was judged by the site's thresholds: what ties a results.json to them.

A results.json carries, with every metric, the criterion that judged it, and under ``clustergate`` the
digest of the profile it ran under (``Profile.run_digest``). ``clustergate.record.verdict.of_record`` judges the
figures again, but against the criteria the file carries: a hand-edited file that lowers a minimum would
pass it. Merge and sign-off therefore hold every run to the thresholds they are given (``--thresholds``,
by default the shipped file): its profile must be one of them, its digest that profile's, and every
stored criterion that profile's criterion for the metric.
"""

from __future__ import annotations

from typing import Any

from clustergate.criteria.thresholds import Thresholds

ASK = "give the thresholds the run was started with (--thresholds FILE)"


def problem(results: dict[str, Any], thresholds: Thresholds) -> str | None:
    """Why ``results`` (a schema-checked run) was not judged by ``thresholds``; None when it was, or when it
    still says "running" (no verdict yet to hold to anything: its readers exclude it as unfinished)."""
    if results.get("verdict") == "running":
        return None
    name = str(results.get("profile"))
    profile = thresholds.profiles.get(name)
    if profile is None:
        return f"it ran under profile {name!r}, which {thresholds.path} does not have: {ASK}"
    recorded = (results.get("clustergate") or {}).get("thresholds_digest")
    if recorded is None:
        return ("its results.json does not say which thresholds judged it (no clustergate.thresholds_digest: "
                "written by an older clustergate, or edited): run it again")
    if recorded != profile.run_digest:
        return (f"it was judged by other thresholds than profile {name!r} of {thresholds.path} "
                f"(digest {recorded}, that profile's is {profile.run_digest}): {ASK}")
    for test in results.get("tests") or []:
        for metric in test.get("metrics") or []:
            stored = metric.get("criterion") or {}
            criterion = profile.metrics.get(metric.get("name"))
            expected = criterion.as_json() if criterion is not None else {}
            if stored != expected:
                return (f"the file was edited after the run: {test.get('nodeid')} stores a criterion for "
                        f"{metric.get('name')} that profile {name!r} of {thresholds.path} does not have "
                        f"({stored}; the profile's: {expected})")
    return None
