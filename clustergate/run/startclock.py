"""How long this rank took to start, step by step: from its launcher's start to the session's.

A run's start is time a handover pays on every node and every run (quick's budget is 20 s, tests included), and
most of it is before pytest's session: the launcher's own start (torchrun imports torch), the rank's imports, the
start-up exchanges, the process groups. Each step is marked once, as it ends, with the wall clock (the launcher's
and this process's start come from /proc, where the kernel keeps them); ``steps`` gives them as seconds from the
launcher's start, and progress.jsonl's ``session_start`` event carries them (``clustergate.run.lifecycle``), so
``benchmarks/quick_time.py breakdown`` can split the start of any run, on any machine.
"""

from __future__ import annotations

import contextlib
import os
import time

from clustergate.common.procfs import start_ticks

_MARKS: list[tuple[str, float]] = []


def mark(step: str) -> None:
    """``step`` ends now (its first mark stands: a hook that runs twice is not two steps)."""
    if all(name != step for name, _ in _MARKS):
        _MARKS.append((step, time.time()))


def process_started(pid: int) -> float | None:
    """When process ``pid`` started, on the wall clock: its start in clock ticks after boot, set against the time
    since boot now (/proc/uptime, to 10 ms; /proc/stat's boot time is whole seconds); None where /proc cannot say."""
    ticks = start_ticks(pid)
    with contextlib.suppress(OSError, ValueError, IndexError):
        if ticks is not None:
            with open("/proc/uptime") as f:
                now, uptime = time.time(), float(f.read().split()[0])
            return now - uptime + ticks / os.sysconf("SC_CLK_TCK")
    return None


def steps() -> list[dict[str, float | str]]:
    """Every step so far as ``{"step", "at"}``: seconds from the launcher's start (the process that started this
    rank: torchrun, or ``clustergate run``), the launcher and this process first. /proc's start times are to a clock
    tick (10 ms)."""
    launcher, own = process_started(os.getppid()), process_started(os.getpid())
    origin = launcher if launcher is not None else own if own is not None else (_MARKS[0][1] if _MARKS else 0.0)
    found = [("launcher", launcher), ("rank process", own), *_MARKS]
    return [{"step": name, "at": round(at - origin, 3)} for name, at in found if at is not None]
