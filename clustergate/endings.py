"""How a run ends early on one rank, from any of three threads: the main one (a lost or departed peer
in a control exchange), the watchdog (a test past its time, a collective that can never complete) and
the signal watcher (SIGINT, SIGTERM, even while the main thread is blocked in C++).

Each ending records what happened, on which rank and host, and where every rank was (results.json on
rank 0, progress.jsonl, the rendezvous store for the other ranks, stderr), then ends the process with
one known code. ``ClusterGate`` (clustergate.session) is built on this.
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

from clustergate import control
from clustergate.control import Step
from clustergate.peers import Peers, main_thread_collective
from clustergate.progress import Progress
from clustergate.redact import Scrubber
from clustergate.results import RunRecord, write_json
from clustergate.watchdog import EXIT_TIMEOUT
from clustergate.world import World

EXIT_LOST = EXIT_TIMEOUT
"""Exit status of a rank that ends the run early (a peer lost, a failed write): as a test past its time."""
EXIT_SIGINT = 128 + signal.SIGINT
EXIT_SIGTERM = 128 + signal.SIGTERM
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

    @property
    def who(self) -> str:
        return f"rank {self.world.rank} ({self.world.host})"

    @property
    def results_path(self) -> Path:
        return self.report_dir / "results.json"

    def where_now(self) -> str:
        return f"{self.current} [{self.phase}]" if self.current else "the session"

    def leave(self, why: str) -> None:
        """This rank leaves the run before its end (interrupted, an internal error, pytest.exit)."""
        with self._lock:
            self.left = self.left or why
            self.run.fail(why)
        self.peers.leave(why)
        self._say(why)
        self._try(lambda: self.progress.event("run_error", nodeid=self.current, message=why))
        self._try(self._write_now)

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

    def _exchange(self, fn: Callable[[], Any]) -> Any:
        try:
            return fn()
        except control.ControlMismatch as exc:
            said = "; ".join(f"{self.peers.who(r)} at '{label}'" for r, label in enumerate(exc.labels))
            self._die(f"ranks are at different steps, so the run cannot go on: {said}", EXIT_LOST,
                      self.peers.behind(self.current))
        except control.ControlLost as exc:
            described = self.peers.describe(self.current)
            self._die(f"{exc} during {self.where_now()}" + (f"; {described}" if described else "")
                      + "; torchrun's summary names the first rank that failed", EXIT_LOST,
                      self.peers.behind(self.current))

    def _on_timeout(self, nodeid: str, limit_s: float) -> None:
        msg = (f"{nodeid} did not finish within {limit_s:.0f} s on {self.who}; the run stops (raise the limit "
               "with --test-timeout or @pytest.mark.time_limit if the workload is just slow)")
        described = self.peers.describe(nodeid)
        if described:
            msg += f"\n  {described} (a rank that finished setup but not call is stuck in the test body)"
        self._record_ending(msg, self.peers.behind(nodeid))

    def _check_blocked(self) -> None:
        """Watchdog poll: a collective that a peer, failed and waiting at its exchange, will never join."""
        nodeid, phase = self.current, self.phase
        call = main_thread_collective() if self.world.launched and nodeid and phase else None
        if call is None or nodeid is None or phase is None:
            self._blocked = None
            return
        if self._blocked is None or self._blocked[:2] != (nodeid, phase):
            self._blocked = (nodeid, phase, time.monotonic())
            return
        waited = time.monotonic() - self._blocked[2]
        failed = self.peers.waiting_after_failure(Step(nodeid, phase).tag) if waited >= BLOCKED_S else None
        if failed is None or failed["rank"] == self.world.rank:
            return
        self._die(f"{nodeid} [{phase}]: {self.peers.who(failed['rank'])} failed it ({failed['message']}) and "
                  f"waits for the others, while {self.who} has been blocked for {waited:.0f} s in {call}, a "
                  "collective that needs every rank: it can never complete, so the run stops", EXIT_LOST,
                  [failed["rank"]])

    def _on_signal(self, signum: int) -> None:
        """From the signal watcher thread, even while the main thread is blocked in a collective."""
        if self.finished_status is not None:
            # A peer exited first and torchrun is stopping the rest: the record is already final.
            sys.stdout.flush()
            os._exit(self.finished_status)
        where = f"{self.who} during {self.where_now()}"
        if signum == signal.SIGTERM:
            described = self.peers.describe(self.current)
            self._die(f"stopped by SIGTERM on {where} (torchrun stops every rank once one has exited or "
                      "failed: its summary names the first)" + (f"; {described}" if described else ""),
                      EXIT_SIGTERM, self.peers.behind(self.current))
        if self._interrupted:
            self._die(f"interrupted by a second SIGINT on {where}", EXIT_SIGINT)
        self._interrupted = True
        self.leave(f"interrupted by SIGINT on {where}")
        timer = threading.Timer(SIGINT_GRACE_S, lambda: self._die(
            f"still running {SIGINT_GRACE_S:.0f} s after SIGINT on {self.who} (blocked in {self.where_now()}); "
            "ending the process", EXIT_SIGINT))
        timer.daemon = True
        timer.start()

    def _record_ending(self, message: str, failed_ranks: list[int] | None = None) -> None:
        with self._lock:
            self.lost = True
            self.run.fail(message)
            if self.current:
                entry = self.run.test(self.current)
                entry.outcome = "failed"
                entry.note(message)
                if failed_ranks and not entry.failed_ranks:
                    entry.failed_ranks = sorted(failed_ranks)
        self.peers.leave(message.splitlines()[0])
        self._say(message)
        self._try(lambda: self.progress.event("run_error", nodeid=self.current, message=message))
        self._try(self._write_now)

    def _die(self, message: str, status: int, failed_ranks: list[int] | None = None) -> NoReturn:
        self._record_ending(message, failed_ranks)
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(status)
