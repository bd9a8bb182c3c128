"""The one verdict rule: from what the tests did and how the run ended to running, accept, partial or reject.

The run (``clustergate.record.results``) decides through ``decide``; every command that reads a stored
results.json (re-render and re-judge, ``merge``, ``signoff``, ``calibrate``) decides through
``of_record``, which recomputes the verdict from the file's records with ``decide`` and never takes the
stored word on trust: a results.json judged again can never reach another verdict by another rule.
Both hold the run to the suite's manifest (``clustergate.trust.completeness``): a run that ran less than a
complete node or fabric run is ``partial``, never ``accept``. ``of_record`` also checks the records in
full against the manifest (``contradiction``): every test once, every declared metric of a passed test
with one figure per part its scope implies, nothing failed in a passed or skipped test.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from clustergate.common.exit_codes import Exit
from clustergate.common.results_view import ResultsView, TestRecord
from clustergate.criteria.criterion import Criterion, Figure
from clustergate.criteria.thresholds import Profile
from clustergate.trust import completeness
from clustergate.trust import manifest as suite_manifest
from clustergate.trust.manifest import Manifest

VerdictName = Literal["running", "accept", "reject", "partial", "unjudged"]
PASSING = ("passed", "skipped")
"""The only outcomes that can be accepted: "failed", "error" and "interrupted" (the run stopped inside the
test) never are."""
UNJUDGED_REASON = ("the profile has no sign-off criteria (sign_off: false): its figures were measured, not "
                   "judged, so this is not a sign-off; choose a profile with criteria (--profile) or calibrate one")
WORDS = {"accept": "ACCEPT", "reject": "REJECT", "running": "RUNNING", "partial": "PARTIAL",
         "unjudged": "NOT A SIGN-OFF"}
"""What the terminal, the reports and the commands print for each verdict (``word_of`` picks one)."""
INTERRUPTED = "INTERRUPTED"
"""The word of a reject that no rank caused (Ctrl-C, a signal from outside, the launcher killed): it says nothing
about the node, so it never reads as the node's REJECT."""


REFUSED = {Exit.USAGE: "REFUSED (usage)", Exit.COULD_NOT_RUN: "COULD NOT RUN"}
"""The word of a run that is not accepted for what the exit table says of it rather than for the node: refused
(2: its command line or input, such as -m multinode alone on one node) or unable to run (4)."""


def word_of(results: Mapping[str, Any], status: int | None = None) -> str:
    """The word the terminal, the reports and the commands say for a results document's verdict, and for the run's
    exit ``status`` where it is known (a refusal or a run that could not run says so, not REJECT)."""
    view = ResultsView.of(results)
    verdict = str(view.verdict)
    if verdict != "accept" and status in REFUSED:
        return REFUSED[Exit(status)]
    if verdict == "reject" and view.interrupted:
        return INTERRUPTED
    return WORDS.get(verdict, "REJECT")


@dataclass(frozen=True, slots=True)
class Verdict:
    verdict: VerdictName
    reason: str | None
    """Why the run is not accepted (None on accept, and while it is still running without an error)."""

    @property
    def word(self) -> str:
        return WORDS[self.verdict]


def decide(outcomes: Iterable[str], *, error: str | None, finished: bool, sign_off: bool = True,
           partial: Sequence[str] = ()) -> Verdict:
    """``accept`` only for a run that finished with no run-level error, in which every test passed or
    was skipped and at least one passed, that ran the whole suite (``partial`` lists why it did not:
    ``clustergate.trust.completeness``), under a profile with criteria; ``running`` until it finishes;
    ``partial`` for a run that passed what it ran but ran less; ``unjudged`` for a complete run under a
    profile without criteria; ``reject`` otherwise."""
    outcomes = list(outcomes)
    if error is not None:
        return Verdict("reject", error)
    if not finished:
        return Verdict("running", None)
    failed = [o for o in outcomes if o not in PASSING]
    if failed:
        return Verdict("reject", f"{len(failed)} of {len(outcomes)} tests did not pass")
    if "passed" not in outcomes:
        why = "no test ran" if not outcomes else f"all {len(outcomes)} tests were skipped"
        return Verdict("reject", f"{why}: nothing was measured, so nothing can be signed off")
    if partial:
        return Verdict("partial", "ran less than a complete run: " + "; ".join(partial))
    if not sign_off:
        return Verdict("unjudged", UNJUDGED_REASON)
    return Verdict("accept", None)


def missing_tests(selected: int | None, deselected: int, ran: int) -> str | None:
    """Why a run that recorded ``ran`` tests did not run its selection, or None when it ran all of it."""
    if not selected:
        if deselected:
            return f"all {deselected} collected tests were deselected by -k/-m: nothing ran"
        return "no tests were collected: check the path and the -m/-k selection"
    if ran < selected:
        return (f"the run stopped after {ran} of {selected} selected tests (-x or --maxfail, or a test told "
                "pytest to stop)")
    if ran > selected:
        return f"{ran} tests are recorded but only {selected} were selected: the record is not one run's"
    return None


def _metric_contradiction(test: TestRecord, metric: Mapping[str, Any]) -> str | None:
    """Where a stored metric's ``passed`` (or its test's outcome) is not what its own figures and criterion
    give, judged again by the criterion's rule; None when they agree."""
    criterion = Criterion.from_json(metric.get("criterion"))
    unit = str(metric.get("unit", ""))
    per_rank = metric.get("per_rank") or [{"value": metric["value"], "node_rank": 0}]
    figures = [Figure(float(p["value"]), unit, int(p.get("node_rank", 0))) for p in per_rank]
    failures = [f for f, _ in criterion.weigh(figures, str(metric.get("scope", "gpu"))) if f]
    name = f"{test.nodeid}: {metric.get('name')}"
    if failures and metric.get("passed", True):
        return f"{name} is stored as passed, but its figures miss its criterion ({failures[0][0]})"
    if not metric.get("passed", True) and test.outcome == "passed":
        return f"{name} is stored as failed, but its test is stored as passed"
    return None


def _part_problem(test: TestRecord, metric: Mapping[str, Any], results: ResultsView) -> str | None:
    """Where a passed test's metric lacks a figure (or has one too many) for the parts its scope implies: one
    per rank (gpu), one per node (node), one for the job (world)."""
    name = f"{test.nodeid}: {metric.get('name')}"
    per_rank = metric.get("per_rank")
    if not isinstance(per_rank, list) or not per_rank:
        return f"{name} has no per-rank figures: which part measured it is unknown"
    nodes = results.nodes
    scope = metric.get("scope")
    if scope == "gpu":
        host_of = {r: n.get("host") for n in nodes for r in n.get("ranks") or []}
        ranks = sorted(int(p.get("rank", -1)) for p in per_rank)
        if ranks != list(range(int(results.world_size or 0))):
            return (f"{name} has figures of ranks {_ranges(ranks)}, not one of each of the "
                    f"{results.world_size} ranks: a per-GPU figure is missing or given twice")
        wrong = [p for p in per_rank if host_of and host_of.get(p.get("rank")) != p.get("host")]
        if wrong:
            return f"{name}: rank {wrong[0].get('rank')}'s figure names host {wrong[0].get('host')!r}, not its node's"
    elif scope == "node":
        got = sorted(int(p.get("node_rank", -1)) for p in per_rank)
        if got != sorted(int(n.get("node_rank", -1)) for n in nodes):
            return f"{name} has figures of nodes {_ranges(got)}, not one of each of the {len(nodes)} nodes"
    elif len(per_rank) != 1:
        return f"{name} is a figure of the whole job, but has {len(per_rank)} of them"
    return None


def _ranges(values: Sequence[int]) -> str:
    return ", ".join(map(str, values[:12])) + (" ..." if len(values) > 12 else "") if values else "none"


def _test_problem(test: TestRecord, results: ResultsView, manifest: Manifest) -> str | None:
    """The first way one test's record contradicts itself or the suite's manifest, or None."""
    nodeid, outcome = test.nodeid, test.outcome
    if outcome not in ("passed", "failed", "skipped", "error", "interrupted"):
        return f"{nodeid}: no outcome recorded ({outcome!r})"
    metrics = test.metrics
    if outcome == "skipped":
        if metrics:
            return f"{nodeid} is stored as skipped, but carries {len(metrics)} metrics: a skipped test measured nothing"
        if not test.message.strip():
            return f"{nodeid} is stored as skipped without a reason: a skip always says why"
    if outcome in ("passed", "skipped") and (test.failed_ranks or test.problems):
        what = "failed ranks" if test.failed_ranks else "problems"
        return f"{nodeid} is stored as {outcome}, but records {what}: something failed in it"
    if outcome == "skipped":
        return None
    for metric in metrics:
        if problem := _metric_contradiction(test, metric):
            return problem
    if outcome != "passed" or "call" not in (test.phases or ["call"]):
        return None  # a body that never ran measured nothing: the completeness rule says so (partial)
    declared = manifest.get(completeness.manifest_id(nodeid, results.selection, manifest) or "")
    if declared is not None:
        recorded = {str(m.get("name")): m for m in metrics}
        absent = [name for name in declared.metrics if name not in recorded]
        if absent:
            return f"{nodeid} is stored as passed without its declared metrics {', '.join(absent)}"
        for name, scope in declared.metrics.items():
            if recorded[name].get("scope") != scope:
                return (f"{nodeid}: {name} is stored with scope {recorded[name].get('scope')!r}; the suite records "
                        f"it per {scope}")
    for metric in metrics:
        if problem := _part_problem(test, metric, results):
            return problem
    return None


def contradiction(results: Mapping[str, Any], manifest: Manifest | None = None) -> str | None:
    """The first way a stored record contradicts itself or the suite's manifest (default: the shipped one) (a
    metric's ``passed``, a test without an outcome or given twice, a passed test without a declared metric or a
    part's figure, a skipped test with figures, more or fewer tests than were selected), or None."""
    manifest = manifest or suite_manifest.shipped()
    view = ResultsView.of(results)
    tests = view.tests
    counted = Counter(t.nodeid for t in tests)
    twice = [nodeid for nodeid, n in counted.items() if n > 1]
    if twice:
        return f"{twice[0]} is recorded {counted[twice[0]]} times: a run records each test once"
    for test in tests:
        if problem := _test_problem(test, view, manifest):
            return problem
    selection = view.selection
    if isinstance(selection.get("selected"), int):
        return missing_tests(selection["selected"], int(selection.get("deselected") or 0), len(tests))
    return None


def of_record(results: Mapping[str, Any], *, need: str | None = None, level: str | None = None,
              manifest: Manifest | None = None, profile: Profile | None = None) -> Verdict:
    """The verdict a stored results.json's records support, by the rule the run used. A record that still
    says "running" never finished; one whose records contradict themselves or the suite's manifest is
    rejected, saying where; one that ran less than a complete run (of kind ``need``, at ``level`` or more, its
    skips earned under ``profile``: ``clustergate.trust.completeness.partial``) is partial."""
    manifest = manifest or suite_manifest.shipped()
    view = ResultsView.of(results)
    error = view.error
    if error is None and view.verdict == "running":
        error = "the run did not finish: its results.json still says running"
    if error is None:
        error = contradiction(results, manifest)
    outcomes = [str(t.outcome) for t in view.tests]
    return decide(outcomes, error=error, finished=True, sign_off=view.sign_off,
                  partial=completeness.partial(results, manifest, need, level, profile))
