"""The judges of a run's progress, pure: from every rank's beat to a finding, or none (``clustergate.run.hang.liveness``
publishes the beats and acts on what these find).

- ``judge``: a rank that waits in a collective judges the peers it waits for: ``silent`` (a beat that stopped),
  ``skipped`` (a peer that left the phase without the collective), ``not started`` (its GPU has not started it),
  ``not entered`` (alive, stuck in its own code);
- ``judge_group``: a hang nobody waits out for a peer: every live rank without progress in the same test, ``stuck``
  (each in its own code), ``hung`` (one collective every rank entered and none completed, past a bound from its
  size and the profile's bandwidth) or ``deadlock`` (every rank waits in an operation none will complete).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import StrEnum
from typing import Any, NamedTuple

from clustergate.run.limits import BLOCKED_S, NO_PROGRESS_S, SILENT_S, STILL_S

TESTING = "testing"


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
    nbytes: int = 0
    """Its input's bytes, as the recorder's entry gives them (0 where not known)."""


class FindingKind(StrEnum):
    """What a finding says of its culprits; the value is the word results.json's ``hang.kind`` carries."""

    SILENT = "silent"
    SKIPPED = "skipped"
    NOT_STARTED = "not started"
    NOT_ENTERED = "not entered"
    FROZEN = "frozen"
    """This rank's own beat thread could not run (the liveness thread finds it of itself)."""
    STUCK = "stuck"
    HUNG = "hung"
    DEADLOCK = "deadlock"
    LAUNCHER_STOPPED = "launcher stopped"


class Still(NamedTuple):
    """How long a rank's main thread has made no progress, and where: its beat's ``still`` (a list in the store's
    JSON, in this order)."""

    seconds: float = 0.0
    inside: str = "code"
    """code, collective (a torch.distributed call) or control (a control exchange)."""
    where: str = ""
    """What it does there: its innermost frame, or the call and where it was called."""
    nbytes: int = 0
    """The open collective's bytes (0 where none or not known)."""
    state: str | None = None
    """The main thread's own state in /proc (R, S, D), where read."""

    @classmethod
    def of(cls, said: Any) -> Still | None:
        """The beat's ``still`` as published (a list, of an older beat perhaps shorter); None where it has none."""
        if not said or not isinstance(said, (list, tuple)):
            return None
        return cls(*said[:len(cls._fields)])


@dataclass(frozen=True, slots=True)
class Finding:
    """A rank that stopped making progress, as the judge found it."""

    kind: FindingKind
    """silent, skipped, not started, not entered, frozen; stuck, hung, deadlock (``judge_group``); launcher
    stopped. A word given is read as its kind."""
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

    def __post_init__(self) -> None:
        object.__setattr__(self, "kind", FindingKind(self.kind))


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

    def find(kind: FindingKind, culprits: list[int], **extra: Any) -> Finding:
        return Finding(kind, tuple(sorted(culprits)), me, group, seq, wait.seconds, extra.pop("joined", joined()),
                       **extra)

    silent = [r for r in peers if silent_s.get(r, 0.0) >= SILENT_S]
    if silent:
        return find(FindingKind.SILENT, silent, silent_s=min(silent_s[r] for r in silent))
    same_phase = [r for r in peers if (beats[r].get("test"), beats[r].get("phase")) == (position.test, position.phase)
                  and beats[r].get("stage") == TESTING == position.stage]
    if wait.seconds >= BLOCKED_S and group != control:
        # a peer at the exchange after this phase that never entered this collective: it left the phase without it
        left = [r for r in same_phase if entered(r) < seq and (beats[r].get("wait") or [None])[0] == control]
        if left:
            return find(FindingKind.SKIPPED, left)
    if wait.seconds >= BLOCKED_S and group == control and position.stage == TESTING:
        # the mirror: this rank is at the exchange, and a peer of this phase waits in a collective it never entered
        for r in same_phase:
            theirs = beats[r].get("wait")
            if theirs and theirs[0] != control and theirs[0] in mine and mine[theirs[0]][0] < int(theirs[1]):
                return Finding(FindingKind.SKIPPED, (me,), me, theirs[0], int(theirs[1]), float(theirs[2]), (r,),
                               op=theirs[3] if len(theirs) > 3 else None)
    if wait.seconds < NO_PROGRESS_S or position.stage != TESTING:
        return None
    # a peer that works alone within the bound its workload gave (workloads.common.working_alone) is not stuck
    testing = [r for r in peers if beats[r].get("stage") == TESTING and (beats[r].get("alone") or [None, 0])[1] <= 0]
    unstarted = [r for r in testing if entered(r) >= seq and 0 <= started(r) < seq]
    if unstarted and (mine.get(group) or [0, -1])[1] >= seq:
        return find(FindingKind.NOT_STARTED, unstarted, joined=joined(strict=True))
    # a peer that waits in a collective itself waits for another (or for this rank, at the exchange): not stuck
    behind = [r for r in testing if entered(r) < seq and not beats[r].get("wait")]
    return find(FindingKind.NOT_ENTERED, behind) if behind else None


def judge_group(me: int, beats: dict[int, dict[str, Any]], silent_s: dict[int, float], *, ranks: tuple[int, ...],
                position: Position, bound_s: Callable[[int], float] = lambda nbytes: STILL_S) -> Finding | None:
    """Every rank of the job (``ranks``; a lone rank: itself) making no progress in the same test, none at a control
    exchange or working alone within its bound: the lowest live rank (``me``) names them; None while that is not so
    (or this rank is not the lowest). ``beats``: every rank's last; ``silent_s``: how long each has not changed (a
    rank silent for SILENT_S makes no progress either). A rank in its own code has made none once it has been still
    for STILL_S; one that waits in a torch.distributed call or an open collective once it has been still for
    ``bound_s`` of the collective's bytes."""
    if position.stage != TESTING:
        return None
    silent = [r for r in ranks if silent_s.get(r, 0.0) >= SILENT_S]
    live = [r for r in ranks if r not in silent]
    if not live or me != live[0] or any(r not in beats for r in live):
        return None
    waiting: dict[int, list[Any] | None] = {}
    stillest = float("inf")
    for r in live:
        b = beats[r]
        still = Still.of(b.get("still"))
        if b.get("stage") != TESTING or b.get("test") != position.test or still is None or still.inside == "control" \
                or (b.get("alone") or [None, 0])[1] > 0:
            return None
        waits = still.inside == "collective" or b.get("wait") is not None
        if float(still.seconds) < (bound_s(int(still.nbytes or 0)) if waits else STILL_S):
            return None
        stillest = min(stillest, float(still.seconds))
        if waits:
            waiting[r] = b.get("wait")
    own = [r for r in live if r not in waiting]

    def find(kind: FindingKind, culprits: list[int], **extra: Any) -> Finding:
        return Finding(kind, tuple(sorted(culprits)), me, waited_s=stillest,
                       silent_s=min((silent_s[r] for r in silent), default=0.0), **extra)

    if own or silent:
        return find(FindingKind.STUCK if own else FindingKind.SILENT, own + silent, joined=tuple(sorted(waiting)))
    opened = {(w[0], int(w[1])) for w in waiting.values() if w}
    if len(opened) == 1 and all(waiting.values()):
        group, seq = opened.pop()
        members = [r for r in live if group in (beats[r].get("groups") or {})]
        entered = [r for r in members if int(beats[r]["groups"][group][0]) >= seq]
        if entered == members == live:
            op = next((w[3] for w in waiting.values() if w and len(w) > 3 and w[3]), None)
            return find(FindingKind.HUNG, live, group=group, seq=seq, joined=tuple(live), op=op)
    return find(FindingKind.DEADLOCK, live, joined=tuple(live))
