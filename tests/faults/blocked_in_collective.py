import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def test_blocked() -> None:
    rank = int(os.environ["RANK"])
    Path(f"ready-{rank}").write_text(str(os.getpid()))  # the harness interrupts the run once both are here
    if rank == 0:
        dist.all_reduce(torch.ones(4))  # blocked in C++: rank 1 never joins
    else:
        time.sleep(120)


def test_never_reached() -> None:
    pass
