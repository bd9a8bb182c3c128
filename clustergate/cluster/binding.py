"""What binds the parts of one cluster run: its id, its times and its GPUs.

Every node run of a cluster run records the run's id (``CLUSTERGATE_RUN_ID``, which the launchers set to
RUN_ID of ``REPORTS/RUN_ID/nodes/``). The merge takes a node file only when

- it carries the run's id (``--run-id``, by default the name of the directory above ``nodes/``): a node
  file of an earlier or another cluster run, copied in, is not this run's;
- it started within the run's window: within ``--window`` hours of the node phase's median start, and
  not after the merge (a file from days before, or from the future, is not this node phase's);
- none of its GPUs' serials or UUIDs appears on another host: one GPU cannot sit in two hosts, so every
  host that shares one is excluded (one node's file copied as another's).

A node that fails any of these is ``unbound``: excluded, its figures left out of the fleet. The merged
record keeps each node file's digest; the sign-off checks the files still match, that the fabric run
carries the same id and started after the merge (``clustergate.cluster.signoff``).
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from clustergate.cluster.node_runs import MergeInputError, NodeRun

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


def bind(runs: list[NodeRun], run_id: str, window_h: float, now: datetime) -> dict[str, Any]:
    """Unbind every node that is not a part of run ``run_id`` (id, window, GPUs); the window, as the merged
    record states it."""
    with_results = [r for r in runs if r.results is not None]
    for run in with_results:
        theirs = run.results.get("run_id") if run.results else None
        if theirs != run_id:
            said = f"run {theirs!r}" if theirs else "no run (CLUSTERGATE_RUN_ID was not set)"
            run.unbind(f"its results.json belongs to {said}, not to this run {run_id!r}: a node file of another "
                       "cluster run is not this node phase's")
    times = {r.host: started(r.results) for r in with_results if r.verdict != "unbound" and r.results}
    known = [t for t in times.values() if t is not None]
    window: dict[str, Any] = {"hours": window_h, "median_start": None, "from": None, "to": None}
    if known:
        median = datetime.fromtimestamp(statistics.median(t.timestamp() for t in known), tz=timezone.utc)
        low, high = median - timedelta(hours=window_h), min(median + timedelta(hours=window_h),
                                                            now + timedelta(seconds=CLOCK_SKEW_S))
        window = {"hours": window_h, "median_start": _iso(median), "from": _iso(low), "to": _iso(high)}
        for run in with_results:
            when = times.get(run.host)
            if run.verdict == "unbound" or run.host not in times:
                continue
            if when is None:
                run.unbind("its results.json does not say when it started: which node phase it belongs to is unknown")
            elif when > now + timedelta(seconds=CLOCK_SKEW_S):
                run.unbind(f"it started {_iso(when)}, after this merge ({_iso(now)}): a clock or the file is wrong")
            elif not low <= when <= high:
                hours = abs((when - median).total_seconds()) / 3600
                run.unbind(f"it started {_iso(when)}, {hours:.1f} h from the node phase's median start {_iso(median)} "
                           f"(the run's window is {window_h:g} h: --window): not this node phase's run")
    _unbind_shared_gpus([r for r in with_results if r.verdict != "unbound"])
    return window


def _iso(when: datetime) -> str:
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def gpu_ids(results: dict[str, Any]) -> set[tuple[str, str]]:
    """("serial" | "uuid", value) of every GPU a node's results.json names (placeholders left out)."""
    out = set()
    for node in results.get("nodes") or []:
        for gpu in node.get("gpus") or []:
            for key in ("serial", "uuid"):
                value = gpu.get(key)
                if isinstance(value, str) and value.strip() and not PLACEHOLDER.fullmatch(value.strip()):
                    out.add((key, value.strip()))
    return out


def _unbind_shared_gpus(runs: list[NodeRun]) -> None:
    """Every host whose GPU serial or UUID another host names too."""
    holders: dict[tuple[str, str], list[str]] = {}
    for run in runs:
        for ident in gpu_ids(run.results or {}):
            holders.setdefault(ident, []).append(run.host)
    shared = {ident: hosts for ident, hosts in holders.items() if len(hosts) > 1}
    by_host: dict[str, list[tuple[tuple[str, str], list[str]]]] = {}
    for ident, hosts in shared.items():
        for host in hosts:
            by_host.setdefault(host, []).append((ident, hosts))
    for run in runs:
        if run.host in by_host:
            (kind, value), hosts = sorted(by_host[run.host])[0]
            others = ", ".join(h for h in hosts if h != run.host)
            more = len(by_host[run.host]) - 1
            run.unbind(f"GPU {kind} {value} also appears on {others}{f' (and {more} more GPU ids)' if more else ''}: "
                       "one GPU cannot be in two hosts, so which node ran which file is unknown (a node's file "
                       "copied as another's?)")
