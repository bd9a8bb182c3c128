import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def test_first() -> None:
    dist.all_reduce(torch.ones(4))


def test_busy() -> None:
    """Rank 1 computes on and on in torch's C++ (the CPU's stand-in for a GPU kernel that spins); rank 0 waits for it
    in all_reduce."""
    rank = int(os.environ["RANK"])
    Path(f"ready-{rank}").write_text(str(os.getpid()))
    if rank == 1:
        os.nice(19)  # this thread only (Linux): its beat keeps its priority; CI's cores stay the others'
        a = torch.randn(192, 192)
        deadline = time.monotonic() + 600  # a hang guard: the run ends this rank long before
        while time.monotonic() < deadline:
            a = torch.tanh(a @ a)
    dist.all_reduce(torch.ones(4))


def test_never_reached() -> None:
    pass
