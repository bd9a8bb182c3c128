"""The jobs that spend most of their time waiting out one of the product's timers, run side by side once per session.

Each is a real torchrun job with a fault planted for real (tests/faults/); what it left is judged by its own test,
in its own module, through the ``waited_out`` fixture (by test name). Their timers: 45 s at start-up, 30 s at the
final barrier, a test's limit from its measured time (test_measured_limits: 60-66 s), 20 s for a stopped rank
(test_fault_verdicts), 20 s for a main thread blocked when SIGINT comes (test_run_endings), the watchdog's 10 s on a
rank blocked in a collective and a 10 s test limit on a hang (test_faults), the liveness bounds of
test_hang_endings. One after another they would hold a worker for the sum of the timers while using little of its
CPU; side by side they hold it for the longest. Each elapsed time is measured from the planted event (a file the
planted code writes as it goes astray, a signal sent, the test's start in progress.jsonl), so a job that starts
late on busy cores is judged on the same bound.

They start in a process of their own at the session's first test (``start_early``, an autouse fixture of
conftest.py) and their tests run last (conftest.py orders them): the worker that runs those tests runs others
while the jobs wait out their timers, instead of sitting idle beside them for a minute.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import children
import pytest
from fleet_data import later, real_run
from report_runs import shared_path

from clustergate.criteria.thresholds import load, shipped_thresholds
from clustergate.run.durations import Healthy, Key, Shape, reference
from clustergate.run.interrupts import listens_on
from clustergate.run.keeper import alive  # a zombie (dead, not yet reaped by its new parent) counts as gone
from clustergate.run.limits import FREEZE_S, TEST_LIMIT_S
from clustergate.run.testlimit import measured_limit
from clustergate.store import Store
from tests.faults.plugin_stuck_alike import STUCK

from torchrun_job import (
    ROOT,
    Job,
    JobResult,
    foreground_signals,
    job_env,
    job_processes,
    plant,
    start_job,
    wait_for,
)

GPU_LIMITS = ["--collective-timeout", str(load(shipped_thresholds()).profile("h100-sxm-80gb").settings[
    "collective_timeout_s"]), "--test-timeout", str(TEST_LIMIT_S["standard"])]
"""A GPU profile's timeouts on the cpu profile's run: the workloads' collectives time out after the H100 profile's
collective_timeout_s (300 s) and a test after the standard level's limit (600 s), as on a GPU node. A hang planted
under them is ended by the peers' liveness, never by a timeout."""
MEASURED_CASES = (("reference", "standard"), ("store", "quick"))
"""test_measured_limits' jobs: where the stuck test's healthy time comes from, and the level."""
TEST_TIMEOUT_S = 10.0
"""--test-timeout of the job whose rank hangs in its test."""


def ended_after(r: JobResult, event: float) -> float:
    """Seconds from ``event`` (time.monotonic() in this process) to the end of the job."""
    return r.seconds - (event - (time.monotonic() - r.seconds))


def _progress(r: JobResult) -> list[dict[str, Any]]:
    """The run's progress.jsonl, one event a line."""
    return [json.loads(line) for line in (r.report_dir / "progress.jsonl").read_text().splitlines()]


def event_time(r: JobResult, event: str) -> float:
    """The wall clock (time.time()) of the first ``event`` in the run's progress.jsonl."""
    return next(e["time"] for e in _progress(r) if e["event"] == event)


def since_test_start(r: JobResult, ended: float, name: str) -> float:
    """Seconds from the start of test ``name`` (progress.jsonl's wall clock) to ``ended`` (time.time())."""
    return ended - next(e["time"] for e in _progress(r) if e["event"] == "test_start" and e["nodeid"].endswith(name))


# ---- test_fault_verdicts ----------------------------------------------------------------------------------------

def _stuck_after_the_verdict(tmp_path: Path) -> Job:
    return start_job(tmp_path, plant(tmp_path, "two_tests", hooks="hooks_stuck_in_unconfigure"), timeout=150)


def _watch_stuck_after_the_verdict(tmp_path: Path, job: Job) -> dict[str, Any]:
    stuck = wait_for(tmp_path / "stuck-1")
    seen = set()
    while time.monotonic() - stuck < 8:  # rank 0 reaches the final barrier in a second or two
        path = tmp_path / "report" / "results.json"
        if path.exists():
            with contextlib.suppress(ValueError, KeyError):
                seen.add(json.loads(path.read_text())["verdict"])
        time.sleep(0.2)
    r = job.wait()
    return {"job": r, "took": ended_after(r, stuck), "seen": sorted(seen)}


def _stuck_at_start_up(tmp_path: Path) -> Job:
    return start_job(tmp_path, plant(tmp_path, "healthy", hooks="hooks_stuck_in_conftest"), timeout=180)


def _watch_stuck_at_start_up(tmp_path: Path, job: Job) -> dict[str, Any]:
    """Timed from rank 0's conftest loaded (it then waits at the start's exchange), and rank 1 stuck in its own."""
    waiting = max(wait_for(tmp_path / "loaded-0"), wait_for(tmp_path / "stuck-1"))
    r = job.wait()
    return {"job": r, "took": ended_after(r, waiting)}


# ---- test_run_endings -------------------------------------------------------------------------------------------

def _blocked_when_sigint_comes(tmp_path: Path) -> Job:
    return start_job(tmp_path, plant(tmp_path, "blocked_in_collective"), timeout=180)


def _watch_blocked_when_sigint_comes(tmp_path: Path, job: Job) -> dict[str, Any]:
    wait_for(tmp_path / "ready-0")
    wait_for(tmp_path / "ready-1")
    time.sleep(1.0)  # rank 0 is inside all_reduce by now
    job.procs[0].send_signal(signal.SIGINT)
    sent = time.monotonic()
    r = job.wait()
    return {"job": r, "took": ended_after(r, sent)}


# ---- test_faults ------------------------------------------------------------------------------------------------

def _raises_before_its_peers_collective(tmp_path: Path) -> Job:
    return start_job(tmp_path, plant(tmp_path, "raise_before_collective"), timeout=150)


def _watch_to_its_end(tmp_path: Path, job: Job) -> dict[str, Any]:
    return {"job": job.wait()}


def _hangs_in_its_test(tmp_path: Path) -> Job:
    return start_job(tmp_path, ["--test-timeout", str(TEST_TIMEOUT_S), *plant(tmp_path, "hang")], timeout=120)


def _watch_hangs_in_its_test(tmp_path: Path, job: Job) -> dict[str, Any]:
    r = job.wait()
    return {"job": r, "took": since_test_start(r, time.time(), "test_hangs_on_rank_1")}


# ---- test_hang_endings -------------------------------------------------------------------------------------------

def _hang(fault: str, nodes: int = 1, nproc: int | None = None, *args: str) -> Callable[[Path], Job]:
    """A job of ``fault`` under GPU_LIMITS: ``nproc`` ranks (default 2) under one agent, or (``nodes`` 2) one rank
    under each of two agents, each rank alone on its "node"; ``args``: more pytest arguments."""
    def start(tmp_path: Path) -> Job:
        return start_job(tmp_path, [*plant(tmp_path, fault), *GPU_LIMITS, *args], nodes=nodes,
                         nproc=nproc or (2 if nodes == 1 else 1), timeout=240)
    return start


def _left_after(job: Job, tree: list[int]) -> list[int]:
    """The processes of ``tree`` still there a second after the job ended (a keeper goes with its rank at once, by the
    parent-death signal; the kernel is allowed a beat), each then killed."""
    time.sleep(1.0)
    left = [pid for pid in tree if alive(pid)]
    for pid in left:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return left


def _watch_hang(signum: int | None, ranks: int = 2, target: int = 1) -> Callable[[Path, Job], dict[str, Any]]:
    """Rank ``target`` gets ``signum`` once every one of ``ranks`` is in the planted test (None: the planted code goes
    astray by itself as it writes its ready file). What the job left: how long from the fault to its end, and which
    of its processes (every process under its agents once the test began: ranks, keepers) were still there after
    it."""
    def watch(tmp_path: Path, job: Job) -> dict[str, Any]:
        astray = max(wait_for(tmp_path / f"ready-{r}") for r in range(ranks))
        time.sleep(0.5)  # the pids are written, and the others are in their wait
        tree = job_processes(job)
        if signum is not None:
            os.kill(int((tmp_path / f"ready-{target}").read_text()), signum)
            astray = time.monotonic()
        try:
            r = job.wait()
        finally:
            left = _left_after(job, tree)
        return {"job": r, "took": ended_after(r, astray), "left": left}
    return watch


def _watch_freeze(tmp_path: Path, job: Job) -> dict[str, Any]:
    """The lone rank stopped for FREEZE_S and a few seconds more, then continued by hand (before its keeper would):
    the run goes on, and is judged."""
    wait_for(tmp_path / "ready-0")
    pid = int((tmp_path / "ready-0").read_text())
    os.kill(pid, signal.SIGSTOP)
    time.sleep(FREEZE_S + 3)
    os.kill(pid, signal.SIGCONT)
    return {"job": job.wait()}


def _states(pids: list[int]) -> list[str]:
    """Each process's state letter ("gone" once reaped)."""
    out = []
    for pid in pids:
        try:
            out.append(Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1][0])
        except (OSError, IndexError):
            out.append("gone")
    return out


def _stop_agent_and_continue(job: Job, agent: subprocess.Popen[str], ranks: list[int],
                             tree: list[int]) -> dict[str, Any]:
    """SIGSTOP ``agent`` (torchrun's, in the job), time how long its job's ``ranks`` take to end (exited: a zombie its
    stopped agent cannot reap), then SIGCONT it and time how long the job takes to end after that."""
    os.kill(agent.pid, signal.SIGSTOP)
    stopped = time.monotonic()
    deadline = stopped + 120  # a hang guard: before, the ranks of a stopped agent ran on and its job never ended
    while time.monotonic() < deadline and not all(s in ("Z", "gone") for s in _states(ranks)):
        time.sleep(0.2)
    ranks_ended = time.monotonic() - stopped
    still = _states(ranks)
    time.sleep(2.0)  # the agent stays stopped a while longer: continued, it ends at once
    os.kill(agent.pid, signal.SIGCONT)
    continued = time.monotonic()
    try:
        r = job.wait()
    finally:
        left = _left_after(job, tree)
    return {"job": r, "took": ranks_ended, "ranks_after": still, "after_continue": ended_after(r, continued),
            "left": left}


SLOW_FIRST_TEST = """
import os
import time
from pathlib import Path

import pytest


@pytest.hookimpl(trylast=True)  # after the test itself: the run is in its call phase
def pytest_runtest_call(item):
    Path(f"ready-{os.environ['RANK']}").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120  # a hang guard: the harness stops the agent long before
    while time.monotonic() < deadline:
        time.sleep(0.1)
"""
"""A plugin that makes the run's first test last two minutes on every rank: the agent is stopped meanwhile."""


def _command_with_a_slow_test(tmp_path: Path) -> Job:
    """``clustergate run`` of two CPU ranks (its agent runs in the command's own process) whose first test lasts."""
    (tmp_path / "slow_first_test.py").write_text(SLOW_FIRST_TEST)
    cmd = [sys.executable, "-m", "clustergate", "run", "--nproc-per-node", "2", "--level", "quick", "-k", "test_world",
           "--report-dir", str(tmp_path / "report"), "-p", "slow_first_test", *GPU_LIMITS]
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=job_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, preexec_fn=foreground_signals)
    return Job([proc], time.monotonic(), 240, tmp_path / "report")


def _watch_command_agent_stopped(tmp_path: Path, job: Job) -> dict[str, Any]:
    ranks = [int((tmp_path / f"ready-{r}").read_text()) for r in range(2) if wait_for(tmp_path / f"ready-{r}")]
    time.sleep(0.5)
    return _stop_agent_and_continue(job, job.procs[0], ranks, job_processes(job))


def _watch_store_agent_stopped(tmp_path: Path, job: Job) -> dict[str, Any]:
    """Two agents of one rank each: the one that serves the ranks' store (MASTER_PORT) is stopped."""
    ranks = [int((tmp_path / f"ready-{r}").read_text()) for r in range(2) if wait_for(tmp_path / f"ready-{r}")]
    time.sleep(0.5)
    environ = Path(f"/proc/{ranks[0]}/environ").read_bytes().split(b"\0")
    port = int(next(v for v in environ if v.startswith(b"MASTER_PORT=")).split(b"=")[1])
    [agent] = [p for p in job.procs if listens_on(p.pid, port)]
    seen = _stop_agent_and_continue(job, agent, ranks, job_processes(job))
    return {**seen, "agent": agent.pid, "agent_index": job.procs.index(agent)}


STOP_AT_REPORT_DIR = """
import os, signal, time
from pathlib import Path
from clustergate.run import startup
_prepare = startup.prepare_report_dir


def prepare_report_dir(config, world, root):
    if world.rank == 1:  # stopped after the process groups formed, before the report directory's exchange
        Path("stopped-1").write_text(f"{os.getpid()} {time.monotonic()}")
        os.kill(os.getpid(), signal.SIGSTOP)
    return _prepare(config, world, root)


startup.prepare_report_dir = prepare_report_dir
"""
"""A plugin that stops rank 1 where the run has process groups but no keeper or beat yet."""


def _stopped_before_the_start(tmp_path: Path) -> Job:
    (tmp_path / "stop_at_report_dir.py").write_text(STOP_AT_REPORT_DIR)
    return start_job(tmp_path, [*plant(tmp_path, "collective_loop"), *GPU_LIMITS, "-p", "stop_at_report_dir"],
                     timeout=150)  # a hang guard: before the fix such a run was still going at 296 s


def _watch_stopped_before_the_start(tmp_path: Path, job: Job) -> dict[str, Any]:
    wait_for(tmp_path / "stopped-1")
    pid, stopped = (tmp_path / "stopped-1").read_text().split()
    tree = job_processes(job)
    try:
        r = job.wait()
    finally:
        left = _left_after(job, tree)
    return {"job": r, "took": ended_after(r, float(stopped)), "left": left, "pid": int(pid)}


# ---- test_measured_limits ---------------------------------------------------------------------------------------

SITE_HEALTHY_S = (22.0, 20.5, 21.0)
"""The stuck test's durations in the site's three accepted runs: its limit 66 s, above the reference's 60 s."""


def site_store(path: Path) -> Path:
    """A store holding SITE_READINGS_TO_SET accepted runs of the cpu profile at quick on 1 node x 2 ranks, the stuck
    test slower in each than in the reference runs."""
    store = Store(path, timeout_s=5)
    for day, seconds in enumerate(SITE_HEALTHY_S, start=1):
        run = later(real_run(), f"2027-01-0{day}T00:00:00+00:00")
        next(t for t in run["tests"] if t["nodeid"] == STUCK)["duration_s"] = seconds
        store.record(run)
    return path


def measured_case(source: str, level: str) -> tuple[Healthy, float]:
    """The stuck test's healthy time as the run reads it (the shipped reference's, or the site store's), and the
    limit that follows from it."""
    healthy = reference(Key("cpu", level, Shape(1, 2)))[STUCK]
    if source == "store":
        healthy = Healthy(max(SITE_HEALTHY_S), len(SITE_HEALTHY_S), "store: 3 accepted runs to 2027-01-03")
    return healthy, measured_limit(healthy.seconds)


def _stuck_past_its_measured_limit(source: str, level: str) -> Start:
    """Every rank stuck alike in STUCK at ``level``, under a GPU profile's collective timeout and no test limit given,
    its healthy time read from ``source`` ("reference", or "store": a site store made for it)."""
    def start(tmp_path: Path) -> Job:
        _, limit = measured_case(source, level)
        store = ["--store", str(site_store(tmp_path / "fleet.db"))] if source == "store" else []
        return start_job(ROOT, [STUCK, "--level", level, "--collective-timeout", GPU_LIMITS[1], *store,
                                "-p", "tests.faults.plugin_stuck_alike"], report_dir=tmp_path / "report",
                         timeout=limit + 240)  # a hang guard: start-up on 2 busy cores, and the ending
    return start


def _watch_stuck_past_its_measured_limit(tmp_path: Path, job: Job) -> dict[str, Any]:
    wait_for(tmp_path / "stuck-0")
    wait_for(tmp_path / "stuck-1")
    time.sleep(0.5)
    tree = job_processes(job)
    try:
        r = job.wait()
        ended = time.time()
    finally:
        left = _left_after(job, tree)
    return {"job": r, "took": since_test_start(r, ended, STUCK.rsplit("::", 1)[1]), "left": left}


Start = Callable[[Path], Job]
Watch = Callable[[Path, Job], dict[str, Any]]
WAITED_OUT: dict[str, tuple[Start, Watch]] = {  # the longest timers first: they start first
    **{f"test_every_rank_stuck_alike_ends_at_the_test_s_measured_limit[{source}-{level}]":
       (_stuck_past_its_measured_limit(source, level), _watch_stuck_past_its_measured_limit)
       for source, level in MEASURED_CASES},
    "test_accept_waits_for_the_final_barrier_and_a_rank_stuck_after_the_verdict_rejects":
        (_stuck_after_the_verdict, _watch_stuck_after_the_verdict),
    "test_rank_stuck_at_start_up_is_named": (_stuck_at_start_up, _watch_stuck_at_start_up),
    "test_sigint_to_the_job_rejects_and_names_rank_and_test":
        (_blocked_when_sigint_comes, _watch_blocked_when_sigint_comes),
    "test_raise_before_collective_ends_bounded_with_default_settings":
        (_raises_before_its_peers_collective, _watch_to_its_end),
    "test_hang_is_cut_by_the_test_timeout": (_hangs_in_its_test, _watch_hangs_in_its_test),
    "test_a_stopped_rank_is_named_and_stopped": (_hang("collective_loop"), _watch_hang(signal.SIGSTOP)),
    "test_a_rank_frozen_in_a_syscall_is_named": (_hang("frozen_in_a_syscall"), _watch_hang(None)),
    "test_a_rank_busy_in_cpp_is_named": (_hang("busy_in_cpp"), _watch_hang(None)),
    "test_a_rank_that_skips_a_collective_is_named": (_hang("skips_a_collective"), _watch_hang(None)),
    "test_a_rank_holding_the_interpreter_is_named_with_its_stack": (_hang("holds_the_interpreter"), _watch_hang(None)),
    "test_a_stopped_rank_alone_on_its_node_is_named_and_ended": (_hang("collective_loop", nodes=2),
                                                                  _watch_hang(signal.SIGSTOP)),
    "test_a_rank_stopped_before_the_run_starts_ends_it_named_and_nothing_is_left":
        (_stopped_before_the_start, _watch_stopped_before_the_start),
    "test_a_lone_rank_stopped_is_named_and_ended": (_hang("collective_loop", nproc=1),
                                                    _watch_hang(signal.SIGSTOP, ranks=1, target=0)),
    "test_a_lone_rank_stuck_in_its_own_code_is_named": (_hang("stuck_alike", nproc=1), _watch_hang(None, ranks=1)),
    "test_a_lone_rank_frozen_and_continued_fails_the_test_it_froze_in": (_hang("measures_for_a_while", nproc=1),
                                                                          _watch_freeze),
    "test_every_rank_stuck_alike_is_named": (_hang("stuck_alike"), _watch_hang(None)),
    "test_every_rank_receiving_from_a_peer_that_never_sends_is_a_deadlock": (_hang("p2p_deadlock"),
                                                                              _watch_hang(None)),
    "test_the_agent_stopped_ends_the_ranks_and_the_command_continued_ends_at_once":
        (_command_with_a_slow_test, _watch_command_agent_stopped),
    "test_another_nodes_rank_names_the_node_whose_agent_stopped": (_hang("collective_loop", 2, None, "-s"),
                                                                    _watch_store_agent_stopped),
}
"""Each test of a job that waits out a timer: how its job starts, and what watches it to its end (planting the
fault, timing it). The jobs start in this order."""


STARTING_AT_ONCE = 3
"""Jobs in their start-up at one time. Each job is two or three processes that import torch and pytest as they start:
twenty started at once on 2 cores (beside the workers' own tests, and the session's shared runs) took minutes to
reach their planted faults, past every watcher's wait. Few at a time, each reaches its fault in seconds, and the
jobs still wait out their timers side by side."""
START_UP_S = 40.0
"""A job counts as started after this long even where it shows no sign of it (a rank planted to hang at start-up)."""


def _past_start_up(folder: Path, job: Job, began: float) -> bool:
    """Whether the job in ``folder`` has come past its start-up: a planted fault's file, its run's progress file, a
    process of it ended, or START_UP_S gone by."""
    marks = ("ready-*", "stuck-*", "stopped-*", "report/progress.jsonl")
    return (any(next(folder.glob(mark), None) is not None for mark in marks)
            or any(proc.poll() is not None for proc in job.procs) or time.monotonic() - began > START_UP_S)


def _run_side_by_side(target: Path, names: list[str]) -> None:
    """Every job of ``names`` started from this thread, no more than STARTING_AT_ONCE in their start-up at a time,
    and watched from its start by a thread of its own (its planted fault is timed from when it happens); what each
    left, or the error its watching raised, into target/ended.json. (A thread runs while a job is forked here: each
    job's preexec_fn only resets a signal's disposition, which takes no lock.)"""
    jobs: dict[str, Job] = {}
    began: dict[str, float] = {}

    def watch(name: str) -> dict[str, Any]:
        try:
            seen = WAITED_OUT[name][1](target / name, jobs[name])
        except Exception:  # noqa: BLE001  (its test reports it; the other jobs are still judged)
            for proc in jobs[name].procs:
                proc.kill()
            return {"error": traceback.format_exc()}
        return {**seen, "job": {**asdict(seen["job"]), "report_dir": str(seen["job"].report_dir)}}

    with ThreadPoolExecutor(len(names)) as pool:
        watched = {}
        for name in names:
            while sum(not _past_start_up(target / n, jobs[n], began[n]) for n in jobs) >= STARTING_AT_ONCE:
                time.sleep(0.2)
            (target / name).mkdir()
            jobs[name], began[name] = WAITED_OUT[name][0](target / name), time.monotonic()
            watched[name] = pool.submit(watch, name)
        ended = {name: watched[name].result() for name in names}
    partial = target / "ended.json.tmp"  # renamed into place: a reader never sees half a file
    partial.write_text(json.dumps(ended))
    partial.rename(target / "ended.json")


RUNNER_WAIT_S = 420.0
"""How long a test waits for the jobs (their longest takes about a minute on 2 busy cores; each has its own
timeout of at most 180 s): a hang guard."""


def _selected(session: pytest.Session, temp: pytest.TempPathFactory) -> tuple[list[str], Path]:
    """The selected tests' jobs, and the folder they run into (the same for every xdist worker)."""
    names = [n for n in WAITED_OUT if any(item.name == n for item in session.items)]
    key = "".join(chr(ord("a") + list(WAITED_OUT).index(n)) for n in names)
    return names, shared_path(temp, f"waited-out-{key}")


def start_early(session: pytest.Session, temp: pytest.TempPathFactory) -> subprocess.Popen[bytes] | None:
    """The selected jobs started in a runner process of their own, by the first worker to get here (the
    others find the folder made); None where this worker did not start it or nothing is selected."""
    names, target = _selected(session, temp)
    if not names:
        return None
    try:
        target.mkdir(parents=True)
    except FileExistsError:
        return None
    # The runner serves the whole session: its processes carry its own tag under the session's, not this worker's
    # (tests/helpers/children.py), and it ends them all once the session's first process has gone.
    (target / "runner.tag").write_text(children.new_tag())
    (target / "session.pid").write_text(str(children.session_pid()))
    with open(target / "runner.log", "wb") as log:  # the runner has its own copy of the descriptor
        # A session of its own: a Ctrl-C of the session reaches the runner only through stop_runner, with its
        # process tree still whole. This checkout first on its path, as its jobs have it (it reads its limits).
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
        env.pop(children.OWNER_ENV, None)
        if (chain := children.session_chain()) is not None:
            env[children.OWNER_ENV] = chain
        runner = subprocess.Popen([sys.executable, __file__, str(target), *names], stdout=log,
                                  stderr=subprocess.STDOUT, start_new_session=True, env=env)
    (target / "runner.pid").write_text(str(runner.pid))  # for the workers that wait on it
    return runner


def _runner_gone(target: Path) -> bool:
    """The runner has exited (or is a zombie its worker has not reaped yet); False while it runs or before the
    worker that starts it has written its pid."""
    try:
        return not alive(int((target / "runner.pid").read_text()))
    except (FileNotFoundError, ValueError):  # not written yet, or half written
        return False


def stop_runner(runner: subprocess.Popen[bytes]) -> None:
    """At the session's end without xdist: a runner still going (the session stopped early) is ended with every
    process of its jobs (their launchers, ranks and keepers, orphaned or not)."""
    target = Path(runner.args[2])  # type: ignore[index]  (start_early's command: python FILE TARGET NAME...)
    children.end((target / "runner.tag").read_text())
    runner.wait()


def stop_runners(root: Path) -> None:
    """At the xdist controller's session end, when no worker can wait on the jobs any more: every runner under
    ``root`` is ended as ``stop_runner`` does. Not at the end of the worker that started it: the worker running the
    waited-out tests may not have reached them yet, and an xdist worker cannot tell a Ctrl-C of the session from
    the end of its share."""
    for tag_file in root.glob("report-run-waited-out-*/runner.tag"):
        children.end(tag_file.read_text())


@pytest.fixture(scope="session")
def waited_out(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What each selected job of ``WAITED_OUT`` left (by test name), its jobs run side by side once per session
    by the runner conftest.py's autouse fixture started (``start_early``) before any test."""
    _, target = _selected(request.session, tmp_path_factory)
    deadline = time.monotonic() + RUNNER_WAIT_S
    while not (target / "ended.json").exists():
        if (target / "failed.txt").exists():
            pytest.fail(f"the runner of the waited-out jobs failed:\n{(target / 'failed.txt').read_text()}")
        if _runner_gone(target) and not (target / "ended.json").exists():
            pytest.fail("the runner of the waited-out jobs exited without their results; it said:\n"
                        f"{(target / 'runner.log').read_text(errors='replace')[-4000:]}")
        if time.monotonic() > deadline:
            pytest.fail(f"the waited-out jobs did not end within {RUNNER_WAIT_S:.0f} s; the runner said:\n"
                        f"{(target / 'runner.log').read_text(errors='replace')[-4000:]}")
        time.sleep(0.5)
    return json.loads((target / "ended.json").read_text())


def ended(waited_out: dict[str, Any], request: pytest.FixtureRequest) -> tuple[JobResult, dict[str, Any]]:
    """This test's job, and what was seen of it."""
    seen = waited_out[request.node.name]
    if "error" in seen:
        pytest.fail(f"watching the job failed:\n{seen['error']}")
    job = seen["job"]
    return JobResult(job["codes"], job["output"], job["seconds"], Path(job["report_dir"])), seen


if __name__ == "__main__":  # the runner: python tests/helpers/waited_out_runs.py TARGET NAME...
    where = Path(sys.argv[1])
    own = children.adopt((where / "runner.tag").read_text())
    children.watch(int((where / "session.pid").read_text()), own)
    try:
        _run_side_by_side(where, sys.argv[2:])
    except BaseException:
        (Path(sys.argv[1]) / "failed.txt").write_text(traceback.format_exc())
        raise
