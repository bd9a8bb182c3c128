"""Whether every rank still makes progress: a beat per rank through the rendezvous store, and a judge that names
the rank the others wait for, whatever the test's own limit and the collectives' timeout.

Every ``BEAT_S`` a thread of each rank publishes its beat (``clustergate/liveness/ATTEMPT/beat/RANK``): a counter,
where the run is (stage, test, phase), where it is in every process group's collectives
(``clustergate.run.hang.flight``: entered, started, completed), the collective it waits in and for how long, what it
works at alone (``workloads.common.working_alone``) and its main thread's innermost frame. The thread runs while the
main thread is blocked in a collective or waits for a kernel that spins: its beat says so.

A rank that has waited in a collective for ``BEAT_S`` reads every peer's beat and judges (``judge``, pure, in
``clustergate.run.hang.hang_judge``; what its own main thread does is read by ``clustergate.run.hang.main_thread``):

- ``silent``: a peer of that collective whose beat has not changed for ``SILENT_S`` is frozen (SIGSTOP, a process
  none of whose threads can run, a host gone);
- ``skipped``: a peer at the exchange after the same test phase (the control group), that never entered the
  collective this rank waits in, left the phase without it: after ``BLOCKED_S`` it can never complete;
- ``not started``: a peer that entered it but whose GPU has not started it, while this rank's has, for
  ``NO_PROGRESS_S``: busy with earlier device work that does not end (a kernel that spins);
- ``not entered``: a live peer that has not entered it for ``NO_PROGRESS_S``, waits in no collective itself and
  works alone past no bound: stuck in its own code (a syscall that never returns, a long C++ call, a loop).

A rank that finds its own beat thread could not run for ``SILENT_S`` was frozen itself (``frozen``) and says so; one
that could not run for ``FREEZE_S`` records the freeze (``freezes``: when, how long, in which test): the run fails the
test phase it fell in, since a measurement that spans it does not count.

A hang where no rank waits for another that still works has a judge of its own (``judge_group``): each beat says how
long this rank has made no progress (``still``: its main thread's stack, its wake-ups and its groups' collectives all
unchanged), and where it is (its own code, a torch.distributed call, a control exchange). Once every live rank of the
job (a lone rank: itself) has made none in the same test for ``STILL_S`` (a rank waiting in a collective: more, by the
collective's size at the profile's bandwidth), the lowest of them names them:

- ``stuck``: ranks stuck in their own code (a call that does not return, a GPU whose work does not finish) while the
  others, if any, wait for them outside a collective the judge above sees (a point-to-point operation);
- ``hung``: one collective every rank entered (and, where the recorder says so, started on its GPU) and none
  completed: a fabric, NVSwitch or fabric manager fault, or a collective the ranks called with different arguments;
- ``deadlock``: every rank waits in a torch.distributed operation (collective or point-to-point) that none of them
  will complete: each receives from a peer that never sends, or waits in another collective than its peers.

The agent is watched too: a rank whose launcher (torchrun's agent) has been stopped for ``AGENT_STOPPED_S`` says so
(``launcher stopped``); a store call unanswered for ``STORE_CALL_S`` loses the store for the run
(``clustergate.run.ranks.peers.RendezvousStore``), and the run names the node whose agent serves it
(``Peers.store_host``).

The rank that finds a hang asks every rank for its stack (``.../hang``), gathers the evidence (``evidence``: the
collective, which ranks joined it, each rank's state and Python stack) and publishes it with the cause
(``.../hang-report``) before it ends the run: every other rank ends at its next beat on that report, naming the
same culprit, rather than wait for its launcher (another node's launcher never learns).
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clustergate.run.hang.flight import FlightRecorder, Group, default_group_name
from clustergate.run.hang.hang_judge import TESTING, Finding, FindingKind, Position, Still, Wait, judge, judge_group
from clustergate.run.hang.main_thread import Main, main_frame, main_waits, observe_main, stack
from clustergate.run.interrupts import register_stack_dump, stack_of
from clustergate.run.keeper import state as process_state
from clustergate.run.limits import (
    AGENT_STOPPED_S,
    BEAT_S,
    DEFAULT_BANDWIDTH_GBPS,
    EVIDENCE_S,
    FREEZE_S,
    NO_PROGRESS_S,
    SILENT_S,
    STILL_S,
    waiting_bound_s,
)
from clustergate.secrets.redact import outgoing
from workloads.common import alone_now

BEATS_READ_PER_BEAT = 64
"""At most this many peers' beats a waiting rank reads a beat (one round trip): a larger group is read every few
beats, so that the rendezvous store's load grows with the job's size, not with its square (every rank of a group of
512 waiting for one: each reads it every 8 beats, 16 s; the silent rank is named within SILENT_S + 16 s)."""


def _key(kind: str, rank: int | None = None) -> str:
    """The store key of ``kind`` (beat, stack, hang, hang-report), of this attempt of the job: torchrun keeps its
    store across the restarts it makes (--max-restarts), and a new attempt must not read the last one's hang."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"clustergate/liveness/{attempt}/{kind}" + (f"/{rank}" if rank is not None else "")


def _alone() -> list[Any] | None:
    """[what, seconds left of its bound] where the workloads say this rank works alone (workloads.common)."""
    said = alone_now()
    return [said[0], round(said[1], 1)] if said else None


@dataclass
class Liveness:
    """This rank's beat, and its judge while it waits (a thread of its own)."""

    rank: int
    host: str
    store: Any
    """The rendezvous store's client (None: nothing is published or read)."""
    position: Callable[[], Position]
    on_finding: Callable[[Finding], None]
    """Called (from this thread) with a hang this rank found: the run gathers the evidence and ends."""
    on_report: Callable[[dict[str, Any]], None]
    """Called (from this thread) with the report of a hang another rank found: the run ends."""
    control: str | None = None
    """The control group's name (the plugin's exchanges)."""
    default: str | None = None
    """The workloads' group's name (default: the default process group's)."""
    recorder: FlightRecorder = field(default_factory=FlightRecorder)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    interval_s: float = BEAT_S
    world_size: int = 1
    node: int = 0
    """This rank's node (torchrun's GROUP_RANK)."""
    launcher: int | None = None
    """This rank's launcher's (torchrun's agent's) process id; None: not watched."""
    bandwidth_gbps: float = DEFAULT_BANDWIDTH_GBPS
    """The profile's slowest collective bandwidth (``limits.slowest_bandwidth_gbps``): how long a collective every rank
    started may take (``limits.waiting_bound_s``)."""
    observe: Callable[[], Main] = observe_main
    wall: Callable[[], float] = time.time

    def __post_init__(self) -> None:
        self.default = self.default or default_group_name()
        self._count = 0
        self._slept = self.clock()
        """When this thread last went to sleep between beats (a beat due interval_s later that comes later than
        FREEZE_S was frozen)."""
        self._moved: tuple[Any, float] = (None, self.clock())
        """What the main thread's progress looked like, and since when it has looked so."""
        self._still = Still()
        """How long without progress and where: published in the beat (a list in the store's JSON)."""
        self.freezes: list[dict[str, Any]] = []
        """This rank's freezes: when ("from", wall clock), how long ("seconds"), in which test and phase."""
        self.longest_late = 0.0
        """The most a beat of this rank came late (past its interval): how far healthy runs are from FREEZE_S."""
        self._launcher_stopped: float | None = None
        self._next_group = 0.0
        self._since: dict[tuple[str, int], float] = {}
        self._checked: dict[tuple[str, int, int], dict[str, Any] | None] = {}
        """(group, done, entered) -> the collective the recorder's entries say the rank waits in (None: none)."""
        self._seen: dict[int, tuple[int, float]] = {}
        """Each peer's beat counter and when this rank first saw it (how long it has not changed)."""
        self._stack_given = False
        self._asked: float | None = None
        """When this rank first saw another rank's request for stacks (a hang it found)."""
        self._lost = False
        """The store failed: its host (a torchrun agent) is gone; nothing more is published or read."""
        self._groups: list[Group] = []
        self.longest: list[Any] | None = None
        """The longest wait in a collective during a test: [seconds, group, seq, test, phase]."""
        self._next_judge = 0.0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.dump_fd: int | None = None
        """The file this process writes its stacks to on a signal (None: not registered)."""

    # ---- the thread -------------------------------------------------------------------------------------------
    def start(self) -> Liveness:
        """The beat's thread, and this process's stacks written on a signal for a peer beside it that finds it
        silent (``interrupts.register_stack_dump``)."""
        if self.store is not None and self._thread is None:
            self.dump_fd = register_stack_dump()
            self._thread = threading.Thread(target=self._run, name="clustergate-liveness", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.beat()
            except Exception as exc:  # a diagnostic aid: it never breaks the run
                with contextlib.suppress(Exception):
                    sys.stderr.write(f"clustergate: rank {self.rank}: liveness: {type(exc).__name__}: {exc}\n")
            self.sleep(self.interval_s)

    def beat(self) -> None:
        """One beat: publish, answer a hang another rank found, judge the peers this rank waits for, and the whole
        job where no rank waits for another that works; watch this rank's own launcher."""
        now = self.clock()
        late = now - self._slept - self.interval_s  # its own store calls are not counted: measured from its sleep
        try:
            self._beat(now, late)
        finally:
            self._slept = self.clock()

    def _beat(self, now: float, late: float) -> None:
        here = self.position()
        if here.stage == "ended":
            return
        self.longest_late = max(self.longest_late, late)
        if FREEZE_S <= late < SILENT_S:  # where it is now is where it froze: a frozen main thread goes nowhere
            self._frozen(late, here, since=now - late)
        stopped = self._watch_launcher(now)
        if stopped is not None:
            self.on_finding(stopped)
            return
        wait = self._wait(now, here)
        self._progress(now, wait)
        self._count += 1
        self._publish(here, wait)
        if self._answer():
            return
        if late >= SILENT_S:  # this thread could not run: the whole process was frozen
            self.on_finding(Finding(FindingKind.FROZEN, (self.rank,), self.rank, waited_s=late + self.interval_s))
            return
        if wait is not None and wait.seconds >= self.interval_s and now >= self._next_judge:
            members = self._members(wait.group)
            self._next_judge = now + self.interval_s * (math.ceil(len(members) / BEATS_READ_PER_BEAT) - 0.5)
            finding = self._judge(wait, here, members)
            if finding is not None:
                self.on_finding(finding)
                return
        if self._still.seconds >= STILL_S and self._still.inside != "control" and here.stage == TESTING \
                and now >= self._next_group:
            ranks = tuple(range(self.world_size))
            self._next_group = now + self.interval_s * (math.ceil(len(ranks) / BEATS_READ_PER_BEAT) - 0.5)
            finding = self._judge_group(here, ranks)
            if finding is not None:
                self.on_finding(finding)

    # ---- this rank's own progress, its freezes, its launcher ----------------------------------------------------
    def _progress(self, now: float, wait: Wait | None) -> None:
        """How long the main thread has made no progress (``_still``): its stack, its wake-ups and its groups'
        collectives unchanged."""
        main = self.observe()
        moved = (main.moved, tuple((g.name, *g.as_beat()) for g in self._groups))
        if moved != self._moved[0]:
            self._moved = (moved, now)
        self._still = Still(round(now - self._moved[1], 1), main.inside, main.where, wait.nbytes if wait else 0,
                            main.state)

    def _frozen(self, late: float, where: Position, since: float) -> None:
        """A freeze of ``late`` seconds past this thread's interval, from about ``since``, in ``where``."""
        self.freezes.append({"rank": self.rank, "from": round(self.wall() - (self.clock() - since), 1),
                             "seconds": round(late, 1), "test": where.test, "phase": where.phase,
                             "since": since, "until": self.clock()})

    def frozen_since(self, since: float) -> dict[str, Any] | None:
        """The longest freeze of this rank that ended after ``since`` (the clock's reading, as a test phase started),
        counting one under way that this thread has not seen yet (the main thread asks before its beat runs); None
        where there was none, or nothing watches."""
        found = [f for f in self.freezes if f["until"] >= since]
        if self._thread is not None and self._thread.is_alive():
            late = self.clock() - self._slept - self.interval_s
            if late >= FREEZE_S:
                where = self.position()
                found.append({"rank": self.rank, "from": round(self.wall() - late, 1), "seconds": round(late, 1),
                              "test": where.test, "phase": where.phase, "since": self.clock() - late,
                              "until": self.clock()})
        return max(found, key=lambda f: f["seconds"], default=None)

    def _watch_launcher(self, now: float) -> Finding | None:
        """This rank's launcher stopped (SIGSTOP) for AGENT_STOPPED_S: a finding; None while it is not."""
        if self.launcher is None:
            return None
        if process_state(self.launcher) != "T":
            self._launcher_stopped = None
            return None
        since = self._launcher_stopped = self._launcher_stopped or now
        if now - since < AGENT_STOPPED_S:
            return None
        return Finding(FindingKind.LAUNCHER_STOPPED, (), self.rank, waited_s=now - since)

    def _wait(self, now: float, here: Position) -> Wait | None:
        """The collective this rank has waited in longest (since this thread first saw it open), or None. A wait
        that lasts a beat is checked once against the recorder's entries (``FlightRecorder.open_collective``): what it
        waits in, and whether it is a collective at all."""
        self._groups = self.recorder.groups()
        groups = {g.name: g for g in self._groups}
        open_now = {(g.name, g.waiting): g for g in self._groups if g.waiting is not None}
        # Where torch records no completion for a gloo group (a torch without gloo's flight recorder), a main thread
        # inside a call of it waits in its last entered collective: gloo's calls return once it is complete.
        inside = main_waits()
        for g in self._groups:
            if g.done is None and g.backend == "gloo" and g.entered > 0 and \
                    inside == ("control" if g.name == self.control else "collective" if g.name == self.default else ""):
                open_now[(g.name, g.entered)] = g
        self._since = {k: self._since.get(k, now) for k in open_now}
        for (name, seq), since in sorted(self._since.items(), key=lambda kv: kv[1]):
            g, op, nbytes = groups[name], None, 0
            if now - since >= self.interval_s and g.done is not None:
                key = (name, g.done, g.entered)
                if key not in self._checked:
                    self._checked = {k: v for k, v in self._checked.items() if k[0] != name}
                    self._checked[key] = self.recorder.open_collective(name, g.done, g.entered)
                entry = self._checked[key]
                if entry is None:
                    continue  # open in the status only (point-to-point operations): no collective waits
                seq, op, nbytes = entry["seq"], entry["op"], int(entry.get("bytes") or 0)
            wait = Wait(name, int(seq), now - since, op, nbytes)
            if here.stage == TESTING and wait.seconds >= self.interval_s and \
                    (self.longest is None or wait.seconds > self.longest[0]):
                self.longest = [round(wait.seconds, 1), self.label(name), wait.seq, here.test, here.phase]
            return wait
        return None

    def _publish(self, here: Position, wait: Wait | None) -> None:
        beat = {"n": self._count, "pid": os.getpid(), "host": self.host, "stage": here.stage, "test": here.test,
                "phase": here.phase, "main": main_frame(), "dump_fd": self.dump_fd, "alone": _alone(),
                "groups": {g.name: g.as_beat() for g in self._groups if g.entered > 0},
                "wait": [wait.group, wait.seq, round(wait.seconds, 1), wait.op] if wait else None,
                "still": self._still, "longest": self.longest, "late": round(self.longest_late, 2),
                "freezes": [self.public(f) for f in self.freezes]}
        self._set(_key("beat", self.rank), beat)

    def _answer(self) -> bool:
        """A hang another rank found: this rank's stack to it (once), and its report handed to the run. True while
        that rank gathers its evidence (this rank judges no further meanwhile; a rank that asked and never
        reported, gone meanwhile, is ignored after 3 x EVIDENCE_S)."""
        if not self._has(_key("hang")):
            return False
        if not self._stack_given:
            self._stack_given = True
            self._set(_key("stack", self.rank), stack())
        report = self._get(_key("hang-report"))
        if isinstance(report, dict):
            self.on_report(report)
            return True
        self._asked = self.clock() if self._asked is None else self._asked
        return self.clock() - self._asked < 3 * EVIDENCE_S

    def _judge(self, wait: Wait, here: Position, members: tuple[int, ...]) -> Finding | None:
        beats, silent = self._read(members)
        mine = {g.name: g.as_beat() for g in self._groups}
        return judge(self.rank, wait, beats, silent, members=members, mine=mine, position=here,
                     control=self.control)

    def _judge_group(self, here: Position, ranks: tuple[int, ...]) -> Finding | None:
        beats, silent = self._read(ranks)
        return judge_group(self.rank, beats, silent, ranks=ranks, position=here,
                           bound_s=lambda nbytes: waiting_bound_s(nbytes, self.bandwidth_gbps))

    def _read(self, ranks: tuple[int, ...]) -> tuple[dict[int, dict[str, Any]], dict[int, float]]:
        """The beats of ``ranks``, and how long each has not changed."""
        beats = self.beats(ranks)
        now = self.clock()
        silent = {}
        for r, b in beats.items():
            seen = self._seen.get(r)
            if seen is None or seen[0] != b.get("n"):
                self._seen[r] = (b.get("n"), now)  # type: ignore[assignment]
            silent[r] = now - self._seen[r][1]
        return beats, silent

    @staticmethod
    def public(freeze: dict[str, Any]) -> dict[str, Any]:
        """A freeze as results.json says it (without this process's clock readings)."""
        return {k: v for k, v in freeze.items() if k not in ("since", "until")}

    # ---- the store ----------------------------------------------------------------------------------------------
    def beats(self, ranks: tuple[int, ...] | list[int]) -> dict[int, dict[str, Any]]:
        """The latest beat of each of ``ranks`` that has published one."""
        keys = [_key("beat", r) for r in ranks]
        if self._lost:
            return {}
        try:  # one round trip where every rank has beaten (a get of a key not there yet would wait for it)
            raw = self.store.multi_get(keys) if self.store.check(keys) else \
                [self.store.get(k) if self.store.check([k]) else b"null" for k in keys]
        except Exception:
            self._lost = True
            return {}
        out = {}
        for r, value in zip(ranks, raw, strict=True):
            with contextlib.suppress(ValueError, UnicodeDecodeError):
                beat = json.loads(value.decode() if isinstance(value, bytes) else value)
                if isinstance(beat, dict):
                    out[r] = beat
        return out

    def _set(self, key: str, value: Any) -> None:
        if self._lost:
            return
        try:
            self.store.set(key, json.dumps(outgoing(value)))
        except Exception:
            self._lost = True

    def _has(self, key: str) -> bool:
        if self._lost:
            return False
        try:
            return bool(self.store.check([key]))
        except Exception:
            self._lost = True
            return False

    def _get(self, key: str) -> Any:
        if not self._has(key):
            return None
        try:
            return json.loads(self.store.get(key).decode())
        except ValueError:
            return None
        except Exception:
            self._lost = True
            return None

    # ---- a hang this rank found ---------------------------------------------------------------------------------
    def label(self, group: str | None) -> str:
        """A group as a message names it: the control group, the workloads' group, or its name."""
        if group is None:
            return ""
        if group == self.control:
            return "the control group"
        if group == self.default:
            return "the workloads' group"
        return f"group {group}"

    def describe(self, finding: Finding, where: str) -> str:
        """The collective of ``finding`` for a message: 'collective 12 (gloo:all_reduce) of the workloads' group', or
        'the exchange after t.py::test_a [call] (collective 40 of the control group)'."""
        if finding.group is None or finding.seq is None:
            return "a collective"
        if finding.group == self.control:
            return f"the exchange after {where} (collective {finding.seq} of the control group)"
        op = finding.op or (self.recorder.describe(finding.group, finding.seq) or {}).get("op")
        return f"collective {finding.seq}" + (f" ({op})" if op else "") + f" of {self.label(finding.group)}"

    def evidence(self, finding: Finding, world_size: int, beside: dict[int, int]) -> dict[str, Any]:
        """Every live rank's stack and state for ``finding``: asks every rank for its stack, continues the stopped
        culprits beside this rank (``beside``: rank -> pid; SIGCONT, so that a thread of theirs can answer), and
        waits up to EVIDENCE_S for the answers. The evidence of the hang, for results.json."""
        self._set(_key("hang"), {"by": self.rank, "culprits": list(finding.culprits), "t": time.time()})
        self._stack_given = True
        self._set(_key("stack", self.rank), stack())
        states: dict[int, str | None] = {}
        stacks: dict[int, str] = {}
        last = self.beats(list(beside))
        for r, pid in beside.items():
            states[r] = process_state(pid)
            fd = last.get(r, {}).get("dump_fd")
            if finding.kind == FindingKind.SILENT and r in finding.culprits and isinstance(fd, int):
                # no thread of it may run Python: faulthandler writes its stacks from C (and it is continued)
                dumped = stack_of(pid, fd)
                if dumped:
                    stacks[r] = f"written by faulthandler (its own threads could not answer):\n{dumped}"
            elif states[r] == "T":
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
        ranks = list(range(world_size))
        # a silent rank answers only if it was stopped beside this rank and continued
        expected = [r for r in ranks if finding.kind != FindingKind.SILENT or r not in finding.culprits or r in beside]
        deadline = self.clock() + EVIDENCE_S
        while True:
            for r in expected:
                if r not in stacks:
                    said = self._get(_key("stack", r))
                    if isinstance(said, str):
                        stacks[r] = said
            if all(r in stacks for r in expected) or self.clock() >= deadline:
                break
            self.sleep(0.2)
        beats = self.beats(ranks)
        detail = self.recorder.describe(finding.group, finding.seq) if finding.group and finding.seq else None
        per_rank = []
        for r in ranks:
            b = beats.get(r, {})
            state = process_state(int(b["pid"])) if b.get("host") == self.host and b.get("pid") else None
            per_rank.append({"rank": r, "host": b.get("host"), "stage": b.get("stage"), "test": b.get("test"),
                             "phase": b.get("phase"), "main": b.get("main"), "wait": b.get("wait"),
                             "still": b.get("still"), "alone": b.get("alone"),
                             "groups": b.get("groups"), "process_state": states.get(r, state),
                             "stack": stacks.get(r)})
        return {"kind": finding.kind.value, "culprits": list(finding.culprits), "found_by": finding.found_by,
                "collective": None if finding.group is None else {
                    "group": self.label(finding.group), "group_name": finding.group, "seq": finding.seq,
                    "op": (detail or {}).get("op") or finding.op, "joined": list(finding.joined),
                    "missing": [r for r in self._members(finding.group) if r not in finding.joined],
                    "bytes": int((detail or {}).get("bytes") or 0), "bandwidth_gbps": self.bandwidth_gbps,
                    "bound_s": round(waiting_bound_s(int((detail or {}).get("bytes") or 0), self.bandwidth_gbps), 1)},
                "waited_s": round(finding.waited_s, 1), "silent_s": round(finding.silent_s, 1),
                "source": self.recorder.source, "ranks": per_rank}

    def _members(self, group: str) -> tuple[int, ...]:
        """The global ranks of process group ``group`` as this rank last read them (() where it is not one of them)."""
        return next((g.ranks for g in self._groups if g.name == group), ())

    def publish(self, report: dict[str, Any]) -> None:
        """The report of the hang (with the cause the run recorded), for every other rank."""
        self._set(_key("hang-report"), report)

    def report(self) -> dict[str, Any] | None:
        """The report of a hang a rank published, with every stack given since."""
        report = self._get(_key("hang-report")) if self.store is not None else None
        if not isinstance(report, dict):
            return None
        for entry in report.get("ranks") or []:
            if isinstance(entry, dict) and not entry.get("stack"):
                said = self._get(_key("stack", int(entry.get("rank", -1))))
                if isinstance(said, str):
                    entry["stack"] = said
        return report

    def summary(self, world_size: int) -> dict[str, Any] | None:
        """The longest wait in a collective during a test of any rank (from every rank's last beat), as the beats saw
        it (a wait shorter than a beat is not seen: ``resolution_s``): how far a run's healthy waits are from
        NO_PROGRESS_S; the latest any rank's beat came (``longest_late_s``: how far from FREEZE_S); and every rank's
        freezes."""
        if self.store is None:
            return None
        beats = self.beats(list(range(world_size)))
        beats.pop(self.rank, None)  # this rank's own, as it is now
        longest = [(b["longest"], r) for r, b in beats.items() if b.get("longest")]
        if self.longest is not None:
            longest.append((self.longest, self.rank))
        late = max([self.longest_late, *(float(b.get("late") or 0.0) for b in beats.values())])
        freezes = sorted([*(self.public(f) for f in self.freezes),
                          *(f for b in beats.values() for f in b.get("freezes") or [] if isinstance(f, dict))],
                         key=lambda f: (f.get("from") or 0, f.get("rank") or 0))
        out: dict[str, Any] = {"longest_wait_s": 0.0}
        if longest:  # a wait in a test lasted a beat
            (seconds, group, seq, test, phase), rank = max(longest, key=lambda x: x[0][0])
            out = {"longest_wait_s": seconds, "rank": rank, "group": group, "collective": seq, "test": test,
                   "phase": phase}
        return {**out, "resolution_s": self.interval_s, "bound_s": NO_PROGRESS_S,
                "longest_late_s": round(max(late, 0.0), 2), "freeze_bound_s": FREEZE_S, "freezes": freezes}
