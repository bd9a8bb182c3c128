"""A test that starts processes and leaves them running, on every rank: a forked child that sleeps (it ignores
nothing itself), and a daemon (forked twice, in a session of its own, its parent gone). Each writes its pid and
what it inherited: whether it holds the report directory's lock, and its SIGTERM handling, which a forked child
must have as a process outside the run has it (a SIGTERM ends it). With LEAVES_CHILDREN_FAIL set, a second test
fails: the run is not accepted, and its ranks leave as a failed run's do."""

import os
import signal
import time
from pathlib import Path

LOCK = ".clustergate.lock"


def _holds_the_lock() -> bool:
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}").endswith(f"/{LOCK}"):
                return True
        except OSError:
            continue
    return False


def _sleep_forever(name: str) -> None:
    rank = os.environ["RANK"]
    Path(f"{name}-{rank}.tmp").write_text(f"{os.getpid()} {'holds' if _holds_the_lock() else 'free'}")
    os.replace(f"{name}-{rank}.tmp", f"{name}-{rank}")
    while True:
        time.sleep(1)


def test_leaves_children_running() -> None:
    # A child the test ends itself: SIGTERM ends it (it must not inherit the run's handler, which does nothing).
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    time.sleep(0.2)
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGTERM, f"status {status}"
    # Left running: a forked child...
    if os.fork() == 0:
        _sleep_forever("child")
    # ... and a daemon.
    first = os.fork()
    if first == 0:
        os.setsid()
        if os.fork() == 0:
            _sleep_forever("daemon")
        os._exit(0)
    os.waitpid(first, 0)
    rank = os.environ["RANK"]
    deadline = time.monotonic() + 30
    while not (Path(f"child-{rank}").exists() and Path(f"daemon-{rank}").exists()) and time.monotonic() < deadline:
        time.sleep(0.05)


def test_the_run_fails_where_asked() -> None:
    assert not os.environ.get("LEAVES_CHILDREN_FAIL"), "planted: this run is not accepted"
