"""What binds the parts of one cluster run: its id, its suite, its profile, its times and its GPUs.

Every node run of a cluster run records the run's id (``CLUSTERGATE_RUN_ID``, which the launchers set to
RUN_ID of ``REPORTS/RUN_ID/nodes/``). The merge takes a node file only when

- it carries the run's id (``--run-id``, by default the name of the directory above ``nodes/``): a node
  file of an earlier or another cluster run, copied in, is not this run's;
- it ran this clustergate's suite: its ``attestation.suite_digest`` is the merge's own
  (``clustergate.trust.attestation.suite_digest``): one version across the cluster run;
- it was judged by the fleet's profile (``--profile``, else the one every node run agrees on; runs that
  disagree without ``--profile`` are an input error), and it is no dry run (the cpu profile) beside GPU nodes;
- it started within the run's window: within ``--window`` hours of the node phase's median start, and
  not after the merge (a file from days before, or from the future, is not this node phase's);
- under a GPU profile, every GPU it names has a UUID and a serial that are identities, not NVML's placeholders
  (``[N/A]``, zeros; the serial only where the profile does not say the model has none readable:
  ``settings.gpu_serial_readable: false``), and none of them appears on another host: one GPU cannot sit in two
  hosts, so every host that shares one is excluded (one node's file copied as another's).

A node that fails any of these is ``unbound``: excluded, its figures left out of the fleet. The merged
record keeps each node file's digest (keyed with a site key: ``clustergate.trust.keyed``); the sign-off checks the
files still match, and holds the fabric run to the same id, suite and profile, started after the merge
(``clustergate.cluster.signoff``).
"""

from __future__ import annotations

import re
import statistics
from collections import Counter
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from clustergate.cluster.node_runs import Exclusion, MergeInputError, NodeRun
from clustergate.common.results_view import ResultsView
from clustergate.criteria.thresholds import Profile, Thresholds
from clustergate.trust import attestation, skip_facts

WINDOW_H = 24.0
"""The node phase runs every node at once; a node run again after a repair the same day still belongs.
Days apart is another node phase."""
CLOCK_SKEW_S = 300.0
"""A node's clock may run this far ahead of the machine that merges."""
PLACEHOLDER = re.compile(r"\[?(n/?a|not supported|unknown|none|0+)\]?", re.IGNORECASE)
"""What NVML answers for a serial it cannot read: not an identity, never compared."""


def default_run_id(paths: Iterable[Path]) -> str:
    """The run id the node directories' place names: RUN_ID of ``REPORTS/RUN_ID/nodes/HOST`` (MergeInputError
    when they are not under one ``nodes/`` directory: then ``--run-id`` must say it)."""
    ids = set()
    for path in paths:
        if path.is_file() and path.name != "results.json":
            continue  # not a node directory: the merge leaves it out, saying so
        directory = path.parent if path.name == "results.json" else path
        if not directory.is_dir():
            raise MergeInputError(f"{path}: not a directory; give the node directories, e.g. REPORTS/RUN_ID/nodes/*")
        parent = directory.resolve().parent
        if parent.name != "nodes":
            raise MergeInputError(f"{path} is not in a nodes/ directory (REPORTS/RUN_ID/nodes/HOST): give the run's "
                                  "id with --run-id")
        ids.add(parent.parent.name)
    if len(ids) > 1:
        raise MergeInputError(f"the node directories belong to different runs ({', '.join(sorted(ids))}): merge one "
                              "run's nodes (REPORTS/RUN_ID/nodes/*), or give --run-id")
    if not ids:
        raise MergeInputError("no node directory to take the run's id from: give --run-id")
    return ids.pop()


def started(results: dict[str, Any]) -> datetime | None:
    try:
        when = datetime.fromisoformat(str(results.get("started")))
    except ValueError:
        return None
    return when if when.tzinfo else when.replace(tzinfo=timezone.utc)


def fleet_profile(runs: list[NodeRun], given: str | None, thresholds: Thresholds) -> Profile | None:
    """The profile that judges the cluster run: ``given`` (``--profile``), else the one every node run with a result
    was judged by (None when none has one); MergeInputError when it is not in ``thresholds``, or the runs disagree
    and none was given."""
    if given is not None:
        if given not in thresholds.profiles:
            raise MergeInputError(f"--profile {given}: {thresholds.path} has no such profile (profiles: "
                                  f"{', '.join(thresholds.profiles)})")
        return thresholds.profiles[given]
    seen = Counter(str(r.results.get("profile")) for r in runs if r.results is not None)
    if len(seen) > 1:
        said = ", ".join(f"{name} ({n} node{'s' if n > 1 else ''})" for name, n in seen.most_common())
        raise MergeInputError(f"the node runs were judged by different profiles: {said}; one profile judges a "
                              "cluster run: give the fleet's with --profile NAME (the others are excluded)")
    return thresholds.profiles.get(next(iter(seen))) if seen else None


def suite_problem(results: Mapping[str, Any]) -> str | None:
    """Why ``results`` did not run this clustergate's suite (another suite digest, or none recorded); None when it
    did."""
    theirs = (results.get("attestation") or {}).get("suite_digest") if isinstance(results.get("attestation"),
                                                                                   Mapping) else None
    if theirs is None:
        return ("its results.json does not say which suite ran it (no attestation.suite_digest: written by an older "
                "clustergate, or edited): run it again with this clustergate")
    ours = attestation.suite_digest()
    if theirs != ours:
        return (f"it ran another version of the suite ({theirs}, this clustergate's is {ours}): one version across "
                "the cluster run; install the same clustergate on every node and where merge and signoff run")
    return None


def profile_problem(results: Mapping[str, Any], profile: Profile, source: str) -> str | None:
    """Why ``results`` cannot stand in a cluster run judged by ``profile`` (``source`` says where that came from):
    judged by another profile, or a dry run (the cpu profile) beside GPU nodes; None when it can."""
    theirs = results.get("profile")
    if theirs != profile.name:
        return (f"it was judged by profile {theirs!r}, not the fleet's {profile.name!r} ({source}): one profile "
                "judges a cluster run")
    gpu_fleet = skip_facts.profile_kind(results, profile) == "gpu"
    if gpu_fleet and (results.get("attestation") or {}).get("dry_run") is True:
        return "it is a dry run (--dry-run, the cpu profile): a dry run is never signed off beside GPU nodes"
    return None


def identity_problem(results: Mapping[str, Any], profile: Profile) -> str | None:
    """Why the GPUs ``results`` names are not identities under ``profile`` (a GPU profile): none named, or a UUID or
    serial that is missing or NVML's placeholder (the serial only where the profile says the model has one)."""
    if skip_facts.profile_kind(results, profile) != "gpu":
        return None
    gpus = ResultsView.of(results).gpus
    if not gpus:
        return f"it names no GPU, though profile {profile.name!r} expects them: which hardware ran it is unknown"
    keys = ("uuid", "serial") if profile.settings.get("gpu_serial_readable", True) else ("uuid",)
    for gpu in gpus:
        for key in keys:
            value = gpu.get(key)
            if not isinstance(value, str) or not value.strip() or PLACEHOLDER.fullmatch(value.strip()):
                return (f"GPU {gpu.get('index')} has no {key} ({value!r}): a placeholder is not an identity, so "
                        f"which GPU ran it is unknown (a model without a readable serial: settings."
                        "gpu_serial_readable: false in its profile)")
    return None


def bind(runs: list[NodeRun], run_id: str, window_h: float, now: datetime, profile: Profile | None = None,
         profile_source: str = "the one every node run agrees on") -> tuple[dict[str, Any], list[Exclusion]]:
    """The window, as the merged record states it, and an ``unbound`` exclusion for every reason a node is not a
    part of run ``run_id`` judged by ``profile`` (id, suite, profile, window, GPUs)."""
    found: list[Exclusion] = []
    unbound = {r.host for r in runs if r.verdict == "unbound"}

    def unbind(run: NodeRun, reason: str) -> None:
        found.append(Exclusion(run.host, reason, verdict="unbound"))
        unbound.add(run.host)

    with_results = [r for r in runs if r.results is not None]
    for run in with_results:
        theirs = run.results.get("run_id") if run.results else None
        if theirs != run_id:
            said = f"run {theirs!r}" if theirs else "no run (CLUSTERGATE_RUN_ID was not set)"
            unbind(run, f"its results.json belongs to {said}, not to this run {run_id!r}: a node file of another "
                        "cluster run is not this node phase's")
        results = run.results or {}
        for problem in (suite_problem(results), profile and profile_problem(results, profile, profile_source),
                        profile and identity_problem(results, profile)):
            if problem:
                unbind(run, problem)
    times = {r.host: started(r.results) for r in with_results if r.host not in unbound and r.results}
    known = [t for t in times.values() if t is not None]
    window: dict[str, Any] = {"hours": window_h, "median_start": None, "from": None, "to": None}
    if known:
        median = datetime.fromtimestamp(statistics.median(t.timestamp() for t in known), tz=timezone.utc)
        low, high = median - timedelta(hours=window_h), min(median + timedelta(hours=window_h),
                                                            now + timedelta(seconds=CLOCK_SKEW_S))
        window = {"hours": window_h, "median_start": _iso(median), "from": _iso(low), "to": _iso(high)}
        for run in with_results:
            when = times.get(run.host)
            if run.host in unbound or run.host not in times:
                continue
            if when is None:
                unbind(run, "its results.json does not say when it started: which node phase it belongs to is unknown")
            elif when > now + timedelta(seconds=CLOCK_SKEW_S):
                unbind(run, f"it started {_iso(when)}, after this merge ({_iso(now)}): a clock or the file is wrong")
            elif not low <= when <= high:
                hours = abs((when - median).total_seconds()) / 3600
                unbind(run, f"it started {_iso(when)}, {hours:.1f} h from the node phase's median start "
                            f"{_iso(median)} (the run's window is {window_h:g} h: --window): not this node phase's run")
    found += _shared_gpus([r for r in with_results if r.host not in unbound])
    return window, found


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def gpu_ids(results: dict[str, Any]) -> set[tuple[str, str]]:
    """("serial" | "uuid", value) of every GPU a node's results.json names (placeholders left out)."""
    out = set()
    for gpu in ResultsView.of(results).gpus:
        for key in ("serial", "uuid"):
            value = gpu.get(key)
            if isinstance(value, str) and value.strip() and not PLACEHOLDER.fullmatch(value.strip()):
                out.add((key, value.strip()))
    return out


def _shared_gpus(runs: list[NodeRun]) -> list[Exclusion]:
    """An ``unbound`` exclusion of every host whose GPU serial or UUID another host names too."""
    holders: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        for ident in gpu_ids(run.results or {}):
            holders.setdefault(ident, []).append(run.host)
    shared = {ident: hosts for ident, hosts in holders.items() if len(hosts) > 1}
    by_host: dict[str, list[tuple[tuple[str, str], list[str]]]] = {}
    for ident, hosts in shared.items():
        for host in hosts:
            by_host.setdefault(host, []).append((ident, hosts))
    found = []
    for run in runs:
        if run.host in by_host:
            (kind, value), hosts = sorted(by_host[run.host])[0]
            others = ", ".join(h for h in hosts if h != run.host)
            more = len(by_host[run.host]) - 1
            found.append(Exclusion(run.host, f"GPU {kind} {value} also appears on {others}"
                                             f"{f' (and {more} more GPU ids)' if more else ''}: one GPU cannot be in "
                                             "two hosts, so which node ran which file is unknown (a node's file "
                                             "copied as another's?)", verdict="unbound"))
    return found
