"""Check one node before its torchrun agent starts; every failure names this node and what to do.

launch/node.sh runs it on every node (Slurm task or Kubernetes pod). It fails fast, before the
rendezvous, on what would otherwise end as a timeout somewhere else: a node whose GPU count
differs, a report or shared directory that is missing, a rendezvous endpoint that never answers.

    python3 launch/preflight.py --gpus 8 --report-dir /shared/r --rdzv-endpoint node-001:29500 --node-index 3

The node is named as in every report (workloads/node/name.py): $CLUSTERGATE_NODE_NAME, else Slurm's
$SLURMD_NODENAME, else the host name. It runs before torch is imported and needs only the checkout.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # the checkout, for workloads.node.name
# Both need the path above, and both are the standard library only.
from clustergate.common.parent_death import die_with_parent  # noqa: E402
from clustergate.common.terminal import error_text  # noqa: E402
from workloads.node.name import node_name  # noqa: E402

PREFIX = "clustergate preflight"


def end_with_parent() -> None:
    """End (SIGTERM) when the parent, launch/node.sh, ends: a preflight never outlives its node's task.

    A scheduler that finds a task's processes by their parent links (Slurm's proctrack/linuxproc) can miss a
    child whose parent it killed a moment before: an orphaned preflight of a node whose job has ended then polls
    the gone first node for the whole rendezvous timeout (600 s) and holds the task's output open, so that Slurm
    waits 60 s more for it. A job whose preflight failed on one node took 64 s to end instead of 4 that way."""
    parent = os.getppid()
    if die_with_parent(signal.SIGTERM) and os.getppid() != parent:  # it ended before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def cuda_device_count() -> tuple[int, str]:
    """CUDA devices this node's ranks will see (torch's count, as the ranks count), and a note."""
    try:
        import torch
    except ImportError as exc:
        return 0, f"torch does not import ({exc}): is this the right Python (CLUSTERGATE_PYTHON)?"
    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    note = ""
    if count == 0:
        try:
            smi = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60, check=False)
            note = f"nvidia-smi -L says: {(smi.stdout or smi.stderr).strip()[:300] or 'nothing'}"
        except (OSError, subprocess.TimeoutExpired) as exc:
            note = error_text(exc) if isinstance(exc, OSError) else str(exc)  # "nvidia-smi: No such file..."
    return count, note


def gpu_problem(expected: int, seen: int, note: str = "") -> str | None:
    """Why this node's GPU count is wrong; None when it matches (or no GPU is expected)."""
    if expected <= 0 or seen == expected:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    where = f" (CUDA_VISIBLE_DEVICES={visible})" if visible is not None else ""
    return (f"{seen} CUDA devices visible{where}, the job expects {expected} per node: drain this node "
            f"or exclude it (sbatch --exclude), or run with --gpus-per-node={seen}" + (f"; {note}" if note else ""))


def directory_problem(path: str, what: str, create: bool) -> str | None:
    """Why ``path`` cannot be used as ``what``; creates it first when ``create``."""
    if create:
        try:
            os.makedirs(path, exist_ok=True)
        except OSError as exc:
            return f"{what} {path} cannot be created: {error_text(exc)}"
    if not os.path.isdir(path):
        return f"{what} {path} does not exist on this node: mount the shared filesystem here, or choose another path"
    if not os.access(path, os.W_OK | os.X_OK):
        return f"{what} {path} is not writable by uid {os.getuid()}"
    return None


def split_endpoint(endpoint: str) -> tuple[str, int]:
    host, sep, port = endpoint.rpartition(":")
    if not sep or not host or not port.isdigit():
        raise ValueError(f"rendezvous endpoint {endpoint!r} must be HOST:PORT")
    return host.strip("[]"), int(port)


def wait_for_endpoint(endpoint: str, timeout_s: float, connect: bool, poll_s: float = 2.0) -> str | None:
    """Wait until the endpoint's host resolves (and, when ``connect``, accepts TCP); why not, on timeout."""
    host, port = split_endpoint(endpoint)
    deadline = time.monotonic() + timeout_s
    last = ""
    while True:
        try:
            infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
            if not connect:
                return None
            for family, kind, proto, _, addr in infos:
                with socket.socket(family, kind, proto) as s:
                    s.settimeout(min(5.0, max(0.5, deadline - time.monotonic())))
                    try:
                        s.connect(addr)
                        return None
                    except OSError as exc:
                        last = f"connect to {addr[0]}:{port}: {error_text(exc)}"
        except socket.gaierror as exc:
            last = f"{host!r} does not resolve: {error_text(exc)}"
        left = deadline - time.monotonic()
        if left <= 0:
            break
        time.sleep(min(poll_s, left))
    return (f"rendezvous endpoint {endpoint} not reachable within {timeout_s:.0f} s ({last}): is the job's "
            "first node up (Slurm: the allocation's first node; Kubernetes: pod <job>-0 and the headless "
            "Service)? a firewall between nodes? raise CLUSTERGATE_RDZV_TIMEOUT if nodes start slowly")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--gpus", type=int, required=True, help="GPUs this node must have (0: CPU ranks)")
    parser.add_argument("--report-dir", required=True, help="the job's report directory (created if absent)")
    parser.add_argument("--shared-dir", default="", help="the shared-filesystem test's directory (must exist)")
    parser.add_argument("--rdzv-endpoint", default="",
                        help="HOST:PORT of the c10d rendezvous (none: a single node with torchrun --standalone)")
    parser.add_argument("--node-index", default="", help="this node's index; 0 hosts the rendezvous")
    parser.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the endpoint")
    args = parser.parse_args(argv)
    host = node_name()
    problems = []
    if args.gpus > 0:
        seen, note = cuda_device_count()
        if p := gpu_problem(args.gpus, seen, note):
            problems.append(p)
    if p := directory_problem(args.report_dir, "report directory", create=True):
        problems.append(p)
    if args.shared_dir and (p := directory_problem(args.shared_dir, "shared directory", create=False)):
        problems.append(p)
    try:
        # The hosting node creates the store itself; the others wait for it to accept connections,
        # so an unreachable endpoint is reported here, by name, instead of as a torchrun traceback.
        hosting = args.node_index == "0"
        known = args.node_index != ""
        if args.rdzv_endpoint and (p := wait_for_endpoint(args.rdzv_endpoint, args.timeout,
                                                          connect=known and not hosting)):
            problems.append(p)
    except ValueError as exc:
        problems.append(str(exc))
    index = f" (node index {args.node_index})" if args.node_index else ""
    if problems:
        for p in problems:
            print(f"{PREFIX} FAILED on {host}{index}: {p}", file=sys.stderr, flush=True)
        return 2
    rendezvous = args.rdzv_endpoint or "none (this node alone)"
    print(f"{PREFIX} ok on {host}{index}: {args.gpus} GPUs, report dir {args.report_dir}, "
          f"rendezvous {rendezvous}", flush=True)
    return 0


if __name__ == "__main__":
    end_with_parent()  # here, not in main(): the suite's tests call main() in their own process
    sys.exit(main())
