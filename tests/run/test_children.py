"""Processes a test starts end with the run (clustergate.run.children), and a report directory whose lock is held
names the process that holds it (clustergate.record.reportdir).

Planted for real: a test under torchrun forks a child and a daemon (forked twice, in a session of its own) on every
rank and leaves them running; a lock kept by a child whose parent, the process the lock file names, is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clustergate.record.reportdir import LOCK_NAME, RunLock
from clustergate.run.keeper import alive

from torchrun_job import plant, run_job

HOLDER = """
import fcntl, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT, 0o600)
fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
os.ftruncate(fd, 0)
os.write(fd, f"pid {os.getpid()} on {socket.gethostname()}, started 2026-01-01T00:00:00+00:00\\n".encode())
child = os.fork()
if child:  # the process the lock file names goes; the child it forked keeps the lock
    print(child, flush=True)
    os._exit(0)
os.setsid()
null = os.open(os.devnull, os.O_RDWR)
for std in (0, 1, 2):  # the caller reads the parent's output to its end
    os.dup2(null, std)
time.sleep(300)
"""
"""A run's lock as an older clustergate left it: taken by a process that forked a child, then went."""


def kept_lock(report: Path) -> int:
    """Plant a lock on ``report`` kept by a child whose parent (the pid the lock file names) has gone; its pid."""
    proc = subprocess.run([sys.executable, "-c", HOLDER, str(report / LOCK_NAME)], capture_output=True, text=True,
                          timeout=30)
    assert proc.returncode == 0, proc.stderr
    return int(proc.stdout)


@pytest.mark.slow  # two torchrun jobs
def test_processes_a_test_left_running_end_with_the_run_and_the_next_run_goes_ahead(tmp_path: Path) -> None:
    r = run_job(tmp_path, plant(tmp_path, "leaves_children"), timeout=240)
    assert r.codes == [0], r.output  # the child given SIGTERM died of it (the test asserts it), on every rank
    left = {f"{name}-{rank}": (tmp_path / f"{name}-{rank}").read_text().split()
            for name in ("child", "daemon") for rank in (0, 1)}
    assert {what for _, what in left.values()} == {"free"}, left  # no child kept the report directory's lock
    pids = [int(pid) for pid, _ in left.values()]
    assert [pid for pid in pids if alive(pid)] == [], left
    said = sorted(line for line in r.output.splitlines() if "the tests left running" in line)
    assert [line.split(": pid ")[0] for line in said] == [
        f"clustergate: rank {rank}: ended 2 processes the tests left running" for rank in (0, 1)], said
    command = Path(sys.executable).name[:15]  # a forked child's name is its rank's: the interpreter as started
    for rank in (0, 1):  # each rank names its own two, and nothing else (its keeper ends with it)
        assert {f"pid {left[f'{name}-{rank}'][0]} ({command})" for name in ("child", "daemon")} == \
            set(said[rank].split(": ", 3)[3].split(", ")), said
    again = run_job(tmp_path, plant(tmp_path, "healthy"), timeout=240)  # into the same --report-dir
    assert again.codes == [0], again.output
    assert again.results["verdict"] == "accept"


@pytest.mark.slow  # a torchrun job
def test_processes_a_test_left_running_end_with_a_run_that_is_not_accepted_on_every_rank(tmp_path: Path) -> None:
    """A run that is not accepted: rank 0 fails first and torchrun's SIGTERM ends the others where they wait for it.
    Every rank still ends what its tests left running, and says so (rank 1's daemon outlived such a run)."""
    r = run_job(tmp_path, plant(tmp_path, "leaves_children"), env={"LEAVES_CHILDREN_FAIL": "1"}, timeout=240)
    assert r.codes == [1] and r.results["verdict"] == "reject", r.output
    pids = [int((tmp_path / f"{name}-{rank}").read_text().split()[0])
            for name in ("child", "daemon") for rank in (0, 1)]
    assert [pid for pid in pids if alive(pid)] == [], r.output
    said = sorted(line.split(": pid ")[0] for line in r.output.splitlines() if "the tests left running" in line)
    assert said == [f"clustergate: rank {rank}: ended 2 processes the tests left running" for rank in (0, 1)], r.output


@pytest.mark.slow  # two torchrun jobs
def test_a_run_into_a_directory_whose_lock_a_live_process_keeps_is_refused_naming_it(tmp_path: Path) -> None:
    report = tmp_path / "report"
    report.mkdir()
    holder = kept_lock(report)
    try:
        r = run_job(tmp_path, plant(tmp_path, "healthy"), timeout=240)
    finally:
        os.kill(holder, signal.SIGKILL)
    assert r.codes == [1], r.output  # a usage error on each rank; torchrun reports 1
    assert f"ERROR: --report-dir {report} is held by pid {holder} (" in r.output, r.output
    deadline = time.monotonic() + 10
    while alive(holder) and time.monotonic() < deadline:
        time.sleep(0.05)
    again = run_job(tmp_path, plant(tmp_path, "healthy"), timeout=240)
    assert again.codes == [0], again.output


def test_a_lock_kept_by_a_child_of_a_gone_run_names_the_child(tmp_path: Path) -> None:
    holder = kept_lock(tmp_path)
    try:
        lock = RunLock(tmp_path)
        refusal = lock.acquire()
        assert refusal is not None and refusal.startswith(f"is held by pid {holder} ("), refusal
        assert f"keeps its lock file {tmp_path / LOCK_NAME} locked; the run that took it (pid " in refusal
        assert f"has ended: end it (kill {holder}) or choose another --report-dir" in refusal
    finally:
        os.kill(holder, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while alive(holder) and time.monotonic() < deadline:
        time.sleep(0.05)
    lock = RunLock(tmp_path)
    assert lock.acquire() is None
    lock.release()


def test_a_lock_the_run_holds_is_not_kept_by_a_child_it_forks(tmp_path: Path) -> None:
    lock = RunLock(tmp_path)
    assert lock.acquire() is None
    read, write = os.pipe()
    child = os.fork()
    if child == 0:  # a child of the run: it must hold no descriptor of the lock file
        os.close(read)
        held = [fd for fd in os.listdir("/proc/self/fd")
                if os.path.realpath(f"/proc/self/fd/{fd}") == os.path.realpath(tmp_path / LOCK_NAME)]
        os.write(write, b"held" if held else b"free")
        os._exit(0)
    os.close(write)
    said = os.read(read, 16)
    os.close(read)
    os.waitpid(child, 0)
    assert said == b"free"
    second = RunLock(tmp_path)
    assert second.acquire() is not None  # the run still holds it
    lock.release()
