import os
from pathlib import Path

import torch
import torch.distributed as dist


def test_first() -> None:
    dist.all_reduce(torch.ones(4))


def test_frozen() -> None:
    """Rank 1 blocks in a read nobody answers (a syscall that never returns; its threads run); rank 0 finishes the
    test and waits for it at the phase's exchange."""
    rank = int(os.environ["RANK"])
    Path(f"ready-{rank}").write_text(str(os.getpid()))
    if rank == 1:
        read, _ = os.pipe()
        os.read(read, 1)


def test_never_reached() -> None:
    pass
