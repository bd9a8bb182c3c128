"""End to end under torchrun on gloo, under a GPU profile's timeouts (the workloads' collectives time out after 300 s,
a test after the standard level's 600 s: ``waited_out_runs.GPU_LIMITS``): a rank that stops making progress ends
the run within 60 s of the fault, naming it, with the evidence in results.json (the collective, which ranks had
joined it, every rank's stack), and no process of the job is left (agents, ranks, keepers: the process table).

Each hang is planted for real (tests/faults/): rank 1 SIGSTOPped while rank 0 waits in all_reduce, beside it and
alone on its node (two agents); rank 1 frozen in a syscall while rank 0 waits at the test's exchange; rank 1
computing on in torch's C++ (a GPU kernel that spins, on a CPU) while rank 0 waits in all_reduce; rank 1 passing a
test without the all_reduce rank 0 waits in; rank 1 holding the interpreter's lock for good (no thread of it runs
Python); rank 1 killed with SIGKILL mid-collective. The jobs that wait out
a liveness bound run side by side with the suite's other such jobs (tests/waited_out_runs.py). Times are from the
fault (the signal sent, or the planted code's file as it goes astray) to the end of the job; the bound is the
product's promise, 60 s; each test's docstring says what it takes (the fault table of docs/how-it-works.md quotes them).
"""

from __future__ import annotations

import os
import signal
import socket
import time
from pathlib import Path
from typing import Any

import pytest
from report_runs import schema_errors
from waited_out_runs import GPU_LIMITS, alive, ended, ended_after, waited_out  # noqa: F401  (waited_out: the fixture)

from torchrun_job import JobResult, job_processes, plant, start_job, wait_for

HOST = socket.gethostname()
WITHIN_S = 60.0
"""A rank that stops making progress ends the run within this of the fault, under every shipped profile."""
pytestmark = pytest.mark.slow


def measured(what: str, seconds: float) -> None:
    print(f"\nmeasured: {what}: {seconds:.1f} s")


def ended_within_a_minute(request: pytest.FixtureRequest, waited_out: dict[str, Any],  # noqa: F811
                          what: str) -> tuple[JobResult, dict[str, Any]]:
    """The job's record, once it ended within WITHIN_S of the fault leaving no process of it behind."""
    r, seen = ended(waited_out, request)
    measured(what, seen["took"])
    assert seen["took"] < WITHIN_S, r.output
    assert seen["left"] == [], f"processes of the job left after its end: {seen['left']}\n{r.output}"
    res = r.results
    assert schema_errors(res) == [], res
    assert res["verdict"] == "reject", res
    return r, res


def stack_of(res: dict[str, Any], rank: int) -> str:
    return next(e for e in res["hang"]["ranks"] if e["rank"] == rank)["stack"] or ""


def test_a_stopped_rank_is_named_and_stopped(waited_out: dict[str, Any],  # noqa: F811
                                             request: pytest.FixtureRequest) -> None:
    """Rank 1 SIGSTOPped in a loop of all_reduce: its beat stops; rank 0, waiting in all_reduce, names it SILENT_S
    after it first looked (17-20 s), continues it for its stack, records and stops it."""
    r, res = ended_within_a_minute(request, waited_out, "rank 1 SIGSTOPped, rank 0 in all_reduce")
    assert res["error"].startswith(f"rank 1 ({HOST}) stopped making progress during test_fault.py::test_loop [call]: "
                                   "no sign of life for"), res["error"]
    assert "(its process is stopped (SIGSTOP)), while rank 0" in res["error"]
    assert "(gloo:all_reduce) of the workloads' group" in res["error"]
    assert res["error_ranks"] == [1] and res["tests"][-1]["failed_ranks"] == [1], res["tests"]
    hang = res["hang"]
    assert (hang["kind"], hang["culprits"], hang["found_by"]) == ("silent", [1], 0), hang
    assert hang["collective"]["op"] == "gloo:all_reduce" and hang["collective"]["joined"] == [0]
    assert hang["collective"]["missing"] == [1] and hang["source"] == "gloo flight recorder"
    assert "in test_loop" in stack_of(res, 0) and "dist.all_reduce(t)" in stack_of(res, 0)
    assert "in test_loop" in stack_of(res, 1)  # continued for its stack: its own thread gave it


def test_a_stopped_rank_alone_on_its_node_is_named_and_ended(waited_out: dict[str, Any],  # noqa: F811
                                                             request: pytest.FixtureRequest) -> None:
    """Two agents of one rank each: nobody beside the SIGSTOPped rank 1 can continue it, and its agent never learns
    that rank 0 ended. Rank 0 names it at SILENT_S; rank 1's keeper continues it at STOPPED_S (30 s), and it ends."""
    r, res = ended_within_a_minute(request, waited_out, "rank 1 alone on its node SIGSTOPped")
    assert r.codes == [1, 1], r.output
    assert res["error"].startswith(f"rank 1 ({HOST}) stopped making progress during test_fault.py::test_loop [call]"), \
        res["error"]
    assert res["error_ranks"] == [1] and res["hang"]["culprits"] == [1]


def test_a_rank_holding_the_interpreter_is_named_with_its_stack(waited_out: dict[str, Any],  # noqa: F811
                                                                request: pytest.FixtureRequest) -> None:
    """Rank 1's interpreter lock is held by a call that never returns: no thread of it runs Python, so its beat stops
    though its process runs. Rank 0 names it at SILENT_S; its stack comes from faulthandler, written from C on a
    signal into a file of its own that rank 0 reads beside it."""
    r, res = ended_within_a_minute(request, waited_out, "rank 1 holding the interpreter, rank 0 in all_reduce")
    assert res["error"].startswith(f"rank 1 ({HOST}) stopped making progress during test_fault.py::test_holds "
                                   "[call]"), res["error"]
    assert "(its process runs, but none of its threads can: the interpreter's lock is held by a call)" in res["error"]
    assert res["error_ranks"] == [1] and res["hang"]["kind"] == "silent"
    written = stack_of(res, 1)
    assert written.startswith("written by faulthandler") and "in test_holds" in written, written


def test_a_rank_frozen_in_a_syscall_is_named(waited_out: dict[str, Any],  # noqa: F811
                                             request: pytest.FixtureRequest) -> None:
    """Rank 1 blocks in a read that never returns (its beat goes on); rank 0 waits at the test's exchange, which rank
    1 never enters: named after NO_PROGRESS_S (33-36 s), not after the 600 s test limit."""
    r, res = ended_within_a_minute(request, waited_out, "rank 1 frozen in a syscall, rank 0 at the exchange")
    assert res["error"].startswith(f"rank 1 ({HOST}) did not enter the exchange after test_fault.py::test_frozen "
                                   "[call] (collective"), res["error"]
    assert "it waits in a call that does not return; rank 1" in res["error"]
    assert "at test_fault.py:19 in test_frozen" in res["error"]
    assert res["error_ranks"] == [1] and res["tests"][1]["failed_ranks"] == [1], res["tests"]
    assert res["hang"]["kind"] == "not entered" and res["hang"]["collective"]["group"] == "the control group"
    assert "os.read(read, 1)" in stack_of(res, 1)  # the stuck rank's own thread gave its stack


def test_a_rank_busy_in_cpp_is_named(waited_out: dict[str, Any],  # noqa: F811
                                     request: pytest.FixtureRequest) -> None:
    """Rank 1 computes on in torch's C++ (a CPU's stand-in for a GPU kernel that spins) while rank 0 waits in
    all_reduce: named after NO_PROGRESS_S."""
    r, res = ended_within_a_minute(request, waited_out, "rank 1 busy in C++, rank 0 in all_reduce")
    assert res["error"].startswith(f"rank 1 ({HOST}) did not enter collective 2 (gloo:all_reduce) of the workloads' "
                                   f"group, which rank 0 ({HOST}) waited in for"), res["error"]
    assert "it is busy in its own work, which does not end" in res["error"]
    assert res["error_ranks"] == [1] and res["hang"]["kind"] == "not entered"
    assert res["hang"]["collective"]["joined"] == [0] and "a = torch.tanh(a @ a)" in stack_of(res, 1)


def test_a_rank_that_skips_a_collective_is_named(waited_out: dict[str, Any],  # noqa: F811
                                                 request: pytest.FixtureRequest) -> None:
    """Rank 1 passes the test without the all_reduce rank 0 waits in, and waits at the exchange: named after
    BLOCKED_S (12-14 s)."""
    r, res = ended_within_a_minute(request, waited_out, "rank 1 skips the all_reduce rank 0 waits in")
    assert res["error"].startswith(f"rank 1 ({HOST}) left test_fault.py::test_skips [call] without joining collective "
                                   "2 (gloo:all_reduce) of the workloads' group"), res["error"]
    assert res["error_ranks"] == [1] and res["hang"]["kind"] == "skipped"


def test_kill_9_mid_collective_names_the_rank(tmp_path: Path) -> None:
    """kill -9 of rank 1 in a loop of all_reduce: torchrun sees it die and stops rank 0, which names it (2.7 s)."""
    job = start_job(tmp_path, [*plant(tmp_path, "collective_loop"), *GPU_LIMITS], timeout=120)
    wait_for(tmp_path / "ready-0")
    wait_for(tmp_path / "ready-1")
    tree = job_processes(job)
    os.kill(int((tmp_path / "ready-1").read_text()), signal.SIGKILL)
    killed = time.monotonic()
    r = job.wait()
    measured("kill -9 of rank 1 mid-collective", ended_after(r, killed))
    assert ended_after(r, killed) < WITHIN_S, r.output
    time.sleep(1.0)
    assert [pid for pid in tree if alive(pid)] == [], r.output
    res = r.results
    assert res["verdict"] == "reject" and res["error_ranks"] == [1], res
    assert res["error"].startswith(f"rank 1 ({HOST}) ended without a word during test_fault.py::test_loop [call]"), \
        res["error"]



def test_a_rank_stopped_before_the_run_starts_ends_it_named_and_nothing_is_left(
        waited_out: dict[str, Any], request: pytest.FixtureRequest) -> None:  # noqa: F811
    """Rank 1 stopped between the process groups' forming and the report directory's exchange (no keeper, no beat
    yet): rank 0 names the exchange it waited in (45 s), ends the stopped rank and leaves at once; before, its exit
    waited on the gloo group's teardown, which waited on the stopped peer for the control group's limit (minutes),
    and nothing ended the stopped rank (45.6 s here)."""
    r, seen = ended(waited_out, request)
    measured("rank 1 stopped before the report directory's exchange", seen["took"])
    assert seen["took"] < WITHIN_S and r.codes != [0], r.output
    assert seen["left"] == [], f"processes of the job left after its end: {seen['left']}\n{r.output}"
    assert (f"rank 1 (pid {seen['pid']}) beside this rank stopped (SIGSTOP or a debugger): ended with it"
            in r.output), r.output
    assert "the run could not start: control exchange 'report directory" in r.output, r.output
    assert not (r.report_dir / "results.json").exists() or r.results["verdict"] != "accept"
