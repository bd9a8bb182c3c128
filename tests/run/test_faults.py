"""End to end under torchrun on gloo: healthy runs, and every planted fault ends bounded and named.

Each fault must end the whole job within the bound, non-zero on every agent, with the test, rank
and host named in the output or in results.json. A healthy two-node job, multinode tests run and accepted,
is tests/cluster/test_multinode_rehearsal.py's (through the launcher a site runs).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
from waited_out_runs import (  # noqa: F401  (waited_out: the fixture)
    TEST_TIMEOUT_S,
    ended,
    event_time,
    since_test_start,
    waited_out,
)

from torchrun_job import JobResult, frames_of_ours, plant, run_job

HOST = socket.gethostname()
LIMIT_WAKE_SLACK_S = 3.0
"""The limit's watchdog waits on a timer of the test's limit; a thread on a busy core wakes a little late."""
CLOCKS_APART_S = 0.5
"""How early the limit may seem to fire, read from progress.jsonl: the watchdog's deadline is on each rank's monotonic
clock, the events are stamped with the wall clock (time.time(), which NTP may slew), and the rank whose limit fires
need not be the one whose test_start was written first. CI once read 9.996 s for a 10 s limit. A limit that fired
early for real (a wrong limit) is seconds off."""
TEARDOWN_SLACK_S = 30.0
"""From the test's start to the job's end, past the limit: rank exit, stack dumps, the outputs, torchrun's teardown
and this process's polling, on CI's 2 busy cores."""

pytestmark = pytest.mark.slow


def job(tmp_path: Path, fault: str, *args: str, **kwargs: object) -> JobResult:
    planted = plant(tmp_path, fault)
    if "--thresholds" in args:
        planted = planted[2:]
    return run_job(tmp_path, [*args, *planted], **kwargs)  # type: ignore[arg-type]


def test_healthy_run_accepts_with_four_outputs(tmp_path: Path) -> None:
    r = job(tmp_path, "healthy")
    assert r.codes == [0], r.output
    assert {p.name for p in r.report_dir.iterdir()} >= {"results.json", "report.html", "junit.xml", "progress.jsonl"}
    res = r.results
    assert res["verdict"] == "accept" and res["world_size"] == 2
    outcomes = {t["nodeid"].split("::")[1]: t["outcome"] for t in res["tests"]}
    assert outcomes == {"test_records_a_metric": "passed", "test_needs_two_nodes": "skipped"}
    assert r.output.count("test session starts") == 1  # only rank 0 talks


def test_failure_on_one_rank_of_the_second_node_fails_everywhere_and_names_it(tmp_path: Path) -> None:
    """The last rank (rank 3, on the second node) fails a test: every rank fails it, on both nodes, naming rank 3;
    the tests before and after it still run."""
    r = job(tmp_path, "fail_on_one_rank", nodes=2, nproc=2)
    assert r.codes == [1, 1], r.output
    [failed] = [t for t in r.results["tests"] if t["outcome"] == "failed"]
    assert failed["nodeid"].endswith("test_fails_on_last_rank") and failed["failed_ranks"] == [3]
    assert "failed on 1/4 ranks" in failed["message"] and f"rank 3 ({HOST}" in failed["message"]
    assert "planted failure on rank 3" in failed["message"]
    assert r.results["verdict"] == "reject"
    assert [t["outcome"] for t in r.results["tests"]] == ["passed", "failed", "passed"]
    assert r.results["world_size"] == 4 and [n["node_rank"] for n in r.results["nodes"]] == [0, 1]


def test_a_skip_on_one_rank_fails_the_test_saying_its_reason_as_given(tmp_path: Path) -> None:
    """The ranks' outcomes differ: the test fails, naming each skipping rank with the reason it gave, word for
    word (a quote and a closing parenthesis included), not as pytest's text of the skip prints it."""
    r = job(tmp_path, "skip_on_one_rank")
    assert r.codes == [1], r.output
    [test] = r.results["tests"]
    assert test["outcome"] == "failed", test
    assert test["message"].splitlines()[1:] == ["rank 1: rank 1's GPU is taken (planted)"], test["message"]


def test_raise_before_collective_ends_bounded_with_default_settings(
        waited_out: dict[str, Any], request: pytest.FixtureRequest) -> None:  # noqa: F811
    """Rank 1 raises and goes to the call exchange; rank 0 waits in all_reduce for it. Rank 0's watchdog
    sees that (10 s in a collective, polled every 5 s) and ends the run: not the collective timeout
    (30 s on CPU, 300 s on GPU profiles), not the test limit (a planted test has no measured time: the level's
    600 s). 120 s leaves room for start-up.
    (The job runs beside the suite's other jobs that wait out a timer: tests/helpers/waited_out_runs.py.)"""
    r, _ = ended(waited_out, request)
    assert r.seconds < 120, r.output
    assert r.codes == [1], r.output
    res = r.results
    first = res["tests"][0]
    assert first["outcome"] == "failed" and first["failed_ranks"] == [1]
    assert (f"test_fault.py::test_raises_before_all_reduce [call]: rank 1 ({HOST}) failed it (ValueError: planted: "
            f"rank 1 raises before the collective) and waits for the others, while rank 0 ({HOST}) has been "
            "blocked for") in res["error"]
    assert "in all_reduce called at test_fault.py:10" in res["error"]
    assert len(res["tests"]) == 1  # the run stops: the second test never runs


def test_hang_is_cut_by_the_test_timeout(waited_out: dict[str, Any],  # noqa: F811
                                         request: pytest.FixtureRequest) -> None:
    """Rank 1 hangs in its test under a 10 s test limit (the job runs beside the suite's other jobs that wait out a
    timer: tests/helpers/waited_out_runs.py)."""
    r, seen = ended(waited_out, request)
    # The product's promise, on its own clock: the 10 s limit fires (progress.jsonl's run_error) 10 s after the
    # test began (test_start is written before the timer arms; CLOCKS_APART_S says how early it may seem), late by a
    # busy core's wake-up at most.
    # Then the job ends: exit and torchrun's teardown, which on CI's 2 cores, beside the other waited-out jobs, once
    # took 16 s; bounded apart, so a run that lingers still fails.
    assert r.codes == [1], r.output
    fired = since_test_start(r, event_time(r, "run_error"), "test_hangs_on_rank_1")
    assert TEST_TIMEOUT_S - CLOCKS_APART_S <= fired < TEST_TIMEOUT_S + LIMIT_WAKE_SLACK_S, (fired, r.output)
    assert seen["took"] < TEST_TIMEOUT_S + TEARDOWN_SLACK_S, r.output
    res = r.results
    assert res["verdict"] == "reject"
    assert "test_hangs_on_rank_1 did not finish within 10 s" in res["error"]
    # where each rank was: rank 1 still in the test body, rank 0 done with it and waiting
    assert f"rank 1 ({HOST}) last finished setup of test_fault.py::test_hangs_on_rank_1" in res["error"]
    assert f"rank 0 ({HOST}) last finished call of test_fault.py::test_hangs_on_rank_1" in res["error"]
    assert res["tests"][0]["failed_ranks"] == [1]  # the rank that never finished the test body


def test_broken_thresholds_is_one_clear_error(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("schema: 1\nprofiles:\n  cpu: {metrics: [\n")
    r = job(tmp_path, "healthy", "--thresholds", str(bad), timeout=120)
    assert r.codes == [1], r.output
    assert r.output.count(f"ERROR: {bad}: not valid YAML at line 4") == 2  # first by rank 0, then by torchrun's summary
    assert not frames_of_ours(r.output), r.output  # no traceback from pytest or us
