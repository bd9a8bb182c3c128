"""The suite's own test session, interrupted, leaves no process behind (tests/helpers/children.py).

A real ``python -m pytest tests/run/test_fault_verdicts.py`` of the job whose rank 1 sleeps an hour after the verdict
(hooks_stuck_in_unconfigure: a waited-out job, run by a runner in a session of its own, which a Ctrl-C of the
terminal does not reach), interrupted once that rank is asleep, as a terminal or a CI job interrupts it: SIGINT to its
process group (Ctrl-C), SIGTERM (a kill, a CI timeout), SIGHUP (a closed terminal); with and without xdist. Every
process of that session carries a mark of this test's own in its environment (a variable the suite knows nothing
of), so what is left is found whoever its parent has become. Before the change, SIGTERM and SIGHUP left the runner,
torchrun's agent, both ranks and their keepers (rank 1 asleep for the hour).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from torchrun_job import ROOT

pytestmark = pytest.mark.slow  # a session of pytest that starts a torchrun job

STUCK = "test_accept_waits_for_the_final_barrier_and_a_rank_stuck_after_the_verdict_rejects"
MARK = "INTERRUPTED_SESSION_MARK"


def marked(mark: str) -> list[int]:
    """Every process whose environment carries ``mark``."""
    needle, found = f"{MARK}={mark}".encode(), []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if needle in (entry / "environ").read_bytes().split(b"\0"):
                    state = (entry / "stat").read_text().rsplit(") ", 1)[1][0]
                    if state != "Z":
                        found.append(int(entry.name))
    return found


def command_of(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:160]
    except OSError:
        return f"{pid} (gone)"


@pytest.mark.parametrize(("signum", "workers"), [(signal.SIGINT, 2), (signal.SIGTERM, 0), (signal.SIGHUP, 2)],
                         ids=["ctrl-c-xdist", "sigterm", "sighup-xdist"])
def test_an_interrupted_session_leaves_no_process(tmp_path: Path, signum: signal.Signals, workers: int) -> None:
    mark = uuid.uuid4().hex
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}  # a session of its own, not a worker
    env[MARK] = mark
    basetemp = tmp_path / "basetemp"
    args = [sys.executable, "-m", "pytest", "tests/run/test_fault_verdicts.py", "-k", STUCK, f"--basetemp={basetemp}",
            "-q", "-n", str(workers)]
    with open(tmp_path / "session.log", "w") as log:
        session = subprocess.Popen(args, cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # its own process group, as a terminal's foreground job
    try:
        deadline = time.monotonic() + 300  # a hang guard: rank 1 is asleep within a minute on 2 busy cores
        while not list(basetemp.glob("**/stuck-1")):
            assert session.poll() is None and time.monotonic() < deadline, (tmp_path / "session.log").read_text()
            time.sleep(0.5)
        time.sleep(1.0)  # rank 0 is at the final barrier
        started = marked(mark)
        assert len(started) >= 5, started  # the session, the runner, torchrun's agent, both ranks (and keepers)
        os.killpg(session.pid, signum)
        session.wait(timeout=120)  # a hang guard: pytest unwinds in seconds
        deadline = time.monotonic() + 15  # the runner looks for its session every 0.5 s
        while (left := marked(mark)) and time.monotonic() < deadline:
            time.sleep(0.5)
        said = (tmp_path / "session.log").read_text()
        assert not left, [command_of(pid) for pid in left] + [said[-3000:]]
    finally:
        for pid in marked(mark):  # whatever the outcome, nothing of it outlives this test
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
