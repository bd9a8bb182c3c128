"""Where every rank is, kept in the rendezvous store (torchrun's agent holds it, so it outlives any rank).

A rank that times out, is stopped or loses a peer reads it to say which rank was where, which ranks
left the run and why, and which rank failed a phase and waits for the others. It is a diagnostic
aid: a store that cannot be reached never breaks a run (every access is guarded).

The run reaches the store through a client of its own (``RendezvousStore``), every call bounded by STORE_CALL_S:
torch's client waits as long as the agent that serves the store is stopped. A store that does not answer in time is
lost for the run: the run is told once (``on_lost``) and ends, naming the agent; every later call fails at once.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from clustergate.run.interrupts import listens_on
from clustergate.run.limits import STORE_CALL_S
from clustergate.run.ranks.world import World
from clustergate.secrets.redact import outgoing
from workloads.common import wait_for_collectives


class StoreLost(RuntimeError):
    """The rendezvous store did not answer (its agent is stopped or gone): nothing more is read or written there."""


class RendezvousStore:
    """The rendezvous store as the run uses it: each call runs in a thread of its own and is given up on after
    ``timeout_s`` (torch's client has no timeout for a server that stops answering); the first call given up on, or
    refused (the agent gone), loses the store for the run: ``lost`` says why, ``on_lost`` is called once (from the
    thread that found it), and every later call raises StoreLost at once."""

    def __init__(self, client: Any, where: str = "", timeout_s: float = STORE_CALL_S) -> None:
        self.client = client
        self.where = where
        """Where the store is served ('127.0.0.1:29500'), for the message that names it."""
        self.timeout_s = timeout_s
        self.lost: str | None = None
        self.on_lost: Callable[[str], None] | None = None
        self._once = threading.Lock()
        self._calls: queue.SimpleQueue[tuple[Callable[[], Any], dict[str, Any], threading.Event]] = queue.SimpleQueue()
        threading.Thread(target=self._serve, name="clustergate-store", daemon=True).start()

    def _serve(self) -> None:
        while True:
            fn, box, done = self._calls.get()
            try:
                box["value"] = fn()
            except Exception as exc:  # handed to the caller
                box["error"] = exc
            done.set()

    def _call(self, what: str, fn: Callable[[], Any]) -> Any:
        if self.lost is not None:
            raise StoreLost(self.lost)
        box: dict[str, Any] = {}
        done = threading.Event()
        self._calls.put((fn, box, done))
        if not done.wait(self.timeout_s):
            self._lose(f"did not answer within {self.timeout_s:.0f} s (its {what})")
        error = box.get("error")
        if isinstance(error, dist.DistNetworkError):  # the connection refused or reset: the agent is gone
            self._lose(f"refused the connection ({str(error).splitlines()[0][:120]})")
        if error is not None:
            raise error
        return box.get("value")

    def _lose(self, why: str) -> None:
        with self._once:
            first = self.lost is None
            if first:
                self.lost = why
        if first and self.on_lost is not None:
            self.on_lost(why)
        raise StoreLost(self.lost)

    def set(self, key: str, value: str | bytes) -> None:
        self._call("set", lambda: self.client.set(key, value))

    def get(self, key: str) -> bytes:
        return self._call("get", lambda: self.client.get(key))  # type: ignore[no-any-return]

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", lambda: self.client.check(keys)))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._call("multi_get", lambda: self.client.multi_get(keys))  # type: ignore[no-any-return]

STEPS = ("started", "finished setup of", "finished call of", "finished teardown of")
"""A rank's progress through a test, in order (the index is how far it got)."""


def _store(world: World) -> RendezvousStore | None:
    """A client of this rank's own on the rendezvous store torchrun's agent serves (MASTER_ADDR:MASTER_PORT), under
    a prefix of this attempt of the job (torchrun keeps its store across the restarts it makes); None where the run
    is not supervised or the store cannot be reached."""
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not world.supervised or not addr or not port:
        return None
    try:
        client = dist.TCPStore(addr, int(port), is_master=False, timeout=timedelta(seconds=STORE_CALL_S),
                               wait_for_workers=False)
    except Exception:
        return None
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    return RendezvousStore(dist.PrefixStore(f"clustergate/attempt_{attempt}", client), where=f"{addr}:{port}")


class Peers:
    def __init__(self, world: World, store: Any = None) -> None:
        """``store``: the rendezvous store's client (default: a client of this rank's own, ``_store``); any other
        is used through a ``RendezvousStore`` too."""
        self.world = world
        if store is not None and not isinstance(store, RendezvousStore):
            store = RendezvousStore(store)
        self._store = store if store is not None else _store(world)
        self.hosts: list[str | None] = [world.host if r == world.rank else None for r in range(world.world_size)]
        """Each rank's host, once every rank's identity is known (before, only this rank's own)."""
        self.gpus: list[str | None] = [None] * world.world_size
        """Each rank's GPU as a message names it ('gpu 3 serial 1650...'), once every rank's identity is known."""
        self.store_host: dict[str, Any] | None = None
        """The node whose launcher (torchrun's agent) serves the rendezvous store: {"node", "host", "pid"}, said by a
        rank of that node as it starts (its launcher holds the store's port) and read by every rank once they have all
        started (``learn_store_host``): a rank that later finds the store unanswered names that node."""
        port = os.environ.get("MASTER_PORT", "")
        if self._store is not None and port.isdigit() and listens_on(os.getppid(), int(port)):
            self.store_host = {"node": world.node_rank, "host": world.host, "pid": os.getppid()}
            self._set("store-host", self.store_host)
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

    def learn_store_host(self) -> None:
        """``store_host``, as the rank whose launcher serves the store said it as it started (called once every rank
        has started: the identities' exchange)."""
        if self.store_host is None:
            said = self._get("store-host", None)
            self.store_host = said if isinstance(said, dict) else None

    def who(self, rank: int, gpu: bool = False) -> str:
        """'rank 3 (node-a)'; with ``gpu``, its GPU too where it has one: 'rank 3 (node-a, gpu 3 serial 1650...)'."""
        host = self.hosts[rank] if 0 <= rank < len(self.hosts) else None
        label = self.gpus[rank] if gpu and 0 <= rank < len(self.gpus) else None
        where = ", ".join(filter(None, [host, label]))
        return f"rank {rank} ({where})" if where else f"rank {rank}"

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
    def store(self) -> RendezvousStore | None:
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
        if name.endswith("clustergate/run/ranks/control.py"):
            return None
        if "/torch/distributed/" in name or frame.f_code is wait_for_collectives.__code__:
            call = call or frame.f_code.co_name  # the innermost: the collective itself
            caller = frame.f_back  # the outermost one's caller: the test's own code
        frame = frame.f_back
    if call is None:
        return None
    where = f" called at {caller.f_code.co_filename.rsplit('/', 1)[-1]}:{caller.f_lineno}" if caller else ""
    return f"{call}{where}"
