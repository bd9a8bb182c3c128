"""What the run reads from pytest's items and reports, and writes back into them: the metrics a test declares
and its time limit, this rank's outcome of a phase, and the merged verdict applied to pytest's own report (so
the terminal, junit.xml and report.html all say it), scrubbed of secrets, its control characters as escapes.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

from clustergate.common.terminal import printable_lines
from clustergate.criteria.thresholds import Profile
from clustergate.record.outcomes import PhaseOutcome, PhaseVerdict, poisons
from clustergate.report import junit
from clustergate.run.recorder import Recorder, Skip, fact_of
from clustergate.secrets.redact import Scrubber, scrub_strings
from clustergate.trust.skip_facts import fact as skip_fact
from workloads.common import LEVELS


def declared(item: pytest.Item) -> tuple[str, ...]:
    """The metrics ``item`` records (``@pytest.mark.metrics``)."""
    return tuple(n for m in item.iter_markers("metrics") for n in m.args)


def problem(items: list[pytest.Item], profile: Profile) -> str | None:
    """The first collected test the run cannot judge or bound: a metric the profile lacks, a bad time limit."""
    for item in items:
        for name in declared(item):
            if name not in profile.metrics:
                return (f"{profile.source}: profile {profile.name!r} has no metrics.{name}, which {item.nodeid} "
                        "records; add it (an empty mapping {} measures without judging)")
        marker = item.get_closest_marker("time_limit")
        if marker is not None:
            limit = marker.args[0] if marker.args else None
            if not isinstance(limit, (int, float)) or not (math.isfinite(limit) and limit > 0):
                return (f"{item.nodeid}: @pytest.mark.time_limit({limit!r}): a time limit must be a finite number "
                        "of seconds above 0")
            levels = marker.kwargs.get("levels", LEVELS)
            if set(marker.kwargs) - {"levels"} or isinstance(levels, str) or not levels \
                    or not set(levels) <= set(LEVELS):
                return (f"{item.nodeid}: @pytest.mark.time_limit({limit!r}, {marker.kwargs}): the only keyword is "
                        f"levels, a list of some of {', '.join(LEVELS)}")
    return None


MARKED_FACT = pytest.StashKey[dict]()
"""The fact of a skip the run marks on an item before it runs (pytest raises that skip itself)."""


def one_node_problem(items: list[pytest.Item], node_count: int) -> str | None:
    """A selection of multinode tests alone on one node (``-m multinode`` on one node) is a usage mistake, not a
    reject: each of them would skip, and the node would read as rejected for what the command line asked."""
    if node_count >= 2 or not items or not all(item.get_closest_marker("multinode") for item in items):
        return None
    return (f"the multinode tests need 2 or more nodes; this job has {node_count}: start torchrun on each of 2 or "
            "more nodes (--nnodes=N with one --rdzv-endpoint, README's fabric phase), or leave out -m multinode "
            "to run the node phase")


def skip_multinode(items: list[pytest.Item], node_count: int) -> None:
    if node_count < 2:
        for item in items:
            if item.get_closest_marker("multinode"):
                item.add_marker(pytest.mark.skip(reason=f"needs 2+ nodes; this job has {node_count}"))
                item.stash[MARKED_FACT] = skip_fact("one_node")


def _fact(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]) -> dict | None:
    """The fact this rank's skip rests on: the one its ``Skip`` carries, or the one the run marked on the item."""
    if report.outcome != "skipped":
        return None
    return fact_of(call.excinfo.value if call.excinfo else None) or item.stash.get(MARKED_FACT, None)


def phase_outcome(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None],
                  recorder: Recorder) -> PhaseOutcome:
    """What this rank saw in this phase, for the exchange."""
    run = recorder.run
    return PhaseOutcome(
        rank=run.world.rank, host=run.identity.host, outcome=report.outcome, message=_message(item, report, call),
        stop=call.stop, records=recorder.records if call.when == "call" else [],
        details=recorder.details if call.when == "call" else {}, gpu_label=run.gpu_label(),
        poisoned=poisons(call.excinfo.value if call.excinfo else None), said=_said(report, call),
        fact=_fact(item, report, call),
    )


def skip_at_the_test(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]) -> None:
    """A ``cg.skip`` is reported where the test skipped, as pytest reports its own: pytest takes a skip's place from
    where it was raised, which for ``cg.skip`` is the recorder ("clustergate/run/recorder.py:127:
    clustergate.run.recorder.Skip: ..." after every such test). Its place is the line of the test's file that led to
    it (the innermost frame there), else the test's definition; its reason is said without the exception's name."""
    error = call.excinfo.value if call.excinfo is not None else None
    if report.outcome != "skipped" or not isinstance(error, Skip) or call.excinfo is None:
        return
    here = Path(item.path).resolve()
    lines = [entry.lineno + 1 for entry in call.excinfo.traceback if Path(entry.path).resolve() == here]
    report.longrepr = (str(item.path), lines[-1] if lines else (item.location[1] or 0) + 1, error.msg)


def apply(item: pytest.Item, report: pytest.TestReport, verdict: PhaseVerdict, when: str) -> None:
    """The verdict every rank agreed, in pytest's own report of this phase (scrubbed)."""
    if verdict.outcome == "failed":
        report.outcome = "failed"
        report.longrepr = verdict.message
    elif verdict.outcome == "skipped" and report.outcome != "skipped":
        report.outcome = "skipped"
        report.longrepr = (str(item.path), (item.location[1] or 0) + 1, verdict.message)
    report.user_properties.append(("failed_ranks", verdict.failed_ranks))
    if when == "call":
        report.user_properties.append(("metrics", [m.as_json() for m in verdict.metrics]))
    scrub_report(report)


def scrub_report(report: pytest.TestReport) -> None:
    """What the report carries reaches the terminal, junit.xml and report.html: scrub it at the source, and show
    its control characters as escapes (a test's message or output with terminal escape sequences in it must not
    clear or retitle the terminal through pytest's own failure lines)."""
    secrets = Scrubber.from_environment()

    def scrub(text: str) -> str:
        return printable_lines(secrets(text))

    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:
        path, line, reason = report.longrepr
        report.longrepr = (path, line, scrub(str(reason)))
    elif report.longrepr is not None:
        text = str(report.longrepr)
        if scrub(text) != text:
            report.longrepr = scrub(text)
    report.sections = [(title, scrub(content)) for title, content in report.sections]
    # Each string, not the JSON text: a short or digits-only secret scrubbed from JSON text would break it.
    report.user_properties = [(name, scrub_strings(json.loads(json.dumps(value, default=str)), secrets))
                              for name, value in report.user_properties]


def _said(report: pytest.TestReport, call: pytest.CallInfo[None]) -> str:
    """This rank's failure or skip in one line, from what pytest holds as data: the skip's reason, the exception's
    type and first line (empty where the phase passed)."""
    if report.outcome == "passed":
        return ""
    error = call.excinfo.value if call.excinfo is not None else None
    if isinstance(error, pytest.skip.Exception):
        return error.msg
    if call.excinfo is not None:
        return next(iter(call.excinfo.exconly().splitlines()), "")[:300]
    if isinstance(report.longrepr, tuple) and len(report.longrepr) == 3:  # a skip pytest made itself
        return str(report.longrepr[2]).removeprefix("Skipped: ")
    return report.outcome


def _message(item: pytest.Item, report: pytest.TestReport, call: pytest.CallInfo[None]) -> str:
    """This rank's failure as a short traceback: N ranks' worth of long tracebacks is unreadable.

    Uses the item's own formatter (which drops pytest's and pluggy's frames) in --tb=short style.
    """
    if report.outcome == "passed":
        return ""
    if report.outcome == "failed" and call.excinfo is not None and isinstance(item, pytest.Function):
        try:
            return str(item._repr_failure_py(call.excinfo, style="short"))
        except Exception:  # a private helper: fall back to pytest's own text if it ever changes
            pass
    return report.longreprtext


def junit_undecided(config: pytest.Config) -> None:
    """junit.xml, as pytest is about to write it, holds the verdict's testcase as undecided (``report.junit``)."""
    from _pytest import junitxml

    xml = config.stash.get(junitxml.xml_key, None)
    if xml is None:
        return
    try:
        junit.undecided(xml)
    except Exception as exc:  # a private API: the run's rewrite of junit.xml adds the testcase then
        sys.stderr.write(f"clustergate: could not add the verdict to junit.xml as undecided: {exc}\n")


def junit_interrupted(item: pytest.Item, what: str) -> None:
    """junit.xml counts a test the run was interrupted in as an error (pytest writes no report for it)."""
    from _pytest import junitxml  # pytest's own writer: its stash key and per-test reporter

    xml = item.config.stash.get(junitxml.xml_key, None)
    if xml is None:
        return
    message = f"interrupted: {what} (the test did not finish)"
    try:
        report = pytest.TestReport(item.nodeid, item.location, {}, "failed", message, "call")
        reporter = xml._opentestcase(report)
        reporter._add_simple("error", message, message)
        xml.finalize(report)
    except Exception as exc:  # a private API: say so rather than lose the run's ending
        sys.stderr.write(f"clustergate: could not add {item.nodeid} to junit.xml as interrupted: {exc}\n")
