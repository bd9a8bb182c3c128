"""The run's state machine without torchrun: every (stage x fault) pair, in milliseconds.

Rank 0 of a 2-rank job runs in this process (tests/helpers/run_fakes.py): a fake clock, the other rank as the control
exchanges and the rendezvous store see it, an exit that raises. Each fault is handed to the run at one stage
and the table says how the run ends: the exit status, the culprits (results.json's ``error_ranks``), the
headline (``error``), the bound the run waited (seconds) and the verdict results.json is left saying. A pair
missing from the table is a fault that cannot reach the run at that stage (a watchdog not armed, no exchange
to notice a peer, no signal watched yet): the run goes on and accepts.

One real torchrun job per fault class stays in tests/run/test_fault_verdicts.py, tests/run/test_run_endings.py and
tests/run/test_faults.py.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch.distributed as dist
from run_fakes import SUITE, TEST, TEST_LIMIT_S, Exited, Harness

from clustergate.common.exit_codes import Exit
from clustergate.run import detectors
from clustergate.run.hang.hang_judge import Finding
from clustergate.run.lifecycle import Stage
from clustergate.run.limits import (
    AGENT_STOPPED_S,
    BLOCKED_S,
    EXCHANGE_GRACE_S,
    FINAL_S,
    FREEZE_S,
    LEAVING_S,
    NO_PROGRESS_S,
    POLL_S,
    REPORT_S,
    SESSION_END_S,
    SIGINT_GRACE_S,
    SIGNAL_GRACE_S,
    SILENT_S,
    STARTUP_S,
    STILL_S,
    STORE_CALL_S,
    exit_status,
)
from clustergate.run.ranks.control import ControlLost, ControlMismatch, Step
from clustergate.run.ranks.peers import StoreLost
from clustergate.run.ranks.world import Launch, StartupLost, StartupRefused, meet_at_start
from clustergate.trust import attestation, manifest


@pytest.fixture(autouse=True)
def planted_suite(monkeypatch: pytest.MonkeyPatch) -> None:
    """The harness's one test is the whole suite (run_fakes.SUITE)."""
    monkeypatch.setattr(manifest, "shipped", lambda: SUITE)


# ---- the faults ---------------------------------------------------------------------------------------------
def watchdog_expires(h: Harness) -> None:
    """The watchdog's deadline passes: a test past its limit, or rank 0 past REPORT_S after the verdict."""
    if h.watchdog.armed is not None:
        label, seconds, expiry = h.watchdog.armed
        h.bound = seconds
        expiry(label, seconds)


def _blocked(h: Harness, outcome: str | None, message: str = "") -> None:
    """Rank 0's main thread is in a workload collective; rank 1 ended the phase (``outcome``) and waits at its
    exchange (None: it is not there). The watchdog polls every POLL_S."""
    if h.run.test and h.run.phase and outcome is not None:
        h.peer.arrived_early(Step(h.run.test, h.run.phase).tag, outcome, message)
    h.in_collective = "all_reduce called at t.py:3"
    start = h.clock()
    try:
        for _ in range(6):
            h.run.on_poll()
            h.clock.sleep(POLL_S)
    except Exited:
        h.bound = h.clock() - start
        raise
    finally:
        h.in_collective = None


def blocked_collective(h: Harness) -> None:
    _blocked(h, "failed", "ValueError: planted on rank 1")


def blocked_by_a_peer_gone(h: Harness) -> None:
    """Rank 1 left the run (pytest.exit in the test) while rank 0's main thread waits for it in a collective."""
    h.peer_leaves(f"pytest.exit('planted') on rank 1 (node-b) during {h.run.where_now()}", "cause", [1],
                  interrupted=True)
    _blocked(h, None)


def blocked_by_a_skip(h: Harness) -> None:
    """Rank 1 skipped the phase alone (a skip that differs by rank)."""
    _blocked(h, "skipped", "planted: rank 1 skips alone")


def _signal(h: Harness, signum: int) -> None:
    if h.run.signals is not None:  # watched from the moment every rank is known
        h.run.signals.on_signal(signum)


def sigint(h: Harness) -> None:
    """Ctrl-C: recorded at once; pytest unwinds, and the process ends SIGINT_GRACE_S later if it cannot."""
    _signal(h, signal.SIGINT)
    if h.timers:
        seconds, action = h.timers.pop()
        h.bound = seconds
        action()


def sigterm_to_the_job(h: Harness) -> None:
    """torchrun forwards a SIGTERM to every rank at once: rank 1 says so in the store as rank 0 gets it."""
    h.peer_leaves(f"stopped by SIGTERM on rank 1 (node-b) during {h.run.where_now()} (sent from outside the run: "
                  "the job was cancelled or torchrun was signalled)", "signal", [], interrupted=True)
    _signal(h, signal.SIGTERM)


def sigterm_to_rank_1(h: Harness) -> None:
    """A SIGTERM to rank 1 alone (a kill of its pid): rank 1 says so and leaves after its grace; torchrun then
    stops rank 0 with its own SIGTERM, seconds later."""
    h.peer_leaves(f"stopped by SIGTERM on rank 1 (node-b) during {h.run.where_now()} (sent from outside the run: "
                  "the job was cancelled or torchrun was signalled)", "signal", [], ago_s=SIGNAL_GRACE_S + 0.5,
                  interrupted=True)
    _signal(h, signal.SIGTERM)


def launcher_lost(h: Harness) -> None:
    """kill -9 of torchrun: the kernel's parent-death signal; the store went with the launcher."""
    h.launcher.is_gone = True
    _signal(h, signal.SIGTERM)


def _lost(step: Step) -> ControlLost:
    return ControlLost(f"control exchange '{step}' failed on rank 0: a peer rank died or stopped answering "
                       "(RuntimeError: Connection closed by peer)")


def peer_gone(h: Harness) -> None:
    """Rank 1 dies without a word (kill -9, a crash): rank 0 sees its connection closed at its next exchange."""
    h.exchange.failing = _lost


def peer_stuck(h: Harness) -> None:
    """Rank 1 never comes to rank 0's next exchange (stuck in a conftest, a test, a hook, or SIGSTOPped): its
    deadline passes. Rank 1 runs under rank 0's launcher, so rank 0 stops it itself once it has recorded why."""
    h.peer_beside()
    def late(step: Step) -> ControlLost:
        lost = ControlLost(f"control exchange '{step}' did not complete on rank 0: a peer rank never arrived")
        lost.timed_out = True
        lost.waited_s = (step.deadline or 0.0) - h.clock()
        h.bound = lost.waited_s
        return lost
    h.exchange.failing = late


def peer_elsewhere(h: Harness) -> None:
    """Rank 1 is at another step: it left the run (pytest.exit in a test) and said why in the store first."""
    h.peer_leaves(f"pytest.exit('planted') on rank 1 (node-b) during {TEST} [call]", "cause", [1], ago_s=1.0,
                  interrupted=True)
    h.exchange.failing = lambda step: ControlMismatch(step, [str(step), "session end (left)"])


def _pytest_unwinds(h: Harness) -> bool:
    """pytest tells the plugin of pytest.exit, KeyboardInterrupt and internal errors between the session's start
    and its end only."""
    return h.run.stage in (Stage.STARTING, Stage.COLLECTING, Stage.TESTING)


def pytest_exit(h: Harness) -> None:
    if _pytest_unwinds(h):
        h.pytest_status = pytest.ExitCode.INTERRUPTED
        h.run.end(detectors.pytest_stopped(h.run, pytest.exit.Exception("planted")))


def internal_error(h: Harness) -> None:
    if _pytest_unwinds(h):
        h.pytest_status = pytest.ExitCode.INTERNAL_ERROR
        h.run.end(detectors.internal_error(h.run, "RuntimeError: planted crash"))


def _finding(h: Harness, finding: Finding) -> None:
    """The liveness thread hands the run what it found, as it does at every stage but the end (it beats no more)."""
    if h.run.liveness is not None and h.run.position().stage != Stage.ENDED.value:
        h.run.on_finding(finding)


def peer_frozen(h: Harness) -> None:
    """Rank 1 (beside rank 0) was SIGSTOPped: its beat has not changed for SILENT_S while rank 0 waits for it."""
    h.peer_beside()
    _finding(h, Finding("silent", (1,), 0, "0", 7, SILENT_S + 2, (0,), SILENT_S))


def peer_not_entering(h: Harness) -> None:
    """Rank 1 is alive but has not entered the collective rank 0 has waited in for NO_PROGRESS_S (a test only)."""
    if h.run.stage is Stage.TESTING:
        _finding(h, Finding("not entered", (1,), 0, "0", 7, NO_PROGRESS_S, (0,)))


def frozen_itself(h: Harness) -> None:
    """Rank 0's own beat thread could not run for SILENT_S: it was stopped, and continued (its keeper)."""
    _finding(h, Finding("frozen", (0,), 0, waited_s=SILENT_S + 5))


def skipped_after_failing(h: Harness) -> None:
    """Rank 0 failed the phase (it said so in the store) and waits at its exchange, while rank 1 waits in a collective
    rank 0 never entered: rank 0's judge leaves it to rank 1, which names rank 0 with its failure (the blocked
    collective's ending): rank 0 does not end the run itself."""
    if h.run.test and h.run.phase:
        h.run.peers.arrived_early(Step(h.run.test, h.run.phase).tag, "failed", "ValueError: planted on rank 0")
        _finding(h, Finding("skipped", (0,), 0, "0", 7, BLOCKED_S, (1,)))


def every_rank_stuck(h: Harness) -> None:
    """Neither rank has moved in its own code for STILL_S, in the same test: rank 0, the lowest, names both."""
    if h.run.stage is Stage.TESTING:
        _finding(h, Finding("stuck", (0, 1), 0, waited_s=STILL_S))


def deadlock(h: Harness) -> None:
    """Each rank waits in a torch.distributed call none of them will complete (each receives from the other)."""
    if h.run.stage is Stage.TESTING:
        _finding(h, Finding("deadlock", (0, 1), 0, waited_s=STILL_S, joined=(0, 1)))


def collective_hung(h: Harness) -> None:
    """Both ranks entered collective 7 and neither completed it within its bound."""
    if h.run.stage is Stage.TESTING:
        _finding(h, Finding("hung", (0, 1), 0, "0", 7, STILL_S + 1, (0, 1), op="gloo:all_reduce"))


def launcher_stopped(h: Harness) -> None:
    """Rank 0's launcher (torchrun's agent) has been stopped for AGENT_STOPPED_S: its beat says so."""
    _finding(h, Finding("launcher stopped", (), 0, waited_s=AGENT_STOPPED_S))


def store_lost(h: Harness) -> None:
    """A call to the rendezvous store went unanswered for STORE_CALL_S (its agent stopped): the run is told once
    (from the thread that made the call), from the moment it listens (every rank known)."""
    store = h.run.peers.store
    if store is not None and store.on_lost is not None and h.run.stage is not Stage.ENDED:
        with contextlib.suppress(StoreLost):
            store._lose(f"did not answer within {STORE_CALL_S:.0f} s (its check)")


def hang_reported(h: Harness) -> None:
    """Rank 1 found a hang (rank 1 itself, not entering) and published its report: rank 0 ends on it."""
    if h.run.liveness is not None and h.run.position().stage != Stage.ENDED.value:
        h.run.on_report({"cause": "rank 1 (node-b) did not enter collective 7", "error_ranks": [1], "found_by": 1})


def failed_write(h: Harness) -> None:
    """The disk fills: every write of results.json from now on fails."""
    h.write_fails = True
    h.bound = 0.0  # noticed at the run's next write, which ends it at once


FAULTS: dict[str, Callable[[Harness], None]] = {
    "watchdog expires": watchdog_expires, "blocked collective": blocked_collective,
    "blocked by a skip": blocked_by_a_skip, "blocked by a peer gone": blocked_by_a_peer_gone, "SIGINT": sigint,
    "SIGTERM to the job": sigterm_to_the_job, "SIGTERM to rank 1": sigterm_to_rank_1,
    "launcher lost": launcher_lost, "peer gone": peer_gone,
    "peer stuck": peer_stuck, "peer elsewhere": peer_elsewhere, "pytest.exit": pytest_exit,
    "internal error": internal_error, "failed write": failed_write, "peer frozen": peer_frozen,
    "peer not entering": peer_not_entering, "frozen itself": frozen_itself, "hang reported": hang_reported,
    "skipped after failing": skipped_after_failing, "every rank stuck": every_rank_stuck, "deadlock": deadlock,
    "collective hung": collective_hung, "launcher stopped": launcher_stopped, "store lost": store_lost,
}


# ---- how each ends --------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Ends:
    exit: int | None
    """The process's exit status; None: the run went on to its end and returned the agreed status (``status``)."""
    culprits: tuple[int, ...] = ()
    cause: str | None = None
    """How the recorded ending (results.json's error) starts; None: nothing was recorded."""
    bound: float = 0.0
    """The deadline the run waited before it ended, seconds (0: at once)."""
    stops: bool = False
    """The run stops the culprits itself (stuck ranks beside it), rather than leave them to torchrun."""
    final: bool = False
    """The run reached its end, and its final ending (not an early one) says this."""
    verdict: str | None = "reject"
    """What results.json says afterwards (None: it was never written)."""
    status: int | None = None
    hosts: tuple[str | None, ...] | None = None
    """The culprits' hosts as the ending names them (None: each culprit's own host)."""


NOT_ACCEPTED = Exit.NOT_ACCEPTED
"""Every early ending's exit status: the run did not finish (what ended it is in results.json, not the status)."""
ACCEPTED = Ends(exit=None, status=0, verdict="accept")
"""The fault never reached the run at that stage: it ends as it would have without it."""
ENDED_ALREADY = Ends(exit=0, verdict="accept")
"""After the final barrier the record is final: the process leaves with the agreed status."""
PHASE_S = 1.0
"""Each phase of the fake test takes this long (run_fakes)."""
IN_TEST = f"{TEST} [call]"
SESSION = (Stage.STARTING, Stage.COLLECTING, Stage.TESTING, Stage.CONCLUDING, Stage.WRITING, Stage.FINAL_BARRIER)
"""The stages in which the signal watcher runs and the record is not final."""
UNWINDING = (Stage.STARTING, Stage.COLLECTING, Stage.TESTING)
"""The stages in which pytest tells the plugin of pytest.exit and internal errors."""
EXCHANGES = {Stage.CONFIGURING: ("identities", STARTUP_S), Stage.STARTING: ("collection", STARTUP_S),
             Stage.COLLECTING: ("collection", STARTUP_S),
             Stage.TESTING: (IN_TEST, TEST_LIMIT_S + EXCHANGE_GRACE_S - 2 * PHASE_S),
             Stage.CONCLUDING: ("session end", SESSION_END_S), Stage.WRITING: ("final barrier", FINAL_S),
             Stage.FINAL_BARRIER: ("final barrier", FINAL_S)}
"""The exchange at which rank 0 notices a peer that went at that stage (or just before), and its deadline: a
stage without one of its own (starting, writing the outputs) is noticed at the next."""


def where(stage: Stage) -> str:
    return IN_TEST if stage is Stage.TESTING else "the session"


def _table() -> dict[tuple[str, Stage], Ends]:
    t: dict[tuple[str, Stage], Ends] = {}
    # The watchdog: a test past its limit names the rank that got least far; after the verdict it bounds rank 0.
    t["watchdog expires", Stage.TESTING] = Ends(NOT_ACCEPTED, (1,), f"{TEST} did not finish within 60 s on rank 0 "
                                                "(node-a); the run stops", TEST_LIMIT_S)
    t["watchdog expires", Stage.WRITING] = Ends(NOT_ACCEPTED, (0,), "rank 0 (node-a) did not get from the verdict to "
                                                "the final barrier within 45 s", REPORT_S)
    t["blocked collective", Stage.TESTING] = Ends(
        NOT_ACCEPTED, (1,), f"{IN_TEST}: rank 1 (node-b) failed it (ValueError: planted on rank 1) and waits for the "
        "others, while rank 0 (node-a) has been blocked for 10 s in all_reduce called at t.py:3", BLOCKED_S)
    t["blocked by a skip", Stage.TESTING] = Ends(
        NOT_ACCEPTED, (1,), f"{IN_TEST}: rank 1 (node-b) skipped it (planted: rank 1 skips alone) and waits for the "
        "others, while rank 0 (node-a) has been blocked for 10 s in all_reduce called at t.py:3", BLOCKED_S)
    t["blocked by a peer gone", Stage.TESTING] = Ends(
        NOT_ACCEPTED, (1,), f"pytest.exit('planted') on rank 1 (node-b) during {IN_TEST}\n  (then rank 0 (node-a) has "
        f"been blocked for 10 s in all_reduce called at t.py:3 during {IN_TEST}, a collective that needs rank 1 "
        "(node-b), which left the run", BLOCKED_S)
    for stage in SESSION:
        w = where(stage)
        t["SIGINT", stage] = Ends(NOT_ACCEPTED, (), f"interrupted by SIGINT on rank 0 (node-a) during {w}",
                                  SIGINT_GRACE_S)
        t["SIGTERM to the job", stage] = Ends(NOT_ACCEPTED, (), f"stopped by SIGTERM on rank 0 (node-a) during {w} "
                                              "(sent from outside the run")
        # The signal reached rank 1 first: it is named, not rank 0, which torchrun stopped after rank 1 had gone.
        t["SIGTERM to rank 1", stage] = Ends(NOT_ACCEPTED, (), f"stopped by SIGTERM on rank 1 (node-b) during {w} "
                                             "(sent from outside the run")
    for stage in (Stage.CONFIGURING, *SESSION):
        t["launcher lost", stage] = Ends(NOT_ACCEPTED, (), f"stopped on rank 0 (node-a) during {where(stage)}: its "
                                         "launcher (pid 4242, torchrun) is gone")
    for fault in ("SIGINT", "SIGTERM to the job", "SIGTERM to rank 1", "launcher lost"):
        t[fault, Stage.ENDED] = ENDED_ALREADY
    for stage, (step, deadline) in EXCHANGES.items():
        w = where(stage)
        # Before the identities are exchanged a rank knows no other rank's host, and names none.
        host = None if stage is Stage.CONFIGURING else "node-b"
        one = "rank 1" if host is None else f"rank 1 ({host})"
        t["peer gone", stage] = Ends(NOT_ACCEPTED, (1,), f"{one} ended without a word during {w} (killed, crashed or "
                                     "exited inside a test", SIGNAL_GRACE_S, hosts=(host,))
        t["peer stuck", stage] = Ends(NOT_ACCEPTED, (1,), f"{one} did not reach '{step}' within {deadline:.0f} s of "
                                      "rank 0 (node-a)", deadline, hosts=(host,), stops=True)
        t["peer elsewhere", stage] = Ends(NOT_ACCEPTED, (1,), "pytest.exit('planted') on rank 1 (node-b) during "
                                          f"{IN_TEST}\n  (then ranks are at different steps, so the run cannot go on: "
                                          f"rank 0 (node-a) at '{step}'; {one} at 'session end (left)'",
                                          hosts=(host,))
    for stage in UNWINDING:
        w = where(stage)
        t["pytest.exit", stage] = Ends(NOT_ACCEPTED, (0,), f"pytest.exit('planted') on rank 0 (node-a) during {w}",
                                       LEAVING_S)
        t["internal error", stage] = Ends(NOT_ACCEPTED, (0,), f"internal error on rank 0 (node-a) during {w}: "
                                          "RuntimeError: planted crash", LEAVING_S)
    # A rank that stops making progress is named at once once the liveness thread finds it (its own bounds are
    # SILENT_S and NO_PROGRESS_S, tests/run/test_liveness.py), at every stage its beat runs: from the identities on.
    collective = "collective 7 (gloo:all_reduce) of the workloads' group"
    for stage in SESSION:
        w = where(stage)
        t["peer frozen", stage] = Ends(NOT_ACCEPTED, (1,), f"rank 1 (node-b) stopped making progress during {w}: no "
                                       "sign of life for 15 s (its process is stopped (SIGSTOP)), while rank 0 "
                                       f"(node-a) waited 17 s in {collective}", stops=True)
        t["frozen itself", stage] = Ends(NOT_ACCEPTED, (0,), f"rank 0 (node-a) was frozen for 20 s during {w} "
                                         "(stopped by SIGSTOP, or its process could not run)")
        t["hang reported", stage] = Ends(NOT_ACCEPTED, (1,), "rank 1 (node-b) did not enter collective 7")
    t["every rank stuck", Stage.TESTING] = Ends(
        NOT_ACCEPTED, (0, 1), f"every rank is stuck alike in its own code during {IN_TEST}: none has made progress for "
        "30 s (rank 0 (node-a) at t.py:3 in test_a; rank 1 (node-b) at t.py:3 in test_a)")
    t["deadlock", Stage.TESTING] = Ends(
        NOT_ACCEPTED, (0, 1), "every rank waits in an operation none of them will complete (a deadlock of the group) "
        f"during {IN_TEST}: none has made progress for 30 s")
    t["collective hung", Stage.TESTING] = Ends(
        NOT_ACCEPTED, (0, 1), f"{collective}, entered (rank 0 (node-a), rank 1 (node-b)), completed on none within "
        f"31 s during {IN_TEST}: the collective hangs")
    for stage in SESSION:
        w = where(stage)
        t["launcher stopped", stage] = Ends(NOT_ACCEPTED, (0, 1), "the launcher of rank 0 (node-a), torchrun's agent "
                                            f"of node 0 (pid 4242), has been stopped (SIGSTOP) for 15 s during {w}: a "
                                            "stopped agent watches no rank and ends no job")
        t["store lost", stage] = Ends(NOT_ACCEPTED, (), "the rendezvous store did not answer within 10 s (its check) "
                                      f"for rank 0 (node-a) during {w}: the torchrun agent that serves it is stopped "
                                      "or gone")
    t["peer not entering", Stage.TESTING] = Ends(
        NOT_ACCEPTED, (1,), f"rank 1 (node-b) did not enter {collective}, which rank 0 (node-a) waited in for 30 s "
        f"during {IN_TEST}: stuck in its own code (a call that does not return, or work that does not end); rank 1 "
        "(node-b) at t.py:3 in test_a")
    # A write that fails ends the run at once; results.json keeps its last good state ("running"), or never was.
    cannot = "could not write {results} on rank 0 (node-a): [Errno 28] No space left on device; the run stops"
    for stage in (Stage.CONFIGURING, Stage.STARTING):
        t["failed write", stage] = Ends(NOT_ACCEPTED, (), cannot, verdict=None)
    for stage in (Stage.COLLECTING, Stage.TESTING):
        t["failed write", stage] = Ends(NOT_ACCEPTED, (), cannot, verdict="running")
    for stage in (Stage.CONCLUDING, Stage.WRITING, Stage.FINAL_BARRIER):  # the accept, written after the barrier
        t["failed write", stage] = Ends(NOT_ACCEPTED, (), cannot.replace("the run stops", "it does not say accept"),
                                        verdict="running", final=True)
    return t


TABLE = _table()
STAGES = list(Stage)


@pytest.mark.parametrize("stage", STAGES, ids=[s.name.lower() for s in STAGES])
@pytest.mark.parametrize("fault", list(FAULTS))
def test_every_stage_and_fault(tmp_path: Path, fault: str, stage: Stage) -> None:
    h = Harness(tmp_path)
    want = TABLE.get((fault, stage), ACCEPTED)
    try:
        status, code = h.drive(stage, FAULTS[fault]), None
    except Exited as exc:
        status, code = None, exc.code
    ending = h.run.final_ending() if want.final else h.run.ending
    res = h.results()
    assert (code, status) == (want.exit, want.status), (ending, res and res["error"])
    assert (res or {}).get("verdict") == want.verdict, res
    if want.cause is None:
        assert ending is None, ending
        return
    assert ending is not None and ending.cause.startswith(want.cause.format(results=tmp_path / "results.json")), \
        ending
    hosts = want.hosts if want.hosts is not None else tuple(("node-a", "node-b")[r] for r in want.culprits)
    assert ending.culprits == want.culprits and ending.hosts == hosts, ending
    if h.bound is not None:
        bound = h.bound
    elif ending.unwinds:  # the rank goes to the session's end, and waits LEAVING_S there for the others
        [(step, at)] = [(s, t) for s, t in h.exchange.steps if s.phase == "session end"]
        bound = (step.deadline or 0.0) - at
    else:
        bound = round(h.clock() - (h.fault_clock or h.clock()), 6)
    assert bound == pytest.approx(want.bound), bound
    assert h.stopped == ([os.getpid()] if want.stops else []), h.stopped  # rank 1 of the fake job is this process
    if res is not None and res["verdict"] == "reject":  # what rank 0 wrote is the ending it recorded
        assert res["error"] == ending.cause and res["error_ranks"] == list(ending.culprits), res
        if ending.test is not None and (ending.interrupted or not ending.unwinds):  # else pytest's report says
            [test] = res["tests"]
            assert test["outcome"] == ("interrupted" if ending.interrupted else "failed"), test


def test_a_freeze_fails_the_test_phase_it_spans_saying_when_how_long_and_where(tmp_path: Path) -> None:
    """Rank 0 was frozen (its beat FREEZE_S + 1 late) during the test's call: that phase fails on rank 0, its message
    saying so; the run goes on to its end and is not accepted."""
    h = Harness(tmp_path)

    def freeze_in_the_call(step: Step) -> None:  # at the setup's exchange: it ends during the call (a second later)
        h.run.liveness.freeze = {"rank": 0, "from": 1795900000.0, "seconds": FREEZE_S + 1, "test": TEST,
                                 "phase": "call", "until": h.clock() + 1.5}
    h.exchange.at["setup"] = freeze_in_the_call
    with pytest.raises(Exited):
        h.drive()
    res = h.results()
    assert res is not None and res["verdict"] == "reject", res
    [test] = res["tests"]
    # (the fake's rank 1 sends what rank 0 sends: the phase failed on both)
    assert test["outcome"] == "failed" and 0 in test["failed_ranks"], test
    assert test["message"].startswith("[call] failed on "), test["message"]  # not setup, not teardown
    assert f"rank 0 (node-a) was frozen for 6 s from 21:06:40 UTC, during {TEST} [call] (its beat could not run: " \
        "stopped by SIGSTOP, or its process could not run): a measurement that spans it does not count" \
        in test["message"], test["message"]


def test_only_ranks_beside_it_are_stopped(tmp_path: Path) -> None:
    """A rank stops stuck ranks of its own host and launcher only: another node's are its own launcher's."""
    h = Harness(tmp_path)
    assert h.run.peers.siblings((1,)) == []  # rank 1 of the fake job is on another node
    h.peer_beside()
    assert h.run.peers.siblings((0, 1)) == [os.getpid()]  # never itself


@pytest.mark.parametrize(("pytest_status", "status"), [
    (pytest.ExitCode.OK, Exit.ACCEPT), (pytest.ExitCode.TESTS_FAILED, Exit.NOT_ACCEPTED),
    (pytest.ExitCode.INTERRUPTED, Exit.NOT_ACCEPTED), (pytest.ExitCode.INTERNAL_ERROR, Exit.NOT_ACCEPTED),
    (pytest.ExitCode.USAGE_ERROR, Exit.USAGE), (pytest.ExitCode.NO_TESTS_COLLECTED, Exit.NOT_ACCEPTED),
])
def test_pytest_status_as_the_table_says_it(pytest_status: int, status: Exit) -> None:
    assert exit_status(pytest_status) == status


def test_every_rank_leaves_with_a_status_of_the_table() -> None:
    """The statuses of the run's endings and of its session's end are the table's, never 3 (pytest's internal
    error) or a signal's 128+N."""
    assert {ends.exit for ends in TABLE.values()} | {int(exit_status(s)) for s in pytest.ExitCode} <= \
        {None, *map(int, Exit)}


@pytest.mark.parametrize(("field", "what"), [
    (0, "the tests"), (2, "the profile"), (3, "the thresholds"), (4, "the level"), (5, "the clustergate version"),
    (6, "the suite's files"),
])
def test_ranks_that_disagree_about_what_to_run_are_named(tmp_path: Path, field: int, what: str) -> None:
    """Every rank's summary of what it runs is compared at collection: a difference in any field is one error
    naming the ranks that differ and what differs (ranks on another checkout, thresholds file, --profile, --level)."""
    h = Harness(tmp_path)
    h.run.meet({})
    h.run.start()

    def other(summary: list) -> list:
        summary[field] = summary[field] + 1 if isinstance(summary[field], int) else f"other-{summary[field]}"
        return summary
    h.exchange.peer_sends["collection"] = other
    said = h.run.collected([TEST])
    assert said is not None and said.startswith(f"ranks disagree about what to run ({what}): ranks 1 differ from "
                                                "rank 0; refusing to start"), said
    assert "  rank 1 (node-b): clustergate " in said and h.run.record.extra["error_ranks"] == [1]


def test_a_plugin_on_another_rank_is_recorded_and_makes_the_run_partial(tmp_path: Path) -> None:
    """One node's PYTEST_ADDOPTS is the run's as much as rank 0's: a plugin that is not the suite's, loaded on rank 1
    alone, is in the record beside rank 0's own (once), and the record is not attested."""
    h = Harness(tmp_path)
    h.run.meet({})
    h.run.start()
    evil = {"name": "skipper", "version": None, "file": "/site/skipper.py", "suite": False}

    def with_plugin(summary: list) -> list:
        summary[7] = [evil, evil]
        return summary
    h.exchange.peer_sends["collection"] = with_plugin
    h.run.attest([{"name": "clustergate", "version": "0.1.0", "file": "/x/clustergate/__init__.py", "suite": True}])
    assert h.run.collected([TEST]) is None  # not a disagreement about what to run
    section = h.run.record.extra["attestation"]
    assert [p["name"] for p in section["plugins"]] == ["clustergate", "skipper"]
    assert any("1 plugins that are not the suite's were loaded: skipper (/site/skipper.py)" in said
               for said in attestation.problems({"attestation": section}))


# ---- before the Run exists: every rank comes to the start through the rendezvous store ------------------------
def _launch(rank: int) -> Launch:
    return Launch(rank=rank, world_size=2, local_rank=rank, local_world_size=2, node_rank=0)


def test_a_problem_one_rank_has_at_the_start_stops_every_rank_with_its_words() -> None:
    """Rank 1 cannot take part (its device, say): rank 0 learns it at the start, at once, in rank 1's words, rather
    than wait STARTUP_S for it and call it stuck."""
    store = dist.HashStore()
    store.set("clustergate/start/1", json.dumps({"host": "node-a", "node": 0,
                                                 "problem": "LOCAL_RANK=1 but only 1 CUDA devices are visible"}))
    with pytest.raises(StartupRefused, match=r"^LOCAL_RANK=1 but only 1 CUDA devices are visible \(on rank 1 "
                                             r"\(node-a\)\)$"):
        meet_at_start(store, _launch(0), "node-a", wait_s=STARTUP_S)


def test_a_rank_that_never_comes_to_the_start_is_named_with_its_nodes_host() -> None:
    store = dist.HashStore()
    with pytest.raises(StartupLost, match=r"^rank 1 \(node-a\) did not reach the start of the run within 0 s of "
                                          r"rank 0 \(node-a\): stuck before the process groups form") as lost:
        meet_at_start(store, _launch(0), "node-a", wait_s=0.2)
    assert lost.value.missing == [1]
