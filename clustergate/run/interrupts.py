"""SIGINT and SIGTERM, seen even while the main thread is blocked in a collective.

Python runs a signal handler only in the main thread, between bytecodes: a rank blocked in a gloo
or NCCL wait never runs it (seen on H200s: torchrun's SIGTERM, then its SIGKILL 30 s later, and no
record). ``signal.set_wakeup_fd`` makes CPython's C-level handler write the signal number to a pipe
at once; a watcher thread reads it and hands it to the session, which records the interruption and
ends the process when the main thread cannot.

SIGINT keeps its meaning in the main thread (KeyboardInterrupt: pytest unwinds and writes what it
can), except inside a control exchange, where it is held until the exchange is done: an exchange
left half-way would pair this rank's next exchange with its peers' current one.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from clustergate.common.parent_death import die_with_parent
from clustergate.run.keeper import stat

_depth = 0
"""Control exchanges in progress in the main thread (KeyboardInterrupt is held while > 0)."""
_held = False


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """Hold a SIGINT's KeyboardInterrupt until the block is done (main thread only)."""
    global _depth, _held
    _depth += 1
    try:
        yield
    finally:
        _depth -= 1
    if _depth == 0 and _held:
        _held = False
        raise KeyboardInterrupt


def _on_sigint(signum: int, frame: Any) -> None:
    global _held
    if _depth:
        _held = True
        return
    raise KeyboardInterrupt


def _on_sigterm(signum: int, frame: Any) -> None:
    """Nothing in the main thread: the watcher thread acts, whether or not the main thread runs."""


class Launcher:
    """This rank's parent: torchrun's agent."""

    def __init__(self) -> None:
        self.pid = os.getppid()

    def gone(self, settle: bool = True) -> bool:
        """Whether the launcher has died. The kernel re-parents a rank one thread at a time and signals it at the
        first: a thread other than the one the parent-death signal was set on may still see the old parent for
        a moment, so with ``settle`` (a signal's watcher asking why it came) a live parent is read for 0.25 s.
        Without it (the thread that set the signal, asking once after setting it) one reading is the answer:
        either this thread is re-parented already or its signal is still to come. That wait was 0.25 s of every
        rank's start."""
        for _ in range(5 if settle else 1):
            if os.getppid() != self.pid:
                return True
            if settle:
                time.sleep(0.05)
        return False

    def follow(self, signum: int) -> bool:
        """Have the kernel send ``signum`` when the launcher dies: a rank orphaned by ``kill -9`` of torchrun must not
        finish alone and write "accept"."""
        return die_with_parent(signum)


def stop_processes(pids: list[int], grace_s: float) -> None:
    """Stop stuck sibling ranks (children of this rank's own launcher) rather than leave them to torchrun, which
    waits 30 s between its SIGTERM and its SIGKILL: SIGCONT (a stopped process acts on nothing else) and SIGTERM
    (its signal watcher records why and ends it), then SIGKILL for one still there after ``grace_s`` (stuck in C
    with the interpreter's lock held)."""
    launcher = os.getppid()

    def ours(pid: int) -> bool:
        state = stat(pid)
        return state is not None and state[0] != "Z" and state[1] == launcher

    alive = [pid for pid in pids if ours(pid)]
    for pid in alive:
        for signum in (signal.SIGCONT, signal.SIGTERM):
            with contextlib.suppress(OSError):
                os.kill(pid, signum)
    deadline = time.monotonic() + grace_s
    while alive and time.monotonic() < deadline:
        time.sleep(0.1)
        alive = [pid for pid in alive if ours(pid)]
    for pid in alive:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def stopped_siblings() -> dict[int, str]:
    """The processes of this rank's launcher's (torchrun's agent's) that are stopped (SIGSTOP, a debugger), by pid
    with their rank, this job's ranks alone (the same TORCHELASTIC_RUN_ID in their environment). A run that ends
    before its ranks have said who they are finds them here: a stopped rank acts on no signal, so torchrun's
    SIGTERM would wait in it until its SIGKILL 30 s later."""
    run_id = os.environ.get("TORCHELASTIC_RUN_ID")
    if not run_id:
        return {}
    launcher, me, found = os.getppid(), os.getpid(), {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        state = stat(int(entry.name))
        if state is None or state[1] != launcher or state[0] not in ("T", "t"):
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if f"TORCHELASTIC_RUN_ID={run_id}".encode() in environ:
            rank = next((v[5:].decode(errors="replace") for v in environ if v.startswith(b"RANK=")), "?")
            found[int(entry.name)] = rank
    return found


def listens_on(pid: int, port: int) -> bool:
    """Whether process ``pid`` holds a socket listening on TCP ``port`` (this host's /proc: the listening sockets of
    /proc/net/tcp and tcp6, and the process's descriptors). How a rank learns that its launcher serves the rendezvous
    store (MASTER_PORT); False where /proc cannot say."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if len(fields) > 9 and fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
                inodes.add(f"socket:[{fields[9]}]")
    if not inodes:
        return False
    try:
        fds = list(Path(f"/proc/{pid}/fd").iterdir())
    except OSError:
        return False
    for fd in fds:
        with contextlib.suppress(OSError):
            if os.readlink(fd) in inodes:
                return True
    return False


STACK_SIGNAL = signal.SIGUSR1
"""The signal on which a rank writes every thread's Python stack (``register_stack_dump``)."""


def register_stack_dump() -> int | None:
    """Have this process write every thread's Python stack, on STACK_SIGNAL, to a file of its own in memory (a
    memfd): from the C signal handler, so it is written even where no thread of the process can run Python (the
    interpreter's lock held by a call that never returns). Another process of the node reads it back through
    /proc (``stack_of``). The file's descriptor, or None where it cannot be made (not Linux)."""
    try:
        fd = os.memfd_create("clustergate-stacks")
        faulthandler.register(STACK_SIGNAL, file=fd, all_threads=True, chain=False)
    except (AttributeError, OSError, RuntimeError, ValueError):
        return None
    return fd


def stack_of(pid: int, fd: int, wait_s: float = 1.0) -> str | None:
    """Process ``pid``'s stacks, written on STACK_SIGNAL to its file ``fd`` (``register_stack_dump``); a stopped
    process is continued for it (SIGCONT). None where nothing came within ``wait_s``."""
    path = Path(f"/proc/{pid}/fd/{fd}")
    try:
        before = path.stat().st_size
        os.kill(pid, STACK_SIGNAL)
        os.kill(pid, signal.SIGCONT)
    except OSError:
        return None
    deadline, size = time.monotonic() + wait_s, before
    while time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            now = path.stat().st_size
        except OSError:
            return None
        if now > before and now == size:  # written, and no longer growing
            break
        size = now
    try:
        with open(path, "rb") as f:
            f.seek(before)
            text = f.read().decode(errors="replace")
    except OSError:
        return None
    return text or None


KEEPER = Path(__file__).with_name("keeper.py")


def start_keeper(stopped_s: float, grace_s: float) -> subprocess.Popen[bytes] | None:
    """This rank's keeper (``clustergate.run.keeper``): a process of its own that continues the rank once it has
    been stopped for ``stopped_s`` and kills it ``grace_s`` later if it is still there. Standard library only, no
    site packages (-I -S): it starts in milliseconds. None where it cannot start (the run goes on without it)."""
    try:
        return subprocess.Popen([sys.executable, "-I", "-S", str(KEEPER), str(os.getpid()), str(stopped_s),
                                 str(grace_s)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                close_fds=True)
    except OSError:
        return None


class SignalWatcher:
    """Calls ``on_signal(signum)`` from its own thread for every SIGINT and SIGTERM."""

    def __init__(self, on_signal: Callable[[int], None]) -> None:
        self._on_signal = on_signal
        self._saved: list[tuple[int, Any]] = []
        self._old_fd: int | None = None
        if threading.current_thread() is not threading.main_thread():
            return  # signals can only be set up from the main thread (e.g. pytest run in a thread)
        self._read, write = os.pipe()
        os.set_blocking(write, False)
        self._write = write
        self._old_fd = signal.set_wakeup_fd(write, warn_on_full_buffer=False)
        for signum, handler in ((signal.SIGINT, _on_sigint), (signal.SIGTERM, _on_sigterm)):
            old = signal.getsignal(signum)
            if old is signal.SIG_IGN:
                continue  # started with the signal ignored (nohup, a background job): respect it
            self._saved.append((signum, old))
            signal.signal(signum, handler)
        threading.Thread(target=self._watch, name="clustergate-signals", daemon=True).start()

    def _watch(self) -> None:
        while True:
            try:
                data = os.read(self._read, 16)
            except OSError:
                return
            if not data:
                return
            for signum in data:
                if signum in (signal.SIGINT, signal.SIGTERM):
                    self._on_signal(signum)

    @property
    def handles_sigterm(self) -> bool:
        return any(signum == signal.SIGTERM for signum, _ in self._saved)

    def close(self) -> None:
        """Give the signals back (the process goes on without the session)."""
        if self._old_fd is None:
            return
        for signum, old in self._saved:
            signal.signal(signum, old)
        signal.set_wakeup_fd(self._old_fd)
        os.close(self._write)
        self._old_fd = None
