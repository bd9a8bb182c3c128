"""End to end under torchrun on gloo: one real job per fault class; every fault planted for real ends within its
bound, as reject, with the first cause as the headline and the rank that caused it named
(``error_ranks``, the test's ``failed_ranks``); killed never means accepted; every rank runs the same code.

Times are measured from the planted event (a file the planted code writes as it goes astray, a signal
sent), so they do not depend on how long torch takes to import on a busy machine. Each elapsed-time bound
is one of the product's own timers plus 15 s of exit and teardown under load; each subprocess timeout is a
hang guard, several times that. The other faults of each class, at every stage of a run, are rows of
tests/run/test_run_lifecycle.py.

Two jobs spend most of their time waiting out one of those timers (45 s at start-up, 30 s at the final
barrier): they run side by side with the other such jobs of the suite, once per session
(tests/helpers/waited_out_runs.py), and their tests judge what each left. A rank that stops making progress (stopped,
frozen, killed mid-collective) is tests/run/test_hang_endings.py's.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from report_runs import schema_errors
from waited_out_runs import (
    alive,
    ended,
    ended_after,
    since_test_start,
    waited_out,  # noqa: F401  (the fixture)
)

from clustergate.run.limits import (
    BLOCKED_S,
    FINAL_S,
    POLL_S,
    SIGNAL_GRACE_S,
    STARTUP_S,
)

from torchrun_job import ROOT, JobResult, plant, run_job, start_job, wait_for

HOST = socket.gethostname()
SLACK_S = 15.0
"""Exit, torchrun's teardown and this process's polling, on CI's 2 busy cores."""
START_SLACK_S = 30.0
"""The same, and rank 0's own way from its conftest to the start's exchange (its options, thresholds, the rendezvous
store): on 2 cores shared with the suite's other jobs that way took 15 s of wall (rank 1 stuck: 66.2 s in all)."""
pytestmark = pytest.mark.slow


def rejected(r: JobResult) -> dict:
    res = r.results
    assert schema_errors(res) == [], res
    assert res["verdict"] == "reject", res
    return res


BLOCKED_BOUND_S = BLOCKED_S + 2 * POLL_S + SLACK_S
"""A rank blocked in a collective a peer will never join: the watchdog's poll sees it blocked (up to POLL_S
late), ends it BLOCKED_S later (up to POLL_S late again); then exit and teardown."""


def measured(what: str, seconds: float) -> None:
    """Say the time taken (shown with -s; docs/how-it-works.md's fault table quotes them)."""
    print(f"\nmeasured: {what}: {seconds:.1f} s")


def test_kill_9_of_torchrun_takes_its_ranks_along_and_never_reads_accept(tmp_path: Path) -> None:
    """Orphaned ranks must not finish alone: each rank dies with its launcher (PR_SET_PDEATHSIG)."""
    job = start_job(tmp_path, plant(tmp_path, "sleeps_then_passes"), timeout=120)
    pids = [int(wait_for(tmp_path / f"ready-{r}") and (tmp_path / f"ready-{r}").read_text()) for r in (0, 1)]
    job.procs[0].send_signal(signal.SIGKILL)
    killed = time.monotonic()
    try:
        while any(alive(p) for p in pids) and time.monotonic() - killed < 60:  # a hang guard: the test sleeps 30 s
            time.sleep(0.2)
        gone_after = time.monotonic() - killed
        measured("kill -9 of torchrun, until both ranks are gone", gone_after)
        # The kernel signals each rank at once; the rank waits SIGNAL_GRACE_S for its peers' word, then ends.
        assert gone_after < SIGNAL_GRACE_S + SLACK_S, f"ranks alive {gone_after:.0f} s after kill -9 of torchrun"
    finally:
        for p in pids:
            if alive(p):
                os.kill(p, signal.SIGKILL)
        job.wait()
    res = json.loads((tmp_path / "report" / "results.json").read_text())
    assert res["verdict"] != "accept", res
    assert res["verdict"] == "reject" and "its launcher (pid" in res["error"] and "is gone" in res["error"], res
    assert res["tests"][0]["outcome"] == "interrupted", res["tests"]


def test_accept_waits_for_the_final_barrier_and_a_rank_stuck_after_the_verdict_rejects(
        waited_out: dict[str, Any], request: pytest.FixtureRequest) -> None:  # noqa: F811
    r, seen = ended(waited_out, request)
    measured("rank 1 stuck in unconfigure", seen["took"])
    assert "accept" not in seen["seen"], "results.json said accept while rank 1 had not passed the final barrier"
    assert seen["took"] < FINAL_S + SLACK_S, r.output  # rank 0's wait at the final barrier
    assert r.codes == [1], r.output
    res = rejected(r)
    assert res["error"].startswith(f"rank 1 ({HOST}) did not reach 'final barrier' within"), res["error"]
    assert res["error_ranks"] == [1]
    assert [t["outcome"] for t in res["tests"]] == ["passed", "passed"]


def test_rank_stuck_at_start_up_is_named(waited_out: dict[str, Any],  # noqa: F811
                                         request: pytest.FixtureRequest) -> None:
    """Rank 1 hangs loading its conftest, before the process groups form: rank 0 names it at STARTUP_S (the groups'
    own creation would wait their whole timeout and end in an INTERNALERROR naming no one)."""
    r, seen = ended(waited_out, request)
    measured("rank 1 stuck in its conftest", seen["took"])
    assert seen["took"] < STARTUP_S + START_SLACK_S, r.output  # never the process groups' own timeout
    assert "INTERNALERROR" not in r.output, r.output
    res = rejected(r)
    assert res["error"].startswith(f"rank 1 ({HOST}) did not reach the start of the run within 45 s of rank 0 "
                                   f"({HOST})"), res["error"]
    assert res["error_ranks"] == [1] and res["tests"] == []


def test_pytest_exit_on_one_rank_is_the_headline(tmp_path: Path) -> None:
    """Rank 1 calls pytest.exit in a test; rank 0 finds it at another step at the test's exchange (a rank blocked in
    a collective then is the table's 'blocked, peer gone')."""
    r = run_job(tmp_path, plant(tmp_path, "exit_on_one_rank"), timeout=150)
    took = since_test_start(r, time.time(), "test_leaves")
    measured("pytest.exit on rank 1", took)
    assert took < SIGNAL_GRACE_S + SLACK_S, r.output
    res = rejected(r)
    assert res["error"].startswith(f"pytest.exit('planted: rank 1 leaves the run') on rank 1 ({HOST}) during "
                                   "test_fault.py::test_leaves [call]"), res["error"]
    assert res["error_ranks"] == [1]
    [test] = res["tests"]
    assert test["outcome"] == "interrupted" and test["failed_ranks"] == [1], test


def test_sigterm_to_one_rank_names_that_rank(tmp_path: Path) -> None:
    """A SIGTERM to rank 1 alone, while it collects: rank 1 leaves after its grace, torchrun then stops rank 0 with
    a SIGTERM of its own. The headline names rank 1, where the signal came from outside, not rank 0."""
    job = start_job(tmp_path, plant(tmp_path, "stuck_collecting"), timeout=120)
    collecting = wait_for(tmp_path / "stuck-1")
    time.sleep(0.5)  # the pid is written
    os.kill(int((tmp_path / "stuck-1").read_text()), signal.SIGTERM)
    sent = time.monotonic()
    r = job.wait()
    measured("SIGTERM to rank 1 while it collects", ended_after(r, sent))
    assert sent - collecting < STARTUP_S  # rank 0 still waits at the collection exchange
    assert ended_after(r, sent) < 2 * SIGNAL_GRACE_S + SLACK_S, r.output
    res = rejected(r)
    assert res["error"].startswith(f"stopped by SIGTERM on rank 1 ({HOST}) during the session (sent from outside the "
                                   "run"), res["error"]
    assert res["error_ranks"] == [] and res["tests"] == []  # no rank caused it


def _other_checkout(tmp_path: Path, version: str) -> Path:
    """A copy of the code with another version and one changed line: what a node with a stale install runs."""
    other = tmp_path / "other-checkout"
    for package in ("clustergate", "workloads"):
        shutil.copytree(ROOT / package, other / package, ignore=shutil.ignore_patterns("__pycache__"))
    init = other / "clustergate" / "__init__.py"
    init.write_text(init.read_text().replace('__version__ = "', f'__version__ = "{version}+'))
    return other


def test_another_clustergate_on_one_node_is_one_error_naming_the_rank(tmp_path: Path) -> None:
    other = _other_checkout(tmp_path, "9.9")
    r = run_job(tmp_path, plant(tmp_path, "healthy"), nodes=2, nproc=1, timeout=180,
                node_env=[{}, {"PYTHONPATH": str(other)}])
    res = r.results
    assert res["verdict"] == "reject" and res["tests"] == [], res
    assert res["error"].startswith("ranks disagree about what to run (the clustergate version, the suite's "
                                   "files): ranks 1 differ from rank 0; refusing to start"), res["error"]
    assert "clustergate 9.9+0.1.0" in res["error"] and res["error_ranks"] == [1]
    assert res["clustergate"]["version"] == "0.1.0" and res["attestation"]["suite_digest"].startswith("sha256:")
