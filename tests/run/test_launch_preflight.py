"""Bad input before the tests: a node with other GPUs, a missing directory, a rendezvous that never answers.

Each must end within its timeout with a message naming the node (its host name) and what to do;
torchrun's own message for an unreachable endpoint is checked too, as the fallback a user sees.
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workloads.node.name import node_name

from torchrun_job import free_port, job_env

ROOT = Path(__file__).resolve().parents[2]
HOST = node_name()  # how preflight names this node (the host name unless Slurm or the user names it)

_spec = importlib.util.spec_from_file_location("preflight", ROOT / "launch" / "preflight.py")
assert _spec is not None and _spec.loader is not None
preflight = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(preflight)


def test_gpu_count_that_differs_is_named() -> None:
    assert preflight.gpu_problem(8, 8) is None
    assert preflight.gpu_problem(0, 3) is None  # CPU ranks: no GPU expected
    problem = preflight.gpu_problem(8, 7, "")
    assert problem is not None and problem.startswith("7 CUDA devices visible")
    assert "the job expects 8 per node" in problem and "--gpus-per-node=7" in problem


def test_directories(tmp_path: Path) -> None:
    assert preflight.directory_problem(str(tmp_path / "new" / "reports"), "report directory", create=True) is None
    assert (tmp_path / "new" / "reports").is_dir()
    missing = preflight.directory_problem(str(tmp_path / "absent"), "shared directory", create=False)
    assert missing == f"shared directory {tmp_path / 'absent'} does not exist on this node: mount the shared " \
                      "filesystem here, or choose another path"


def test_endpoint_that_answers(tmp_path: Path) -> None:
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        endpoint = f"127.0.0.1:{server.getsockname()[1]}"
        assert preflight.wait_for_endpoint(endpoint, 5, connect=True) is None


def test_endpoint_that_never_answers_ends_at_its_timeout() -> None:
    port = free_port()
    start = time.monotonic()
    problem = preflight.wait_for_endpoint(f"127.0.0.1:{port}", 1.5, connect=True, poll_s=0.5)
    # Asked to wait 1.5 s, polling every 0.5 s: 5 s is the timer plus a generous scheduling margin.
    assert time.monotonic() - start < 5
    assert problem is not None and problem.startswith(f"rendezvous endpoint 127.0.0.1:{port} not reachable within 2 s")
    assert f"connect to 127.0.0.1:{port}: Connection refused" in problem and "pod <job>-0" in problem
    unresolved = preflight.wait_for_endpoint("no-such-host.invalid:29500", 0.5, connect=False, poll_s=0.2)
    assert unresolved is not None and "'no-such-host.invalid' does not resolve" in unresolved
    assert "[Errno" not in problem + unresolved  # said in words
    with pytest.raises(ValueError, match="must be HOST:PORT"):
        preflight.wait_for_endpoint("node-001", 1, connect=True)


def test_main_names_this_host_and_every_problem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = preflight.main(["--gpus", "8", "--report-dir", str(tmp_path / "r"), "--shared-dir", str(tmp_path / "nope"),
                           "--rdzv-endpoint", f"127.0.0.1:{free_port()}", "--node-index", "1", "--timeout", "1"])
    err = capsys.readouterr().err.splitlines()
    assert code == 2 and len(err) == 3
    assert all(line.startswith(f"clustergate preflight FAILED on {HOST} (node index 1): ") for line in err)
    assert "CUDA devices visible" in err[0] and "expects 8" in err[0]  # this machine has no GPU
    assert "shared directory" in err[1] and "not reachable within 1 s" in err[2]


# Run in a process of its own: it makes itself a subreaper (PR_SET_CHILD_SUBREAPER), so that the preflight its bash
# starts is handed to it, not to init, once bash is killed; it can then reap it and say how and when it ended.
ORPHAN = r'''import ctypes, json, os, signal, subprocess, sys, time
assert ctypes.CDLL(None, use_errno=True).prctl(36, 1, 0, 0, 0) == 0
preflight, endpoint, reports = sys.argv[1:]
bash = subprocess.Popen(["bash", "-c", f'"{sys.executable}" "{preflight}" --gpus 0 --report-dir "{reports}" '
                         f'--rdzv-endpoint {endpoint} --node-index 1 --timeout 600 & echo $!; wait'],
                        stdout=subprocess.PIPE, text=True)
pid = int(bash.stdout.readline())
# Killed once the preflight has asked for its parent's death signal: main() makes the report directory after that.
armed = time.monotonic()
while not os.path.isdir(reports) and time.monotonic() - armed < 30:
    time.sleep(0.05)
os.kill(bash.pid, signal.SIGKILL)
bash.wait()
killed = time.monotonic()
while time.monotonic() - killed < 15:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        print(json.dumps({"signal": os.WTERMSIG(status) if os.WIFSIGNALED(status) else None,
                          "seconds": time.monotonic() - killed}))
        break
    time.sleep(0.05)
else:
    os.kill(pid, signal.SIGKILL)
    print(json.dumps({"signal": None, "seconds": None}))
'''


def test_preflight_ends_with_the_node_script(tmp_path: Path) -> None:
    """A preflight whose node.sh was killed (a scheduler that missed it) ends then, not 600 s later."""
    proc = subprocess.run([sys.executable, "-c", ORPHAN, str(ROOT / "launch" / "preflight.py"),
                           f"127.0.0.1:{free_port()}", str(tmp_path / "r")], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    ended = json.loads(proc.stdout)
    assert ended["signal"] == signal.SIGTERM, f"the preflight outlived its parent by 15 s: {ended}"
    assert ended["seconds"] < 5


def _node_sh(tmp_path: Path, **extra: str) -> tuple[subprocess.CompletedProcess[str], float]:
    env = job_env({"CLUSTERGATE_NNODES": "2", "CLUSTERGATE_GPUS_PER_NODE": "0", "CLUSTERGATE_NPROC_PER_NODE": "1",
                   "CLUSTERGATE_RDZV_ENDPOINT": f"127.0.0.1:{free_port()}", "CLUSTERGATE_RDZV_ID": "preflight",
                   "CLUSTERGATE_REPORT_DIR": str(tmp_path / "r"), "CLUSTERGATE_RDZV_TIMEOUT": "2",
                   "CLUSTERGATE_PYTHON": sys.executable, **extra})
    env = {k: v for k, v in env.items() if k not in ("SLURM_NODEID", "JOB_COMPLETION_INDEX")}
    start = time.monotonic()
    proc = subprocess.run(["bash", str(ROOT / "launch" / "node.sh")], env=env, capture_output=True, text=True,
                          timeout=60)
    return proc, time.monotonic() - start


def test_node_script_unreachable_rendezvous_named_within_timeout(tmp_path: Path) -> None:
    proc, seconds = _node_sh(tmp_path, CLUSTERGATE_NODE_INDEX="1")
    # node.sh waits 2 s for the endpoint, then names it: the lower bound shows it waited, the upper one
    # (bash and a Python start-up on a busy machine, 10x the usual) that it did not wait for torchrun's 600 s.
    assert proc.returncode == 2 and 2 <= seconds < 20
    assert f"clustergate preflight FAILED on {HOST} (node index 1): rendezvous endpoint 127.0.0.1:" in proc.stderr
    assert "not reachable within 2 s" in proc.stderr


def test_node_script_missing_shared_directory(tmp_path: Path) -> None:
    proc, _ = _node_sh(tmp_path, CLUSTERGATE_NODE_INDEX="0", CLUSTERGATE_SHARED_DIR=str(tmp_path / "absent"))
    assert proc.returncode == 2
    assert f"FAILED on {HOST} (node index 0): shared directory {tmp_path / 'absent'} does not exist" in proc.stderr


@pytest.mark.slow
def test_torchrun_unreachable_endpoint_ends_bounded(tmp_path: Path) -> None:
    """What torchrun itself prints when the store never answers: bounded by read_timeout, and clear."""
    port = free_port()
    start = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
         f"--rdzv-endpoint=127.0.0.1:{port}", "--rdzv-id=unreachable", "--max-restarts=0",
         "--rdzv-conf=is_host=0,read_timeout=2,join_timeout=5", "-m", "pytest", "--version"],
        cwd=tmp_path, env=job_env(), capture_output=True, text=True, timeout=90)
    seconds = time.monotonic() - start
    assert proc.returncode != 0
    assert seconds < 30, f"took {seconds:.0f} s"
    assert "RendezvousConnectionError" in proc.stderr
    assert f"timed out after 2000ms while trying to connect to (127.0.0.1, {port})" in proc.stderr
    assert os.listdir(tmp_path) == []  # nothing started, nothing written
