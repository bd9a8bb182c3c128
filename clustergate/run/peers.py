"""Where every rank is, kept in the rendezvous store (torchrun's agent holds it, so it outlives any rank).

A rank that times out, is stopped or loses a peer reads it to say which rank was where, which ranks
left the run and why, and which rank failed a phase and waits for the others. It is a diagnostic
aid: a store that cannot be reached never breaks a run (every access is guarded).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

import torch.distributed as dist

from clustergate.redact import outgoing
from clustergate.run.world import World
from workloads.common import wait_for_collectives

STEPS = ("started", "finished setup of", "finished call of", "finished teardown of")
"""A rank's progress through a test, in order (the index is how far it got)."""


def _store(world: World) -> Any:
    if not world.launched or not dist.is_initialized():
        return None
    try:
        return dist.distributed_c10d._get_default_store()
    except Exception:
        return None


class Peers:
    def __init__(self, world: World, store: Any = None) -> None:
        """``store``: the rendezvous store's client (default: the default process group's)."""
        self.world = world
        self._store = store if store is not None else _store(world)
        self.hosts: list[str | None] = [world.host if r == world.rank else None for r in range(world.world_size)]
        """Each rank's host, once every rank's identity is known (before, only this rank's own)."""
        # Every rank's keys exist before any peer reads them (a get of a missing key would block).
        self._set(f"state/{world.rank}", {"test": None, "step": -1, "text": "starting the session"})
        self._set(f"left/{world.rank}", None)
        self._set(f"at/{world.rank}", "")
        self._set(f"process/{world.rank}", {"pid": os.getpid(), "launcher": os.getppid(), "host": world.host})

    def _set(self, key: str, value: Any) -> None:
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.set(f"clustergate/{key}", json.dumps(outgoing(value)))  # other ranks read it

    def _get(self, key: str, default: Any) -> Any:
        if self._store is None:
            return default
        try:
            if not self._store.check([f"clustergate/{key}"]):
                return default
            return json.loads(self._store.get(f"clustergate/{key}").decode())
        except Exception:
            return default

    def who(self, rank: int) -> str:
        host = self.hosts[rank] if 0 <= rank < len(self.hosts) else None
        return f"rank {rank} ({host})" if host else f"rank {rank}"

    # ---- this rank says ------------------------------------------------------------------------
    def mark(self, step: int, nodeid: str) -> None:
        self._set(f"state/{self.world.rank}", {"test": nodeid, "step": step, "text": f"{STEPS[step]} {nodeid}"})

    def at(self, label: str) -> None:
        """This rank waits in the control exchange ``label`` (a peer that times out there names the ranks
        that are elsewhere)."""
        self._set(f"at/{self.world.rank}", label)

    def departed(self, why: str, kind: str = "cause", culprits: list[int] | None = None,
              interrupted: bool = False) -> None:
        """This rank leaves the run. ``kind``: "cause" (it starts the ending: pytest.exit, an error, a test
        past its time), "signal" (SIGINT or SIGTERM reached it) or "consequence" (it saw another rank go).
        ``culprits``: the ranks that caused it; ``interrupted``: the test was interrupted, not failed."""
        if self._get(f"left/{self.world.rank}", None):
            return  # the first reason stays: later ones follow from it
        self._set(f"left/{self.world.rank}", {"rank": self.world.rank, "why": why, "kind": kind,
                                              "culprits": [self.world.rank] if culprits is None else culprits,
                                              "interrupted": interrupted, "t": time.time()})

    def arrived_early(self, tag: int, outcome: str, said: str) -> None:
        """This rank failed or skipped a phase and goes to its exchange: a peer blocked in a collective it
        needs learns that it waits in vain, and why (``said``: ``PhaseOutcome.said``)."""
        self._set(f"failed/{tag}", {"rank": self.world.rank, "outcome": outcome, "message": said[:300]})

    # ---- what the others said --------------------------------------------------------------
    def waiting_after_failure(self, tag: int) -> dict[str, Any] | None:
        return self._get(f"failed/{tag}", None)

    def departures(self) -> dict[int, dict[str, Any]] | None:
        """Why each rank that left the run left (rank -> its record); None when the store cannot be read
        (torchrun's agent, which holds it, is gone): then nothing is known of the others."""
        if self._store is None:
            return None
        out = {}
        try:
            for r in range(self.world.world_size):
                key = f"clustergate/left/{r}"
                left = json.loads(self._store.get(key).decode()) if self._store.check([key]) else None
                if isinstance(left, dict):
                    out[r] = left
        except Exception:
            return None
        return out

    @property
    def store(self) -> Any:
        """The rendezvous store's client (None without one)."""
        return self._store

    def beside(self, ranks: tuple[int, ...]) -> dict[int, int]:
        """Those of ``ranks`` that run beside this rank (the same host, the same launcher): rank -> process id."""
        mine = self._get(f"process/{self.world.rank}", None)
        if not mine:
            return {}
        out = {}
        for r in ranks:
            theirs = self._get(f"process/{r}", None)
            if theirs and r != self.world.rank and (theirs.get("host"), theirs.get("launcher")) == \
                    (mine.get("host"), mine.get("launcher")):
                out[r] = int(theirs["pid"])
        return out

    def siblings(self, ranks: tuple[int, ...]) -> list[int]:
        """The process ids of those of ``ranks`` that run beside this rank: the same host, the same launcher."""
        return list(self.beside(ranks).values())

    def elsewhere(self, label: str) -> list[int]:
        """The ranks not waiting in the exchange ``label``."""
        return [r for r in range(self.world.world_size) if self._get(f"at/{r}", "") != label]

    def states(self) -> list[dict[str, Any]]:
        return [{"rank": r, **self._get(f"state/{r}", {"test": None, "step": -1, "text": "unknown"}),
                 "left": (self._get(f"left/{r}", None) or {}).get("why", "")} for r in range(self.world.world_size)]

    def describe(self, nodeid: str | None = None) -> str:
        """Which ranks did not get as far as the others in ``nodeid``, each rank's last step, and why any
        rank left: for the message of an ending."""
        if self._store is None:
            return ""
        behind = self.behind(nodeid) if nodeid else []
        parts = [f"{self.who(s['rank'])} last {s['text']}" + (f", left: {s['left']}" if s["left"] else "")
                 for s in self.states()]
        lagging = f"{', '.join(self.who(r) for r in behind)} did not get as far as the others; " \
            if 0 < len(behind) < self.world.world_size else ""
        return f"{lagging}each rank's last step: " + "; ".join(parts)

    def behind(self, nodeid: str | None) -> list[int]:
        """The ranks that got least far in ``nodeid`` (all ranks when they are level or nothing is known)."""
        everyone = list(range(self.world.world_size))
        if self._store is None or nodeid is None:
            return [self.world.rank]
        states = self.states()
        left = [s["rank"] for s in states if s["left"]]
        if left:
            return left
        progress = {s["rank"]: s["step"] if s["test"] == nodeid else -1 for s in states}
        least = min(progress.values())
        slow = [r for r, p in progress.items() if p == least]
        return slow if len(slow) < len(everyone) else everyone


def main_thread_collective() -> str | None:
    """Where the main thread is, if it is inside a torch.distributed call (not one of the plugin's own
    exchanges): 'all_reduce called at conftest.py:12'. None otherwise."""
    frame = sys._current_frames().get(threading.main_thread().ident or -1)
    call, caller = None, None
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if name.endswith("clustergate/run/control.py"):
            return None
        if "/torch/distributed/" in name or frame.f_code is wait_for_collectives.__code__:
            call = call or frame.f_code.co_name  # the innermost: the collective itself
            caller = frame.f_back  # the outermost one's caller: the test's own code
        frame = frame.f_back
    if call is None:
        return None
    where = f" called at {caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}" if caller else ""
    return f"{call}{where}"
