"""A rank that stops making progress, as the liveness thread sees it (clustergate.run.hang.liveness), without torchrun.

The judge is a pure function of every rank's beat: each rule is a row here, with the bound it waits (SILENT_S,
BLOCKED_S, NO_PROGRESS_S) and the wait just short of it. The thread's beat is driven by hand on a fake clock, two
ranks sharing one in-memory store; the flight recorder is read from a real one-rank gloo group; the keeper is a
real process watching a real one. The real hangs, planted under torchrun, are tests/run/test_hang_endings.py's.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
from run_fakes import HOSTS, SUITE, Clock, Exited, Harness
from waited_out_runs import alive

from clustergate.criteria.thresholds import load, shipped_thresholds
from clustergate.run import interrupts
from clustergate.run.hang.flight import FlightRecorder, Group
from clustergate.run.hang.hang_judge import Finding, Position, Wait, judge, judge_group
from clustergate.run.hang.liveness import Liveness
from clustergate.run.hang.main_thread import Main, stack
from clustergate.run.interrupts import listens_on
from clustergate.run.limits import (
    AGENT_STOPPED_S,
    BEAT_S,
    BLOCKED_S,
    COLLECTIVE_SLACK,
    DEFAULT_BANDWIDTH_GBPS,
    FREEZE_S,
    NO_PROGRESS_S,
    SILENT_S,
    STILL_S,
    slowest_bandwidth_gbps,
    waiting_bound_s,
)
from clustergate.run.ranks.peers import RendezvousStore, StoreLost
from clustergate.trust import manifest
from workloads import common

from torchrun_job import free_port

CONTROL, WORK = "1", "0"
START = Clock()()
"""The fake clock's reading when a test starts."""
TESTING = Position("testing", "t.py::test_a", "call")


def beat(stage: str = "testing", phase: str = "call", groups: dict[str, list[int]] | None = None,
         wait: list[Any] | None = None, n: int = 1) -> dict[str, Any]:
    return {"n": n, "stage": stage, "test": "t.py::test_a", "phase": phase, "groups": groups or {}, "wait": wait,
            "main": "t.py:3 in test_a", "host": "node-a", "pid": 1}


def judged(wait: Wait, peer: dict[str, Any], *, silent_s: float = 0.0, mine: dict[str, list[int]] | None = None,
           position: Position = TESTING) -> Finding | None:
    """Rank 0 waits in ``wait``; rank 1's beat is ``peer``, unchanged for ``silent_s``."""
    return judge(0, wait, {1: peer}, {1: silent_s}, members=(0, 1), position=position, control=CONTROL,
                 mine=mine or {WORK: [7, -1, 6], CONTROL: [20, -1, 20]})


# ---- the judge's rules ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("silent_s", "kind"), [(SILENT_S, "silent"), (SILENT_S - 1, None)])
def test_a_peer_whose_beat_stopped_is_silent(silent_s: float, kind: str | None) -> None:
    """Rank 1's beat has not changed for SILENT_S while rank 0 waits in collective 7: frozen, at any stage."""
    peer = beat(groups={WORK: [6, -1, 6]}, wait=None)
    found = judged(Wait(WORK, 7, silent_s + 2), peer, silent_s=silent_s, position=Position("concluding"))
    assert (found and found.kind) == kind
    if found:
        assert found.culprits == (1,) and found.joined == (0,) and found.silent_s == silent_s


@pytest.mark.parametrize(("waited", "kind"), [(NO_PROGRESS_S, "not entered"), (NO_PROGRESS_S - 1, None)])
def test_a_live_peer_that_never_enters_is_named_after_no_progress_s(waited: float, kind: str | None) -> None:
    found = judged(Wait(WORK, 7, waited), beat(groups={WORK: [6, -1, 6]}))
    assert (found and found.kind) == kind
    if found:
        assert found.culprits == (1,) and (found.group, found.seq, found.joined) == (WORK, 7, (0,))


@pytest.mark.parametrize(("left_s", "kind"), [(5.0, None), (0.0, "not entered")])
def test_a_peer_working_alone_is_named_only_past_its_workloads_bound(left_s: float, kind: str | None) -> None:
    """A rank that says it works alone (workloads.common.working_alone: a node's leader writing the shared
    directory, a rank compiling) keeps its peers waiting without being named, until its bound has run out."""
    peer = beat(groups={WORK: [6, -1, 6]})
    peer["alone"] = ["writing 4096 MiB to the shared directory", left_s]
    found = judged(Wait(WORK, 7, NO_PROGRESS_S * 3), peer)
    assert (found and found.kind) == kind


def test_working_alone_says_what_and_the_time_left() -> None:
    assert common.alone_now() is None
    with common.working_alone("compiling", 60.0):
        with common.working_alone("writing", 5.0):
            what, left = common.alone_now()  # type: ignore[misc]
            assert what == "writing" and 4.0 < left <= 5.0
        assert common.alone_now()[0] == "compiling"  # type: ignore[index]
    assert common.alone_now() is None


def test_a_peer_that_waits_itself_is_not_the_one_stuck() -> None:
    """Rank 1 waits in a collective of a group rank 0 is not in (for a third rank): not rank 0's culprit."""
    assert judged(Wait(WORK, 7, NO_PROGRESS_S * 2), beat(groups={WORK: [6, -1, 6], "5": [3, -1, 2]},
                                                           wait=["5", 3, 40.0])) is None


def test_only_a_silent_peer_is_named_outside_a_test() -> None:
    """Between the verdict and the final barrier (rank 0 writing its report), a peer behind is bounded elsewhere."""
    assert judged(Wait(CONTROL, 21, NO_PROGRESS_S * 2), beat(stage="concluding", groups={CONTROL: [20, -1, 20]}),
                  position=Position("concluding")) is None


@pytest.mark.parametrize(("waited", "phase", "kind"), [(BLOCKED_S, "call", "skipped"), (BLOCKED_S - 1, "call", None),
                                                        (BLOCKED_S, "teardown", None)])
def test_a_peer_at_the_exchange_of_this_phase_skipped_the_collective(waited: float, phase: str,
                                                                      kind: str | None) -> None:
    """Rank 1 waits at the exchange after this phase, never having entered collective 7: it left the phase without
    it. (At another phase's exchange it is merely behind.)"""
    peer = beat(phase=phase, groups={WORK: [6, -1, 6], CONTROL: [21, -1, 20]}, wait=[CONTROL, 21, waited])
    found = judged(Wait(WORK, 7, waited), peer)
    assert (found and found.kind) == kind
    if found:
        assert found.culprits == (1,)


def test_the_rank_at_the_exchange_names_itself_when_it_skipped() -> None:
    """The mirror: rank 0 waits at the exchange, rank 1 of the same phase waits in collective 7, which rank 0 never
    entered: rank 0 left the phase without it."""
    peer = beat(groups={WORK: [7, -1, 6], CONTROL: [20, -1, 20]}, wait=[WORK, 7, 12.0, "gloo:all_reduce"])
    found = judged(Wait(CONTROL, 21, BLOCKED_S), peer, mine={WORK: [6, -1, 6], CONTROL: [21, -1, 20]})
    assert found == Finding("skipped", (0,), 0, WORK, 7, 12.0, (1,), op="gloo:all_reduce")


def test_a_peer_whose_gpu_never_started_the_collective_is_named() -> None:
    """NCCL with start events: rank 0's GPU started collective 7 and waits in it; rank 1 entered it, but its GPU has
    not started it (busy with a kernel that spins)."""
    peer = beat(groups={WORK: [7, 6, 6]})
    found = judged(Wait(WORK, 7, NO_PROGRESS_S), peer, mine={WORK: [7, 7, 6]})
    assert found is not None and (found.kind, found.culprits, found.joined) == ("not started", (1,), (0,))


@pytest.mark.parametrize(("group", "waiting"), [
    (Group("0", (0, 1), "gloo", entered=7, done=6), 7),
    (Group("0", (0, 1), "gloo", entered=7, done=7), None),
    (Group("0", (0, 1), "nccl", entered=7, started=7, done=6), 7),
    (Group("0", (0, 1), "nccl", entered=8, started=6, done=6), None),  # queued behind this rank's own work
    (Group("0", (0, 1), "gloo", entered=7, done=None), None),  # not known: not waiting
])
def test_a_rank_waits_in_the_oldest_collective_it_entered_and_not_completed(group: Group, waiting: int | None) -> None:
    assert group.waiting == waiting


# ---- the thread: beats through a store, the judge, the evidence, the report ----------------------------------------
class FakeRecorder:
    """A rank's collectives; ``collective``: whether its entries say the open one is a collective (False: only
    point-to-point operations are open)."""

    source = "fake recorder"

    def __init__(self, groups: list[Group], collective: bool = True) -> None:
        self.now, self.collective = groups, collective

    def groups(self) -> list[Group]:
        return self.now

    def describe(self, name: str, seq: int) -> dict[str, Any] | None:
        return {"seq": seq, "op": "gloo:all_reduce"}

    def open_collective(self, name: str, done: int, entered: int) -> dict[str, Any] | None:
        return self.describe(name, done + 1) if self.collective else None


def two_ranks(found: list[Finding], reports: list[dict[str, Any]]) -> tuple[Liveness, Liveness, Clock]:
    """Rank 0 waits in collective 7 of the workloads' group; rank 1 never entered it. One store, one clock."""
    store, clock = dist.HashStore(), Clock()
    ranks = []
    for rank, entered in ((0, 7), (1, 6)):
        groups = [Group(WORK, (0, 1), "gloo", entered, None, 6)]
        ranks.append(Liveness(rank=rank, host=HOSTS[0], store=store, position=lambda: TESTING,
                              on_finding=found.append, on_report=reports.append, control=CONTROL, default=WORK,
                              recorder=FakeRecorder(groups), clock=clock, sleep=clock.sleep))  # type: ignore[arg-type]
    return ranks[0], ranks[1], clock


def test_a_stopped_peer_is_found_silent_after_silent_s_of_unchanged_beats() -> None:
    found: list[Finding] = []
    rank0, rank1, clock = two_ranks(found, [])
    rank1.beat()  # its last beat: then it is stopped
    rank0.beat()  # rank 0 enters its wait
    while not found and clock() < START + 2 * SILENT_S:
        clock.sleep(BEAT_S)
        rank0.beat()
    [finding] = found
    assert (finding.kind, finding.culprits, finding.group, finding.seq) == ("silent", (1,), WORK, 7)
    # rank 0 first looks a beat into its wait, and names rank 1 SILENT_S later (at its next beat)
    assert SILENT_S <= finding.silent_s <= SILENT_S + BEAT_S and clock() - START <= SILENT_S + 2 * BEAT_S


def test_a_live_peer_that_never_enters_is_found_and_every_rank_ends_on_the_report() -> None:
    found: list[Finding] = []
    reports: list[dict[str, Any]] = []
    rank0, rank1, clock = two_ranks(found, reports)
    while not found and clock() < START + NO_PROGRESS_S + 2 * BEAT_S:
        clock.sleep(BEAT_S)
        rank1.beat()  # alive: its beat goes on
        rank0.beat()
    [finding] = found
    assert (finding.kind, finding.culprits) == ("not entered", (1,))
    assert rank0.describe(finding, "t.py::test_a [call]") == "collective 7 (gloo:all_reduce) of the workloads' group"

    def meanwhile(seconds: float) -> None:  # while rank 0 waits for the stacks, rank 1 beats: and gives its stack
        clock.sleep(seconds)
        rank1.beat()
    rank0.sleep = meanwhile
    evidence = rank0.evidence(finding, 2, {})
    assert evidence["collective"] == {"group": "the workloads' group", "group_name": WORK, "seq": 7,
                                      "op": "gloo:all_reduce", "joined": [0], "missing": [1], "bytes": 0,
                                      "bandwidth_gbps": DEFAULT_BANDWIDTH_GBPS, "bound_s": STILL_S}
    assert [e["rank"] for e in evidence["ranks"]] == [0, 1] and evidence["ranks"][1]["main"]
    assert "test_a_live_peer_that_never_enters" in evidence["ranks"][0]["stack"]  # rank 0's own main thread
    assert evidence["ranks"][1]["stack"]  # rank 1 answered (this process's stack, given by its beat)
    rank0.publish({**evidence, "cause": "rank 1 did not enter", "error_ranks": [1]})
    rank1.beat()
    assert [r["cause"] for r in reports] == ["rank 1 did not enter"]
    assert rank0.report()["error_ranks"] == [1]


def test_a_group_open_only_through_point_to_point_operations_is_no_wait() -> None:
    """The recorder's status counts sends and receives, and may never see a batched one complete: a group whose
    entries hold no open collective waits in nothing, however long its status says so."""
    rank0, _, clock = two_ranks([], [])
    rank0.recorder.collective = False  # type: ignore[attr-defined]
    for _ in range(4):
        clock.sleep(BEAT_S)
        rank0.beat()
    assert json.loads(rank0.store.get("clustergate/liveness/0/beat/0"))["wait"] is None and rank0.longest is None


class CountingStore:
    """A store that counts the beats read."""

    def __init__(self) -> None:
        self.store, self.read = dist.HashStore(), 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        self.read += 1
        return self.store.multi_get(keys)


def test_a_rank_of_a_large_group_reads_its_peers_beats_every_few_beats() -> None:
    """130 ranks wait for one: each reads the 129 others' beats every third beat (BEATS_READ_PER_BEAT), not every."""
    store, clock = CountingStore(), Clock()
    members = tuple(range(130))
    for r in members[1:]:
        store.set(f"clustergate/liveness/0/beat/{r}", json.dumps(beat(n=1)))
    rank0 = Liveness(rank=0, host=HOSTS[0], store=store, position=lambda: TESTING, on_finding=lambda f: None,
                     on_report=lambda r: None, control=CONTROL, default=WORK, clock=clock, sleep=clock.sleep,
                     recorder=FakeRecorder([Group(WORK, members, "gloo", 7, None, 6)]))  # type: ignore[arg-type]
    for _ in range(10):
        clock.sleep(BEAT_S)
        rank0.beat()
    assert store.read == 3  # at the 2nd beat of its wait (a beat in), then every third: the 5th and the 8th


def test_a_rank_whose_own_beat_could_not_run_finds_itself_frozen() -> None:
    found: list[Finding] = []
    rank0, _, clock = two_ranks(found, [])
    rank0.beat()
    clock.sleep(SILENT_S + BEAT_S + 1)  # stopped, then continued
    rank0.beat()
    assert [(f.kind, f.culprits) for f in found] == [("frozen", (0,))]


def test_the_longest_wait_of_a_test_is_kept_for_results_json() -> None:
    rank0, rank1, clock = two_ranks([], [])
    for _ in range(3):
        clock.sleep(BEAT_S)
        rank0.beat()
        rank1.beat()
    summary = rank0.summary(2)
    assert summary is not None and summary["longest_wait_s"] == 2 * BEAT_S and summary["rank"] == 0
    assert (summary["test"], summary["phase"], summary["collective"], summary["bound_s"], summary["resolution_s"]) == \
        ("t.py::test_a", "call", 7, NO_PROGRESS_S, BEAT_S)


def test_a_stack_has_the_main_thread_first_without_pytests_machinery() -> None:
    text = stack()
    assert text.startswith("Main thread (most recent call last):")
    assert "test_a_stack_has_the_main_thread_first" in text and "/_pytest/" not in text and "pluggy" not in text


# ---- torch's flight recorder, read back ----------------------------------------------------------------------------
def test_the_flight_recorder_says_what_each_group_entered_and_completed(gloo_world: None) -> None:
    # A group of its own: the recorder keeps what earlier default groups of this process (other tests') recorded
    # under the default group's id; a run makes its groups once.
    pg = dist.new_group(ranks=[0])
    t = torch.ones(4)
    for _ in range(3):
        dist.all_reduce(t, group=pg)
    recorder = FlightRecorder()
    deadline = time.monotonic() + 5
    while True:  # gloo records a completion from its own thread, a moment after the call returned
        [group] = [g for g in recorder.groups() if g.name == pg.group_name]
        if group.done == 3 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert (group.ranks, group.backend, group.entered, group.done, group.waiting) == ((0,), "gloo", 3, 3, None)
    assert recorder.source == "gloo flight recorder"
    assert recorder.describe(group.name, 2)["op"] == "gloo:all_reduce"
    assert recorder.open_collective(group.name, 0, 3) is None  # all three completed


def test_the_flight_recorder_is_on_unless_the_site_says(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCH_NCCL_ENABLE_TIMING", "0")
    monkeypatch.delenv("TORCH_FR_BUFFER_SIZE", raising=False)
    common.flight_recorder()
    assert os.environ["TORCH_NCCL_ENABLE_TIMING"] == "0" and os.environ["TORCH_FR_BUFFER_SIZE"] == "2000"


# ---- the run records the evidence ----------------------------------------------------------------------------------
def test_the_evidence_of_a_hang_is_in_results_json(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest, "shipped", lambda: SUITE)
    h = Harness(tmp_path)
    h.run.meet({})
    h.run.start()
    h.peer_beside()
    with pytest.raises(Exited):
        h.run.on_finding(Finding("silent", (1,), 0, WORK, 7, 17.0, (0,), 15.0))
    res = h.results()
    assert res is not None and res["error_ranks"] == [1]
    assert res["hang"]["kind"] == "silent" and res["hang"]["culprits"] == [1]
    assert h.run.liveness.published["cause"] == res["error"] and h.run.liveness.stopped_beside == {1: os.getpid()}
    assert json.loads(json.dumps(res["hang"])) == res["hang"]


# ---- the launcher's death, read at start and for a signal ----------------------------------------------------------
def test_a_live_launcher_is_read_once_at_start_and_settled_only_for_a_signal() -> None:
    """At start the thread that set the parent-death signal reads its parent once (no wait on every rank's start);
    a signal's watcher, on another thread, reads a live parent for 0.25 s before it says the launcher lives."""
    launcher = interrupts.Launcher()
    began = time.monotonic()
    assert not launcher.gone(settle=False)
    once = time.monotonic() - began
    began = time.monotonic()
    assert not launcher.gone()
    settled = time.monotonic() - began
    assert once < 0.05 and settled >= 0.25, (once, settled)
    launcher.pid = -1  # a parent that is no longer this process's
    assert launcher.gone(settle=False) and launcher.gone()


# ---- a stack from a process none of whose threads can run ----------------------------------------------------------
HOLDS = """
import os, re
from clustergate.run import interrupts
print(os.getpid(), interrupts.register_stack_dump(), flush=True)
def holds_the_interpreter():
    return re.match(r"(a+)+$", "a" * 64 + "b")  # backtracks for ever, the interpreter's lock held
holds_the_interpreter()
"""


def test_the_stacks_of_a_process_whose_threads_cannot_run_come_from_faulthandler() -> None:
    """The interpreter's lock held by a call that never returns, then stopped too: faulthandler writes the stacks
    from C on a signal (the process continued for it), into its own in-memory file, read back through /proc."""
    proc = subprocess.Popen([sys.executable, "-c", HOLDS], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(Path(interrupts.__file__).parents[2])})
    try:
        assert proc.stdout is not None
        pid, fd = map(int, proc.stdout.readline().split())
        time.sleep(0.5)
        text = interrupts.stack_of(pid, fd)
        assert text is not None and "in holds_the_interpreter" in text, text
        os.kill(pid, signal.SIGSTOP)
        time.sleep(0.2)
        again = interrupts.stack_of(pid, fd)
        assert again is not None and "in holds_the_interpreter" in again and again.count("Current thread") == 1
    finally:
        proc.kill()
        proc.wait()


# ---- the keeper ----------------------------------------------------------------------------------------------------
RANK = """
import sys, time
from clustergate.run import interrupts
keeper = interrupts.start_keeper(float(sys.argv[1]), float(sys.argv[2]))
print(keeper.pid, flush=True)
time.sleep(120)
"""


def _rank(stopped_s: float, grace_s: float) -> tuple[subprocess.Popen[str], int]:
    """A process standing for a rank, with its keeper; (the process, the keeper's pid)."""
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(stopped_s), str(grace_s)], stdout=subprocess.PIPE,
                            text=True, env={**os.environ, "PYTHONPATH": str(Path(interrupts.__file__).parents[2])},
                            start_new_session=True)
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def test_a_rank_stopped_too_long_is_continued_and_ended_by_its_keeper() -> None:
    """Stopped for stopped_s, the rank is continued; still there grace_s later (nothing in it ends it: no run), it is
    killed, and the keeper goes with it."""
    proc, keeper = _rank(stopped_s=1.0, grace_s=1.0)
    try:
        os.kill(proc.pid, signal.SIGSTOP)
        start = time.monotonic()
        proc.wait(timeout=20)
        took = time.monotonic() - start
        assert proc.returncode == -signal.SIGKILL and 2.0 <= took < 10.0, took  # 1 s stopped + 1 s grace + polls
        time.sleep(0.5)
        assert not alive(keeper)
    finally:
        for pid in (proc.pid, keeper):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


def test_a_keeper_outlives_a_sigterm_to_its_group_and_goes_with_its_rank() -> None:
    proc, keeper = _rank(stopped_s=30.0, grace_s=5.0)
    try:
        time.sleep(1.0)  # the keeper is up (it ignores the signals once it has started)
        os.kill(keeper, signal.SIGTERM)  # torchrun signals a rank's whole process group
        time.sleep(0.5)
        assert alive(keeper)
        proc.kill()
        proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while alive(keeper) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not alive(keeper)  # the kernel's parent-death signal
    finally:
        for pid in (proc.pid, keeper):
            if alive(pid):
                os.kill(pid, signal.SIGKILL)


# ---- a hang nobody waits for: every rank making no progress (judge_group) --------------------------------------------
def quiet(seconds: float, inside: str = "code", where: str = "t.py:9 in test_a", wait: list[Any] | None = None,
          nbytes: int = 0, groups: dict[str, list[int]] | None = None, test: str = "t.py::test_a") -> dict[str, Any]:
    """A rank's beat saying it has made no progress for ``seconds``, where (its own code, a collective, a control
    exchange)."""
    b = beat(groups=groups or {WORK: [7, -1, 6]}, wait=wait)
    b["still"], b["test"] = [seconds, inside, where, nbytes, "S"], test
    return b


def grouped(beats: dict[int, dict[str, Any]], me: int = 0, silent: dict[int, float] | None = None,
            bound: Any = None) -> Finding | None:
    return judge_group(me, beats, silent or {}, ranks=tuple(sorted(beats)), position=TESTING,
                       **({"bound_s": bound} if bound else {}))


@pytest.mark.parametrize(("still", "kind"), [(STILL_S, "stuck"), (STILL_S - 1, None)])
def test_a_lone_rank_that_makes_no_progress_in_its_own_code_is_stuck(still: float, kind: str | None) -> None:
    found = grouped({0: quiet(still)})
    assert (found and (found.kind, found.culprits, found.found_by, found.waited_s)) == \
        (kind and ("stuck", (0,), 0, STILL_S))


def test_every_rank_stuck_alike_is_named_by_the_lowest_alone() -> None:
    beats = {0: quiet(STILL_S + 3), 1: quiet(STILL_S)}
    found = grouped(beats)
    assert found is not None and (found.kind, found.culprits, found.waited_s) == ("stuck", (0, 1), STILL_S)
    assert grouped(beats, me=1) is None  # rank 1 leaves it to rank 0


@pytest.mark.parametrize("other", [
    quiet(STILL_S, inside="control"),  # at a phase's exchange: the judge of a rank waiting in a collective names it
    quiet(STILL_S - 1),  # not long enough
    quiet(STILL_S, test="t.py::test_b"),  # elsewhere
    {**quiet(STILL_S), "alone": ["compiling", 12.0]},  # working alone within its bound
    {**quiet(STILL_S), "stage": "concluding"},
])
def test_no_group_hang_while_a_rank_is_elsewhere_or_within_a_bound(other: dict[str, Any]) -> None:
    assert grouped({0: quiet(STILL_S * 2), 1: other}) is None


def test_ranks_waiting_for_one_stuck_in_its_own_code_name_it() -> None:
    """Rank 1 is stuck in its own code; rank 0 waits in a point-to-point receive from it (no collective open in
    torch's records): rank 1 is the culprit, rank 0 the one that waits."""
    found = grouped({0: quiet(STILL_S, inside="collective", where="recv called at t.py:4"), 1: quiet(STILL_S)})
    assert found is not None and (found.kind, found.culprits, found.joined) == ("stuck", (1,), (0,))


def test_a_silent_rank_counts_as_one_that_makes_no_progress() -> None:
    found = grouped({0: quiet(STILL_S, inside="collective", where="recv called at t.py:4"), 1: quiet(0.0)},
                    silent={1: SILENT_S})
    assert found is not None and (found.kind, found.culprits) == ("silent", (1,))


def test_every_rank_in_an_operation_none_completes_is_a_deadlock() -> None:
    beats = {r: quiet(STILL_S, inside="collective", where="recv called at t.py:4") for r in (0, 1)}
    found = grouped(beats)
    assert found is not None and (found.kind, found.culprits, found.joined) == ("deadlock", (0, 1), (0, 1))
    # ranks in different collectives of one group are deadlocked too
    beats = {0: quiet(STILL_S, wait=[WORK, 7, 30.0, "gloo:all_reduce"]),
             1: quiet(STILL_S, wait=["5", 3, 30.0, "gloo:broadcast"], groups={WORK: [6, -1, 6], "5": [3, -1, 2]})}
    assert (grouped(beats) or Finding("", (), 0)).kind == "deadlock"


def test_one_collective_every_rank_entered_and_none_completed_is_hung_past_its_bound() -> None:
    """Both ranks entered collective 7 (and, with NCCL's start events, started it) and neither completed it: hung once
    it has lasted its bound, which grows with its bytes at the profile's bandwidth."""
    def both(still: float, nbytes: int) -> dict[int, dict[str, Any]]:
        return {r: quiet(still, wait=[WORK, 7, still, "nccl:broadcast"], nbytes=nbytes, groups={WORK: [7, 7, 6]})
                for r in (0, 1)}
    bound = functools.partial(waiting_bound_s, gbps=35.0)
    assert grouped(both(STILL_S, 1 << 20), bound=bound) is None  # 1 MiB: a moment more than STILL_S
    found = grouped(both(bound(1 << 20), 1 << 20), bound=bound)
    assert found is not None and (found.kind, found.culprits, found.group, found.seq, found.op) == \
        ("hung", (0, 1), WORK, 7, "nccl:broadcast")
    big = 1 << 40  # 1 TiB at 35 GB/s, times COLLECTIVE_SLACK both ways: minutes more
    assert waiting_bound_s(big, 35.0) == pytest.approx(STILL_S + COLLECTIVE_SLACK * 2 * big / 35e9)
    assert grouped(both(STILL_S + 60, big), bound=bound) is None
    assert grouped(both(waiting_bound_s(big, 35.0), big), bound=bound) is not None


def test_the_slowest_collective_bandwidth_of_a_profile_bounds_its_collectives() -> None:
    thresholds = load(shipped_thresholds())
    assert slowest_bandwidth_gbps(thresholds.profile("h100-sxm-80gb")) == 35.0  # its all-to-all floors
    assert slowest_bandwidth_gbps(thresholds.profile("cpu")) == 0.001


class StillMain:
    """The main thread as a beat observes it: unchanged until ``moved`` changes."""

    def __init__(self) -> None:
        self.moved, self.inside = 0, "code"

    def __call__(self) -> Main:
        return Main(self.moved, self.inside, "t.py:9 in test_a", "S")


def test_a_lone_rank_whose_main_thread_does_not_move_is_found_stuck_by_its_own_beat() -> None:
    found: list[Finding] = []
    clock, main = Clock(), StillMain()
    live = Liveness(rank=0, host=HOSTS[0], store=dist.HashStore(), position=lambda: TESTING, on_finding=found.append,
                    on_report=lambda r: None, control=CONTROL, default=WORK, clock=clock, sleep=clock.sleep,
                    recorder=FakeRecorder([Group(WORK, (0,), "gloo", 3, None, 3)]), observe=main)
    live.beat()
    for _ in range(8):  # it moves (a loop that polls wakes on every turn): never stuck
        clock.sleep(BEAT_S * 2)
        main.moved += 1
        live.beat()
    start = clock()
    while not found and clock() < start + STILL_S + 3 * BEAT_S:
        clock.sleep(BEAT_S)
        live.beat()
    [finding] = found
    assert (finding.kind, finding.culprits) == ("stuck", (0,)) and STILL_S <= clock() - start <= STILL_S + BEAT_S


def test_a_late_beat_is_a_freeze_that_the_test_phase_it_spans_fails_on() -> None:
    """A beat FREEZE_S late: the rank was frozen (stopped and continued); the freeze is kept with where it happened,
    and found by a phase that began before it ended, not by one that began after."""
    found: list[Finding] = []
    rank0, _, clock = two_ranks(found, [])
    rank0.beat()
    began = clock()
    clock.sleep(BEAT_S + FREEZE_S + 1)
    rank0.beat()
    assert found == [] and rank0.longest_late == FREEZE_S + 1
    [freeze] = rank0.freezes
    assert (freeze["seconds"], freeze["test"], freeze["phase"]) == (FREEZE_S + 1, "t.py::test_a", "call")
    assert rank0.frozen_since(began) == freeze and rank0.frozen_since(clock() + 1) is None
    summary = rank0.summary(2)
    assert summary is not None and summary["freezes"] == [Liveness.public(freeze)]
    assert summary["longest_late_s"] == FREEZE_S + 1 and summary["freeze_bound_s"] == FREEZE_S


# ---- the agent: its store unanswered, the launcher stopped ----------------------------------------------------------
SERVE = ("import sys, time, torch.distributed as d\n"
         "s = d.TCPStore('127.0.0.1', int(sys.argv[1]), is_master=True, wait_for_workers=False)\n"
         "s.set('a', '1'); print('up', flush=True); time.sleep(120)\n")


def test_a_store_whose_server_stops_answering_is_lost_once_and_fails_at_once_after() -> None:
    """A real TCPStore server (as torchrun's agent serves one) SIGSTOPped: torch's client would wait as long as it is
    stopped; through RendezvousStore the call is given up on after its timeout, the run is told once, and every later
    call fails at once."""
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVE, str(port)], stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None and server.stdout.readline().strip() == "up"
        told: list[str] = []
        store = RendezvousStore(dist.TCPStore("127.0.0.1", port, is_master=False, wait_for_workers=False),
                                where=f"127.0.0.1:{port}", timeout_s=1.0)
        store.on_lost = told.append
        assert store.get("a") == b"1" and store.check(["a"])
        os.kill(server.pid, signal.SIGSTOP)
        start = time.monotonic()
        with pytest.raises(StoreLost):
            store.check(["a"])
        assert 1.0 <= time.monotonic() - start < 5.0  # its own timeout, plus a busy machine's start of a thread
        assert told == ["did not answer within 1 s (its check)"] and store.lost == told[0]
        start = time.monotonic()
        with pytest.raises(StoreLost):
            store.get("a")
        assert time.monotonic() - start < 0.5 and len(told) == 1
    finally:
        os.kill(server.pid, signal.SIGCONT)
        server.kill()
        server.wait()


def test_a_rank_whose_launcher_is_stopped_finds_it_after_agent_stopped_s() -> None:
    found: list[Finding] = []
    launcher = subprocess.Popen(["sleep", "60"])
    try:
        clock = Clock()
        live = Liveness(rank=0, host=HOSTS[0], store=dist.HashStore(), position=lambda: TESTING,
                        on_finding=found.append, on_report=lambda r: None, control=CONTROL, default=WORK, clock=clock,
                        sleep=clock.sleep, recorder=FakeRecorder([]), launcher=launcher.pid, observe=StillMain())
        live.beat()
        os.kill(launcher.pid, signal.SIGSTOP)
        time.sleep(0.2)
        while not found and clock() < START + 2 * AGENT_STOPPED_S:
            clock.sleep(BEAT_S)
            live.beat()
        [finding] = found
        assert finding.kind == "launcher stopped" and AGENT_STOPPED_S <= finding.waited_s <= AGENT_STOPPED_S + BEAT_S
    finally:
        launcher.kill()
        launcher.wait()


def test_a_process_that_listens_on_a_port_is_found_by_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert listens_on(os.getpid(), port) and not listens_on(os.getpid(), free_port())
