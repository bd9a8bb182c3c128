"""junit.xml carries the run's verdict: one testcase ``clustergate.verdict`` and the testsuite's properties.

A CI gate wired to junit.xml (Jenkins' junit step, GitLab's test reports) reads the testsuite's failures and
errors, never results.json. A run whose tests all skipped or passed but whose verdict is not accept (a reject
with nothing measured, a partial ``-k`` run, a run error) would read green there. So the verdict is a testcase of
its own, failing unless the run is accepted, and its suite's counts say so:

- pytest writes junit.xml before the verdict is decided (its writer's ``pytest_sessionfinish`` runs before the
  plugin's): ``undecided`` adds the verdict testcase first, as an error ("not decided"), so that a run that never
  gets further (killed, or a peer lost at the session's end) leaves a junit.xml that fails;
- ``stamp`` rewrites it in place (whole, ``write_atomic``) with what the run decided: a ``<failure>`` for a
  reject, a partial run and a run with no criteria (``type`` says which), an ``<error>`` for a run that ended in
  a run error, could not run (4) or was refused (2, usage), and nothing (passed) for an accept, written only once
  every rank has passed the final barrier (before that an accept is held, as results.json says "running").

The testsuite's properties say the same: ``clustergate_verdict``, ``clustergate_reason``,
``clustergate_exit_status``.
"""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from clustergate.common.exit_codes import Exit
from clustergate.common.files import write_atomic
from clustergate.record.verdict import word_of

CLASSNAME = "clustergate"
NAME = "verdict"
UNDECIDED = ("the run had not decided its verdict when junit.xml was written (it ended before the session's end "
             "was agreed): not accepted")
HELD = ("accept, held until every rank has passed the final barrier: a junit.xml that still says this is of a run "
        "that did not get there, not accepted")
PROPERTY = "clustergate_"


def undecided(xml: Any) -> None:
    """Add the verdict testcase, as an error, to pytest's LogXML ``xml`` before it writes junit.xml (its
    per-test reporter, as ``clustergate.run.items.junit_interrupted`` uses it)."""
    reporter = xml.node_reporter(f"{CLASSNAME}::{NAME}")
    reporter.attrs.update(classname=CLASSNAME, name=NAME)
    reporter._add_simple("error", UNDECIDED, UNDECIDED)


def judged(results: Mapping[str, Any], status: int, *, held: bool = False) -> tuple[str | None, str, str]:
    """What the verdict testcase holds: its element (``failure``, ``error``, or None where it passes), its type and
    its message (``WORD: why (exit N)``)."""
    verdict = str(results.get("verdict"))
    if verdict == "accept" and held:
        return "error", "held", HELD
    if verdict == "accept" and status == Exit.ACCEPT:
        return None, "accept", "ACCEPT (exit 0)"
    word = word_of(results, status)
    error = results.get("error")
    why = str(error or results.get("reason") or "not accepted").splitlines()[0]
    if status == Exit.USAGE:
        kind, element = "usage", "error"
    elif status == Exit.COULD_NOT_RUN:
        kind, element = "could not run", "error"
    elif verdict == "accept":  # decided accept, but a rank ended otherwise: never a pass
        kind, element, word = "error", "error", "REJECT"
    elif results.get("interrupted") is True:
        kind, element = "interrupted", "error"
    elif error:
        kind, element = "error", "error"
    else:
        kind, element = verdict, "failure"  # reject, partial, unjudged: the tests' verdict, not a run error
    return element, kind, f"{word}: {why} (exit {int(status) or int(Exit.NOT_ACCEPTED)})"


def stamp(path: Path, results: Mapping[str, Any], status: int, *, held: bool = False,
          scrub: Callable[[str], str] = str) -> None:
    """Rewrite junit.xml at ``path`` (whole) so that its verdict testcase and its testsuite's properties and
    counts say ``results``' verdict under exit ``status``. OSError or ValueError where it cannot be read or
    written."""
    try:
        root = ET.fromstring(path.read_text(encoding="utf-8"))
    except ET.ParseError as exc:
        raise ValueError(f"{path} is not XML pytest wrote: {exc}") from None
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError(f"{path} has no testsuite")
    case = next((c for c in suite.findall("testcase") if (c.get("classname"), c.get("name")) == (CLASSNAME, NAME)),
                None)
    if case is None:
        case = ET.Element("testcase", classname=CLASSNAME, name=NAME, time="0.000")
        at = len(suite.findall("properties"))
        suite.insert(at, case)
        _count(suite, "tests", 1)
    for old in [c for c in case if c.tag in ("failure", "error", "skipped")]:
        _count(suite, {"failure": "failures", "error": "errors", "skipped": "skipped"}[old.tag], -1)
        case.remove(old)
    element, kind, message = judged(results, status, held=held)
    message = scrub(message)
    if element is not None:
        ET.SubElement(case, element, type=kind, message=message).text = message
        _count(suite, "failures" if element == "failure" else "errors", 1)
    properties = suite.find("properties")
    if properties is None:
        properties = ET.Element("properties")
        suite.insert(0, properties)
    for prop in [p for p in properties if str(p.get("name", "")).startswith(PROPERTY)]:
        properties.remove(prop)
    said = {"verdict": "running" if held else str(results.get("verdict")), "verdict_type": kind,
            "reason": message, "exit_status": str(int(status))}
    for name, value in said.items():
        ET.SubElement(properties, "property", name=PROPERTY + name, value=value)
    write_atomic(path, '<?xml version="1.0" encoding="utf-8"?>' + ET.tostring(root, encoding="unicode"))


def _count(suite: ET.Element, attribute: str, by: int) -> None:
    suite.set(attribute, str(max(0, int(suite.get(attribute) or 0) + by)))
