"""Run pytest under torchrun, as a user does, from the suite's own tests.

One agent (``--standalone``) or several agents on 127.0.0.1 forming a multi-node job through c10d
rendezvous: the multi-node rehearsal that needs no second machine.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class JobResult:
    codes: list[int]
    output: str
    seconds: float
    report_dir: Path

    @property
    def results(self) -> dict[str, Any]:
        return json.loads((self.report_dir / "results.json").read_text())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def job_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "RANK", "LOCAL_RANK", "WORLD_SIZE"))}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env["OMP_NUM_THREADS"] = "1"
    env["CUDA_VISIBLE_DEVICES"] = ""  # the suite's own tests run the cpu profile, whatever the host has
    env.update(extra or {})
    return env


def run_job(cwd: Path, pytest_args: list[str], *, nodes: int = 1, nproc: int = 2, timeout: float = 240,
            env: dict[str, str] | None = None, report_dir: Path | None = None,
            node_env: list[dict[str, str]] | None = None, node_args: list[list[str]] | None = None) -> JobResult:
    """Start ``nodes`` torchrun agents of ``nproc`` ranks each running pytest; wait for all.

    ``node_env`` and ``node_args`` (one entry per agent) add to one agent's environment and pytest
    arguments: its node name, or a fault planted in that node alone.
    """
    report_dir = report_dir or cwd / "report"
    args = ["-m", "pytest", "-p", "clustergate.plugin", "-p", "clustergate.htmlreport", "-p", "no:cacheprovider",
            "--rootdir", str(cwd),
            "--report-dir", str(report_dir), *pytest_args]
    if nodes == 1:
        launch = [["--standalone", f"--nproc-per-node={nproc}"]]
    else:
        port, run_id = free_port(), uuid.uuid4().hex[:8]
        common = [f"--nnodes={nodes}", f"--nproc-per-node={nproc}", "--rdzv-backend=c10d",
                  f"--rdzv-endpoint=127.0.0.1:{port}", f"--rdzv-id={run_id}", "--max-restarts=0"]
        launch = [common for _ in range(nodes)]
    start = time.monotonic()
    procs = [subprocess.Popen([sys.executable, "-m", "torch.distributed.run", *opts, *args,
                               *(node_args[i] if node_args else [])], cwd=cwd,
                              env=job_env({**(env or {}), **(node_env[i] if node_env else {})}),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
             for i, opts in enumerate(launch)]
    outputs, codes = [], []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=max(1.0, timeout - (time.monotonic() - start)))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            out = (p.communicate()[0] or "") + f"\n[test harness: killed after {timeout} s]"
        outputs.append(out)
        codes.append(p.returncode)
    return JobResult(codes=codes, output="\n".join(outputs), seconds=time.monotonic() - start, report_dir=report_dir)
