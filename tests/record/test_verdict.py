"""The one verdict rule."""

from __future__ import annotations

from clustergate.record.verdict import decide


def test_accept_needs_a_finished_run_with_a_pass_and_no_failure() -> None:
    assert decide(["passed", "skipped"], error=None, finished=True).verdict == "accept"
    assert decide(["passed", "failed"], error=None, finished=True).verdict == "reject"
    assert decide(["passed", "error"], error=None, finished=True).verdict == "reject"


def test_a_run_not_finished_is_running_and_never_accept() -> None:
    assert decide(["passed"], error=None, finished=False).verdict == "running"
    assert decide(["passed"], error="SIGTERM on rank 1", finished=False).verdict == "reject"


def test_a_run_error_rejects_whatever_the_tests_did() -> None:
    verdict = decide(["passed"], error="rank 1 lost", finished=True)
    assert (verdict.verdict, verdict.reason) == ("reject", "rank 1 lost")


def test_nothing_measured_rejects_with_the_reason() -> None:
    assert "all 3 tests were skipped" in str(decide(["skipped"] * 3, error=None, finished=True).reason)
    assert "no test ran" in str(decide([], error=None, finished=True).reason)


def test_an_interrupted_test_is_never_passing() -> None:
    verdict = decide(["passed", "interrupted"], error=None, finished=True)
    assert (verdict.verdict, verdict.reason) == ("reject", "1 of 2 tests did not pass")
