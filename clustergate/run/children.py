"""The processes a test starts end with the run.

A test may fork (``os.fork``, multiprocessing's fork) or start programs of its own, and leave them running. Two
things follow, and this module owns both:

- A forked child is a copy of the rank: it would inherit the run's signal handling (the watcher's SIGTERM handler
  does nothing in the main thread, its thread not being copied, so the child ignored SIGTERM; the wakeup pipe it
  writes to is the rank's, so a signal to the child woke the rank's watcher as if the rank had been signalled) and
  the signal on which the rank writes its stacks into its own file. ``watch`` arms ``os.register_at_fork``: in the
  child the run's signals are given back as they were before the run (``SignalWatcher.close``); the report
  directory's lock is not kept either (``clustergate.record.reportdir``). In the rank, every child it forks is
  remembered with its start time.
- At the run's end (``end_left``, from the run's one way out) every process the rank started that is still there
  is ended: its descendants (by parent, from /proc: ``keeper.stat``), and every process in the session or process
  group of one of them or of a child it forked (a daemon that forked twice has left its parent, not the session
  its first child made). The rank's own session and group count only where the rank leads them: torchrun starts
  each rank in a session of its own, so everything in it is the rank's; under plain pytest they are the shell's.
  SIGCONT and SIGTERM first (a stopped process acts on nothing else), SIGKILL after ``CHILDREN_GRACE_S``. The
  rank's keeper is spared: it ignores SIGTERM by design and ends with its rank.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import threading
import time
from pathlib import Path
from typing import Any

from clustergate.common.procfs import command_line, process_start
from clustergate.run.interrupts import STACK_SIGNAL
from clustergate.run.keeper import alive, stat
from clustergate.run.limits import CHILDREN_GRACE_S

KILLED_S = 1.0
"""How long a killed process is given to be gone (the kernel frees it within milliseconds)."""

_watcher: Any = None
"""The run's signal watcher, whose signals a forked child gives back."""
_forked: dict[int, float | None] = {}
"""Every child this process forked: its pid and start time (a pid reused later by another process is not it)."""
_spared: set[int] = set()
_armed = False


def watch(watcher: Any) -> None:
    """Arm the at-fork handlers (once per process) for the run whose signals ``watcher`` holds."""
    global _watcher, _armed
    _watcher = watcher
    if not _armed and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_parent=_remember_child, after_in_child=_leave_the_run)
        _armed = True


def spare(pid: int) -> None:
    """A process of the run's own that ends by itself with the rank (its keeper)."""
    _spared.add(pid)


def _remember_child() -> None:
    """In the rank, right after a fork: the children of the forking thread, the new one among them."""
    with contextlib.suppress(OSError, ValueError):
        listed = Path(f"/proc/self/task/{threading.get_native_id()}/children").read_text().split()
        for pid in map(int, listed):
            if pid not in _forked:
                _forked[pid] = process_start(pid)


def _leave_the_run() -> None:
    """In a forked child: the run's signals back as they were before it, its stack signal unregistered; what the
    rank remembered is not the child's."""
    global _watcher
    _forked.clear()
    _spared.clear()
    if _watcher is not None:
        with contextlib.suppress(Exception):  # a fork must never fail for this
            _watcher.close()
        _watcher = None
    with contextlib.suppress(Exception):
        faulthandler.unregister(STACK_SIGNAL)


def _ids(pid: int) -> tuple[int, int] | None:
    """A process's session and process group; None where it is gone."""
    try:
        return os.getsid(pid), os.getpgid(pid)
    except OSError:
        return None


def left_running() -> list[int]:
    """Every process this rank started that is still there (not a zombie), but its spared ones and itself."""
    me = os.getpid()
    table: dict[int, tuple[int, int, int]] = {}  # pid -> parent, session, group
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        pid = int(entry)
        found, ids = stat(pid), _ids(pid)
        if found is not None and found[0] not in ("Z", "X") and ids is not None:
            table[pid] = (found[1], *ids)
    children: dict[int, list[int]] = {}
    for pid, (parent, _, _) in table.items():
        children.setdefault(parent, []).append(pid)
    descendants, todo = set(), [me]
    while todo:
        for kid in children.get(todo.pop(), []):
            if kid not in descendants:
                descendants.add(kid)
                todo.append(kid)
    # Sessions and groups that are the rank's: those of the children it forked (a pid still used as a session or
    # group is never given to another process; one reused since the fork has another start time), and of every
    # descendant.
    keys = {pid for pid, started in _forked.items()
            if pid not in table or started is None or process_start(pid) == started}
    keys |= descendants | {i for pid in descendants for i in table[pid][1:]}
    own = _ids(me)
    if own is None or own[0] != me:  # not its session's leader (plain pytest): its session and group are a shell's
        keys -= {me, *(own or ())}
    ended = descendants | {pid for pid, (_, sid, pgid) in table.items() if sid in keys or pgid in keys}
    return sorted(ended - _spared - {me})


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
    except OSError:
        return "?"


COMPILE_WORKER = "/torch/_inductor/compile_worker/"
"""In the command line of torch.compile's compile-worker pool (its process and the workers it forks): the run told
that pool to stop when the tests were over (``clustergate.run.outside.release_compile_workers``) without waiting
for it, so one still there at the end is the run's own, not something a test left."""


def _compile_worker(pid: int) -> bool:
    return COMPILE_WORKER in command_line(pid, limit=None)


def end_left(grace_s: float = CHILDREN_GRACE_S) -> list[str]:
    """End every process this rank started that is still there (``left_running``): SIGCONT and SIGTERM, SIGKILL
    after ``grace_s``; returns each as "pid N (name)", but torch.compile's compile workers, which are ended
    without a word (the run stopped them itself: ``COMPILE_WORKER``)."""
    try:
        pids = left_running()
    except OSError:
        return []  # no /proc: nothing can be found
    named = [f"pid {pid} ({_name(pid)})" for pid in pids if not _compile_worker(pid)]
    for pid in pids:
        for signum in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
    pids = _wait_gone(pids, grace_s)
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    _wait_gone(pids, KILLED_S)  # gone before the rank is: what they held (the report directory's lock) is free
    return named


def _wait_gone(pids: list[int], seconds: float) -> list[int]:
    """Those of ``pids`` still there after up to ``seconds``."""
    deadline = time.monotonic() + seconds
    while (pids := [pid for pid in pids if alive(pid)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return pids
