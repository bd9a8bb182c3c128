import os
import re
from pathlib import Path

import torch
import torch.distributed as dist


def test_first() -> None:
    dist.all_reduce(torch.ones(4))


def test_holds() -> None:
    """Rank 1 matches a regular expression that backtracks for ever, holding the interpreter's lock all the while: no
    thread of it runs Python (its beat stops) though its process runs. Rank 0 waits for it in all_reduce."""
    rank = int(os.environ["RANK"])
    Path(f"ready-{rank}").write_text(str(os.getpid()))
    if rank == 1:
        os.nice(19)  # this thread only (Linux): its beat keeps its priority; CI's cores stay the others'
        re.match(r"(a+)+$", "a" * 64 + "b")
    dist.all_reduce(torch.ones(4))


def test_never_reached() -> None:
    pass
