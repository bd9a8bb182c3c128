"""The node phase's directories, read one by one into what the merged cluster report says of each node.

A node's own results.json decides its own verdict (the rule in ``clustergate.record.verdict``, held to a complete
node run at the level the site requires); this module only reads it and says why in a line or two: the
run error, each failed test's first failing figure or exception, what a partial run left out, or why there
is no verdict at all (no results.json, an unreadable one, one that still says "running" because the run
was killed or hung, an expected host with no directory, or a file that is not this cluster run's part:
``unbound``, see ``clustergate.cluster.binding``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from clustergate.cluster import judged_by
from clustergate.common import inputfile
from clustergate.common.numbers import number
from clustergate.common.results_view import ResultsView
from clustergate.criteria.criterion import Criterion
from clustergate.criteria.thresholds import Thresholds
from clustergate.record import actions, resultsfile
from clustergate.record.results import short_test_name
from clustergate.record.verdict import of_record
from clustergate.trust import keyed
from workloads.node.name import problem as name_problem

SUMMARY_CHARS = 240
"""A reason is one line: the full message stays in the node's own report."""

ACCEPTED, EXCLUDED = "accepted", "excluded"


class MergeInputError(ValueError):
    """A path given to merge that cannot be a node's report directory."""


class Exclusion(NamedTuple):
    """One cause for which a step of merge excludes a host, as the step returns it: merge's steps read the node runs
    and return these, and one place adds them to their hosts (``clustergate.cluster.excluded.join``, in the order
    ``clustergate.cluster.merge.judge_nodes`` takes the steps)."""

    host: str
    reason: str
    """The line the merged record's ``reasons`` says it in."""
    step: actions.Step | None = None
    """What to do about it where the cause itself says (a fleet outlier's part, the fleet's firmware); None: the
    host's own run and its verdict say it (``clustergate.cluster.excluded.steps``)."""
    verdict: str | None = None
    """The verdict it gives its host: ``unbound`` (not a part of this cluster run: its figures leave the fleet),
    ``partial`` (an accepted run that lacks what its fleet has); None: the host's verdict stays."""


@dataclass(slots=True)
class NodeRun:
    """One node of the node phase, as the merged report shows it."""

    host: str
    directory: str | None
    verdict: str
    """The node's verdict computed again from its records (accept | reject | partial | unjudged), or running |
    unreadable | missing | unbound where it has none."""
    reasons: list[str] = field(default_factory=list)
    """Why the node is excluded: its own run's (``read_node``), then what each of merge's steps found, in their
    order (``exclusions``)."""
    exclusions: list[Exclusion] = field(default_factory=list)
    """What merge's steps found besides its own run, each with its step (``clustergate.cluster.excluded.join``)."""
    warnings: list[str] = field(default_factory=list)
    results: dict[str, Any] | None = None
    """The node's results.json (not written into the cluster results)."""
    unjudged: dict[str, Any] | None = None
    """The results.json of a run not judged by the thresholds merge holds it to: read only to say what judged it
    (``clustergate.cluster.judged_by.fleet_problem``), its figures never taken."""
    digest: str | None = None
    """sha256 of the node's results.json as merge read it (keyed with a site key: ``clustergate.trust.keyed.digest``):
    sign-off checks the file is still that one."""
    failed: list[dict[str, str]] | None = None
    """Its failed tests' lines (``failed_tests``), said when it was read (``clustergate.cluster.node_facts.keep``): the
    messages they come from are not kept."""
    drift: list[dict[str, Any]] | None = None
    """Its drift rows (``clustergate.cluster.excluded.drift_rows``), said when it was read."""
    firmware: dict[str, tuple[str, ...]] | None = None
    """Its firmware and driver versions (``clustergate.cluster.firmware_fleet.node_versions``), said when it was
    read: the fleet holds every node to the versions most of it carries."""

    @property
    def status(self) -> str:
        return ACCEPTED if self.verdict == "accept" and not self.reasons else EXCLUDED


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= SUMMARY_CHARS else text[:SUMMARY_CHARS - 3] + "..."


def message_summary(message: str) -> str:
    """The line of a merged failure message that says what went wrong (the exception, else the first line)."""
    lines = [line.strip() for line in message.splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(("[call] failed on", "[setup] failed on",
                                                             "[teardown] failed on", "failed on", "--- rank"))]
    exc = next((line[1:].strip() for line in said if line.startswith("E ")), None)
    return _cut(exc or (said[0] if said else "failed"))


def _metric_misses(test: dict[str, Any]) -> list[str]:
    out = []
    for m in test.get("metrics", []):
        if m.get("passed", True):
            continue
        bad = [p for p in m.get("per_rank") or [] if not p.get("passed", True)]
        up = Criterion.from_json(m.get("criterion")).higher_is_better
        worst = (min if up in (True, None) else max)(bad, key=lambda p: p["value"]) if bad else None
        where = ""
        if bad:
            gpus = sorted({p.get("gpu_index") for p in bad} - {None})
            where = (f" on gpu {', '.join(map(str, gpus))}" if gpus else
                     f" on rank {', '.join(str(p['rank']) for p in bad[:8])}")
        value = worst["value"] if worst else m["value"]
        expected = Criterion.from_json(m.get("criterion")).text()
        out.append(f"{m['name']}={number(value, m.get('unit', ''))} ({expected}){where}")
    return out


def failed_tests(results: dict[str, Any]) -> list[dict[str, str]]:
    """Every failed or errored test with a one-line summary: its missed figures, else its exception."""
    out = []
    for test in results.get("tests", []):
        if test.get("outcome") in ("failed", "error"):
            misses = _metric_misses(test)
            summary = "; ".join(misses) if misses else message_summary(test.get("message", ""))
            out.append({"nodeid": test["nodeid"], "outcome": test["outcome"], "summary": _cut(summary)})
    return out


def _last_progress(directory: Path) -> str:
    """Where a run that never finished was, from the last line of its progress.jsonl."""
    try:
        lines = inputfile.read_text(directory / "progress.jsonl", "progress").splitlines()
    except (OSError, ValueError):  # none, unreadable, not a regular file or too large: nothing to say
        return ""
    for line in reversed(lines):
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("nodeid"):
            return f"; its last step: {event.get('event')} {event['nodeid']}"
    return ""


def _shown(name: str) -> str:
    """A name as it can stand in a line of a host list: escaped where it is not a node name (a newline in a
    directory's name must not become a second line of accepted-hosts.txt)."""
    return name if name_problem(name) is None else name.encode("unicode_escape").decode("ascii")


def _host_of(results: dict[str, Any], directory: Path) -> str | None:
    """The host the node's results.json names (None where it names none)."""
    nodes = results.get("nodes") or []
    if len(nodes) > 1:
        raise MergeInputError(f"{directory}/results.json is a run of {len(nodes)} nodes, not one node's: merge "
                              "takes the node phase's directories (REPORTS/RUN_ID/nodes/*)")
    return str(nodes[0]["host"]) if nodes else None


def _identity_problem(host: str | None, directory: Path) -> str | None:
    """Why the results cannot be this directory's node: a node is known by its directory's name, and the
    run that wrote the file must have had the same name (``workloads.node.name`` is the rule)."""
    if host is None:
        return "its results.json names no node: which node ran it is unknown"
    if why := name_problem(host):
        return f"its results.json names host {_shown(host)!r}, which is not a node name ({why})"
    if host != directory.name:
        return (f"its results.json names host {host!r}, not {directory.name!r} (its directory): which node ran it "
                "is unknown; each node writes into REPORTS/RUN_ID/nodes/<its own name>")
    return None


def read_node(path: Path, thresholds: Thresholds, level: str = "standard", key: bytes | None = None) -> NodeRun:
    """One node's directory (or its results.json), judged again by the run's rule against ``thresholds``, as
    a complete node run at ``level`` or more; with the site ``key``, only when its HMAC matches. Never raises for
    what a dead run, a broken disk or a hand-edited file leaves behind: such a node is excluded, saying why."""
    directory = path.parent if path.name == "results.json" else path
    if not directory.is_dir():
        raise MergeInputError(f"{path}: not a directory; give the node directories, e.g. REPORTS/RUN_ID/nodes/*")
    host = _shown(directory.name)
    if why := name_problem(directory.name):
        return NodeRun(host, str(directory), "unreadable", [f"directory name {host!r} is not a node name: {why}"])
    results_path = directory / "results.json"
    if not results_path.exists():
        started = (directory / "progress.jsonl").exists()
        why = ("no results.json although pytest started (progress.jsonl is there): the run died" if started else
               "no results.json: the node phase never reached pytest here (see this node's job output)")
        return NodeRun(host, str(directory), "missing", [why + _last_progress(directory)])
    try:
        results, digest = resultsfile.read_with_digest(results_path)
    except resultsfile.ResultsFileError as exc:
        return NodeRun(host, str(directory), "unreadable", [_cut(str(exc))])
    if key is not None:  # nothing in a file is believed before its HMAC is
        digest = keyed.digest(key, digest)
        if (why := keyed.problem(results, key, keyed.writer(results))) is not None:
            return NodeRun(host, str(directory), "unbound", [_cut(f"{results_path}: {why}")], digest=digest)
    if problem := _identity_problem(_host_of(results, directory), directory):
        return NodeRun(host, str(directory), "unreadable", [problem])
    if (why := judged_by.problem(results, thresholds)) is not None:  # its figures stay out of the fleet
        return NodeRun(host, str(directory), "unjudged", [_cut(f"not judged by the site's thresholds: {why}")],
                       unjudged=results, digest=digest)
    stored = str(results["verdict"])
    decision = of_record(results, need="node", level=level, profile=thresholds.profiles.get(str(results["profile"])))
    run = NodeRun(host, str(directory), decision.verdict, results=results, digest=digest)
    run.warnings += [_cut(f"{w.get('metric', '?')}={w.get('value')} ({w.get('where', '')}): warning")
                     for w in results.get("warnings") or []]
    if stored == "running":
        run.verdict = "running"
        run.reasons.append("results.json still says running: the run was killed or hung" + _last_progress(directory))
        return run
    if decision.verdict == "partial":
        run.reasons.append(_cut(str(decision.reason)))
        return run
    if stored == "accept" and decision.verdict != "accept":
        run.reasons.append(_cut(f"records contradict the stored verdict accept: {decision.reason}"))
        return run
    if decision.verdict == "accept":
        if stored != "accept":  # the node's own run said no (its end failed): a record alone does not overrule it
            run.verdict = stored
            run.reasons.append(f"its own run's verdict is {stored}, although its records pass: see its report")
        return run
    if results.get("error"):
        run.reasons.append(_cut(f"run error: {str(results['error']).splitlines()[0]}"))
    run.reasons += [f"{short_test_name(t['nodeid'])}: {t['summary']}" for t in failed_tests(results)]
    if not run.reasons:
        run.reasons.append(_cut(decision.reason or "rejected"))
    return run


def missing_node(host: str) -> NodeRun:
    return NodeRun(host, None, "missing", ["expected, but no result: no directory in the node phase's output "
                                           "(the node never ran it, or wrote elsewhere)"])


def node_row(run: NodeRun) -> dict[str, Any]:
    """What the cluster results.json says of one node."""
    res = run.results or {}
    counts: dict[str, int] = {}
    for test in res.get("tests", []):
        counts[test.get("outcome", "?")] = counts.get(test.get("outcome", "?"), 0) + 1
    gpus = ResultsView.of(res).gpus
    return {"host": run.host, "directory": run.directory, "digest": run.digest, "run_id": res.get("run_id"),
            "status": run.status, "verdict": run.verdict,
            "profile": res.get("profile"), "level": res.get("level"), "started": res.get("started"),
            "duration_s": res.get("duration_s"), "ranks": res.get("world_size"), "gpus": len(gpus),
            "gpu_models": sorted({str(g.get("name")) for g in gpus}), "tests": counts,
            "failed_tests": run.failed if run.failed is not None else failed_tests(res) if res else [],
            "reasons": run.reasons, "warnings": run.warnings}

