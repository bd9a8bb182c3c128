import os
from pathlib import Path

import torch
import torch.distributed as dist


def test_first() -> None:
    dist.all_reduce(torch.ones(4))


def test_deadlock() -> None:
    """Every rank receives from its next peer, which never sends: a deadlock of the whole group."""
    rank, size = dist.get_rank(), dist.get_world_size()
    Path(f"ready-{rank}").write_text(str(os.getpid()))
    dist.recv(torch.zeros(4), src=(rank + 1) % size)


def test_never_reached() -> None:
    pass
