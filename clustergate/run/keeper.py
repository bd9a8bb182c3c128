"""A rank's keeper: a small process of its own that continues the rank once it has been stopped too long.

A stopped process (SIGSTOP, state ``T`` in /proc) runs nothing, not even a signal handler: torchrun's SIGTERM and
the parent-death signal stay pending, and a rank alone on its node has no sibling to continue it. Its agent
never learns that the other nodes' ranks have ended (it watches its own workers only), so without a keeper the
rank and its agent stay for good (or until the agent's SIGKILL, 30 s after a SIGTERM the rank could not act
on). The keeper reads the rank's state every ``POLL_S``; once the rank has been
stopped for ``stopped_s`` it sends SIGCONT: the rank's liveness thread then finds it was frozen and ends the
run naming it, or a pending SIGTERM ends it. A rank still there ``grace_s`` later (stuck in C) is killed. The
keeper ends with its rank (the kernel kills it when the rank dies: PR_SET_PDEATHSIG).

Run by the rank as ``python -I -S keeper.py PID STOPPED_S GRACE_S``: the standard library only, started in
milliseconds (``clustergate.run.interrupts.start_keeper``).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import time

POLL_S = 1.0
"""How often the keeper reads its rank's state."""
PR_SET_PDEATHSIG = 1


def stat(pid: int | str) -> tuple[str, int] | None:
    """A process's state letter and parent pid from /proc (``T`` stopped, ``D`` in an uninterruptible wait, ``Z`` a
    zombie); None where it is gone (or /proc cannot say). ``pid`` may name one of its threads: 'PID/task/TID'."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(") ", 1)[1].split()
        return fields[0], int(fields[1])
    except (OSError, IndexError, ValueError):
        return None


def state(pid: int | str) -> str | None:
    """A process's state letter (``stat``); None where it is gone."""
    found = stat(pid)
    return found[0] if found is not None else None


def alive(pid: int) -> bool:
    return state(pid) not in (None, "Z", "X")


def keep(pid: int, stopped_s: float, grace_s: float) -> str:
    """Watch ``pid`` until it is gone; what the keeper did ("gone", "continued", "killed")."""
    since: float | None = None
    while alive(pid):
        now = time.monotonic()
        if state(pid) == "T":  # job-control stop; "t" (a debugger's) is left alone
            since = now if since is None else since
            if now - since >= stopped_s:
                os.kill(pid, signal.SIGCONT)
                deadline = time.monotonic() + grace_s
                while alive(pid) and time.monotonic() < deadline:
                    time.sleep(0.2)
                if not alive(pid):
                    return "continued"
                os.kill(pid, signal.SIGKILL)
                return "killed"
        else:
            since = None
        time.sleep(POLL_S)
    return "gone"


def main(argv: list[str]) -> int:
    pid, stopped_s, grace_s = int(argv[1]), float(argv[2]), float(argv[3])
    # torchrun signals a rank's whole process group (its session), the keeper included: the signal is the rank's
    # to act on. The keeper goes when the rank does (the parent-death signal, or its next look).
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        signal.signal(signum, signal.SIG_IGN)
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if os.getppid() != pid:  # the rank died before the keeper could follow it
        return 0
    with contextlib.suppress(OSError):
        keep(pid, stopped_s, grace_s)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
