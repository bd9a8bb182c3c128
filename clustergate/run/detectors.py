"""What ends a run early, each seen by one detector and told as one ``Ending`` for ``Run.end``.

- a control exchange that fails: ranks at different steps, a malformed message, a peer gone, a peer late
  past the exchange's deadline (stuck at start-up, in the session's end, after the verdict);
- a test past its time limit (the watchdog);
- a collective that can never complete: the main thread blocked in it while a peer failed, skipped or left
  that phase (the watchdog's poll);
- SIGTERM (from outside, or from torchrun because a peer exited) and the launcher gone; SIGINT;
- rank 0 stuck between the verdict and the final barrier (the watchdog, REPORT_S);
- a rank that stopped making progress while its peers wait for it, or this rank frozen itself; every rank making
  no progress alike (stuck in its own code, a lone rank's included; one collective none completes; a deadlock);
  this rank's launcher stopped, or the rendezvous store its agent serves unanswered (the liveness thread,
  ``clustergate.run.hang.liveness``, and the store's client, ``clustergate.run.ranks.peers.RendezvousStore``);
- a freeze of this rank that a test phase spans: the phase fails (``frozen_measurement``).

Each function reads the run's state (``RunView``: what a detector may see of ``clustergate.run.lifecycle.Run``)
and says what it means; none changes it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import pytest

from clustergate.run.ending import Ending, Kind
from clustergate.run.hang.hang_judge import Finding, FindingKind, Still
from clustergate.run.limits import BLOCKED_S, SIGINT_GRACE_S
from clustergate.run.outside import Outside
from clustergate.run.ranks.control import ControlLost, ControlMalformed, ControlMismatch, Step
from clustergate.run.ranks.peers import Peers
from clustergate.run.ranks.world import World


class RunView(Protocol):
    """What a detector reads of the run."""

    world: World
    peers: Peers
    outside: Outside
    test: str | None
    phase: str | None

    @property
    def who(self) -> str: ...

    def where_now(self) -> str: ...

    def blamed(self, observed: Ending, *, grace_s: float = ..., vanished: bool = ...) -> Ending:
        """``observed`` with its first cause first (the others' words in the store)."""

    def blocked_for(self, nodeid: str | None, phase: str | None, call: str | None) -> float | None:
        """How long the main thread has been in collective ``call`` in this test and phase."""


def exchange_failed(run: RunView, step: Step, exc: ControlLost) -> Ending:
    """A control exchange did not complete: who was elsewhere, late or gone, first cause first."""
    peers, me = run.peers, run.world.rank
    if isinstance(exc, ControlMismatch):
        said = "; ".join(f"{peers.who(r)} at '{label}'" for r, label in enumerate(exc.labels))
        mine = exc.labels[me]
        elsewhere = [r for r, label in enumerate(exc.labels) if label != mine] or peers.behind(run.test)
        return run.blamed(Ending(f"ranks are at different steps, so the run cannot go on: {said}",
                                 culprits=tuple(elsewhere)))
    if isinstance(exc, ControlMalformed):
        return Ending(f"{exc} during {run.where_now()}", culprits=(exc.rank,))
    described = peers.describe(run.test)
    if exc.timed_out:
        late = [r for r in peers.elsewhere(str(step.tag)) if r != me]
        names = ", ".join(peers.who(r) for r in late) or "a peer rank"
        return run.blamed(Ending(f"{names} did not reach '{step}' within {exc.waited_s:.0f} s of {run.who} (stuck, "
                                 "or slower than every limit allows)" + (f"; {described}" if described else ""),
                                 culprits=tuple(late or peers.behind(run.test)), stuck=tuple(late)), grace_s=0.0)
    return run.blamed(Ending(f"{exc} during {run.where_now()}" + (f"; {described}" if described else ""),
                             culprits=tuple(peers.behind(run.test))), vanished=True)


def time_limit(run: RunView, nodeid: str, limit_s: float) -> Ending:
    """The test did not finish within its limit: the ranks that got least far are the culprits."""
    msg = (f"{nodeid} did not finish within {limit_s:.0f} s on {run.who}; the run stops (raise the limit "
           "with --test-timeout or @pytest.mark.time_limit if the workload is just slow)")
    described = run.peers.describe(nodeid)
    if described:
        msg += f"\n  {described} (a rank that finished setup but not call is stuck in the test body)"
    return run.blamed(Ending(msg, culprits=tuple(run.peers.behind(nodeid))), grace_s=0.0)


def failed_before(run: RunView, nodeid: str, phase: str, waited: float, call: str) -> Ending | None:
    """A peer that failed or skipped this phase and waits at its exchange (it said so in the store), while this
    rank has been blocked ``waited`` seconds in ``call``; None where no peer said so."""
    peers = run.peers
    early = peers.waiting_after_failure(Step(nodeid, phase).tag)
    if early is None or early["rank"] == run.world.rank:
        return None
    did = {"skipped": "skipped", "passed": "finished"}.get(early.get("outcome", "failed"), "failed")
    return Ending(f"{nodeid} [{phase}]: {peers.who(early['rank'])} {did} it ({early['message']}) and waits for the "
                  f"others, while {run.who} has been blocked for {waited:.0f} s in {call}, a collective that needs "
                  "every rank: it can never complete, so the run stops", culprits=(early["rank"],))


def blocked_collective(run: RunView) -> Ending | None:
    """The main thread waits in a collective that a peer, failed, skipped or gone, will never join; None while
    that is not so, or not yet for BLOCKED_S."""
    nodeid, phase = run.test, run.phase
    call = run.outside.collective_in_main_thread() if run.world.launched and nodeid and phase else None
    waited = run.blocked_for(nodeid, phase, call)
    if waited is None or waited < BLOCKED_S or nodeid is None or phase is None:
        return None
    peers, me = run.peers, run.world.rank
    early = failed_before(run, nodeid, phase, waited, call)
    if early is not None:
        return early
    gone = {r: d for r, d in (peers.departures() or {}).items() if r != me}
    if gone:
        return run.blamed(Ending(f"{run.who} has been blocked for {waited:.0f} s in {call} during {nodeid} [{phase}], "
                                 f"a collective that needs {', '.join(peers.who(r) for r in sorted(gone))}, which "
                                 "left the run: it can never complete, so the run stops", culprits=tuple(sorted(gone))),
                          grace_s=0.0)
    return None


STATES = {"T": "its process is stopped (SIGSTOP)", "D": "its process is in an uninterruptible wait (D)",
          "R": "its process runs, but none of its threads can: the interpreter's lock is held by a call",
          "S": "its process sleeps, and none of its threads answers", "Z": "its process is gone",
          None: "its process is gone"}
"""What a silent rank's process state beside this rank says (/proc)."""
BUSY = {"R": "it is busy in its own work, which does not end", "S": "it waits in a call that does not return",
        "D": "it waits in a call that does not return (an uninterruptible wait, D)",
        None: "stuck in its own code (a call that does not return, or work that does not end)"}
"""What a live rank that does not enter a collective does, from its process state beside this rank (/proc)."""


STILL = {"R": "busy in a call that does not end (on a GPU: waiting for device work that does not finish, a kernel "
                "that spins)", "S": "it waits in a call that does not return",
         "D": "it waits in a call that does not return (an uninterruptible wait, D)"}
"""What a main thread that has not moved does, from its own state in /proc (``main_thread.Main.state``)."""


def _doing(ranks: dict[Any, dict[str, Any]], who: Any, culprits: tuple[int, ...] | list[int],
           named: bool = True) -> str:
    """'rank 0 (h) at t.py:12 in test_x (it waits in a call that does not return); rank 1 (h) in recv called at
    t.py:14': where each of ``culprits`` was, as its beat said (without its name where not ``named``)."""
    parts = []
    for r in culprits:
        still = Still.of(ranks.get(r, {}).get("still"))
        where = still.where if still is not None and still.where else ranks.get(r, {}).get("main")
        if not where:
            continue
        inside = still.inside if still is not None else "code"
        how = STILL.get(still.state) if still is not None and inside == "code" else None
        parts.append((f"{who(r, gpu=True)} " if named else "") + f"{'in' if inside == 'collective' else 'at'} {where}"
                     + (f" ({how})" if how and named else f": {how}" if how else ""))
    return "; ".join(parts)


@dataclass(frozen=True, slots=True)
class _Seen:
    """What every message of a finding reads: the finding, the run, and the words made of them once."""

    run: RunView
    finding: Finding
    collective: str
    """'collective 12 (gloo:all_reduce) of the workloads' group'."""
    evidence: dict[str, Any]
    ranks: dict[Any, dict[str, Any]]
    """Every rank's entry of the evidence, by rank."""
    names: str
    """The culprits, by name."""
    others: list[int]
    """The ranks that joined and are no culprits."""
    waiting: str
    """The others by name (this rank where none)."""
    where: str
    waited: float


def _frozen(s: _Seen) -> str:
    return (f"{s.run.peers.who(s.run.world.rank, gpu=True)} was frozen for {s.waited:.0f} s during {s.where} (stopped "
            "by SIGSTOP, or its process could not run): it stopped making progress, so the run stops")


def _stuck(s: _Seen) -> str:
    culprits, others, who = s.finding.culprits, s.others, s.run.peers.who
    one = len(culprits) == 1
    if not one and not others:
        lead = (f"every rank is stuck alike in its own code during {s.where}: none has made progress for "
                f"{s.waited:.0f} s")
    else:
        lead = (f"{s.names} {'is' if one else 'are'} stuck in {'its' if one else 'their'} own code during {s.where}: "
                f"no progress for {s.waited:.0f} s")
    doing = _doing(s.ranks, who, culprits, named=not one)
    waits = _doing(s.ranks, who, others)
    return lead + (f", {doing}" if doing and one else f" ({doing})" if doing else "") + \
        (f"; meanwhile {waits}, waiting for {'it' if one else 'them'}" if waits else "")


def _hung(s: _Seen) -> str:
    finding = s.finding
    gpus = "started on every GPU" if any((s.ranks.get(r, {}).get("groups") or {}).get(finding.group or "", [0, -1])[1]
                                         >= (finding.seq or 0) > 0 for r in finding.culprits) else "entered"
    seen = s.evidence.get("collective") or {}
    size = (f" ({seen['bytes'] / 2**20:.1f} MiB: at most {seen['bound_s']:.0f} s at the profile's slowest "
            f"bandwidth, {seen['bandwidth_gbps']:g} GB/s, with its slack)" if seen.get("bound_s") else "")
    return (f"{s.collective}, {gpus} ({s.names}), completed on none within {s.waited:.0f} s during {s.where}{size}: "
            "the collective hangs (a fabric, NVLink, NVSwitch or fabric manager fault, or ranks that called it with "
            "different arguments)")


def _deadlock(s: _Seen) -> str:
    doing = _doing(s.ranks, s.run.peers.who, s.finding.culprits)
    return (f"every rank waits in an operation none of them will complete (a deadlock of the group) during "
            f"{s.where}: none has made progress for {s.waited:.0f} s" + (f" ({doing})" if doing else ""))


def _silent(s: _Seen) -> str:
    seen = [s.ranks.get(r, {}) for r in s.finding.culprits]
    how = STATES.get(seen[0].get("process_state"), "stopped, unable to run, or its host unreachable") \
        if seen and seen[0].get("host") == s.ranks.get(s.run.world.rank, {}).get("host") else \
        "stopped, unable to run, or its host unreachable"
    return (f"{s.names} stopped making progress during {s.where}: no sign of life for {s.finding.silent_s:.0f} s "
            f"({how}), while {s.waiting} waited {s.waited:.0f} s in {s.collective}")


def _skipped(s: _Seen) -> str | Ending:
    run = s.run
    early = failed_before(run, run.test, run.phase, s.waited,
                          run.outside.collective_in_main_thread() or s.collective) if run.test and run.phase else None
    if early is not None:  # the peer said why it left the phase: its failure is the cause
        return early
    return (f"{s.names} left {s.where} without joining {s.collective}, which {s.waiting} waited in for "
            f"{s.waited:.0f} s: it can never complete, so the run stops")


def _not_started(s: _Seen) -> str:
    gpus = "its GPU has" if len(s.finding.culprits) == 1 else "their GPUs have"
    return (f"{s.names} entered {s.collective} but {gpus} not started it, while {s.waiting} started it and "
            f"waited {s.waited:.0f} s during {s.where}: the device is busy with earlier work that does not end "
            "(a kernel that spins)")


def _not_entered(s: _Seen) -> str:
    ranks, who, culprits = s.ranks, s.run.peers.who, s.finding.culprits
    doing = "; ".join(f"{who(r)} at {ranks[r]['main']}" + (
        f", still {ranks[r]['alone'][0]} {-ranks[r]['alone'][1]:.0f} s past the bound its workload gave"
        if ranks[r].get("alone") else "") for r in culprits if ranks.get(r, {}).get("main"))
    seen = ranks.get(culprits[0], {}) if culprits else {}
    beside = seen.get("host") == ranks.get(s.run.world.rank, {}).get("host")
    how = BUSY.get(seen.get("process_state") if beside else None, BUSY[None])
    during = "" if s.where in s.collective else f" during {s.where}"
    return (f"{s.names} did not enter {s.collective}, which {s.waiting} waited in for {s.waited:.0f} s{during}: {how}"
            + (f"; {doing}" if doing else ""))


SAID: dict[FindingKind, Callable[[_Seen], str | Ending]] = {
    FindingKind.FROZEN: _frozen, FindingKind.STUCK: _stuck, FindingKind.HUNG: _hung,
    FindingKind.DEADLOCK: _deadlock, FindingKind.SILENT: _silent, FindingKind.SKIPPED: _skipped,
    FindingKind.NOT_STARTED: _not_started, FindingKind.NOT_ENTERED: _not_entered,
}
"""The cause of a finding, one message per kind (a kind not here, launcher stopped, is told by ``agent_lost``; one
that returns an Ending found a cause before it, the peer's own words)."""


def no_progress(run: RunView, finding: Finding, collective: str, evidence: dict[str, Any]) -> Ending:
    """A rank stopped making progress (``finding``, from the liveness thread): named with what it did not do, in
    which collective (``collective``: 'collective 12 (gloo:all_reduce) of the workloads' group'), for how long."""
    who = run.peers.who
    others = [r for r in finding.joined if r not in finding.culprits]
    seen = _Seen(run, finding, collective, evidence,
                 ranks={e.get("rank"): e for e in evidence.get("ranks") or [] if isinstance(e, dict)},
                 names=", ".join(who(r, gpu=True) for r in finding.culprits), others=others,
                 waiting=", ".join(who(r) for r in others) or run.who, where=run.where_now(), waited=finding.waited_s)
    cause = SAID.get(finding.kind, _not_entered)(seen)
    if isinstance(cause, Ending):
        return cause
    return Ending(cause, culprits=finding.culprits, stuck=tuple(r for r in finding.culprits if r != run.world.rank))


def frozen_measurement(run: RunView, freeze: dict[str, Any]) -> str:
    """This rank was frozen (``freeze``, from the liveness thread) in the test phase that ends now: its measurement
    does not count."""
    began = time.strftime("%H:%M:%S", time.gmtime(float(freeze.get("from") or 0)))
    where = f"{freeze['test']} [{freeze['phase']}]" if freeze.get("test") else run.where_now()
    return (f"{run.peers.who(run.world.rank, gpu=True)} was frozen for {float(freeze['seconds']):.0f} s from {began} "
            f"UTC, during {where} (its beat could not run: stopped by SIGSTOP, or its process could not run): a "
            "measurement that spans it does not count, so this phase fails")


def agent_lost(run: RunView, *, launcher_stopped_s: float | None, store_lost: str | None,
               store_host: dict[str, Any] | None, culprits: tuple[int, ...]) -> Ending:
    """torchrun's agent does not watch the run any more: this rank's own launcher is stopped (SIGSTOP; for
    ``launcher_stopped_s``, where its beat measured it), or the rendezvous store did not answer (``store_lost``: how),
    whose agent ``store_host`` names where known. ``culprits``: the ranks of the node whose agent it is."""
    pid, me, node = run.outside.launcher.pid, run.world.rank, run.world.node_rank
    who, where = run.peers.who(me, gpu=True), run.where_now()
    store = run.peers.store
    at = f" at {store.where}" if store is not None and store.where else ""
    stopped = "a stopped agent watches no rank and ends no job, so the run stops (the agent, continued, ends at once)"
    if launcher_stopped_s is not None and store_lost is None:
        cause = (f"the launcher of {who}, torchrun's agent of node {node} (pid {pid}), has been stopped (SIGSTOP) for "
                 f"{launcher_stopped_s:.0f} s during {where}: {stopped}")
    elif launcher_stopped_s is not None:
        cause = (f"the launcher of {who}, torchrun's agent of node {node} (pid {pid}), which serves the rendezvous "
                 f"store{at}, is stopped (SIGSTOP): the store {store_lost} during {where}; {stopped}")
    else:
        agent = "the torchrun agent that serves it"
        if store_host:
            host, agent_pid = store_host.get("host"), store_host.get("pid")
            agent = f"torchrun's agent of node {store_host['node']} ({host}, pid {agent_pid})"
        cause = (f"the rendezvous store{at} {store_lost} for {who} during {where}: {agent} is stopped or gone, and no "
                 "rank can tell another anything, so the run stops")
    return Ending(cause, culprits=culprits)


def stuck_after_verdict(run: RunView, limit_s: float) -> Ending:
    """Rank 0 did not get from the verdict to the final barrier within REPORT_S."""
    return Ending(f"{run.who} did not get from the verdict to the final barrier within {limit_s:.0f} s: stuck in the "
                  "end of the session (writing report.html or junit.xml, or another plugin's session finish or "
                  "unconfigure); the run stops", culprits=(run.world.rank,))


def sigterm(run: RunView, *, launcher_gone: bool) -> Ending:
    """SIGTERM reached this rank: its launcher died (killed outright), or it came from outside the run."""
    where = f"{run.who} during {run.where_now()}"
    if launcher_gone:
        cause = (f"stopped on {where}: its launcher (pid {run.outside.launcher.pid}, torchrun) is gone, killed "
                 "outright; every rank stops with it, so no rank can finish alone")
    else:
        cause = (f"stopped by SIGTERM on {where} (sent from outside the run: the job was cancelled or torchrun was "
                 "signalled)")
    return Ending(cause, interrupted=True)


def sigint(run: RunView) -> Ending:
    """The first SIGINT: pytest unwinds (KeyboardInterrupt) and writes what it can."""
    return Ending(f"interrupted by SIGINT on {run.who} during {run.where_now()}", kind=Kind.SIGNAL, interrupted=True,
                  unwinds=True)


def second_sigint(run: RunView) -> Ending:
    return Ending(f"interrupted by a second SIGINT on {run.who} during {run.where_now()}", interrupted=True)


def still_running_after_sigint(run: RunView) -> Ending:
    """SIGINT_GRACE_S after the first SIGINT the main thread has not unwound (blocked in C++)."""
    return Ending(f"still running {SIGINT_GRACE_S:.0f} s after SIGINT on {run.who} (blocked in {run.where_now()}); "
                  "ending the process", interrupted=True)



def pytest_stopped(run: RunView, exc: BaseException) -> Ending:
    """pytest.exit on this rank, or a KeyboardInterrupt (the signal watcher has said so already, unless it came
    some other way): pytest unwinds."""
    if isinstance(exc, pytest.exit.Exception):
        return Ending(f"pytest.exit({exc.msg!r}) on {run.who} during {run.where_now()}", culprits=(run.world.rank,),
                      interrupted=True, unwinds=True)
    return Ending(f"KeyboardInterrupt on {run.who} during {run.where_now()}", kind=Kind.SIGNAL, interrupted=True,
                  unwinds=True)


def internal_error(run: RunView, what: str) -> Ending:
    """An internal error of pytest or a plugin on this rank: pytest unwinds."""
    return Ending(f"internal error on {run.who} during {run.where_now()}: {what}", culprits=(run.world.rank,),
                  unwinds=True)


def end_not_run(run: RunView) -> Ending:
    """The session ended without deciding its verdict (a crash at its end): never accept."""
    return Ending(f"the end of the session did not run on {run.who} (see the error above)")
