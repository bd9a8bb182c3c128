"""A real Slurm cluster for the suite's Slurm tests (marker ``slurm``): find it, hold it, submit to it.

The tests need a cluster that is up, root, and the hooks of launch/slurm/local-cluster.sh (node
names node1..nodeN on this machine; a TaskProlog that plants `export K=V` lines from
HOOKS/env.NODENAME into every task on that node; a Prolog that runs HOOKS/prolog; a
HealthCheckProgram, every 5 s, that runs HOOKS/healthcheck). Where any of it
is missing they skip with the reason, or fail where CLUSTERGATE_REQUIRE_SLURM=1 (CI, which starts
the cluster itself and must not pass by skipping). Where CLUSTERGATE_SLURM_TIER=later they skip at once:
CI runs them in a tier of their own, after the rest, while the cluster it starts is coming up.

One test at a time holds the cluster (a file lock): plants are per node and cluster-wide, so two
tests (xdist workers, or two checkouts on one machine) must not mix them. Every job submitted is
logged to $CLUSTERGATE_SLURM_JOB_LOG when set (CI prints it: nodes, job, status, seconds).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from torchrun_job import ROOT, job_env

START = "launch/slurm/local-cluster.sh start 4"


@dataclass
class Job:
    """A finished batch job: its id, exit status (sbatch --wait's), output file and wall time."""

    job_id: str
    status: int
    output_file: Path
    seconds: float

    @property
    def output(self) -> str:
        return self.output_file.read_text(errors="replace") if self.output_file.exists() else ""


@dataclass
class SlurmCluster:
    nodes: list[str]
    hooks: Path
    """The directory of the TaskProlog / Prolog hooks (env.NODENAME, prolog)."""
    planted: list[Path] = field(default_factory=list)

    def plant_env(self, node: str, **variables: str) -> None:
        """Every task on ``node`` gets these variables (the TaskProlog hook: slurmd takes the rest of each
        `export K=V` line as the value, spaces included, quotes not removed)."""
        assert not any("\n" in v for v in variables.values()), "one line per variable"
        lines = [f"export {k}={v}" for k, v in variables.items()]
        path = self.hooks / f"env.{node}"
        path.write_text("\n".join(lines) + "\n")
        self.planted.append(path)

    def plant_prolog(self, text: str) -> None:
        """Run this script as the cluster's Prolog (on every node of a job, as it is allocated)."""
        path = self.hooks / "prolog"
        path.write_text(text)
        path.chmod(0o755)
        self.planted.append(path)

    def plant_healthcheck(self, text: str) -> None:
        """Run this script as the cluster's HealthCheckProgram (every 5 s on every node)."""
        path = self.hooks / "healthcheck"
        path.write_text(text)
        path.chmod(0o755)
        self.planted.append(path)

    def clear(self) -> None:
        for path in [*self.planted, *self.hooks.glob("env.*"), self.hooks / "prolog", self.hooks / "healthcheck"]:
            path.unlink(missing_ok=True)
        self.planted.clear()

    def node_state(self, node: str) -> tuple[str, str]:
        """(state, reason) as scontrol shows them, e.g. ("IDLE+DRAIN", "clustergate: reject: ...")."""
        out = _run(["scontrol", "show", "node", node]).stdout
        state = re.search(r"\bState=(\S+)", out)
        reason = re.search(r"\bReason=(.*?)(?: \[\S+@\S+\])?$", out, re.M)
        return (state.group(1) if state else "?", reason.group(1) if reason else "")

    def daemon_lines(self, job_id: str) -> str:
        """What slurmctld and each slurmd logged of this job (local-cluster.sh keeps their logs beside the hooks):
        where a job took longer than it should, they say which node's step lingered and why."""
        mark = re.compile(rf"JobId={job_id}\b|\[{job_id}\.|StepId={job_id}\.|job {job_id}\b")
        lines = []
        for log_file in sorted(self.hooks.glob("slurm*.log")):
            found = [line for line in log_file.read_text(errors="replace").splitlines() if mark.search(line)]
            lines += [f"{log_file.name}: {line}" for line in found[-20:]]
        return "\n".join(lines) or f"no line of {self.hooks}/slurm*.log names job {job_id}"

    def resume_drained(self) -> None:
        """Put back nodes a clustergate test drained (a drain of anything else is left alone)."""
        for node in self.nodes:
            state, reason = self.node_state(node)
            if "DRAIN" in state and reason.startswith("clustergate: "):
                _run(["scontrol", "update", f"nodename={node}", "state=resume"])

    def submit(self, script: str, args: list[str], *, nodes: int, out_dir: Path, timeout: float,
               env: dict[str, str] | None = None, sbatch: list[str] | None = None) -> Job:
        """``sbatch --wait`` a script from launch/slurm/ on ``nodes`` nodes, CPU ranks; cancel it past
        ``timeout`` (then the test fails with the output so far)."""
        out_dir.mkdir(parents=True, exist_ok=True)
        name = f"cg-test-{uuid.uuid4().hex[:8]}"  # to cancel it by name: sbatch --wait prints its id at the end
        cmd = ["sbatch", "--wait", "--parsable", f"--job-name={name}", f"--nodes={nodes}",
               f"--output={out_dir / 'job-%j.out'}", *(sbatch or []), str(ROOT / "launch" / "slurm" / script), *args]
        start = time.monotonic()
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=cpu_job_env(out_dir, env), capture_output=True, text=True,
                                  timeout=timeout)
        except subprocess.TimeoutExpired:
            _run(["scancel", f"--name={name}"])
            outputs = "\n".join(p.read_text(errors="replace")[-6000:] for p in out_dir.glob("job-*.out"))
            log(f"slurm job {name}: {script} on {nodes} nodes: cancelled after {timeout:.0f} s (the test's limit)")
            pytest.fail(f"job {name} ({script} on {nodes} nodes) still running after {timeout:.0f} s; cancelled.\n"
                        f"{outputs}")
        job_id = proc.stdout.strip().split(";")[0]
        assert job_id, f"sbatch did not submit: {proc.stderr}"
        job = Job(job_id, proc.returncode, out_dir / f"job-{job_id}.out", time.monotonic() - start)
        verdicts = ", ".join(f"{r.parent.relative_to(out_dir)}: {json.loads(r.read_text()).get('verdict')}"
                             for r in sorted(out_dir.rglob("results.json")))
        log(f"slurm job {job_id}: {script} {' '.join(args)} on {nodes} node{'s' if nodes > 1 else ''}: "
            f"exit {job.status}, {job.seconds:.1f} s; results.json: {verdicts or 'none'}")
        return job

    def submit_nowait(self, script: str, args: list[str], *, nodes: int, out_dir: Path,
                      env: dict[str, str] | None = None) -> tuple[str, Path]:
        out_dir.mkdir(parents=True, exist_ok=True)
        proc = _run(["sbatch", "--parsable", f"--nodes={nodes}", f"--output={out_dir / 'job-%j.out'}",
                     str(ROOT / "launch" / "slurm" / script), *args], env=cpu_job_env(out_dir, env), cwd=ROOT)
        job_id = proc.stdout.strip().split(";")[0]
        assert proc.returncode == 0 and job_id, proc.stderr
        return job_id, out_dir / f"job-{job_id}.out"


def cpu_job_env(reports: Path, extra: dict[str, str] | None = None) -> dict[str, str]:
    """What sbatch exports to a job of the suite's tests: CPU ranks, one per node, reports under ``reports``."""
    return job_env({"CLUSTERGATE_REPORT_DIR": str(reports), "CLUSTERGATE_GPUS_PER_NODE": "0",
                    "CLUSTERGATE_NPROC_PER_NODE": "1", "CLUSTERGATE_PYTHON": sys.executable,
                    **(extra or {})})


def _run(cmd: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, **kwargs)


def wait_gone(job_id: str, timeout: float) -> float:
    """Seconds until ``job_id`` leaves the queue; fails past ``timeout``."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        if not _run(["squeue", "-h", "-j", job_id]).stdout.strip():
            return time.monotonic() - start
        time.sleep(0.5)
    pytest.fail(f"job {job_id} still in the queue {timeout:.0f} s later")


def log(line: str) -> None:
    """One line per job for CI's log (CLUSTERGATE_SLURM_JOB_LOG) and the test's own output."""
    path = os.environ.get("CLUSTERGATE_SLURM_JOB_LOG")
    if path:
        with open(path, "a") as f:
            f.write(line + "\n")
    print(line)


def results(path: Path) -> dict[str, Any]:
    assert path.exists(), f"{path} was not written"
    return json.loads(path.read_text())


_NO_CONTROLLER: list[str] = []
"""Why sinfo failed, once it has (a cluster does not come up in the middle of a test run)."""


def _unavailable(nodes: int) -> str | None:
    """Why the Slurm tests cannot run here; None when they can."""
    if os.environ.get("CLUSTERGATE_SLURM_TIER") == "later":
        return "CLUSTERGATE_SLURM_TIER=later: the Slurm tests run in a tier of their own (tests -m slurm)"
    if shutil.which("sbatch") is None:
        return f"sbatch not found: Slurm is not installed (as root: {START} installs and starts a local cluster)"
    if os.geteuid() != 0:
        return "the Slurm tests need root: they plant per-node faults in the cluster's hooks and drain nodes"
    if _NO_CONTROLLER:
        return _NO_CONTROLLER[0]
    info = _run(["sinfo", "-h", "-N", "-o", "%N %t"])
    if info.returncode != 0:
        # sinfo takes 9 s to give up on a controller that is not there: asked once per test process.
        _NO_CONTROLLER.append(f"no Slurm cluster is up (sinfo: {info.stderr.strip()}): start one with {START}")
        return _NO_CONTROLLER[0]
    up = [line.split()[0] for line in info.stdout.splitlines() if line.split()[1].rstrip("*~#") in
          ("idle", "mix", "alloc", "drain", "drng")]
    if len(up) < nodes:
        return f"this test needs {nodes} Slurm nodes; sinfo shows {len(up)} up: start them with {START}"
    return None


def _hooks() -> Path | None:
    config = _run(["scontrol", "show", "config"]).stdout
    found = re.search(r"^TaskProlog\s*=\s*(\S+)", config, re.M)
    if not found or not found.group(1).endswith("/taskprolog.sh"):
        return None
    return Path(found.group(1)).parent


@pytest.fixture
def slurm(request: pytest.FixtureRequest) -> Iterator[SlurmCluster]:
    """The cluster, held by this test alone; skipped (or failed, under CLUSTERGATE_REQUIRE_SLURM=1) without one.
    ``@pytest.mark.slurm_nodes(N)`` asks for N nodes (default 4)."""
    marker = request.node.get_closest_marker("slurm_nodes")
    needed = marker.args[0] if marker else 4
    why = _unavailable(needed)
    hooks = _hooks() if why is None else None
    if why is None and hooks is None:
        why = f"this cluster has no planting hooks (TaskProlog .../taskprolog.sh): start it with {START}"
    if why is not None:
        if os.environ.get("CLUSTERGATE_REQUIRE_SLURM") == "1":
            pytest.fail(f"CLUSTERGATE_REQUIRE_SLURM=1 but {why}")
        pytest.skip(why)
    assert hooks is not None
    names = _run(["sinfo", "-h", "-N", "-o", "%N"]).stdout.split()
    # The lock lives with the hooks (root's alone), not at a fixed /tmp path another user could plant first.
    lock_path = hooks / "tests.lock"
    lock_path.touch(exist_ok=True)
    with lock_path.open() as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # waits for another test (or checkout) using the cluster
        cluster = SlurmCluster(nodes=sorted(set(names)), hooks=hooks)
        cluster.clear()  # what a killed test run may have left
        cluster.resume_drained()
        try:
            yield cluster
        finally:
            cluster.clear()
            cluster.resume_drained()
