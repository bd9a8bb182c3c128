"""Every process the suite's own tests start ends with the test process that started it, however that ends.

A test process (and the waited-out jobs' runner, tests/helpers/waited_out_runs.py) adds a tag of its own to its
environment (``OWNER_ENV``: the tags of the test processes above it, then its own), which every process started from it
inherits: pytester's and forked runs, xdist's workers, torchrun's agents, their ranks (each in a session of its own,
so no process group holds them), a rank's keeper, and a rank whose launcher died before it (re-parented to init, out
of reach of a walk down the process tree). The tag, read from /proc/PID/environ, finds them all; ``end`` kills every
process that carries it.

The test process ends its own as it exits (``adopt``: an exit handler, a pytest session's end, and SIGTERM and
SIGHUP, which would end it without either: a kill, a CI timeout, a closed terminal); Ctrl-C unwinds to the same end.
Only SIGKILL of the test process itself escapes: the runner watches the test session's first process for that
(``watch``).
"""

from __future__ import annotations

import atexit
import contextlib
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from clustergate.run.keeper import alive  # running, stopped or asleep; a zombie is not

OWNER_ENV = "SUITE_TESTS_OWNER"
"""The variable that carries a test process's tag to every process started from it."""


def new_tag() -> str:
    return f"{os.getpid()}-{uuid.uuid4().hex[:12]}"


def chained(tag: str, chain: str | None = None) -> str:
    """``OWNER_ENV``'s value for a process of ``tag`` started under ``chain`` (the tags above it)."""
    return f"{chain}:{tag}" if chain else tag


def tagged(tag: str) -> list[int]:
    """Every process but this one whose environment carries ``tag``."""
    prefix, me, found = f"{OWNER_ENV}=".encode(), os.getpid(), []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        with contextlib.suppress(OSError):  # gone meanwhile, or not ours to read
            for var in (entry / "environ").read_bytes().split(b"\0"):
                if var.startswith(prefix) and tag in var[len(prefix):].decode(errors="replace").split(":"):
                    found.append(int(entry.name))
    return found


def end(tag: str) -> list[int]:
    """SIGKILL every process that carries ``tag``, until none is left (one may start another while the first are
    killed); the processes killed."""
    killed: list[int] = []
    for _ in range(20):
        pids = [pid for pid in tagged(tag) if alive(pid)]
        if not pids:
            break
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        killed += pids
        time.sleep(0.05)
    return killed


def _ending(tag: str) -> Any:
    def handler(signum: int, frame: Any) -> None:
        end(tag)
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)  # and this process ends as the signal would have ended it
    return handler


def adopt(tag: str | None = None) -> str:
    """Add ``tag`` (a new one unless given) to this process's environment, and end every process that carries it when
    this one exits or is sent SIGTERM or SIGHUP (where no other handler was set). Main thread only."""
    tag = tag or new_tag()
    os.environ[OWNER_ENV] = chained(tag, os.environ.get(OWNER_ENV))
    atexit.register(end, tag)
    for signum in (signal.SIGTERM, signal.SIGHUP):
        if signal.getsignal(signum) == signal.SIG_DFL:
            signal.signal(signum, _ending(tag))
    return tag


def session_chain() -> str | None:
    """The tags of the test session's first process and those above it (an xdist worker's is its controller's): a
    process that serves the whole session (the runner) must outlive the worker that happened to start it."""
    chain = os.environ.get(OWNER_ENV)
    if chain and os.environ.get("PYTEST_XDIST_WORKER"):
        return chain.rpartition(":")[0] or None
    return chain


def session_pid() -> int:
    """The test session's first process: an xdist worker's controller, else this one."""
    return os.getppid() if os.environ.get("PYTEST_XDIST_WORKER") else os.getpid()


def watch(pid: int, tag: str) -> None:
    """End every process of ``tag`` (this one too) once ``pid`` has gone: a runner whose test session was killed
    outright (SIGKILL) leaves nothing behind."""
    def watching() -> None:
        while alive(pid):
            time.sleep(0.5)
        end(tag)
        os._exit(1)
    threading.Thread(target=watching, name="tests-owner-watch", daemon=True).start()
