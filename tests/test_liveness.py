"""A rank that stops making progress, as the liveness thread sees it (clustergate.run.liveness), without torchrun.

The judge is a pure function of every rank's beat: each rule is a row here, with the bound it waits (SILENT_S,
BLOCKED_S, NO_PROGRESS_S) and the wait just short of it. The thread's beat is driven by hand on a fake clock, two
ranks sharing one in-memory store; the flight recorder is read from a real one-rank gloo group; the keeper is a
real process watching a real one. The real hangs, planted under torchrun, are tests/test_hang_endings.py's.
"""

from __future__ import annotations

import json
import os
import signal
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

from clustergate import manifest
from clustergate.run import interrupts
from clustergate.run.flight import Group, Recorder
from clustergate.run.limits import BEAT_S, BLOCKED_S, NO_PROGRESS_S, SILENT_S
from clustergate.run.liveness import Finding, Liveness, Position, Wait, judge, stack
from workloads import common

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
                                      "op": "gloo:all_reduce", "joined": [0], "missing": [1]}
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
    recorder = Recorder()
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
