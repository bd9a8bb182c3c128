"""How a run ends early on one rank, from any of three threads: the main one (a lost or departed peer
in a control exchange), the watchdog (a test past its time, a collective that can never complete) and
the signal watcher (SIGINT, SIGTERM, even while the main thread is blocked in C++).

Each ending records what happened, on which rank and host, and where every rank was (results.json on
rank 0, progress.jsonl, the rendezvous store for the other ranks, stderr), then ends the process with
one known code. ``ClusterGate`` (clustergate.run.session) is built on this.

The first cause is the headline: a rank that only sees the consequence (a peer gone, a signal torchrun
sent because a peer exited) reads in the store why every rank that left did so, and names the earliest
cause and the ranks that caused it (``failed_ranks``, results.json's ``error_ranks``) before its own view.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NoReturn

from clustergate.redact import Scrubber
from clustergate.results import RunRecord, write_json
from clustergate.run import control
from clustergate.run.control import Step
from clustergate.run.peers import Peers, main_thread_collective
from clustergate.run.progress import Progress
from clustergate.run.watchdog import EXIT_TIMEOUT
from clustergate.run.world import World

EXIT_LOST = EXIT_TIMEOUT
"""Exit status of a rank that ends the run early (a peer lost, a failed write): as a test past its time."""
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
SIGNAL_GRACE_S = 2.0
"""How long a rank that saw a peer go (or got SIGTERM) waits for every peer's word in the store before it
names the cause: torchrun signals every rank at once, and each says so within milliseconds; a rank that
says nothing by then died without a word (kill -9, a crash, os._exit)."""
SIGINT_GRACE_S = 20.0
"""After SIGINT pytest unwinds and writes what it can; a main thread blocked in C++ cannot, and the
process ends after this (torchrun's SIGKILL follows its SIGINT after 30 s)."""
BLOCKED_S = 10.0
"""A main thread this long in a collective while a peer has failed the phase and waits at its exchange:
that collective can never complete."""


class Endings:
    """The endings of a ``ClusterGate``; its state is the gate's."""

    world: World
    report_dir: Path
    run: RunRecord
    peers: Peers
    progress: Progress
    current: str | None
    phase: str | None
    lost: bool
    left: str | None
    finished_status: int | None
    _lock: threading.RLock
    _interrupted: bool
    _blocked: tuple[str, str, float] | None
    _signalled: str | None
    _parent: int
    _ending: threading.Lock

    @property
    def who(self) -> str:
        return f"rank {self.world.rank} ({self.world.host})"

    @property
    def results_path(self) -> Path:
        return self.report_dir / "results.json"

    def where_now(self) -> str:
        return f"{self.current} [{self.phase}]" if self.current else "the session"

    def leave(self, why: str, kind: str = "cause", culprits: list[int] | None = None,
              interrupted: bool = False) -> None:
        """This rank leaves the run before its end (interrupted, an internal error, pytest.exit)."""
        with self._lock:
            self.left = self.left or why
            self._fail(why, [self.world.rank] if culprits is None else culprits)
            if interrupted and self.current:
                self._mark_test(why, [self.world.rank] if culprits is None else culprits, interrupted=True)
        self.peers.leave(why.splitlines()[0], kind, culprits, interrupted)
        self._say(why)
        self._try(lambda: self.progress.event("run_error", nodeid=self.current, message=why))
        self._try(self._write_now)

    def _fail(self, error: str, culprits: list[int]) -> None:
        """The run-level error, with the ranks that caused it, unless an earlier one explains the ending."""
        if self.run.error is None:
            self.run.extra["error_ranks"] = sorted(set(culprits))
        self.run.fail(error)

    def _mark_test(self, message: str, culprits: list[int], interrupted: bool) -> None:
        entry = self.run.test(self.current)  # type: ignore[arg-type]
        if entry.outcome not in ("failed", "error", "interrupted"):
            entry.outcome = "interrupted" if interrupted else "failed"
        entry.note(message)
        if culprits and not entry.failed_ranks:
            entry.failed_ranks = sorted(set(culprits))

    def _say(self, message: str) -> None:
        sys.stderr.write(Scrubber.from_environment()(f"clustergate: {self.who}: {message}\n"))
        sys.stderr.flush()

    def _write_now(self) -> None:
        if self.world.is_leader:
            with self._lock:
                write_json(self.results_path, self.run.as_json())

    def _try(self, fn: Callable[[], None]) -> None:
        """Writing the record of an ending must not hide the ending itself."""
        try:
            fn()
        except Exception as exc:
            sys.stderr.write(f"clustergate: {self.who}: could not record the ending: {exc}\n")

    # ---- whose fault ---------------------------------------------------------------------
    def _blame(self, observed: str, culprits: list[int], *, grace_s: float,
               vanished: bool = False) -> tuple[str, list[int], bool]:
        """The ending's headline, the ranks that caused it and whether the test was interrupted.

        ``observed``/``culprits``: what this rank saw. An earlier cause another rank recorded comes first;
        with ``vanished`` (a peer's connection closed, or torchrun's SIGTERM) a peer that said nothing within
        ``grace_s`` died without a word and is the cause; then a signal (this rank's own first).
        """
        me, size = self.world.rank, self.world.world_size
        deadline = time.monotonic() + grace_s
        while True:
            known = self.peers.departures()
            said = {r: d for r, d in (known or {}).items() if r != me}
            silent = [r for r in range(size) if r != me and r not in said] if known is not None else []
            signals = [d for d in said.values() if d.get("kind") == "signal"]
            waiting_for_own = signals and self._signalled is None
            if (not silent and not waiting_for_own) or time.monotonic() >= deadline:
                break
            time.sleep(0.1)
        causes = sorted((d for d in said.values() if d.get("kind") == "cause"), key=lambda d: d.get("t", 0))
        first_signal = min((d.get("t", 0) for d in signals), default=float("inf"))
        if causes and causes[0].get("t", 0) <= first_signal:
            c = causes[0]
            return (f"{c['why']}\n  (then {observed[0].lower()}{observed[1:]})", list(c.get("culprits") or []),
                    bool(c.get("interrupted")))
        if vanished and silent:
            names = ", ".join(self.peers.who(r) for r in silent)
            described = self.peers.describe(self.current)
            return (f"{names} ended without a word during {self.where_now()} (killed, crashed or exited inside a "
                    "test: torchrun's summary gives its exit code)" + (f"; {described}" if described else "")
                    + f"\n  (then {observed[0].lower()}{observed[1:]})", silent, False)
        if self._signalled is not None:
            return self._signalled, [], True
        if signals:
            return min(signals, key=lambda d: d.get("t", 0))["why"], [], True
        return observed, culprits, False

    def _end(self, observed: str, status: int, culprits: list[int], *, grace_s: float = SIGNAL_GRACE_S,
             vanished: bool = False) -> NoReturn:
        headline, blamed, interrupted = self._blame(observed, culprits, grace_s=grace_s, vanished=vanished)
        self._die(headline, status, blamed, interrupted=interrupted,
                  kind="cause" if headline == observed else "consequence")

    def _exchange(self, step: Step, fn: Callable[[], Any]) -> Any:
        self.peers.at(str(step.tag))
        try:
            return fn()
        except control.ControlMismatch as exc:
            said = "; ".join(f"{self.peers.who(r)} at '{label}'" for r, label in enumerate(exc.labels))
            mine = exc.labels[self.world.rank]
            self._end(f"ranks are at different steps, so the run cannot go on: {said}", EXIT_LOST,
                      [r for r, label in enumerate(exc.labels) if label != mine] or self.peers.behind(self.current))
        except control.ControlMalformed as exc:
            self._die(f"{exc} during {self.where_now()}", EXIT_LOST, [exc.rank])
        except control.ControlLost as exc:
            described = self.peers.describe(self.current)
            if exc.timed_out:
                late = [r for r in self.peers.elsewhere(str(step.tag)) if r != self.world.rank]
                names = ", ".join(self.peers.who(r) for r in late) or "a peer rank"
                self._end(f"{names} did not reach '{step}' within {exc.waited_s:.0f} s of {self.who} (stuck, or "
                          f"slower than every limit allows)" + (f"; {described}" if described else ""), EXIT_LOST,
                          late or self.peers.behind(self.current), grace_s=0.0)
            self._end(f"{exc} during {self.where_now()}" + (f"; {described}" if described else ""), EXIT_LOST,
                      self.peers.behind(self.current), vanished=True)

    def _on_timeout(self, nodeid: str, limit_s: float) -> None:
        msg = (f"{nodeid} did not finish within {limit_s:.0f} s on {self.who}; the run stops (raise the limit "
               "with --test-timeout or @pytest.mark.time_limit if the workload is just slow)")
        described = self.peers.describe(nodeid)
        if described:
            msg += f"\n  {described} (a rank that finished setup but not call is stuck in the test body)"
        headline, blamed, interrupted = self._blame(msg, self.peers.behind(nodeid), grace_s=0.0)
        self._record_ending(headline, blamed, interrupted=interrupted,
                            kind="cause" if headline == msg else "consequence")

    def _check_blocked(self) -> None:
        """Watchdog poll: a collective that a peer, failed, skipped or gone, will never join."""
        nodeid, phase = self.current, self.phase
        call = main_thread_collective() if self.world.launched and nodeid and phase else None
        if call is None or nodeid is None or phase is None:
            self._blocked = None
            return
        if self._blocked is None or self._blocked[:2] != (nodeid, phase):
            self._blocked = (nodeid, phase, time.monotonic())
            return
        waited = time.monotonic() - self._blocked[2]
        if waited < BLOCKED_S:
            return
        early = self.peers.waiting_after_failure(Step(nodeid, phase).tag)
        if early is not None and early["rank"] != self.world.rank:
            did = {"skipped": "skipped", "passed": "finished"}.get(early.get("outcome", "failed"), "failed")
            self._die(f"{nodeid} [{phase}]: {self.peers.who(early['rank'])} {did} it ({early['message']}) and "
                      f"waits for the others, while {self.who} has been blocked for {waited:.0f} s in {call}, a "
                      "collective that needs every rank: it can never complete, so the run stops", EXIT_LOST,
                      [early["rank"]])
        gone = {r: d for r, d in (self.peers.departures() or {}).items() if r != self.world.rank}
        if gone:
            self._end(f"{self.who} has been blocked for {waited:.0f} s in {call} during {nodeid} [{phase}], a "
                      f"collective that needs {', '.join(self.peers.who(r) for r in sorted(gone))}, which left the "
                      "run: it can never complete, so the run stops", EXIT_LOST, sorted(gone), grace_s=0.0)

    def _on_signal(self, signum: int) -> None:
        """From the signal watcher thread, even while the main thread is blocked in a collective."""
        if self.finished_status is not None:
            # A peer exited first and torchrun is stopping the rest: the record is already final.
            sys.stdout.flush()
            os._exit(self.finished_status)
        where = f"{self.who} during {self.where_now()}"
        if signum == signal.SIGTERM:
            parent_gone = self._launcher_gone()
            if parent_gone:
                message = (f"stopped on {where}: its launcher (pid {self._parent}, torchrun) is gone, killed "
                           "outright; every rank stops with it, so no rank can finish alone")
            else:
                message = (f"stopped by SIGTERM on {where} (sent from outside the run: the job was cancelled or "
                           "torchrun was signalled)")
            self._signalled = message
            if parent_gone:  # every rank got it from the kernel; the store went with the launcher
                self._die(message, EXIT_SIGTERM, [], interrupted=True)
            self.peers.leave(message, "signal", [], interrupted=True)
            self._end(message, EXIT_SIGTERM, [], vanished=True)
        if self._interrupted:
            self._die(f"interrupted by a second SIGINT on {where}", EXIT_SIGINT, [], interrupted=True)
        self._interrupted = True
        self._signalled = f"interrupted by SIGINT on {where}"
        self.leave(self._signalled, "signal", [], interrupted=True)
        timer = threading.Timer(SIGINT_GRACE_S, lambda: self._die(
            f"still running {SIGINT_GRACE_S:.0f} s after SIGINT on {self.who} (blocked in {self.where_now()}); "
            "ending the process", EXIT_SIGINT, [], interrupted=True))
        timer.daemon = True
        timer.start()

    def _launcher_gone(self) -> bool:
        """Whether this rank's parent (torchrun's agent) has died. The kernel re-parents a rank one thread at a
        time and signals it at the first: this thread may still see the old parent for a moment."""
        for _ in range(5):
            if os.getppid() != self._parent:
                return True
            time.sleep(0.05)
        return False

    def _record_ending(self, message: str, failed_ranks: list[int] | None = None, *, interrupted: bool = False,
                       kind: str = "cause") -> None:
        culprits = sorted(set(failed_ranks or []))
        with self._lock:
            self.lost = True
            self._fail(message, culprits)
            if self.current:
                self._mark_test(message, culprits, interrupted)
        self.peers.leave(message.splitlines()[0], kind, culprits, interrupted)
        self._say(message)
        self._try(lambda: self.progress.event("run_error", nodeid=self.current, message=message))
        self._try(self._write_now)

    def _die(self, message: str, status: int, failed_ranks: list[int] | None = None, *,
             interrupted: bool = False, kind: str = "cause") -> NoReturn:
        if not self._ending.acquire(blocking=False):
            while True:  # another thread is ending the process already, with its own record
                time.sleep(60)
        self._record_ending(message, failed_ranks, interrupted=interrupted, kind=kind)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(status)
