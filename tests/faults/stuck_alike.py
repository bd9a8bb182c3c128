import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def test_first() -> None:
    dist.all_reduce(torch.ones(4))


def test_stuck() -> None:
    """A test that takes 3 s when healthy; here every rank then blocks in a read nobody answers (a call in its own
    code that never returns), alike: no rank waits in a collective for another."""
    time.sleep(3)
    Path(f"ready-{os.environ['RANK']}").write_text(str(os.getpid()))
    read, _ = os.pipe()
    os.read(read, 1)


def test_never_reached() -> None:
    pass
