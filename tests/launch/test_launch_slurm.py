"""The Slurm launcher and the per-node script: syntax, shellcheck, and what they hand to srun and torchrun.

srun, scontrol and Python are replaced by small recorders on PATH, so the scripts run for real here
and the tests read back the exact commands and environment a cluster would get.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

import clustergate

ROOT = Path(__file__).resolve().parents[2]
SBATCH = ROOT / "launch" / "slurm" / "clustergate.sbatch"
NODE = ROOT / "launch" / "node.sh"
SCRIPTS = [*sorted((ROOT / "launch" / "slurm").glob("*.s*")), NODE, ROOT / "launch" / "k8s" / "render.sh",
           ROOT / "launch" / "image.sh"]

sys.path.insert(0, str(ROOT / "launch"))
import first_failure  # noqa: E402


def _exe(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IEXEC | stat.S_IXGRP | stat.S_IXOTH)
    return path


def _recorder(bin_dir: Path, name: str, log: Path) -> None:
    """A fake command that writes its arguments (one a line) and CLUSTERGATE_* environment to ``log``."""
    _exe(bin_dir / name, f"""#!/usr/bin/env bash
{{ printf 'ARG %s\\n' "$@"; env | grep '^CLUSTERGATE_' | sed 's/^/ENV /'; }} >> '{log}'
""")


def _read(log: Path) -> tuple[list[str], dict[str, str]]:
    lines = log.read_text().splitlines()
    args = [line[4:] for line in lines if line.startswith("ARG ")]
    env = dict(line[4:].split("=", 1) for line in lines if line.startswith("ENV "))
    return args, env


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_bash_syntax(script: Path) -> None:
    proc = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


@pytest.mark.skipif(shutil.which("shellcheck") is None, reason="shellcheck not installed (apt-get install shellcheck)")
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_shellcheck_clean(script: Path) -> None:
    proc = subprocess.run(["shellcheck", "--shell=bash", "--external-sources", str(script)], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _slurm(tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "srun.log"
    _recorder(bin_dir, "srun", log)
    _exe(bin_dir / "scontrol", "#!/bin/sh\n[ \"$1 $2\" = 'show hostnames' ] && printf 'gpu-a07\\ngpu-a08\\n'\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERGATE_"))}
    env |= {"PATH": f"{bin_dir}{os.pathsep}{env['PATH']}", "SLURM_JOB_ID": "4242", "SLURM_JOB_NUM_NODES": "2",
            "SLURM_JOB_NODELIST": "gpu-a[07-08]", "SLURM_GPUS_PER_NODE": "h100:8", "SLURM_CPUS_ON_NODE": "224",
            "SLURM_SUBMIT_DIR": str(ROOT), "CLUSTERGATE_REPORT_DIR": str(tmp_path / "reports"), **extra}
    proc = subprocess.run(["bash", str(SBATCH), "acceptance", "-m", "multinode"], env=env, capture_output=True,
                          text=True, timeout=60)
    return proc, log


def test_sbatch_starts_one_torchrun_agent_per_node(tmp_path: Path) -> None:
    proc, log = _slurm(tmp_path)
    assert proc.returncode == 0, proc.stderr
    args, env = _read(log)
    assert args[:6] == ["--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--cpu-bind=none", "--cpus-per-task=224",
                        "--kill-on-bad-exit=1"]
    assert args[6:] == ["bash", str(ROOT / "launch" / "node.sh"), "acceptance", "-m", "multinode"]
    assert env["CLUSTERGATE_RDZV_ENDPOINT"] == "gpu-a07:29500"  # the allocation's first node
    assert env["CLUSTERGATE_RDZV_ID"] == "4242"
    assert env["CLUSTERGATE_NNODES"] == "2" and env["CLUSTERGATE_GPUS_PER_NODE"] == "8"
    assert env["CLUSTERGATE_REPORT_DIR"] == str(tmp_path / "reports" / "clustergate-4242")
    assert (tmp_path / "reports" / "clustergate-4242").is_dir()
    assert "collect" in proc.stdout and "results.json" in proc.stdout


def test_sbatch_in_a_pyxis_container(tmp_path: Path) -> None:
    nccl = tmp_path / "nccl.env"
    nccl.write_text("NCCL_DEBUG=INFO\n")
    proc, log = _slurm(tmp_path, CLUSTERGATE_CONTAINER_IMAGE="nvcr.io#nvidia/pytorch:25.01-py3",
                       CLUSTERGATE_NCCL_ENV=str(nccl), CLUSTERGATE_RDZV_PORT="29600")
    assert proc.returncode == 0, proc.stderr
    args, env = _read(log)
    assert "--container-image=nvcr.io#nvidia/pytorch:25.01-py3" in args
    reports = tmp_path / "reports" / "clustergate-4242"
    assert f"--container-mounts={ROOT}:{ROOT},{reports}:{reports},{nccl}:{nccl}" in args
    assert f"--container-workdir={ROOT}" in args
    assert env["CLUSTERGATE_RDZV_ENDPOINT"] == "gpu-a07:29600" and env["CLUSTERGATE_NCCL_ENV"] == str(nccl)


def test_sbatch_in_the_clustergate_image_from_a_registry(tmp_path: Path) -> None:
    """CLUSTERGATE_REGISTRY: the Dockerfile's image, named as launch/image.sh names it, in pyxis' form."""
    for name in ("pushed", "named", "bad"):
        (tmp_path / name).mkdir()
    proc, log = _slurm(tmp_path / "pushed", CLUSTERGATE_REGISTRY="registry.example:5000/gpu-team")
    assert proc.returncode == 0, proc.stderr
    args, _ = _read(log)
    assert f"--container-image=registry.example:5000#gpu-team/clustergate:{clustergate.__version__}" in args
    assert f"--container-workdir={ROOT}" in args
    proc, log = _slurm(tmp_path / "named", CLUSTERGATE_REGISTRY="ghcr.io/acme", CLUSTERGATE_CONTAINER_IMAGE="/i.sqsh")
    assert "--container-image=/i.sqsh" in _read(log)[0]  # an image named outright wins
    proc, log = _slurm(tmp_path / "bad", CLUSTERGATE_REGISTRY="docker://ghcr.io/acme")
    assert proc.returncode == 2 and proc.stderr.startswith("clustergate: CLUSTERGATE_REGISTRY='docker://ghcr.io/acme'")


@pytest.mark.parametrize(("unset", "message"), [
    ("CLUSTERGATE_REPORT_DIR", "set CLUSTERGATE_REPORT_DIR to a directory every node mounts"),
    ("SLURM_GPUS_PER_NODE", "how many GPUs per node?"),
])
def test_sbatch_refuses_missing_parameters(tmp_path: Path, unset: str, message: str) -> None:
    proc, log = _slurm(tmp_path, **{unset: ""})
    assert proc.returncode == 2 and message in proc.stderr
    assert not log.exists()


def _node(tmp_path: Path, index: str | None, *, numactl: bool = True, **extra: str) -> tuple[
        subprocess.CompletedProcess[str], list[str]]:
    """Run launch/node.sh with a fake Python that passes preflight and records torchrun's arguments."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    log = tmp_path / "torchrun.log"
    _exe(bin_dir / "python", f"""#!/usr/bin/env bash
case "$1 $2 $3" in
  "-c "*node_name*) echo "${{FAKE_NODE_NAME:-gpu-a08}}"; exit 0 ;;  # this node's name (workloads/node/name.py)
  "-c "*) exec '{sys.executable}' "$@" ;;  # the node's exit record (launch/first_failure.py reads it)
  "launch/preflight.py"*) echo "preflight $*" >> '{tmp_path}/preflight.log'; exit 0 ;;
  "-m torch.distributed.run --help") echo "  --numa-binding {{node,socket,exclusive,core-complex}}"; exit 0 ;;
esac
printf '%s\\n' "$@" > '{log}'
echo "${{CLUSTERGATE_RUN_ID:-}}" > '{tmp_path}/run-id.txt'  # what the ranks record as the cluster run
exit ${{FAKE_STATUS:-0}}
""")
    if numactl:
        _exe(bin_dir / "numactl", "#!/bin/sh\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "CLUSTERGATE_", "JOB_COMPLETION"))}
    env |= {"PATH": f"{bin_dir}{os.pathsep}/usr/bin{os.pathsep}/bin", "CLUSTERGATE_PYTHON": str(bin_dir / "python"),
            "CLUSTERGATE_NNODES": "2", "CLUSTERGATE_GPUS_PER_NODE": "8", "CLUSTERGATE_RDZV_ENDPOINT": "gpu-a07:29500",
            "CLUSTERGATE_RDZV_ID": "4242", "CLUSTERGATE_REPORT_DIR": str(tmp_path / "r"), **extra}
    if index is not None:
        env["SLURM_NODEID"] = index
    proc = subprocess.run(["bash", str(NODE), "acceptance", "--level", "quick"], env=env, capture_output=True,
                          text=True, timeout=60)
    return proc, (log.read_text().splitlines() if log.exists() else [])


def test_node_script_runs_torchrun_with_c10d(tmp_path: Path) -> None:
    proc, args = _node(tmp_path, "0")
    assert proc.returncode == 0, proc.stderr
    assert args == ["-m", "torch.distributed.run", "--numa-binding=node", "--nnodes=2", "--rdzv-backend=c10d",
                    "--rdzv-endpoint=gpu-a07:29500", "--rdzv-id=4242",
                    "--rdzv-conf=join_timeout=600,read_timeout=60,is_host=1", "--nproc-per-node=8",
                    "--max-restarts=0", "-m", "pytest", "--report-dir", str(tmp_path / "r"),
                    "acceptance", "--level", "quick"]
    preflight = (tmp_path / "preflight.log").read_text()
    assert "--gpus 8" in preflight and "--node-index 0" in preflight and f"--shared-dir {tmp_path / 'r'}" in preflight


def test_node_script_on_other_nodes_and_without_numactl(tmp_path: Path) -> None:
    proc, args = _node(tmp_path, "1", numactl=False, CLUSTERGATE_RDZV_TIMEOUT="120")
    assert proc.returncode == 0, proc.stderr
    assert "--rdzv-conf=join_timeout=120,read_timeout=60,is_host=0" in args
    assert not any(a.startswith("--numa-binding") for a in args)
    assert "numactl not found" in proc.stderr


def test_node_script_cpu_ranks(tmp_path: Path) -> None:
    proc, args = _node(tmp_path, None, CLUSTERGATE_GPUS_PER_NODE="0", CLUSTERGATE_NPROC_PER_NODE="2")
    assert proc.returncode == 0, proc.stderr
    assert "--nproc-per-node=2" in args and "--rdzv-conf=join_timeout=600,read_timeout=60" in args
    assert not any(a.startswith("--numa-binding") for a in args)


def test_node_script_sources_the_nccl_file(tmp_path: Path) -> None:
    env_file = tmp_path / "nccl.env"
    env_file.write_text("# comment\nNCCL_IB_HCA==mlx5_0:1\n")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    _exe(bin_dir / "python", "#!/usr/bin/env bash\n[ \"$1\" = launch/preflight.py ] && exit 0\n"
                             f"echo \"$NCCL_IB_HCA\" > '{tmp_path}/seen'\n")
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}",
           "CLUSTERGATE_PYTHON": str(bin_dir / "python"), "CLUSTERGATE_NNODES": "1", "CLUSTERGATE_GPUS_PER_NODE": "0",
           "CLUSTERGATE_NPROC_PER_NODE": "1", "CLUSTERGATE_RDZV_ENDPOINT": "127.0.0.1:1", "CLUSTERGATE_RDZV_ID": "x",
           "CLUSTERGATE_REPORT_DIR": str(tmp_path / "r"), "CLUSTERGATE_NCCL_ENV": str(env_file)}
    subprocess.run(["bash", str(NODE)], env=env, check=True, capture_output=True, timeout=60)
    assert (tmp_path / "seen").read_text().strip() == "=mlx5_0:1"


def test_node_script_names_the_node_when_pytest_never_started(tmp_path: Path) -> None:
    proc, _ = _node(tmp_path, "1", FAKE_STATUS="1")
    assert proc.returncode == 1
    assert "clustergate FAILED on gpu-a08 (node index 1): torchrun exited 1 before pytest started" in proc.stderr
    assert "RendezvousTimeoutError" in proc.stderr and "gpu-a07:29500 (id 4242)" in proc.stderr
    record = json.loads((tmp_path / "r" / "node-exits" / "gpu-a08.json").read_text())
    assert record["node"] == "gpu-a08" and record["node_index"] == "1" and record["status"] == 1
    assert abs(record["time"] - time.time()) < 60


def test_node_script_exit_record_is_json_whatever_the_node_is_called(tmp_path: Path) -> None:
    name = 'gpu"a08\\ {x}/../y'  # quotes, a backslash, braces, a slash: printf-built JSON broke on each
    proc, _ = _node(tmp_path, "1", FAKE_STATUS="3", FAKE_NODE_NAME=name)
    assert proc.returncode == 3
    [path] = (tmp_path / "r" / "node-exits").iterdir()
    record = json.loads(path.read_text())
    assert path.name == "gpu_a08___x__.._y.json"  # inside node-exits/, whatever the name holds
    assert record == {"node": name, "node_index": "1", "stage": "torchrun", "status": 3, "time": record["time"]}
    assert first_failure.main([str(tmp_path / "r")]) == 0


@pytest.mark.parametrize("verdict", ["partial", "unjudged", "reject"])
def test_a_run_that_ended_on_every_node_together_keeps_its_verdict(tmp_path: Path, verdict: str) -> None:
    """A narrowed run (partial) or one under a profile without criteria (unjudged) ends non-zero on every node
    together, as a reject does: no node failed first, so its results.json is not re-judged into a reject."""
    report = tmp_path / "r"
    (report / "node-exits").mkdir(parents=True)
    for node in ("a", "b"):
        (report / "node-exits" / f"{node}.json").write_text(json.dumps(
            {"node": node, "node_index": "0", "stage": "torchrun", "status": 1, "time": time.time()}))
    (report / "progress.jsonl").write_text('{"time": 1, "event": "session_end"}\n')
    results = {"verdict": verdict, "error": None, "reason": "ran less than a complete run: (planted)",
               "tests": [{"outcome": "passed"}]}
    (report / "results.json").write_text(json.dumps(results))
    assert first_failure.main([str(report), "--annotate"]) == 0
    assert json.loads((report / "results.json").read_text()) == results


@pytest.mark.parametrize(("verdict", "error", "status"), [
    ("partial", None, "1"), ("reject", None, "1"), ("accept", None, "0"),
    ("reject", "rank 3 (node2) was lost", "143"),  # ended early: srun's own status stands
])
def test_a_job_whose_run_ended_with_its_verdict_exits_by_it(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                            verdict: str, error: str | None, status: str) -> None:
    """srun --kill-on-bad-exit signals a node still ending when another has exited 1 (step status 143): a run
    that ended on every node with its verdict gives the job the verdict's status, as the exit table says."""
    report = tmp_path / "r"
    report.mkdir()
    (report / "progress.jsonl").write_text('{"time": 1, "event": "session_end"}\n')
    (report / "results.json").write_text(json.dumps({"verdict": verdict, "error": error, "tests": []}))
    assert first_failure.main([str(report), "--job-status", "143"]) == 0
    assert capsys.readouterr().out.strip() == status


def test_node_script_alone_per_node_report_directory(tmp_path: Path) -> None:
    """One node alone (the sign-off's node phase): torchrun --standalone, reports under the node's name."""
    proc, args = _node(tmp_path, "2", CLUSTERGATE_NNODES="1", CLUSTERGATE_RDZV_ENDPOINT="", CLUSTERGATE_RDZV_ID="",
                       CLUSTERGATE_REPORT_DIR=str(tmp_path / "run" / "nodes" / "{node}"))
    assert proc.returncode == 0, proc.stderr
    node_dir = str(tmp_path / "run" / "nodes" / "gpu-a08")
    assert args[2:6] == ["--numa-binding=node", "--standalone", "--nproc-per-node=8", "--max-restarts=0"]
    assert args[-5:] == ["--report-dir", node_dir, "acceptance", "--level", "quick"]
    preflight = (tmp_path / "preflight.log").read_text()
    assert f"--report-dir {node_dir} --shared-dir {node_dir} --rdzv-endpoint  --node-index 2" in preflight


@pytest.mark.parametrize(("report_dir", "given", "run_id"), [
    ("REPORTS/run-7/nodes/{node}", "", "run-7"),  # a node of the node phase
    ("REPORTS/run-7/fabric", "fabric", "run-7"),  # the fabric phase, by hand through clustergate.sbatch
    ("REPORTS/one-job", "site-run", "site-run"),  # elsewhere: the variable ...
    ("REPORTS/one-job", "", "one-job"),  # ... else the report directory's name
])
def test_node_script_gives_the_ranks_the_cluster_runs_id(tmp_path: Path, report_dir: str, given: str,
                                                          run_id: str) -> None:
    proc, _ = _node(tmp_path, "0", CLUSTERGATE_NNODES="1", CLUSTERGATE_RDZV_ENDPOINT="", CLUSTERGATE_RDZV_ID="",
                    CLUSTERGATE_REPORT_DIR=str(tmp_path / report_dir), CLUSTERGATE_RUN_ID=given)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run-id.txt").read_text().strip() == run_id


@pytest.mark.parametrize(("var", "value", "message"), [
    ("CLUSTERGATE_RDZV_ENDPOINT", "", "CLUSTERGATE_RDZV_ENDPOINT is not set"),
    ("CLUSTERGATE_GPUS_PER_NODE", "eight", "not a number"),
    ("CLUSTERGATE_NCCL_ENV", "/nonexistent/nccl.env", "is not a readable file"),
])
def test_node_script_refuses_bad_parameters(tmp_path: Path, var: str, value: str, message: str) -> None:
    proc, args = _node(tmp_path, "0", **{var: value})
    assert proc.returncode == 2 and message in proc.stderr and "clustergate FAILED on" in proc.stderr
    assert args == []


def test_local_cluster_refuses_a_state_directory_others_can_write(tmp_path: Path) -> None:
    """local-cluster.sh runs as root and kills the pids in its directory's pid files, and slurmd runs the hooks
    kept there: a directory another user could write (the old fixed /tmp/local-slurm) is refused, nothing killed."""
    shared = tmp_path / "local-slurm"
    shared.mkdir()
    shared.chmod(0o777)
    victim = subprocess.Popen(["sleep", "60"])
    try:
        (shared / "slurmctld.pid").write_text(f"{victim.pid}\n")  # planted by "another user"
        env = {**os.environ, "LOCAL_SLURM_DIR": str(shared)}
        proc = subprocess.run(["bash", str(ROOT / "launch" / "slurm" / "local-cluster.sh"), "stop"], env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode != 0 and "refusing directory" in proc.stderr and "(LOCAL_SLURM_DIR)" in proc.stderr
        assert victim.poll() is None  # still running
    finally:
        victim.kill()
        victim.wait()
    script = (ROOT / "launch" / "slurm" / "local-cluster.sh").read_text()
    assert "dir=${LOCAL_SLURM_DIR:-/var/lib/clustergate/local-slurm}" in script
