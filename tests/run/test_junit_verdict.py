"""junit.xml carries the verdict (clustergate.report.junit): a CI gate wired to it fails every run that is not
accepted, and passes an accepted one. Real ``clustergate run`` jobs (2 CPU ranks, --level quick) and the shared
complete node run (tests/helpers/trust_runs.py)."""

from __future__ import annotations

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any

import pytest
from complete_runs import NODE_TESTS
from trust_runs import node_run  # noqa: F401  (the fixture)

from clustergate.common.exit_codes import Exit
from clustergate.report import junit

from torchrun_job import job_env


def suite_of(path: Path) -> ET.Element:
    root = ET.parse(path).getroot()
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    assert suite is not None, ET.tostring(root)
    return suite


def verdict_case(suite: ET.Element) -> ET.Element:
    [case] = [c for c in suite.iter("testcase") if (c.get("classname"), c.get("name")) == ("clustergate", "verdict")]
    return case


def properties(suite: ET.Element) -> dict[str, str]:
    props = suite.find("properties")
    return {} if props is None else {str(p.get("name")): str(p.get("value")) for p in props}


def clustergate_run(tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    report = tmp_path / "report"
    proc = subprocess.run([sys.executable, "-m", "clustergate", "run", "--nproc-per-node", "2", "--level", "quick",
                           "--report-dir", str(report), *args], cwd=tmp_path, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=240)
    return proc, report


def test_a_one_node_multinode_run_is_a_usage_error_and_its_junit_fails(tmp_path: Path) -> None:
    """The design card's fabric command on one node: every selected test would skip. A usage mistake (exit 2, one
    line saying what to do), and junit.xml fails with it: an error, typed usage, not a suite of green skips."""
    proc, report = clustergate_run(tmp_path, "-m", "multinode")
    out = proc.stdout
    assert proc.returncode == Exit.USAGE, out
    said = [line for line in out.splitlines() if line.startswith("ERROR: ")]
    assert said == ["ERROR: the multinode tests need 2 or more nodes; this job has 1: start torchrun on each of 2 or "
                    "more nodes (--nnodes=N with one --rdzv-endpoint, README's fabric phase), or leave out -m "
                    "multinode to run the node phase"], out
    last = out.strip().splitlines()[-1]  # a refusal of the command line, not a reject of the node
    assert last.startswith("clustergate run: REFUSED (usage): the multinode tests need 2 or more nodes"), last
    assert last.endswith(f"(exit 2; {report / 'results.json'})"), last
    suite = suite_of(report / "junit.xml")
    assert int(suite.get("errors") or 0) >= 1 and suite.get("tests") == "1", ET.tostring(suite)  # no test ran
    error = verdict_case(suite).find("error")
    assert error is not None and error.get("type") == "usage", ET.tostring(suite)
    assert error.get("message", "").startswith("REFUSED (usage): the multinode tests need 2 or more nodes")
    props = properties(suite)
    assert props["clustergate_verdict"] == "reject" and props["clustergate_exit_status"] == "2", props


def test_a_narrowed_run_is_partial_and_its_junit_fails(tmp_path: Path) -> None:
    """-k: every test it ran passed, and the run is partial; junit.xml's suite counts a failure, typed partial."""
    proc, report = clustergate_run(tmp_path, "-k", "test_world")
    assert proc.returncode == Exit.NOT_ACCEPTED, proc.stdout
    suite = suite_of(report / "junit.xml")
    passed = [c for c in suite.iter("testcase") if c.get("classname") != "clustergate"]
    assert len(passed) == 2 and all(len(c.findall("failure") + c.findall("error")) == 0 for c in passed)
    assert suite.get("failures") == "1" and suite.get("errors") == "0", ET.tostring(suite)
    failure = verdict_case(suite).find("failure")
    assert failure is not None and failure.get("type") == "partial", ET.tostring(suite)
    assert failure.get("message", "").startswith(
        f"PARTIAL: ran less than a complete run: {NODE_TESTS - 2} of the {NODE_TESTS} tests")
    assert "(-k 'test_world')" in failure.get("message", "")
    assert properties(suite)["clustergate_verdict"] == "partial"


def test_an_accepted_run_has_the_verdict_testcase_passing(node_run: Path) -> None:  # noqa: F811
    """README's command 1, accepted: the verdict's testcase passes and the suite counts no failure or error."""
    status = (node_run.parents[3] / "status").read_text().strip()
    assert status == "0", (node_run.parents[3] / "output.txt").read_text()[-3000:]
    suite = suite_of(node_run / "junit.xml")
    case = verdict_case(suite)
    assert list(case) == [], ET.tostring(case)  # no failure, error or skipped element: passed
    assert (suite.get("failures"), suite.get("errors")) == ("0", "0"), ET.tostring(suite)[:2000]
    props = properties(suite)
    assert (props["clustergate_verdict"], props["clustergate_exit_status"]) == ("accept", "0"), props


RESULTS: list[tuple[dict[str, Any], int, tuple[str | None, str, str]]] = [
    ({"verdict": "accept"}, 0, (None, "accept", "ACCEPT")),
    ({"verdict": "reject", "reason": "1 of 9 tests did not pass"}, 1, ("failure", "reject", "REJECT: 1 of 9")),
    ({"verdict": "partial", "reason": "ran less than a complete run: x"}, 1, ("failure", "partial", "PARTIAL: ran")),
    ({"verdict": "unjudged", "reason": "no criteria"}, 1, ("failure", "unjudged", "NOT A SIGN-OFF: no criteria")),
    ({"verdict": "reject", "error": "rank 1 lost"}, 1, ("error", "error", "REJECT: rank 1 lost")),
    ({"verdict": "reject", "error": "SIGINT", "interrupted": True}, 1, ("error", "interrupted", "INTERRUPTED: SIGINT")),
    ({"verdict": "reject", "error": "bad option"}, 2, ("error", "usage", "REFUSED (usage): bad option")),
    ({"verdict": "reject", "error": "no rendezvous"}, 4, ("error", "could not run", "COULD NOT RUN: no rendezvous")),
    ({"verdict": "accept"}, 1, ("error", "error", "REJECT")),  # decided accept, a rank ended otherwise
]


@pytest.mark.parametrize(("results", "status", "expected"), RESULTS)
def test_the_verdict_testcase_says_partial_reject_and_error_apart(results: dict[str, Any], status: int,
                                                                   expected: tuple[str | None, str, str]) -> None:
    element, kind, message = junit.judged(results, status)
    assert (element, kind) == expected[:2] and message.startswith(expected[2]), message


def test_a_held_accept_fails_until_stamped_and_restamping_keeps_the_counts(tmp_path: Path) -> None:
    """As pytest writes it (the verdict undecided, an error), then held, accepted, and rejected at the very end:
    each rewrite replaces the verdict's element, and the suite's counts follow."""
    path = tmp_path / "junit.xml"
    path.write_text('<?xml version="1.0" encoding="utf-8"?><testsuites name="pytest tests"><testsuite name="pytest" '
                    'errors="1" failures="1" skipped="0" tests="3"><testcase classname="t" name="a"/>'
                    '<testcase classname="t" name="b"><failure message="x"/></testcase>'
                    f'<testcase classname="clustergate" name="verdict"><error message="{junit.UNDECIDED}"/>'
                    '</testcase></testsuite></testsuites>')
    counts = []
    for results, status, held in [({"verdict": "accept"}, 0, True), ({"verdict": "accept"}, 0, False),
                                  ({"verdict": "reject", "error": "a rank failed at the very end"}, 4, False)]:
        junit.stamp(path, results, status, held=held)
        suite = suite_of(path)
        counts.append((suite.get("tests"), suite.get("failures"), suite.get("errors"),
                       [c.tag for c in verdict_case(suite)], properties(suite)["clustergate_verdict"]))
    assert counts == [("3", "1", "1", ["error"], "running"), ("3", "1", "0", [], "accept"),
                      ("3", "1", "1", ["error"], "reject")]
