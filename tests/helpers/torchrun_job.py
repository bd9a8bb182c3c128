"""Run pytest under torchrun, as a user does, from the suite's own tests.

One agent (``--standalone``) or several agents on 127.0.0.1 forming a multi-node job through c10d
rendezvous: the multi-node rehearsal that needs no second machine.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import _pytest

ROOT = Path(__file__).resolve().parents[2]
FAULTS = ROOT / "tests" / "faults"


@dataclass
class JobResult:
    codes: list[int]
    output: str
    seconds: float
    report_dir: Path

    @property
    def results(self) -> dict[str, Any]:
        return json.loads((self.report_dir / "results.json").read_text())


PLANTED_SUITE = ["-p", "tests.faults.planted_suite"]
"""pytest arguments that make the planted test files the whole suite (tests/faults/planted_suite.py)."""


def plant(cwd: Path, fault: str, hooks: str | None = None) -> list[str]:
    """Copy ``tests/faults/FAULT.py`` to ``cwd/test_fault.py`` (and ``HOOKS.py``, hooks that act between
    tests, to ``conftest.py``); the pytest arguments that run it against the shipped thresholds, as the whole
    suite (``tests/faults/planted_suite.py``, copied beside it: a rank given another PYTHONPATH loads it too)."""
    shutil.copy(FAULTS / f"{fault}.py", cwd / "test_fault.py")
    shutil.copy(FAULTS / "planted_suite.py", cwd / "planted_suite.py")
    if hooks is not None:
        shutil.copy(FAULTS / f"{hooks}.py", cwd / "conftest.py")
    return ["--thresholds", str(ROOT / "thresholds.yaml"), "-p", "planted_suite", "test_fault.py"]


def frames_of_ours(output: str) -> list[str]:
    """The lines of ``output`` that show a traceback through clustergate's own code or pytest's (a frame's file, in
    Python's form or pytest's ``path.py:N``): a usage error is one line, never such a traceback. torchrun's own
    traceback of a failed child names only the interpreter's files, which may lie under a directory named
    clustergate (a virtual environment in the checkout): those are not ours."""
    ours = re.compile("|".join([re.escape(str(ROOT / "clustergate") + os.sep),
                                re.escape(str(Path(_pytest.__file__).resolve().parent) + os.sep),
                                r"(?<![\w./-])(?:clustergate|_pytest)/[\w/]+\.py"]))
    return [line for line in output.splitlines() if ours.search(line)]


def root_cause(output: str) -> dict[str, str]:
    """The "Root Cause" entry of torchrun's own failure summary in ``output`` (its ChildFailedError): each field by
    name (``exitcode``, ``error_file``, ``traceback``: the rank's error file's words, continued lines joined); empty
    where torchrun printed none."""
    block = output.rpartition("Root Cause (first observed failure):")[2].split("\n=====", 1)[0]
    fields: dict[str, str] = {}
    last = None
    for line in block.splitlines()[2:]:  # after "[0]:"
        name, sep, value = line.partition(":")
        if sep and last != "traceback" and name.strip() in ("time", "host", "rank", "exitcode", "error_file",
                                                            "traceback"):
            last = name.strip()
            fields[last] = value.strip()
        elif last is not None:
            fields[last] += "\n" + line.removeprefix("  ")
    return fields


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def foreground_signals() -> None:
    """preexec_fn of every job: SIGINT back to its default, as a shell does for a foreground command.
    A test runner started in the background (``cmd &`` in a script, nohup) ignores SIGINT and its
    children inherit that; the plugin rightly respects an ignored SIGINT, so a planted Ctrl-C would
    then be lost and the job run to its timeout."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def clustergate_args(*args: str) -> list[str]:
    """``python -m clustergate`` and its arguments: ``merge``, ``signoff`` and ``calibrate`` as given, anything else
    a results file to re-render (``render``), as the cluster tests name their commands."""
    command = list(args) if args[:1] and args[0] in ("merge", "signoff", "calibrate", "render") else ["render", *args]
    return [sys.executable, "-m", "clustergate", *command]


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of a run as the README starts one: only the suite's plugins load (a plugin installed here,
    pytest-xdist's, would make the run partial: clustergate.trust.attestation)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env["PYTEST_DISABLE_PLUGIN_AUTOLOAD"] = "1"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # the suite's own tests run the cpu profile, whatever the host has
    env.update(extra or {})
    return env


@dataclass
class Job:
    """A job under way: signal it (``procs``), then ``wait``."""

    procs: list[subprocess.Popen[str]]
    start: float
    timeout: float
    report_dir: Path

    def wait(self) -> JobResult:
        outputs, codes = [], []
        for p in self.procs:
            try:
                out, _ = p.communicate(timeout=max(1.0, self.timeout - (time.monotonic() - self.start)))
            except subprocess.TimeoutExpired:
                for q in self.procs:
                    kill_tree(q.pid)
                out = (p.communicate()[0] or "") + f"\n[test harness: killed after {self.timeout} s]"
            outputs.append(out)
            codes.append(p.returncode)
        return JobResult(codes=codes, output="\n".join(outputs), seconds=time.monotonic() - self.start,
                         report_dir=self.report_dir)


def descendants(pid: int) -> list[int]:
    """Every live process below ``pid``, read from /proc (torchrun puts each rank in a session of its own, so no
    process group holds them all)."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(") ", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = [], [pid]
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def job_processes(job: Job) -> list[int]:
    """Every process of a job now: its agents and everything below them (ranks, their keepers, their children)."""
    return [each for p in job.procs for each in [p.pid, *descendants(p.pid)]]


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything below it. Killing torchrun alone leaves its ranks running with no launcher
    (a rank planted to hang then hangs for good)."""
    for each in [pid, *descendants(pid)]:  # read before any is killed: an orphan is re-parented away
        with contextlib.suppress(ProcessLookupError):
            os.kill(each, signal.SIGKILL)


def _pytest_args(cwd: Path, pytest_args: list[str], report_dir: Path | None = None) -> list[str]:
    return ["-m", "pytest", "-p", "clustergate", "-p", "no:cacheprovider",
            "--rootdir", str(cwd), "--report-dir", str(report_dir or cwd / "report"), *pytest_args]


def start_job(cwd: Path, pytest_args: list[str], *, nodes: int = 1, nproc: int = 2, timeout: float = 240,
              env: dict[str, str] | None = None, report_dir: Path | None = None,
              node_env: list[dict[str, str]] | None = None, node_args: list[list[str]] | None = None) -> Job:
    """Start ``nodes`` torchrun agents of ``nproc`` ranks each running pytest.

    ``node_env`` and ``node_args`` (one entry per agent) add to one agent's environment and pytest
    arguments: its node name, or a fault planted in that node alone.
    """
    report_dir = report_dir or cwd / "report"
    if nodes == 1:
        launch = [["--standalone", f"--nproc-per-node={nproc}"]]
    else:
        port, run_id = free_port(), uuid.uuid4().hex[:8]
        common = [f"--nnodes={nodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}", "--max-restarts=0"]
        launch = [common for _ in range(nodes)]
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *opts,
                               *_pytest_args(cwd, pytest_args, report_dir), *(node_args[i] if node_args else [])],
                              cwd=cwd, env=job_env({**(env or {}), **(node_env[i] if node_env else {})}),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              preexec_fn=foreground_signals)
             for i, opts in enumerate(launch)]
    return Job(procs, start, timeout, report_dir)


def run_job(cwd: Path, pytest_args: list[str], *, nodes: int = 1, nproc: int = 2, timeout: float = 240,
            env: dict[str, str] | None = None, report_dir: Path | None = None,
            node_env: list[dict[str, str]] | None = None, node_args: list[list[str]] | None = None) -> JobResult:
    """Start ``nodes`` torchrun agents of ``nproc`` ranks each running pytest; wait for all."""
    return start_job(cwd, pytest_args, nodes=nodes, nproc=nproc, timeout=timeout, env=env, report_dir=report_dir,
                     node_env=node_env, node_args=node_args).wait()


def start_ranks(cwd: Path, pytest_args: list[str], *, nproc: int = 2, timeout: float = 240,
                env: dict[str, str] | None = None) -> Job:
    """``nproc`` ranks started as torchrun would, but by this process: no agent stops the others when one
    dies, and each rank's own exit status is seen (``codes[r]`` is rank r's)."""
    port, start = free_port(), time.monotonic()
    procs = []
    for rank in range(nproc):
        rank_env = {"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc),
                    "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port), **(env or {})}
        procs.append(subprocess.Popen([sys.executable, *_pytest_args(cwd, pytest_args)], cwd=cwd,
                                      env=job_env(rank_env), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, preexec_fn=foreground_signals))
    return Job(procs, start, timeout, cwd / "report")


def wait_for(path: Path, timeout: float = 120) -> float:
    """Wait until ``path`` exists (a planted test says where it is); the monotonic time it appeared."""
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} did not appear within {timeout} s")
        time.sleep(0.1)
    return time.monotonic()
