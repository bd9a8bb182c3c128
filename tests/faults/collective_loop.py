import os
import time
from pathlib import Path

import torch
import torch.distributed as dist


def test_first() -> None:
    pass


def test_loop() -> None:
    Path(f"ready-{os.environ['RANK']}").write_text(str(os.getpid()))  # the harness kills rank 0 once here
    t = torch.ones(4)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        dist.all_reduce(t)
        time.sleep(0.05)
