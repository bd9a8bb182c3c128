"""A run of rank 0 in a 2-rank job, in this process, without torchrun: fake clock, exchange, watchdog, signals
and launcher, an exit that raises, and the real rendezvous-store records (an in-memory store) through which
rank 1 says what it did. ``Harness.drive`` takes the run through its stages and hands it a fault where asked.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import torch
import torch.distributed as dist
from complete_runs import attested

from clustergate.criteria.thresholds import Thresholds, load, shipped_thresholds
from clustergate.record.outcomes import PhaseOutcome
from clustergate.record.results import write_json
from clustergate.run.lifecycle import Run, Stage
from clustergate.run.options import Options
from clustergate.run.outside import Outside
from clustergate.run.ranks.control import Step
from clustergate.run.ranks.peers import Peers
from clustergate.run.ranks.world import World
from clustergate.trust import manifest
from clustergate.trust.identity import RankIdentity

TEST = "t.py::test_a"
HOSTS = ("node-a", "node-b")
TEST_LIMIT_S = 60.0
SUITE = manifest.Manifest("planted", (manifest.SuiteTest(f"planted/{TEST}", "node"),), Path("planted"), "planted")
"""The one test the harness runs is the whole suite: a clean run of it is complete, so its verdict is the run's own
(the run holds its verdict to the shipped manifest otherwise: ``clustergate.trust.completeness``)."""


class Exited(BaseException):
    """The process would end here with ``code``."""

    def __init__(self, code: int) -> None:
        super().__init__(code)
        self.code = code


class Parked(BaseException):
    """A second thread wanted to end the run while another was ending it."""


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


class FakeWatchdog:
    """Armed and disarmed as the real one; ``expire`` is the moment its deadline passes."""

    def __init__(self, clock: Clock, on_expiry: Callable[[str, float], None], on_poll: Callable[[], None]) -> None:
        self.clock, self.on_expiry, self.on_poll = clock, on_expiry, on_poll
        self.armed: tuple[str, float, Callable[[str, float], None]] | None = None
        self.deadline: float | None = None

    def arm(self, label: str, seconds: float, on_expiry: Callable[[str, float], None] | None = None) -> None:
        self.armed = (label, seconds, on_expiry or self.on_expiry)
        self.deadline = self.clock() + seconds

    def disarm(self) -> None:
        self.armed = self.deadline = None


class FakeSignals:
    handles_sigterm = True

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self.on_signal = on_signal

    def close(self) -> None:
        pass


@dataclass
class FakeLauncher:
    pid: int = 4242
    is_gone: bool = False

    def gone(self, settle: bool = True) -> bool:
        return self.is_gone

    def follow(self, signum: int) -> bool:
        return True


class FakeLiveness:
    """The liveness thread as the run sees it: no thread; a finding is handed to the run by the test (``on_finding``),
    the evidence is what ``evidence`` returns, and what the run publishes is kept (``published``)."""

    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.published: dict[str, Any] | None = None
        self.stopped_beside: dict[int, int] | None = None
        self.freeze: dict[str, Any] | None = None
        """A freeze of this rank, which ended at its "until" (the run's clock): found by a test phase that began before
        it ended (``frozen_since``)."""

    def frozen_since(self, since: float) -> dict[str, Any] | None:
        return self.freeze if self.freeze is not None and self.freeze["until"] >= since else None

    def evidence(self, finding: Any, world_size: int, beside: dict[int, int]) -> dict[str, Any]:
        self.stopped_beside = beside
        return {"kind": finding.kind, "culprits": list(finding.culprits), "found_by": finding.found_by,
                "ranks": [{"rank": r, "host": HOSTS[0] if r in beside else HOSTS[r],
                           "process_state": "T" if r in finding.culprits else "S", "main": "t.py:3 in test_a"}
                          for r in range(world_size)]}

    def describe(self, finding: Any, where: str) -> str:
        return f"collective {finding.seq} (gloo:all_reduce) of the workloads' group"

    def publish(self, report: dict[str, Any]) -> None:
        self.published = report

    def report(self) -> dict[str, Any] | None:
        return self.published

    def summary(self, world_size: int) -> dict[str, Any]:
        return {"longest_wait_s": 0.0, "bound_s": 30.0}


@dataclass
class FakeExchange:
    """The other rank at every control exchange: it arrives and agrees, unless ``at[phase]`` says what happens
    when this rank gets to the step of that phase (``Step.phase``: "identities", "collection", "call",
    "session end", "final barrier")."""

    clock: Clock
    size: int = 2
    at: dict[str, Callable[[Step], None]] = field(default_factory=dict)
    steps: list[tuple[Step, float]] = field(default_factory=list)
    failing: Callable[[Step], BaseException] | None = None
    """What the next exchange raises (a peer gone, late, elsewhere), from the step it is at."""
    peer_sends: dict[str, Callable[[Any], Any]] = field(default_factory=dict)
    """What rank 1 sends at the all_gather of a phase, made from what rank 0 sends (default: the same)."""

    def _arrive(self, step: Step) -> None:
        self.steps.append((step, self.clock()))
        action = self.at.pop(step.phase, None)
        if action is not None:
            action(step)
        if self.failing is not None:
            failing, self.failing = self.failing, None
            raise failing(step)

    def all_gather(self, world: World, obj: Any, step: Step, check: Any = None) -> list[Any]:
        self._arrive(step)
        out = [dict(obj, rank=r, host=HOSTS[r]) if isinstance(obj, dict) and "host" in obj else obj
               for r in range(self.size)]
        if step.phase in self.peer_sends:
            out[1] = self.peer_sends[step.phase](json.loads(json.dumps(obj)))
        return [check(json.loads(json.dumps(o))) if check else o for o in out]

    def max_int(self, world: World, value: int, step: Step) -> int:
        self._arrive(step)
        return value

    def gather_to_leader(self, world: World, obj: Any, step: Step, check: Any = None) -> list[Any]:
        self._arrive(step)
        return [check(dict(obj, rank=r, host=HOSTS[r])) for r in range(self.size)]

    def broadcast_from_leader(self, world: World, obj: Any, step: Step, check: Any = None) -> Any:
        self._arrive(step)
        return check(obj) if check else obj


@functools.cache
def _thresholds() -> Thresholds:
    return load(shipped_thresholds())


def world_of(rank: int) -> World:
    return World(rank=rank, world_size=2, local_rank=rank, local_world_size=1, node_rank=rank, host=HOSTS[rank],
                 device=torch.device("cpu"), backend="gloo", control=None)


class Harness:
    """Rank 0's run, the fakes it sees, and rank 1 as the store knows it (``peer``)."""

    def __init__(self, report_dir: Path) -> None:
        self.clock = Clock()
        self.store = dist.HashStore()
        self.peer = Peers(world_of(1), store=self.store)
        self.peer.hosts = list(HOSTS)
        self.exchange = FakeExchange(self.clock)
        self.launcher = FakeLauncher()
        self.said: list[str] = []
        self.stopped: list[int] = []
        """The process ids the run stopped (stuck ranks beside it)."""
        self.timers: list[tuple[float, Callable[[], None]]] = []
        self.in_collective: str | None = None
        self.write_fails = False
        self.before_write: Callable[[], None] | None = None
        self.bound: float | None = None
        """The deadline a fault's detector used, where the fault says it (seconds)."""
        self.pytest_status = 0
        """The status pytest's session ends with (a fault that makes pytest unwind sets it)."""
        self.fault_clock: float | None = None
        """When the fault was handed to the run (the fake clock)."""
        self.report_dir = report_dir
        thresholds = _thresholds()
        options = Options(thresholds=str(shipped_thresholds()), profile="cpu", report_dir=str(report_dir),
                          level="quick", shared_dir=None, test_timeout_s=TEST_LIMIT_S, collective_timeout_s=30.0)
        outside = Outside(
            peers=Peers(world_of(0), store=self.store), exchange=self.exchange, clock=self.clock,
            sleep=self.clock.sleep, write=self._write, exit=self._exit, park=self._park, say=self.said.append,
            timer=lambda seconds, action: self.timers.append((seconds, action)), dump_stacks=lambda: None,
            stop=self.stopped.extend,
            launcher=self.launcher, collective_in_main_thread=lambda: self.in_collective,
            watchdog=lambda on_expiry, on_poll: FakeWatchdog(self.clock, on_expiry, on_poll), signals=FakeSignals,
            liveness=FakeLiveness, keeper=lambda: None)
        identity = RankIdentity(rank=0, local_rank=0, node_rank=0, host=HOSTS[0], gpu=None)
        self.run = Run(world_of(0), thresholds.profile("cpu"), options, report_dir, identity=identity,
                       outside=outside)

    @staticmethod
    def _exit(code: int) -> NoReturn:
        raise Exited(code)

    @staticmethod
    def _park() -> NoReturn:
        raise Parked()

    def _write(self, path: Path, data: dict[str, Any]) -> None:
        if self.before_write is not None:
            action, self.before_write = self.before_write, None
            action()
        if self.write_fails:
            raise OSError(28, "No space left on device")
        write_json(path, data)

    @property
    def watchdog(self) -> FakeWatchdog:
        return self.run.watchdog

    def results(self) -> dict[str, Any] | None:
        path = self.report_dir / "results.json"
        return json.loads(path.read_text()) if path.exists() else None

    def peer_leaves(self, why: str, kind: str, culprits: list[int], *, ago_s: float = 0.0,
                    interrupted: bool = False) -> None:
        """Rank 1 says in the store why it left, ``ago_s`` seconds ago."""
        self.store.set("clustergate/left/1", json.dumps({"rank": 1, "why": why, "kind": kind, "culprits": culprits,
                                                         "interrupted": interrupted, "t": time.time() - ago_s}))

    def peer_beside(self) -> None:
        """Rank 1 runs beside rank 0: the same host, the same launcher (its process record in the store says so)."""
        mine = json.loads(self.store.get("clustergate/process/0"))
        self.store.set("clustergate/process/1", json.dumps(mine))

    def drive(self, fault_at: Stage | None = None, fault: Callable[[Harness], None] | None = None) -> int:
        """Rank 0 through every stage of a one-test run; ``fault`` acts when the run is at ``fault_at`` (inside that
        stage's control exchange where it has one). The status the run ends with, where it ends without ``end``."""
        run = self.run

        def now(stage: Stage) -> None:
            if stage is fault_at and fault is not None:
                self.fault_clock = self.clock()
                fault(self)

        phase_of = {Stage.CONFIGURING: "identities", Stage.COLLECTING: "collection", Stage.TESTING: "call",
                    Stage.CONCLUDING: "session end", Stage.FINAL_BARRIER: "final barrier"}
        if fault_at in phase_of:
            self.exchange.at[phase_of[fault_at]] = lambda step: now(fault_at)  # type: ignore[arg-type]
        run.meet({})
        if fault_at is Stage.STARTING:  # while the session starts: at its first write of results.json
            self.before_write = lambda: now(Stage.STARTING)
        run.start()
        run.select(selected=1, deselected=0, multinode=0, multinode_deselected=0, suite=".")
        run.attest(attested()["plugins"])  # the suite's plugins alone, as the plugin lists them at collection
        assert run.collected([TEST]) is None
        run.start_test(TEST, TEST_LIMIT_S)
        for when in ("setup", "call", "teardown"):
            self.clock.sleep(1.0)
            run.enter(when)
            mine = PhaseOutcome(rank=0, host=HOSTS[0], outcome="passed", message="", stop=self.clock())
            run.merge_phase(TEST, when, mine, (), 0.01)
        run.end_test(TEST)
        status = run.decide(self.pytest_status)
        if fault_at is Stage.WRITING:
            now(Stage.WRITING)
        status = run.final_barrier([])
        if fault_at is Stage.ENDED:
            now(Stage.ENDED)
        if run.poisoned or run.exiting or status != 0:
            run.end(run.final_ending())
        return status
