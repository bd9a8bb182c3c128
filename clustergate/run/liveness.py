"""Whether every rank still makes progress: a beat per rank through the rendezvous store, and a judge that names
the rank the others wait for, whatever the test's own limit and the collectives' timeout.

Every ``BEAT_S`` a thread of each rank publishes its beat (``clustergate/liveness/ATTEMPT/beat/RANK``): a counter,
where the run is (stage, test, phase), where it is in every process group's collectives (``clustergate.run.flight``:
entered, started, completed), the collective it waits in and for how long, what it works at alone
(``workloads.common.working_alone``) and its main thread's innermost frame. The thread runs while the main thread
is blocked in a collective or waits for a kernel that spins: its beat says so.

A rank that has waited in a collective for ``BEAT_S`` reads every peer's beat and judges (``judge``, pure):

- ``silent``: a peer of that collective whose beat has not changed for ``SILENT_S`` is frozen (SIGSTOP, a process
  none of whose threads can run, a host gone);
- ``skipped``: a peer at the exchange after the same test phase (the control group), that never entered the
  collective this rank waits in, left the phase without it: after ``BLOCKED_S`` it can never complete;
- ``not started``: a peer that entered it but whose GPU has not started it, while this rank's has, for
  ``NO_PROGRESS_S``: busy with earlier device work that does not end (a kernel that spins);
- ``not entered``: a live peer that has not entered it for ``NO_PROGRESS_S``, waits in no collective itself and
  works alone past no bound: stuck in its own code (a syscall that never returns, a long C++ call, a loop).

A rank that finds its own beat thread could not run for ``SILENT_S`` was frozen itself (``frozen``) and says so.

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
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from clustergate.redact import outgoing
from clustergate.run.flight import Group, Recorder, default_group_name
from clustergate.run.interrupts import register_stack_dump, stack_of
from clustergate.run.keeper import state as process_state
from clustergate.run.limits import BEAT_S, BLOCKED_S, EVIDENCE_S, NO_PROGRESS_S, SILENT_S
from workloads.common import alone_now

BEATS_READ_PER_BEAT = 64
"""At most this many peers' beats a waiting rank reads a beat (one round trip): a larger group is read every few
beats, so that the rendezvous store's load grows with the job's size, not with its square (every rank of a group of
512 waiting for one: each reads it every 8 beats, 16 s; the silent rank is named within SILENT_S + 16 s)."""
STACK_FRAMES = 24
"""The innermost frames of a rank's main thread the evidence keeps: the test's call chain down to where it waits."""
STACK_CHARS = 8000
"""The most of a rank's stack the evidence keeps (results.json stays small at hundreds of ranks)."""
TESTING = "testing"


def _key(kind: str, rank: int | None = None) -> str:
    """The store key of ``kind`` (beat, stack, hang, hang-report), of this attempt of the job: torchrun keeps its
    store across the restarts it makes (--max-restarts), and a new attempt must not read the last one's hang."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return f"clustergate/liveness/{attempt}/{kind}" + (f"/{rank}" if rank is not None else "")


@dataclass(frozen=True, slots=True)
class Position:
    """Where the run is, as the run says it."""

    stage: str
    test: str | None = None
    phase: str | None = None


@dataclass(frozen=True, slots=True)
class Wait:
    """A collective this rank waits in."""

    group: str
    seq: int
    seconds: float
    op: str | None = None
    """What it is ('gloo:all_reduce'), once it has lasted a beat (the recorder's entries are read once for it)."""


@dataclass(frozen=True, slots=True)
class Finding:
    """A rank that stopped making progress, as the judge found it."""

    kind: str
    """silent, skipped, not started, not entered or frozen."""
    culprits: tuple[int, ...]
    found_by: int
    group: str | None = None
    seq: int | None = None
    waited_s: float = 0.0
    """How long the rank that found it had waited in that collective (frozen: how long it was frozen)."""
    joined: tuple[int, ...] = ()
    """The group's ranks that had entered that collective (and, for ``not started``, started it)."""
    silent_s: float = 0.0
    """How long the culprits' beats had not changed."""
    op: str | None = None
    """What the collective is, where the rank that waits in it said so."""


def judge(me: int, wait: Wait, beats: dict[int, dict[str, Any]], silent_s: dict[int, float], *,
          members: tuple[int, ...], mine: dict[str, list[int]], position: Position, control: str | None
          ) -> Finding | None:
    """The peers of the collective this rank waits in (``wait``: of a group of ``members``) that stopped making
    progress, from their ``beats`` and how long each has been ``silent_s``; None while none has (yet).
    ``mine``: this rank's own [entered, started, done] per group; ``control``: the plugin's control group."""
    group, seq = wait.group, wait.seq
    peers = [r for r in members if r != me and r in beats]

    def entered(r: int) -> int:
        return int((beats[r].get("groups") or {}).get(group, [0, -1, -1])[0])

    def started(r: int) -> int:
        return int((beats[r].get("groups") or {}).get(group, [0, -1, -1])[1])

    def joined(strict: bool = False) -> tuple[int, ...]:
        out = [r for r in peers if entered(r) >= seq and (not strict or started(r) >= seq)]
        return tuple(sorted([me, *out]))

    def find(kind: str, culprits: list[int], **extra: Any) -> Finding:
        return Finding(kind, tuple(sorted(culprits)), me, group, seq, wait.seconds, extra.pop("joined", joined()),
                       **extra)

    silent = [r for r in peers if silent_s.get(r, 0.0) >= SILENT_S]
    if silent:
        return find("silent", silent, silent_s=min(silent_s[r] for r in silent))
    same_phase = [r for r in peers if (beats[r].get("test"), beats[r].get("phase")) == (position.test, position.phase)
                  and beats[r].get("stage") == TESTING == position.stage]
    if wait.seconds >= BLOCKED_S and group != control:
        # a peer at the exchange after this phase that never entered this collective: it left the phase without it
        left = [r for r in same_phase if entered(r) < seq and (beats[r].get("wait") or [None])[0] == control]
        if left:
            return find("skipped", left)
    if wait.seconds >= BLOCKED_S and group == control and position.stage == TESTING:
        # the mirror: this rank is at the exchange, and a peer of this phase waits in a collective it never entered
        for r in same_phase:
            theirs = beats[r].get("wait")
            if theirs and theirs[0] != control and theirs[0] in mine and mine[theirs[0]][0] < int(theirs[1]):
                return Finding("skipped", (me,), me, theirs[0], int(theirs[1]), float(theirs[2]), (r,),
                               op=theirs[3] if len(theirs) > 3 else None)
    if wait.seconds < NO_PROGRESS_S or position.stage != TESTING:
        return None
    # a peer that works alone within the bound its workload gave (workloads.common.working_alone) is not stuck
    testing = [r for r in peers if beats[r].get("stage") == TESTING and (beats[r].get("alone") or [None, 0])[1] <= 0]
    unstarted = [r for r in testing if entered(r) >= seq and 0 <= started(r) < seq]
    if unstarted and (mine.get(group) or [0, -1])[1] >= seq:
        return find("not started", unstarted, joined=joined(strict=True))
    # a peer that waits in a collective itself waits for another (or for this rank, at the exchange): not stuck
    behind = [r for r in testing if entered(r) < seq and not beats[r].get("wait")]
    return find("not entered", behind) if behind else None


def _alone() -> list[Any] | None:
    """[what, seconds left of its bound] where the workloads say this rank works alone (workloads.common)."""
    said = alone_now()
    return [said[0], round(said[1], 1)] if said else None


def main_waits() -> str | None:
    """What the main thread is inside: "control" (a control exchange), "collective" (a torch.distributed call), or
    None."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    found = None
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if name.endswith("clustergate/run/control.py"):
            return "control"
        if "/torch/distributed/" in name:
            found = "collective"
        frame = frame.f_back
    return found


def main_frame() -> str:
    """The main thread's innermost frame: 'test_x.py:12 in test_x' (what a beat says the rank is doing)."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return ""
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} in {frame.f_code.co_name}"


NOISE = ("/_pytest/", "/pluggy/", "<frozen runpy>", "/pytest/__main__.py")
"""Frames of pytest's own machinery: left out of a rank's stack (the test's frames and what it called are the
evidence)."""


def stack() -> str:
    """This process's main thread's Python stack (its last STACK_FRAMES frames, pytest's machinery left out), then
    each other thread's innermost frame."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    lines = []
    if main in frames:
        summary = [f for f in traceback.extract_stack(frames[main]) if not any(n in f.filename for n in NOISE)]
        lines.append("Main thread (most recent call last):")
        lines += [line.rstrip("\n") for line in traceback.format_list(summary[-STACK_FRAMES:])]
    for ident, frame in frames.items():
        if ident not in (main, threading.get_ident()):
            lines.append(f"Thread {names.get(ident, ident)}: {frame.f_code.co_filename.rsplit('/', 1)[-1]}:"
                         f"{frame.f_lineno} in {frame.f_code.co_name}")
    return "\n".join(lines)[-STACK_CHARS:]


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
    recorder: Recorder = field(default_factory=Recorder)
    clock: Callable[[], float] = time.monotonic
    sleep: Callable[[float], None] = time.sleep
    interval_s: float = BEAT_S

    def __post_init__(self) -> None:
        self.default = self.default or default_group_name()
        self._count = 0
        self._last = self.clock()
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
        """One beat: publish, answer a hang another rank found, judge the peers this rank waits for."""
        now = self.clock()
        gap, self._last = now - self._last, now
        here = self.position()
        if here.stage == "ended":
            return
        wait = self._wait(now, here)
        self._count += 1
        self._publish(here, wait)
        if self._answer():
            return
        if gap - self.interval_s >= SILENT_S:  # this thread could not run: the whole process was frozen
            self.on_finding(Finding("frozen", (self.rank,), self.rank, waited_s=gap))
            return
        if wait is not None and wait.seconds >= self.interval_s and now >= self._next_judge:
            members = self._members(wait.group)
            self._next_judge = now + self.interval_s * (math.ceil(len(members) / BEATS_READ_PER_BEAT) - 0.5)
            finding = self._judge(wait, here, members)
            if finding is not None:
                self.on_finding(finding)

    def _wait(self, now: float, here: Position) -> Wait | None:
        """The collective this rank has waited in longest (since this thread first saw it open), or None. A wait
        that lasts a beat is checked once against the recorder's entries (``Recorder.open_collective``): what it
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
            g, op = groups[name], None
            if now - since >= self.interval_s and g.done is not None:
                key = (name, g.done, g.entered)
                if key not in self._checked:
                    self._checked = {k: v for k, v in self._checked.items() if k[0] != name}
                    self._checked[key] = self.recorder.open_collective(name, g.done, g.entered)
                entry = self._checked[key]
                if entry is None:
                    continue  # open in the status only (point-to-point operations): no collective waits
                seq, op = entry["seq"], entry["op"]
            wait = Wait(name, int(seq), now - since, op)
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
                "longest": self.longest}
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
        beats = self.beats(members)
        now = self.clock()
        silent = {}
        for r, b in beats.items():
            seen = self._seen.get(r)
            if seen is None or seen[0] != b.get("n"):
                self._seen[r] = (b.get("n"), now)  # type: ignore[assignment]
            silent[r] = now - self._seen[r][1]
        mine = {g.name: g.as_beat() for g in self._groups}
        return judge(self.rank, wait, beats, silent, members=members, mine=mine, position=here,
                     control=self.control)

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
            if finding.kind == "silent" and r in finding.culprits and isinstance(fd, int):
                # no thread of it may run Python: faulthandler writes its stacks from C (and it is continued)
                dumped = stack_of(pid, fd)
                if dumped:
                    stacks[r] = f"written by faulthandler (its own threads could not answer):\n{dumped}"
            elif states[r] == "T":
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGCONT)
        ranks = list(range(world_size))
        # a silent rank answers only if it was stopped beside this rank and continued
        expected = [r for r in ranks if finding.kind != "silent" or r not in finding.culprits or r in beside]
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
                             "alone": b.get("alone"),
                             "groups": b.get("groups"), "process_state": states.get(r, state),
                             "stack": stacks.get(r)})
        return {"kind": finding.kind, "culprits": list(finding.culprits), "found_by": finding.found_by,
                "collective": None if finding.group is None else {
                    "group": self.label(finding.group), "group_name": finding.group, "seq": finding.seq,
                    "op": (detail or {}).get("op") or finding.op, "joined": list(finding.joined),
                    "missing": [r for r in self._members(finding.group) if r not in finding.joined]},
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
        NO_PROGRESS_S."""
        if self.store is None:
            return None
        longest = [(b["longest"], r) for r, b in self.beats(list(range(world_size))).items() if b.get("longest")]
        if self.longest is not None:
            longest.append((self.longest, self.rank))
        if not longest:  # no wait in a test lasted a beat
            return {"longest_wait_s": 0.0, "resolution_s": self.interval_s, "bound_s": NO_PROGRESS_S}
        (seconds, group, seq, test, phase), rank = max(longest, key=lambda x: x[0][0])
        return {"longest_wait_s": seconds, "rank": rank, "group": group, "collective": seq, "test": test,
                "phase": phase, "resolution_s": self.interval_s, "bound_s": NO_PROGRESS_S}
