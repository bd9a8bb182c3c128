"""A clean exit ends the process groups for real, so gloo cannot abort the process at exit.

The abort this guards against ("terminate called without an active exception", SIGABRT, seen in
CI under load): torch._dynamo, imported for the first time while a group exists (DDP's constructor
does), keeps references to the group; ``destroy_process_group()`` then cannot free the gloo backend,
whose worker threads live on into interpreter shutdown and abort the process when one of them
drops the last collective's tensors there. The check is deterministic: it counts gloo's threads
after the clean path instead of waiting for the race to be lost.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from torchrun_job import job_env

GLOO_THREADS = ("pt_gloo_runloop", "gloo_tcp_loop")

JOB = """
import json, os, sys
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from workloads.common import distributed

def threads():
    return sorted(open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task"))

def train():  # a workload's run(): the DDP model is gone when it returns
    model = DDP(torch.nn.Linear(8, 8))  # imports torch._dynamo now, as training code does
    model(torch.randn(4, 8)).sum().backward()

with distributed() as here:
    train()
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, here.rank)
    during = threads()
left = threads()
with open(os.path.join(sys.argv[1], f"rank{here.rank}.json"), "w") as f:
    json.dump({"during": during, "after": left}, f)
"""


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="reads thread names from /proc (Linux)")
def test_distributed_ends_gloo_threads_even_after_ddp_imported_dynamo(tmp_path: Path) -> None:
    script = tmp_path / "job.py"
    script.write_text(JOB)
    # Bound: two CPU ranks start, train one step and exit in about 10 s idle; 240 s leaves room
    # for a machine whose cores are busy with other tests.
    proc = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
                           str(script), str(tmp_path)], env=job_env(), capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    for rank in (0, 1):
        seen = json.loads((tmp_path / f"rank{rank}.json").read_text())
        assert any(name in seen["during"] for name in GLOO_THREADS), seen  # the check sees gloo's threads
        assert not [t for t in seen["after"] if t in GLOO_THREADS], seen  # ... and they are gone after
