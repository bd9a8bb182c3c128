"""What a run touches beyond its own state: the control exchanges, the rendezvous store, the clock, the
process's exit, stderr, timers, the launcher, the watchdog and the signal watcher.

Each is the real one by default. The suite's own tests hand in fakes (a fake clock, exchange and store, an exit
that raises) to drive a run through every stage and fault in milliseconds, without torchrun.
"""

from __future__ import annotations

import atexit
import faulthandler
import gc
import os
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NoReturn

from clustergate.common.terminal import printable_lines
from clustergate.record.results import write_json
from clustergate.run import children
from clustergate.run.hang.liveness import Liveness
from clustergate.run.hang.watchdog import Watchdog
from clustergate.run.interrupts import Launcher, SignalWatcher, start_keeper, stop_processes
from clustergate.run.limits import KEEPER_GRACE_S, STOP_GRACE_S, STOPPED_S
from clustergate.run.ranks import control
from clustergate.run.ranks.peers import Peers, main_thread_collective
from clustergate.secrets.redact import Scrubber


def end_what_the_tests_left() -> None:
    """End what the tests left running (``children.end_left``), and say which: before this rank leaves, by its own
    exit or by its agent's SIGTERM (whose default action ends it where it waits for it)."""
    if ended := children.end_left():
        _say(f"clustergate: rank {os.environ.get('RANK', '0')}: ended {len(ended)} process"
             f"{'es' if len(ended) > 1 else ''} the tests left running: {', '.join(ended)}\n")


def exit_now(status: int) -> NoReturn:
    """End what the tests left running (``end_what_the_tests_left``), flush what was said, then leave at once: no
    interpreter teardown (the run never destroys its process groups, whose teardown can wait on a peer that never
    comes)."""
    end_what_the_tests_left()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)


def _say(line: str) -> None:
    sys.stderr.write(printable_lines(Scrubber.from_environment()(line)))
    sys.stderr.flush()


def _park() -> NoReturn:
    while True:  # another thread is ending the process already, with its own record
        time.sleep(60)


def _timer(seconds: float, action: Callable[[], None]) -> None:
    timer = threading.Timer(seconds, action)
    timer.daemon = True
    timer.start()


def _stop(pids: list[int]) -> None:
    stop_processes(pids, STOP_GRACE_S)


def release_compile_workers() -> threading.Thread | None:
    """Tells torch.compile's compile-worker pools to stop, in a thread of their own, and returns it (None where
    torch.compile never ran here). Inductor's exit handler does the same but waits for every worker to exit:
    0.7 s on a 2-core machine, about 1 s of an accepted quick run on one H100, after the final barrier.
    Started when the tests are over, that wait overlaps the verdict, the report and the final barrier, and
    the exit handler then finds the pools stopped already."""
    inductor = sys.modules.get("torch._inductor.async_compile")
    if inductor is None:  # nothing compiled in this process: importing inductor would cost a second
        return None
    thread = threading.Thread(target=inductor.shutdown_compile_workers, name="clustergate-compile-workers",
                              daemon=True)
    thread.start()
    return thread


def freeze_heap() -> None:
    """Moves every object alive now out of the cyclic garbage collector's reach (``gc.freeze``). Once the tests
    are collected these are torch's, pytest's and the suite's modules, classes and functions: the bulk of the
    heap, and none of them garbage a test leaves. A full collection then scans only what the tests made. The
    workloads make one before giving GPU memory back (``workloads.gpu._hw.release``), 27 times in a quick run on
    one GPU, and each had scanned the whole heap. Measured on three H100 VMs, base and this alternated on each:
    quick's tests other than the bf16 sweep (whose warm-up alone varies by 2 s from run to run) took 0.8-1.9 s
    less. What is frozen is still freed by reference counting; only a reference cycle among these objects that
    turns into garbage later stays, for the life of a short process."""
    gc.freeze()


def _keeper() -> object:
    keeper = start_keeper(STOPPED_S, KEEPER_GRACE_S)
    if keeper is not None:
        children.spare(keeper.pid)  # it ends with its rank
    return keeper


def _signals(on_signal: Callable[[int], None]) -> SignalWatcher:
    watcher = SignalWatcher(on_signal)
    children.watch(watcher)  # a child a test forks gives the run's signals back
    return watcher


def _liveness(**kwargs: Any) -> Liveness:
    return Liveness(**kwargs).start()


def _dump_stacks() -> None:
    faulthandler.dump_traceback(file=sys.stderr, all_threads=True)


@dataclass(kw_only=True)
class Outside:
    """What a run touches beyond its own state (each the real one unless given)."""

    peers: Peers
    """Every rank's whereabouts and departures (the rendezvous store)."""
    exchange: Any = control
    """The control exchanges: ``max_int``, ``all_gather``, ``gather_to_leader``, ``broadcast_from_leader``."""
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time
    """The wall clock, as the ranks' words in the store are dated."""
    sleep: Callable[[float], None] = time.sleep
    write: Callable[[Any, dict[str, Any]], None] = write_json
    """Writes results.json (``clustergate.record.results.write_json``: atomic, strict, redacted)."""
    exit: Callable[[int], NoReturn] = exit_now
    """Ends the process with a status: the only way out of an early ending."""
    exit_handlers: Callable[[], None] = atexit._run_exitfuncs
    """Python's exit handlers, run before an accepted run leaves (``exit`` skips them): pytest unlocks its
    temporary directories, clustergate removes NCCL's log directory. 14 ms of a CPU quick run."""
    tests_begin: Callable[[], object] = freeze_heap
    """What is done once, after every rank collected the same tests, before the first test."""
    tests_over: Callable[[], object] = release_compile_workers
    """What may be let go once the last test has ended, before the verdict is shared."""
    park: Callable[[], NoReturn] = _park
    """What a second thread that wants to end the run does while the first ends it."""
    say: Callable[[str], None] = _say
    """stderr, scrubbed."""
    timer: Callable[[float, Callable[[], None]], None] = _timer
    dump_stacks: Callable[[], None] = _dump_stacks
    """Every thread's stack to stderr (a test past its limit: which rank was where in its code)."""
    stop: Callable[[list[int]], None] = _stop
    """Stops stuck sibling ranks (their process ids), rather than leave them to torchrun's SIGKILL 30 s later."""
    launcher: Launcher = field(default_factory=Launcher)
    collective_in_main_thread: Callable[[], str | None] = main_thread_collective
    watchdog: Callable[..., Any] = Watchdog
    """Made with the run's two watchdog handlers (expiry, poll)."""
    signals: Callable[..., Any] = _signals
    """Made with the run's signal handler."""
    liveness: Callable[..., Any] = _liveness
    """Made (and started) with the run's place and its handlers of a hang found (``clustergate.run.hang.liveness``)."""
    keeper: Callable[[], object] = _keeper
    """Starts this rank's keeper, which continues it once it has been stopped too long (``clustergate.run.keeper``)."""
