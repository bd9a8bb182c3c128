"""A cluster on one machine: "nodes" are torchrun agents, each named through CLUSTERGATE_NODE_NAME.

The phases run exactly the commands docs/cluster-signoff.md gives under "The phases", from the
checkout: every node alone (``torchrun --standalone ... -m "not multinode"``, all at once, each into
``RUN/nodes/NAME``), the report command's ``merge`` and ``signoff``, and the fabric phase (one
torchrun agent per node, c10d rendezvous on 127.0.0.1) into ``RUN/fabric``. A fault is planted in one
node by adding ``-p tests.faults.plugin_NAME`` to that node's command only.
"""

from __future__ import annotations

import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path

from torchrun_job import ROOT, clustergate_args, free_port, job_env

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]


@dataclass
class Agent:
    name: str
    code: int
    output: str


def _run_all(commands: list[tuple[str, list[str], dict[str, str]]], timeout: float) -> list[Agent]:
    """Start every (name, argv, env) at once from the checkout; wait for all, killing all past ``timeout``."""
    start = time.monotonic()
    procs = [(name, subprocess.Popen(argv, cwd=ROOT, env=job_env(env), stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)) for name, argv, env in commands]
    agents = []
    for name, proc in procs:
        try:
            out, _ = proc.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            for _, other in procs:
                other.kill()
            out = (proc.communicate()[0] or "") + f"\n[rehearsal: killed after {timeout} s]"
        agents.append(Agent(name, proc.returncode, out))
    return agents


def node_phase(run_dir: Path, names: list[str], pytest_args: list[str], *, nproc: int = 1, timeout: float = 180,
               planted: dict[str, list[str]] | None = None) -> list[Agent]:
    """Every node runs the single-node suite alone, all at once, into RUN/nodes/NAME."""
    commands = [(name, [*TORCHRUN, "--standalone", f"--nproc-per-node={nproc}", "-m", "pytest", *pytest_args,
                        "-m", "not multinode", "--report-dir", str(run_dir / "nodes" / name),
                        *(planted or {}).get(name, [])],
                 {"CLUSTERGATE_NODE_NAME": name}) for name in names]
    return _run_all(commands, timeout)


def fabric_phase(run_dir: Path, names: list[str], pytest_args: list[str], *, nproc: int = 1, timeout: float = 180,
                 planted: dict[str, list[str]] | None = None, run_id: str | None = None) -> list[Agent]:
    """One torchrun agent per node forming one job (c10d rendezvous), -m multinode, into RUN/fabric, as a part of
    cluster run ``run_id`` (CLUSTERGATE_RUN_ID, as the launchers set it)."""
    rdzv = [f"--nnodes={len(names)}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
            f"--rdzv-endpoint=127.0.0.1:{free_port()}", f"--rdzv-id={uuid.uuid4().hex[:8]}", "--max-restarts=0"]
    commands = [(name, [*TORCHRUN, *rdzv, "-m", "pytest", *pytest_args, "-m", "multinode",
                        "--report-dir", str(run_dir / "fabric"), *(planted or {}).get(name, [])],
                 {"CLUSTERGATE_NODE_NAME": name, **({"CLUSTERGATE_RUN_ID": run_id} if run_id else {})})
                for name in names]
    return _run_all(commands, timeout)


def report(*args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    """``python3 -m clustergate`` with ARGS from the checkout (``torchrun_job.clustergate_args``)."""
    return subprocess.run(clustergate_args(*args), cwd=ROOT, env=job_env(), text=True,
                          stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)


def outputs(agents: list[Agent]) -> str:
    return "\n".join(f"===== {a.name}: exit {a.code}\n{a.output[-4000:]}" for a in agents)
