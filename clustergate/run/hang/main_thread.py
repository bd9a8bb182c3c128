"""What a rank's main thread is doing, read from another thread of the rank (its beat): where it is, whether it has
moved since the last look, what it waits in, and its Python stack for the evidence of a hang."""

from __future__ import annotations

import os
import sys
import threading
import traceback
from dataclasses import dataclass
from typing import Any

from clustergate.run.keeper import state as process_state
from clustergate.run.ranks.peers import main_thread_collective

STACK_FRAMES = 24
"""The innermost frames of a rank's main thread the evidence keeps: the test's call chain down to where it waits."""


STACK_CHARS = 8000
"""The most of a rank's stack the evidence keeps (results.json stays small at hundreds of ranks)."""


def main_waits(frame: Any = None) -> str | None:
    """What the main thread (or ``frame``, its innermost) is inside: "control" (a control exchange), "collective" (a
    torch.distributed call), or None."""
    frame = frame or sys._current_frames().get(threading.main_thread().ident or -1)
    found = None
    while frame is not None:
        name = frame.f_code.co_filename.replace("\\", "/")
        if name.endswith("clustergate/run/ranks/control.py"):
            return "control"
        if "/torch/distributed/" in name:
            found = "collective"
        frame = frame.f_back
    return found


def main_frame(frame: Any = None) -> str:
    """The main thread's innermost frame (or ``frame``): 'test_x.py:12 in test_x' (what a beat says the rank is
    doing)."""
    frame = frame or sys._current_frames().get(threading.main_thread().ident or -1)
    if frame is None:
        return ""
    return f"{frame.f_code.co_filename.rsplit('/', 1)[-1]}:{frame.f_lineno} in {frame.f_code.co_name}"


def wakeups(tid: int | None) -> int | None:
    """How often thread ``tid`` of this process has slept and woken (its voluntary context switches, /proc): a main
    thread in a loop that polls wakes on every turn, one in a call that never returns does not; None where /proc
    cannot say."""
    if tid is None:
        return None
    try:
        with open(f"/proc/self/task/{tid}/status") as f:
            for line in f:
                if line.startswith("voluntary_ctxt_switches:"):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def fingerprint(frame: Any) -> tuple[tuple[int, int], ...]:
    """Where a thread is, down to the instruction, in every frame of its stack: the same only while it has not
    moved (a frame blocked in a call keeps its instruction; a loop changes it, or its frames)."""
    out = []
    while frame is not None:
        out.append((id(frame), frame.f_lasti))
        frame = frame.f_back
    return tuple(out)


@dataclass(frozen=True, slots=True)
class Main:
    """The main thread as one beat sees it."""

    moved: Any
    """What changes whenever it makes progress (``fingerprint`` and its ``wakeups``)."""
    inside: str
    """"code" (its own), "collective" (a torch.distributed call) or "control" (a control exchange)."""
    where: str
    """'all_reduce called at test_x.py:12' in a collective, else its innermost frame 'test_x.py:12 in test_x'."""
    state: str | None = None
    """Its own state letter in /proc: R running (busy), S or D waiting."""


def observe_main() -> Main:
    """The main thread now."""
    main = threading.main_thread()
    frame = sys._current_frames().get(main.ident or -1)
    inside = main_waits(frame) or "code"
    where = (main_thread_collective() if inside == "collective" else None) or main_frame(frame)
    tid = main.native_id
    return Main((fingerprint(frame), wakeups(tid)), inside, where,
                process_state(f"{os.getpid()}/task/{tid}") if tid is not None else None)


NOISE = ("/_pytest/", "/pluggy/", "<frozen runpy>", "/pytest/__main__.py")
"""Frames of pytest's own machinery: left out of a rank's stack (the test's frames and what it called are the
evidence)."""


def stack() -> str:
    """This process's main thread's Python stack (its last STACK_FRAMES frames, pytest's machinery left out), then
    each other thread's innermost frame while STACK_CHARS allow: the main thread's is the evidence, and comes first
    however many threads a process has (compile workers, a store's client)."""
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    main = threading.main_thread().ident
    text = ""
    if main in frames:
        summary = [f for f in traceback.extract_stack(frames[main]) if not any(n in f.filename for n in NOISE)]
        lines = [line.rstrip("\n") for line in traceback.format_list(summary[-STACK_FRAMES:])]
        text = "Main thread (most recent call last):\n" + "\n".join(lines)[-STACK_CHARS:]
    for ident, frame in frames.items():
        if ident not in (main, threading.get_ident()):
            line = (f"\nThread {names.get(ident, ident)}: {frame.f_code.co_filename.rsplit('/', 1)[-1]}:"
                    f"{frame.f_lineno} in {frame.f_code.co_name}")
            if len(text) + len(line) > STACK_CHARS:
                break
            text += line
    return text.lstrip("\n")
