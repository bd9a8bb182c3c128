"""How a run ends early, as one value: what ended it, who caused it, where, and the exit status.

Every detector (a test past its limit, a collective that can never complete, a signal, a launcher gone, a
peer gone or late at an exchange, a rank stuck after the verdict, a failed write, pytest stopping the
session) describes what it saw as an ``Ending`` and hands it to ``Run.end``, the one way down.

The first cause is the headline: a rank that sees only a consequence (a peer gone, a signal torchrun sent
because a peer exited) reads in the rendezvous store why every rank that left did so; ``first_cause`` names
the earliest cause and the ranks that caused it before this rank's own view.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any

from clustergate.run.limits import EXIT_EARLY, SIGNAL_SKEW_S


class Kind(str, Enum):
    """What the other ranks read of an ending in the store."""

    CAUSE = "cause"
    """This rank starts the ending: pytest.exit, an error, a test past its time, a peer it found stuck."""
    SIGNAL = "signal"
    """SIGINT or SIGTERM reached this rank."""
    CONSEQUENCE = "consequence"
    """This rank saw another rank's ending (a peer gone, a cause another rank recorded)."""


@dataclass(frozen=True, slots=True)
class Ending:
    """One ending of the run on one rank."""

    cause: str
    """The headline: what ended the run, the first cause first (results.json's ``error``)."""
    culprits: tuple[int, ...] = ()
    """The ranks that caused it (``error_ranks``, the test's ``failed_ranks``); empty for a signal from outside."""
    exit_code: int = EXIT_EARLY
    """The status this rank leaves with (unless it unwinds: then every rank agrees one at the session's end)."""
    kind: Kind = Kind.CAUSE
    interrupted: bool = False
    """The test it happened in did not finish: it is ``interrupted``, not failed."""
    unwinds: bool = False
    """pytest carries on to the session's end (pytest.exit, KeyboardInterrupt, an internal error, the first SIGINT):
    the ending is recorded now and the exit status agreed there with every rank."""
    stuck: tuple[int, ...] = ()
    """Ranks that never came where this rank waited for them: stopped by this rank where it can, rather than
    left to torchrun's SIGKILL 30 s later."""
    test: str | None = None
    """The test the run was in (set when the run records it)."""
    hosts: tuple[str | None, ...] = ()
    """The culprits' hosts, None where not known yet (set when the run records it)."""
    verdict: str | None = None
    """What results.json says once it is recorded ("reject"; "running" on a rank that could not write it)."""
    evidence: dict[str, Any] | None = None
    """The evidence of a hang (clustergate.run.hang.liveness): results.json's ``hang``."""


def first_cause(observed: Ending, *, said: dict[int, dict[str, Any]], silent: list[int],
                own_signal: tuple[str, float] | None, vanished: bool, who: Callable[[int], str], where: str,
                described: str) -> Ending:
    """``observed`` told with its first cause first.

    ``said``: why each peer that left did so (its record in the store); ``silent``: the peers that said nothing;
    ``own_signal``: this rank's own signal and when it came. An earlier cause another rank recorded comes first;
    with ``vanished`` (a peer's connection closed, or torchrun's SIGTERM) a silent peer died without a word and
    is the cause; then the first signal: a peer's that came SIGNAL_SKEW_S before this rank's own reached that
    peer alone (torchrun signals this rank once that peer has gone), else this rank's own.
    """
    then = f"\n  (then {observed.cause[0].lower()}{observed.cause[1:]})"
    signals = [d for d in said.values() if d.get("kind") == Kind.SIGNAL]
    causes = sorted((d for d in said.values() if d.get("kind") == Kind.CAUSE), key=lambda d: d.get("t", 0))
    first_signal = min((d.get("t", 0) for d in signals), default=float("inf"))
    if causes and causes[0].get("t", 0) <= first_signal:
        c = causes[0]
        return _told(observed, f"{c['why']}{then}", tuple(c.get("culprits") or ()), bool(c.get("interrupted")))
    if vanished and silent:
        names = ", ".join(who(r) for r in silent)
        return _told(observed, f"{names} ended without a word during {where} (killed, crashed or exited inside a "
                               "test: torchrun's account gives its exit status)"
                     + (f"; {described}" if described else "") + then, tuple(silent), False)
    earliest = min(signals, key=lambda d: d.get("t", 0), default=None)
    if own_signal is not None and (earliest is None or earliest.get("t", 0) >= own_signal[1] - SIGNAL_SKEW_S):
        return _told(observed, own_signal[0], (), True)
    if earliest is not None:
        return _told(observed, earliest["why"], (), True)
    return _told(observed, observed.cause, observed.culprits, False)


def _told(observed: Ending, cause: str, culprits: tuple[int, ...], interrupted: bool) -> Ending:
    return Ending(cause=cause, culprits=culprits, exit_code=observed.exit_code, interrupted=interrupted,
                  kind=Kind.CAUSE if cause == observed.cause else Kind.CONSEQUENCE, stuck=observed.stuck,
                  evidence=observed.evidence)
